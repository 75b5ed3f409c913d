// Instantiations of the prepared plans' kernels for K = V = 64 (the preparation, the recurrence with
// 1, 2 or 4 consumer warps, the chain); the plan kernel is kda_prepared_sm90.cu's.
#include "kda_prepared_launch.cuh"

namespace flash_kda::cuda::sm90 {

template cudaError_t launch_kda_prep<64>(const KdaFwdArgs&, const PlanArgs&, int64_t, cudaStream_t);
template cudaError_t launch_kda_rec<64, 1>(const KdaFwdArgs&, const PlanArgs&, int, int64_t, cudaStream_t);
template cudaError_t launch_kda_rec<64, 2>(const KdaFwdArgs&, const PlanArgs&, int, int64_t, cudaStream_t);
template cudaError_t launch_kda_rec<64, 4>(const KdaFwdArgs&, const PlanArgs&, int, int64_t, cudaStream_t);
template cudaError_t launch_kda_chain<64, 8, 2>(const KdaFwdArgs&, const PlanArgs&, int64_t, cudaStream_t);
template cudaError_t launch_kda_chain<64, 16, 2>(const KdaFwdArgs&, const PlanArgs&, int64_t, cudaStream_t);
template cudaError_t launch_kda_chain<64, 16, 1>(const KdaFwdArgs&, const PlanArgs&, int64_t, cudaStream_t);

}  // namespace flash_kda::cuda::sm90
