// Instantiations and launcher of the sm90 forward kernel.
#include "../dispatch_common.h"
#include "kda_fwd_kernel.cuh"

namespace flash_kda::cuda::sm90 {

namespace {

template <class Tr, bool kSoftplus>
cudaError_t launch_gate(const KdaFwdArgs& args, int64_t num_units, cudaStream_t stream) {
  const cudaError_t attr_status = raise_smem_limit<kda_fwd_kernel<Tr, kSoftplus>>(Tr::kSmemBytes);
  if (attr_status != cudaSuccess) return attr_status;
  kda_fwd_kernel<Tr, kSoftplus><<<dim3(static_cast<unsigned>(num_units)), Tr::kThreads, Tr::kSmemBytes, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace

template <int kConsumerWarps>
cudaError_t launch_kda_fwd(const KdaFwdArgs& args, int64_t num_units, cudaStream_t stream) {
  using Tr = KdaFwdTraits<kConsumerWarps>;
  return args.softplus_gate ? launch_gate<Tr, true>(args, num_units, stream)
                            : launch_gate<Tr, false>(args, num_units, stream);
}

template cudaError_t launch_kda_fwd<1>(const KdaFwdArgs&, int64_t, cudaStream_t);
template cudaError_t launch_kda_fwd<2>(const KdaFwdArgs&, int64_t, cudaStream_t);
template cudaError_t launch_kda_fwd<4>(const KdaFwdArgs&, int64_t, cudaStream_t);
template cudaError_t launch_kda_fwd<8>(const KdaFwdArgs&, int64_t, cudaStream_t);

}  // namespace flash_kda::cuda::sm90
