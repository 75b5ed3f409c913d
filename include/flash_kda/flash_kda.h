// flash-kda public C++ API.
//
// One parameter struct (FwdParams) carries every argument of the KDA forward described in
// docs/spec.md; one entry point (fwd) validates it and runs it on the chosen backend. Errors are
// reported through a Status value whose message names the offending argument; nothing is written
// to any output or state buffer by a call that returns an error, and nothing aborts the process.
//
// Shapes (B batch rows, T tokens per row, H query/key heads, HV value heads, K = V = 128):
//   q, k        bf16 [B, T, H, K]     raw queries and keys (L2-normalised inside)
//   v           bf16 [B, T, HV, V]
//   g           bf16 [B, T, HV, K]    raw gate
//   beta        bf16 [B, T, HV]       beta logits
//   out         bf16 [B, T, HV, V]    written
//   A_log       fp32 [HV]
//   dt_bias     fp32 [HV * K]
//   initial_state / final_state: bf16 or fp32 [N, HV, V, K], contiguous, V-first layout
//   cu_seqlens  int64 or int32 [N + 1] (requires B == 1), else N = B
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#ifndef FLASH_KDA_NO_CUDA_TYPES
#include <cuda_runtime_api.h>
#else
typedef struct CUstream_st* cudaStream_t;
#endif

namespace flash_kda {

enum class DType : int { kNone = 0, kBF16, kF32, kI32, kI64 };

// Where the tensors live and which implementation computes the result.
enum class Backend : int {
  kCuda = 0,      // device pointers, the CUDA kernels (sm_90a); asynchronous on `stream`
  kCpu,           // host pointers, the chunked fp32 multi-threaded CPU implementation
  kCpuReference,  // host pointers, the per-token float64 recurrence (slow; the test oracle)
};

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument,  // a value, shape, stride or alignment is wrong (Python: ValueError)
  kTypeMismatch,     // a dtype is wrong (Python: TypeError)
  kUnsupported,      // valid per the spec but not supported by this build/backend/device
  kCudaError,        // a CUDA runtime call failed
};

struct Status {
  StatusCode code = StatusCode::kOk;
  std::string message;

  bool ok() const { return code == StatusCode::kOk; }
  static Status Ok() { return {}; }
};

// Element strides (not bytes) of a [B, T, heads, D] activation tensor; the last dimension must be
// contiguous. A stride of 0 for `batch` is fine when B == 1.
struct ActStrides {
  int64_t batch = 0;
  int64_t token = 0;
  int64_t head = 0;
};

struct FwdParams {
  // ---- sizes ----
  int64_t batch = 0;         // B
  int64_t seqlen = 0;        // T (tokens per batch row; with cu_seqlens, the packed length)
  int64_t heads = 0;         // H (heads of q and k)
  int64_t heads_v = 0;       // HV (heads of v, g, beta, out, states); 0 means HV = H
  int64_t head_dim_k = 128;  // K
  int64_t head_dim_v = 128;  // V

  // ---- inputs (bf16 unless noted) ----
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* g = nullptr;
  const void* beta = nullptr;
  const float* A_log = nullptr;    // fp32 [HV]
  const float* dt_bias = nullptr;  // fp32 [HV * K]
  float scale = 0.0f;              // output scale, usually K^-0.5
  float lower_bound = -5.0f;       // gate floor, -5 <= lower_bound < 0

  // ---- output ----
  void* out = nullptr;

  // Element strides of q, k, v, g, out ([B, T, heads, D]) and beta ([B, T, HV], `head` is the
  // stride between heads). Leave all zero for contiguous tensors (filled in by fill_contiguous).
  ActStrides q_strides, k_strides, v_strides, g_strides, out_strides, beta_strides;

  // ---- recurrent state ----
  const void* initial_state = nullptr;  // nullptr: zeros
  void* final_state = nullptr;          // nullptr: not written; may equal initial_state
  DType state_dtype = DType::kNone;     // kBF16 or kF32 when either state is given

  // ---- variable-length batch ----
  const void* cu_seqlens = nullptr;  // nullptr: every batch row is one sequence
  DType cu_seqlens_dtype = DType::kNone;  // kI64 or kI32
  int64_t num_seqs = 0;                   // N: entries of cu_seqlens minus one

  // ---- scratch memory (caller-owned; see workspace_size) ----
  void* workspace = nullptr;
  size_t workspace_bytes = 0;

  Backend backend = Backend::kCuda;

  // Threads for the CPU backends; 0 means all hardware threads.
  int cpu_threads = 0;
};

// Number of sequences the call processes (num_seqs with cu_seqlens, else batch).
int64_t num_sequences(const FwdParams& p);

// Fills any all-zero stride triple with the contiguous strides of its tensor.
void fill_contiguous_strides(FwdParams& p);

// Checks every argument against the contract. Host-side only: it never reads device memory, so
// for Backend::kCuda the *contents* of cu_seqlens are not checked here (see docs/api.md).
Status validate(const FwdParams& p);

// Bytes of scratch memory `fwd` needs for these parameters (0 when none is needed).
size_t workspace_size(const FwdParams& p);

// Validates, then runs the forward on params.backend. For kCuda the call is asynchronous on
// `stream`, performs no allocation and no host synchronisation (CUDA-graph capturable); for the
// CPU backends `stream` is ignored and the call returns when the result is written.
Status fwd(const FwdParams& params, cudaStream_t stream = nullptr);

// Human-readable name of a dtype ("bf16", "fp32", ...).
const char* dtype_name(DType d);

// True when this build contains the CUDA kernels and a device of compute capability 9.0 is present.
bool cuda_available();

}  // namespace flash_kda
