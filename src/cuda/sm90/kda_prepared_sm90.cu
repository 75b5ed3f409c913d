// Instantiations and launchers of the prepared plans' kernels (plan, preparation, recurrence, chain).
#include "../dispatch_common.h"
#include "kda_prepared.h"
#include "kda_rec.cuh"

namespace flash_kda::cuda::sm90 {

cudaError_t launch_kda_plan(const KdaFwdArgs& a, const PlanArgs& p, cudaStream_t stream) {
  kda_plan_kernel<<<1, 1024, 0, stream>>>(a, p);
  return cudaGetLastError();
}

namespace {

template <bool kSoftplus>
cudaError_t launch_prep_gate(const KdaFwdArgs& a, const PlanArgs& p, int64_t ctas, cudaStream_t stream) {
  const cudaError_t e = raise_smem_limit<kda_prep_kernel<kSoftplus>>(KdaPrepTraits::kSmemBytes);
  if (e != cudaSuccess) return e;
  kda_prep_kernel<kSoftplus>
      <<<dim3(static_cast<unsigned>(ctas)), KdaPrepTraits::kThreads, KdaPrepTraits::kSmemBytes, stream>>>(a, p);
  return cudaGetLastError();
}

template <class Tr, bool kCk>
cudaError_t launch_rec(const KdaFwdArgs& a, const PlanArgs& p, int pass, int64_t ctas, cudaStream_t stream) {
  const cudaError_t e = raise_smem_limit<kda_rec_kernel<Tr, kCk>>(Tr::kSmemBytes);
  if (e != cudaSuccess) return e;
  kda_rec_kernel<Tr, kCk><<<dim3(static_cast<unsigned>(ctas)), Tr::kThreads, Tr::kSmemBytes, stream>>>(a, p, pass);
  return cudaGetLastError();
}

}  // namespace

// The softplus gate has its own preparation kernel (docs/spec.md, "Gate forms"); the recurrence,
// chain and plan kernels serve every gate.
cudaError_t launch_kda_prep(const KdaFwdArgs& a, const PlanArgs& p, int64_t ctas, cudaStream_t stream) {
  return a.softplus_gate ? launch_prep_gate<true>(a, p, ctas, stream) : launch_prep_gate<false>(a, p, ctas, stream);
}

template <int kConsumerWarps>
cudaError_t launch_kda_rec(const KdaFwdArgs& a, const PlanArgs& p, int pass, int64_t ctas, cudaStream_t stream) {
  using Tr = KdaRecTraits<kConsumerWarps>;
  return a.checkpoint_interval > 0 ? launch_rec<Tr, true>(a, p, pass, ctas, stream)
                                   : launch_rec<Tr, false>(a, p, pass, ctas, stream);
}

template cudaError_t launch_kda_rec<1>(const KdaFwdArgs&, const PlanArgs&, int, int64_t, cudaStream_t);
template cudaError_t launch_kda_rec<2>(const KdaFwdArgs&, const PlanArgs&, int, int64_t, cudaStream_t);
template cudaError_t launch_kda_rec<4>(const KdaFwdArgs&, const PlanArgs&, int, int64_t, cudaStream_t);
template cudaError_t launch_kda_rec<8>(const KdaFwdArgs&, const PlanArgs&, int, int64_t, cudaStream_t);

cudaError_t launch_kda_chain(const KdaFwdArgs& a, const PlanArgs& p, int64_t ctas, cudaStream_t stream) {
  const cudaError_t e = raise_smem_limit<kda_chain_kernel>(ChainTraits::kSmemBytes);
  if (e != cudaSuccess) return e;
  kda_chain_kernel<<<dim3(static_cast<unsigned>(ctas)), ChainTraits::kThreads, ChainTraits::kSmemBytes, stream>>>(a, p);
  return cudaGetLastError();
}

}  // namespace flash_kda::cuda::sm90
