// CUDA backend of `decode`: checks the device, picks the kernel shape for the problem and launches
// it. No allocation, no synchronisation, no host read of device memory: safe inside graph capture.
#include "../api/backends.h"
#include "dispatch_common.h"
#include "sm90/kda_decode_sm90.cuh"

namespace flash_kda::cuda {

namespace {

template <typename StateT>
cudaError_t launch(const sm90::KdaDecodeArgs& a, int64_t pairs, int rows_per_thread, cudaStream_t stream) {
  switch (rows_per_thread) {
    case 4: return sm90::launch_kda_decode<StateT, 4>(a, pairs * 2, stream);
    case 2: return sm90::launch_kda_decode<StateT, 2>(a, pairs * 4, stream);
    default: return sm90::launch_kda_decode<StateT, 1>(a, pairs * 8, stream);
  }
}

}  // namespace

Status decode(const DecodeParams& p, cudaStream_t stream) {
  int sm_count = 0;
  Status st = current_sm90_device(&sm_count);
  if (!st.ok()) return st;

  const int64_t N = num_sequences(p);
  const int64_t HV = p.heads_v > 0 ? p.heads_v : p.heads;
  if (N == 0 || p.seqlen == 0) return Status::Ok();

  sm90::KdaDecodeArgs a{};
  copy_activations(a, p);
  a.state = p.state;
  a.state_indices = p.state_indices;
  a.num_accepted = p.slots_per_seq > 1 ? p.num_accepted_tokens : nullptr;
  a.seqlen = p.seqlen;
  a.pool_size = p.pool_size;
  a.slots_per_seq = static_cast<int>(p.slots_per_seq);
  a.indices_stride = p.state_indices_stride > 0 ? p.state_indices_stride : p.slots_per_seq;
  a.heads_v = static_cast<int>(HV);
  a.group = static_cast<int>(HV / p.heads);
  a.scale = p.scale;
  a.lower_bound = p.lower_bound;
  // The gate forms (docs/spec.md, "Gate forms"): A_log may be null (rate 1) with the sigmoid gate.
  a.softplus_gate = p.gate == GateForm::kSoftplus;
  a.beta_scale = p.allow_neg_eigval ? 2.0f : 1.0f;
  a.cu_seqlens_i64 = p.cu_seqlens_dtype == DType::kI64;

  // Rows of S per thread: as many as keep at least ~4 CTAs per SM in the grid (4 rows: 2 CTAs per
  // (sequence, head), ~128 registers, 4 CTAs resident per SM); fewer rows per thread split a head
  // over more CTAs when the batch alone cannot fill the GPU (B=1, H=32: 32 heads × 8 slices).
  const int64_t pairs = N * HV;
  int rows_per_thread = 4;
  while (rows_per_thread > 1 && pairs * (8 / rows_per_thread) < 4 * int64_t(sm_count)) rows_per_thread /= 2;
  if (pairs * (8 / rows_per_thread) > INT32_MAX)
    return {StatusCode::kUnsupported, "q: too many (sequence, head) pairs for one launch"};

  const cudaError_t e = p.state_dtype == DType::kF32 ? launch<float>(a, pairs, rows_per_thread, stream)
                                                     : launch<__nv_bfloat16>(a, pairs, rows_per_thread, stream);
  if (e != cudaSuccess) return cuda_error("kernel launch", e);
  return Status::Ok();
}

}  // namespace flash_kda::cuda
