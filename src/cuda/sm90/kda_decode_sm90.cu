// Instantiations and launcher of the sm90 decode kernel. Shared memory is static (at most ~48 KB), so
// a launch needs no function attribute and no host call besides the launch itself.
#include "kda_decode_sm90.cuh"

namespace flash_kda::cuda::sm90 {

template <typename StateT, int kHeadDim, int kRowsPerThread>
cudaError_t launch_kda_decode(const KdaDecodeArgs& args, int64_t units, cudaStream_t stream) {
  using Tr = KdaDecodeTraits<StateT, kHeadDim, kRowsPerThread>;
  kda_decode_kernel<Tr><<<dim3(static_cast<unsigned>(units)), Tr::kThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

template cudaError_t launch_kda_decode<float, 128, 1>(const KdaDecodeArgs&, int64_t, cudaStream_t);
template cudaError_t launch_kda_decode<float, 128, 2>(const KdaDecodeArgs&, int64_t, cudaStream_t);
template cudaError_t launch_kda_decode<float, 128, 4>(const KdaDecodeArgs&, int64_t, cudaStream_t);
template cudaError_t launch_kda_decode<__nv_bfloat16, 128, 1>(const KdaDecodeArgs&, int64_t, cudaStream_t);
template cudaError_t launch_kda_decode<__nv_bfloat16, 128, 2>(const KdaDecodeArgs&, int64_t, cudaStream_t);
template cudaError_t launch_kda_decode<__nv_bfloat16, 128, 4>(const KdaDecodeArgs&, int64_t, cudaStream_t);
template cudaError_t launch_kda_decode<float, 64, 1>(const KdaDecodeArgs&, int64_t, cudaStream_t);
template cudaError_t launch_kda_decode<float, 64, 2>(const KdaDecodeArgs&, int64_t, cudaStream_t);
template cudaError_t launch_kda_decode<float, 64, 4>(const KdaDecodeArgs&, int64_t, cudaStream_t);
template cudaError_t launch_kda_decode<__nv_bfloat16, 64, 1>(const KdaDecodeArgs&, int64_t, cudaStream_t);
template cudaError_t launch_kda_decode<__nv_bfloat16, 64, 2>(const KdaDecodeArgs&, int64_t, cudaStream_t);
template cudaError_t launch_kda_decode<__nv_bfloat16, 64, 4>(const KdaDecodeArgs&, int64_t, cudaStream_t);

}  // namespace flash_kda::cuda::sm90
