// Instantiations and launchers of the prepared plans' kernels (plan, preparation, recurrence, chain).
#include "../dispatch_common.h"
#include "kda_prepared.h"
#include "kda_rec.cuh"

namespace flash_kda::cuda::sm90 {

namespace {

// Launches a kernel of the plan after the first with programmatic stream serialization: its CTAs
// may be scheduled while the previous kernel's last CTAs run, and each waits (griddep_wait) for
// that kernel to complete before it reads anything.
template <class... Args>
cudaError_t launch_dependent(void (*kernel)(Args...), int64_t ctas, int threads, size_t smem, cudaStream_t stream,
                             const Args&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(ctas));
  cfg.blockDim = dim3(static_cast<unsigned>(threads));
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, args...);
}

}  // namespace

cudaError_t launch_kda_plan(const KdaFwdArgs& a, const PlanArgs& p, cudaStream_t stream) {
  kda_plan_kernel<<<1, 1024, 0, stream>>>(a, p);
  return cudaGetLastError();
}

cudaError_t launch_kda_prep(const KdaFwdArgs& a, const PlanArgs& p, int64_t ctas, cudaStream_t stream) {
  const cudaError_t e = raise_smem_limit<kda_prep_kernel>(KdaPrepTraits::kSmemBytes);
  if (e != cudaSuccess) return e;
  return launch_dependent(kda_prep_kernel, ctas, KdaPrepTraits::kThreads, KdaPrepTraits::kSmemBytes, stream, a, p);
}

template <int kConsumerWarps>
cudaError_t launch_kda_rec(const KdaFwdArgs& a, const PlanArgs& p, int pass, int64_t ctas, cudaStream_t stream) {
  using Tr = KdaRecTraits<kConsumerWarps>;
  const cudaError_t e = raise_smem_limit<kda_rec_kernel<Tr>>(Tr::kSmemBytes);
  if (e != cudaSuccess) return e;
  return launch_dependent(kda_rec_kernel<Tr>, ctas, Tr::kThreads, Tr::kSmemBytes, stream, a, p, pass);
}

template cudaError_t launch_kda_rec<1>(const KdaFwdArgs&, const PlanArgs&, int, int64_t, cudaStream_t);
template cudaError_t launch_kda_rec<2>(const KdaFwdArgs&, const PlanArgs&, int, int64_t, cudaStream_t);
template cudaError_t launch_kda_rec<4>(const KdaFwdArgs&, const PlanArgs&, int, int64_t, cudaStream_t);
template cudaError_t launch_kda_rec<8>(const KdaFwdArgs&, const PlanArgs&, int, int64_t, cudaStream_t);

cudaError_t launch_kda_chain(const KdaFwdArgs& a, const PlanArgs& p, int64_t ctas, cudaStream_t stream) {
  const cudaError_t e = raise_smem_limit<kda_chain_kernel>(ChainTraits::kSmemBytes);
  if (e != cudaSuccess) return e;
  return launch_dependent(kda_chain_kernel, ctas, ChainTraits::kThreads, ChainTraits::kSmemBytes, stream, a, p);
}

}  // namespace flash_kda::cuda::sm90
