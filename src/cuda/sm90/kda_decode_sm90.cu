// Instantiations and launcher of the sm90 decode kernel. Shared memory is dynamic (two state buffers
// of up to 32 KB and the token vectors): above 48 KB the kernel's limit is raised once per device
// (dispatch_common.h's raise_smem_limit, not a stream operation: harmless in graph capture).
#include "kda_decode_sm90.cuh"

namespace flash_kda::cuda::sm90 {

template <typename StateT, int kHeadDim, int kRowsPerThread>
cudaError_t launch_kda_decode(const KdaDecodeArgs& args, unsigned grid, size_t smem_bytes, cudaStream_t stream) {
  using Tr = KdaDecodeTraits<StateT, kHeadDim, kRowsPerThread>;
  // (the largest this shape asks for: two buffers, 8 tokens; raised once per device)
  constexpr size_t kMaxBytes = KdaDecodeSmem<Tr>::bytes(2, Tr::kMaxTokens);
  static_assert(kMaxBytes <= kSmemPerCtaMax, "the decode kernel's shared memory fits a CTA");
  if (smem_bytes > 48 * 1024) {
    const cudaError_t e = raise_smem_limit<kda_decode_kernel<Tr>>(int(kMaxBytes));
    if (e != cudaSuccess) return e;
  }
  kda_decode_kernel<Tr><<<dim3(grid), Tr::kThreads, smem_bytes, stream>>>(args);
  return cudaGetLastError();
}

template cudaError_t launch_kda_decode<float, 128, 1>(const KdaDecodeArgs&, unsigned, size_t, cudaStream_t);
template cudaError_t launch_kda_decode<float, 128, 2>(const KdaDecodeArgs&, unsigned, size_t, cudaStream_t);
template cudaError_t launch_kda_decode<float, 128, 4>(const KdaDecodeArgs&, unsigned, size_t, cudaStream_t);
template cudaError_t launch_kda_decode<__nv_bfloat16, 128, 1>(const KdaDecodeArgs&, unsigned, size_t, cudaStream_t);
template cudaError_t launch_kda_decode<__nv_bfloat16, 128, 2>(const KdaDecodeArgs&, unsigned, size_t, cudaStream_t);
template cudaError_t launch_kda_decode<__nv_bfloat16, 128, 4>(const KdaDecodeArgs&, unsigned, size_t, cudaStream_t);
template cudaError_t launch_kda_decode<float, 64, 1>(const KdaDecodeArgs&, unsigned, size_t, cudaStream_t);
template cudaError_t launch_kda_decode<float, 64, 2>(const KdaDecodeArgs&, unsigned, size_t, cudaStream_t);
template cudaError_t launch_kda_decode<float, 64, 4>(const KdaDecodeArgs&, unsigned, size_t, cudaStream_t);
template cudaError_t launch_kda_decode<__nv_bfloat16, 64, 1>(const KdaDecodeArgs&, unsigned, size_t, cudaStream_t);
template cudaError_t launch_kda_decode<__nv_bfloat16, 64, 2>(const KdaDecodeArgs&, unsigned, size_t, cudaStream_t);
template cudaError_t launch_kda_decode<__nv_bfloat16, 64, 4>(const KdaDecodeArgs&, unsigned, size_t, cudaStream_t);

}  // namespace flash_kda::cuda::sm90
