// The contract on tensors: an argument described as a tensor (data, dtype, shape, strides, device;
// what DLPack carries) is turned into FwdParams / DecodeParams here, with the checks only such a
// description allows: ranks and extents against q and v, dtypes, last-dimension and whole-tensor
// contiguity, devices, writability. validate() (src/api/validate.cpp) then checks the rest. The
// Python binding converts arrays into these descriptions and nothing else; torch's fake tensors
// come through check_fwd / check_decode with no data at all (data_free).
#pragma once

#include <cstdint>
#include <string>

#include "flash_kda/flash_kda.h"

namespace flash_kda {

enum class Device : int { kHost, kCuda, kMeta, kOther };

constexpr int kMaxTensorRank = 8;

struct TensorArg {
  bool given = false;  // false: None
  const void* data = nullptr;
  DType dtype = DType::kNone;  // kNone: a dtype flash-kda does not take; dtype_text says which
  std::string dtype_text;      // the caller's dtype in words, for messages ("float16")
  int ndim = 0;                // more than kMaxTensorRank: only the rank is known
  int64_t shape[kMaxTensorRank] = {};
  int64_t strides[kMaxTensorRank] = {};  // in elements
  Device device = Device::kHost;
  int device_id = 0;
  std::string device_text;  // kOther: what it is
  bool read_only = false;
};

// The arguments fwd and decode share, as tensors, and the call's options.
struct CallArgs {
  TensorArg q, k, v, g, beta, out, A_log, dt_bias, cu_seqlens, cu_seqlens_cpu;  // A_log may be absent (sigmoid gate)
  double scale = 0.0;
  double lower_bound = -5.0;
  bool has_lower_bound = true;    // false (Python: lower_bound=None): GateForm::kSoftplus
  bool allow_neg_eigval = false;  // beta = 2 sigmoid(logit)
  std::string backend = "auto";  // "auto" (where the tensors live), "cuda", "cpu", "reference"
  int cpu_threads = 0;
};

struct FwdArgs : CallArgs {
  TensorArg initial_state, final_state, state_indices, has_initial_state;
  // Prefix-cache checkpoints: the pool [P2, HV, V, K], int32 slots [N, M] (rows may be further
  // apart than M; the last dimension contiguous), int32 / int64 absolute starts [N].
  TensorArg checkpoint_state, checkpoint_indices, checkpoint_start;
  int64_t checkpoint_interval = 0;  // 0: none
};

struct DecodeArgs : CallArgs {
  TensorArg state, state_indices, num_accepted_tokens;
};

// Fills `p` from the tensors after checking what the descriptions carry; `p` then goes to fwd /
// decode, which validate the rest. The device the tensors live on (for Backend::kCuda: which GPU)
// is returned in *device_id. data_free: the descriptions carry no data (meta tensors pass).
Status fwd_params(const FwdArgs& a, FwdParams* p, int* device_id, bool data_free = false);
Status decode_params(const DecodeArgs& a, DecodeParams* p, int* device_id, bool data_free = false);

// Every check of fwd / decode that needs no data: the tensor rules above and validate()'s rules on
// sizes, scalars, strides and dtypes (for torch's fake and meta tensors). A given tensor's `data`
// must be non-null (any distinct dummy address): it marks the argument present.
Status check_fwd(const FwdArgs& a);
Status check_decode(const DecodeArgs& a);

}  // namespace flash_kda
