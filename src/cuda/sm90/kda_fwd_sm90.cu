// Instantiations and launcher of the sm90 forward kernel.
#include <mutex>

#include "kda_fwd_kernel.cuh"

namespace flash_kda::cuda::sm90 {

template <int kConsumerWarps>
cudaError_t launch_kda_fwd(const KdaFwdArgs& args, int64_t num_units, cudaStream_t stream) {
  using Tr = KdaFwdTraits<kConsumerWarps>;
  static std::once_flag once;
  static cudaError_t attr_status = cudaSuccess;
  // Raising the dynamic shared-memory limit is a function attribute, not a stream operation, so
  // it is done once and never inside a captured graph's critical path.
  std::call_once(once, [] {
    attr_status = cudaFuncSetAttribute(kda_fwd_kernel<Tr>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       Tr::kSmemBytes);
  });
  if (attr_status != cudaSuccess) return attr_status;
  kda_fwd_kernel<Tr><<<dim3(static_cast<unsigned>(num_units)), Tr::kThreads, Tr::kSmemBytes, stream>>>(args);
  return cudaGetLastError();
}

template cudaError_t launch_kda_fwd<1>(const KdaFwdArgs&, int64_t, cudaStream_t);
template cudaError_t launch_kda_fwd<2>(const KdaFwdArgs&, int64_t, cudaStream_t);
template cudaError_t launch_kda_fwd<4>(const KdaFwdArgs&, int64_t, cudaStream_t);
template cudaError_t launch_kda_fwd<8>(const KdaFwdArgs&, int64_t, cudaStream_t);

}  // namespace flash_kda::cuda::sm90
