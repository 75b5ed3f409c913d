// Instantiations of the sm90 fused forward kernel for K = V = 128 (64: kda_fwd64_sm90.cu).
#include "kda_fwd_launch.cuh"

namespace flash_kda::cuda::sm90 {

template cudaError_t launch_kda_fwd<128, 1>(const KdaFwdArgs&, int64_t, cudaStream_t);
template cudaError_t launch_kda_fwd<128, 2>(const KdaFwdArgs&, int64_t, cudaStream_t);
template cudaError_t launch_kda_fwd<128, 4>(const KdaFwdArgs&, int64_t, cudaStream_t);
template cudaError_t launch_kda_fwd<128, 8>(const KdaFwdArgs&, int64_t, cudaStream_t);

}  // namespace flash_kda::cuda::sm90
