// CUDA backend of `decode`: checks the device, picks the kernel shape for the problem and launches
// it. No allocation, no synchronisation, no host read of device memory: safe inside graph capture.
#include "../api/backends.h"
#include "dispatch_common.h"
#include "sm90/kda_decode_sm90.cuh"

namespace flash_kda::cuda {

namespace {

template <typename StateT, int kHeadDim, int kRowsPerThread>
cudaError_t launch_rows(const sm90::KdaDecodeArgs& a, int64_t pairs, cudaStream_t stream) {
  constexpr int64_t kSlices = sm90::KdaDecodeTraits<StateT, kHeadDim, kRowsPerThread>::kSlices;
  return sm90::launch_kda_decode<StateT, kHeadDim, kRowsPerThread>(a, pairs * kSlices, stream);
}

template <typename StateT, int kHeadDim>
cudaError_t launch(const sm90::KdaDecodeArgs& a, int64_t pairs, int rows_per_thread, cudaStream_t stream) {
  switch (rows_per_thread) {
    case 4: return launch_rows<StateT, kHeadDim, 4>(a, pairs, stream);
    case 2: return launch_rows<StateT, kHeadDim, 2>(a, pairs, stream);
    default: return launch_rows<StateT, kHeadDim, 1>(a, pairs, stream);
  }
}

template <int kHeadDim>
cudaError_t launch_dim(const sm90::KdaDecodeArgs& a, DType state, int64_t pairs, int rows_per_thread,
                       cudaStream_t stream) {
  return state == DType::kF32 ? launch<float, kHeadDim>(a, pairs, rows_per_thread, stream)
                              : launch<__nv_bfloat16, kHeadDim>(a, pairs, rows_per_thread, stream);
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

  // Rows of S per thread: as many as keep at least ~16 warps per SM in the grid (4 rows: ~128
  // registers, 16 resident warps per SM: D = 128, 2 CTAs of 4 warps per (sequence, head) and 4 CTAs
  // per SM; D = 64, 1 CTA of 2 warps and 8 per SM); fewer rows per thread split a head over more CTAs
  // when the batch alone cannot fill the GPU (B=1, H=32, D = 128: 32 heads × 8 slices). A CTA has
  // D threads and owns 16 rows per row a thread: D / (16 r) CTAs per head, of D / 32 warps each.
  const int64_t D = p.head_dim_k, pairs = N * HV;
  int rows_per_thread = 4;
  auto ctas = [&](int r) { return pairs * (D / (16 * r)); };
  while (rows_per_thread > 1 && ctas(rows_per_thread) * (D / 32) < 16 * int64_t(sm_count)) rows_per_thread /= 2;
  if (ctas(rows_per_thread) > INT32_MAX)
    return {StatusCode::kUnsupported, "q: too many (sequence, head) pairs for one launch"};

  // validate() admits K = V = 128 and 64 for the CUDA decode.
  const cudaError_t e = D == 64 ? launch_dim<64>(a, p.state_dtype, pairs, rows_per_thread, stream)
                                : launch_dim<128>(a, p.state_dtype, pairs, rows_per_thread, stream);
  if (e != cudaSuccess) return cuda_error("kernel launch", e);
  return Status::Ok();
}

}  // namespace flash_kda::cuda
