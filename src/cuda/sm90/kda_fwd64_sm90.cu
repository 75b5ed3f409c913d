// Instantiations of the sm90 fused forward kernel for K = V = 64: a CTA owns at most the 64 rows of
// a head (4 consumer warps), so 1, 2 or 4 CTAs share one (sequence, head).
#include "kda_fwd_launch.cuh"

namespace flash_kda::cuda::sm90 {

template cudaError_t launch_kda_fwd<64, 1>(const KdaFwdArgs&, int64_t, cudaStream_t);
template cudaError_t launch_kda_fwd<64, 2>(const KdaFwdArgs&, int64_t, cudaStream_t);
template cudaError_t launch_kda_fwd<64, 4>(const KdaFwdArgs&, int64_t, cudaStream_t);

}  // namespace flash_kda::cuda::sm90
