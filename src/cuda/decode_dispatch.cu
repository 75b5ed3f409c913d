// CUDA backend of `decode`: checks the device, picks the kernel shape for the problem and launches
// it. No allocation, no synchronisation, no host read of device memory: safe inside graph capture.
#include "../api/backends.h"
#include "dispatch_common.h"
#include "sm90/kda_decode_sm90.cuh"

namespace flash_kda::cuda {

Status decode(const DecodeParams& p, cudaStream_t stream) {
  int sm_count = 0;
  Status st = current_sm90_device(&sm_count);
  if (!st.ok()) return st;

  const int64_t N = num_sequences(p);
  const int64_t HV = p.heads_v > 0 ? p.heads_v : p.heads;
  if (N == 0 || p.seqlen == 0) return Status::Ok();

  const sm90::KdaDecodeArgs a = sm90::decode_kernel_args(p);
  const int64_t D = p.head_dim_k, pairs = N * HV;
  const sm90::DecodeShape shape =
      sm90::decode_shape(p.state_dtype, pairs, D, sm_count, p.cu_seqlens == nullptr && p.seqlen == 1,
                         p.slots_per_seq > 1);
  if (pairs * (D / (16 * shape.rows_per_thread)) > INT32_MAX)
    return {StatusCode::kUnsupported, "q: too many (sequence, head) pairs for one launch"};

  // validate() admits K = V = 128 and 64 for the CUDA decode.
  const cudaError_t e = sm90::with_decode_traits(p.state_dtype, D, shape, [&](auto tr) {
    using Tr = decltype(tr);
    return sm90::launch_kda_decode<typename Tr::State, Tr::kDim, Tr::kRowsPerThread_, Tr::kRowPasses_, Tr::kMatrix_>(
        a, pairs * Tr::kSlices, stream);
  });
  if (e != cudaSuccess) return cuda_error("kernel launch", e);
  return Status::Ok();
}

}  // namespace flash_kda::cuda
