// Instantiations and launchers of the prepared plans' kernels: the plan kernel (every head
// dimension) and the preparation, recurrence and chain kernels for K = V = 128 (64:
// kda_prepared64_sm90.cu).
#include "kda_plan_kernels.cuh"
#include "kda_prepared_launch.cuh"

namespace flash_kda::cuda::sm90 {

cudaError_t launch_kda_plan(const KdaFwdArgs& a, const PlanArgs& p, cudaStream_t stream) {
  kda_plan_kernel<<<1, 1024, 0, stream>>>(a, p);
  return cudaGetLastError();
}

template cudaError_t launch_kda_prep<128>(const KdaFwdArgs&, const PlanArgs&, int64_t, cudaStream_t);
template cudaError_t launch_kda_rec<128, 1>(const KdaFwdArgs&, const PlanArgs&, int, int64_t, cudaStream_t);
template cudaError_t launch_kda_rec<128, 2>(const KdaFwdArgs&, const PlanArgs&, int, int64_t, cudaStream_t);
template cudaError_t launch_kda_rec<128, 4>(const KdaFwdArgs&, const PlanArgs&, int, int64_t, cudaStream_t);
template cudaError_t launch_kda_rec<128, 8>(const KdaFwdArgs&, const PlanArgs&, int, int64_t, cudaStream_t);
template cudaError_t launch_kda_chain<128, 8, 2>(const KdaFwdArgs&, const PlanArgs&, int64_t, cudaStream_t);
template cudaError_t launch_kda_chain<128, 16, 2>(const KdaFwdArgs&, const PlanArgs&, int64_t, cudaStream_t);
template cudaError_t launch_kda_chain<128, 16, 1>(const KdaFwdArgs&, const PlanArgs&, int64_t, cudaStream_t);

}  // namespace flash_kda::cuda::sm90
