// The launchers of the prepared plans' kernels that depend on the head dimension (preparation,
// recurrence, chain), for the translation units that instantiate them: kda_prepared_sm90.cu for
// K = V = 128 (with the plan kernel, which serves every head dimension), kda_prepared64_sm90.cu for 64.
#pragma once

#include <utility>

#include "../dispatch_common.h"
#include "kda_chain.cuh"
#include "kda_prepared.h"
#include "kda_rec.cuh"

namespace flash_kda::cuda::sm90 {

namespace prepared_launch {

// Launches `kernel` allowed to start before the kernel ahead of it in the stream has finished
// (programmatic dependent launch; docs/kernel.md, "Pipeline"): its CTAs take SMs as the previous
// kernel's last CTAs free them, and each waits in ptx::wait_for_prior_grid() before it reads
// anything. Only the preparation, recurrence and chain kernels are launched so: each follows a
// kernel of the same call, so the call as a whole still starts after the caller's earlier work.
template <class... Params, class... Args>
cudaError_t launch_after_prior(void (*kernel)(Params...), int64_t ctas, int threads, int smem, cudaStream_t stream,
                               Args&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(ctas));
  cfg.blockDim = dim3(static_cast<unsigned>(threads));
  cfg.dynamicSmemBytes = static_cast<size_t>(smem);
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

template <int kD, bool kSoftplus, bool kPair, bool kTma>
cudaError_t launch_prep_with(const KdaFwdArgs& a, const PlanArgs& p, const RawMaps& maps, int64_t ctas,
                             cudaStream_t stream) {
  using Tr = KdaPrepTraits<kD>;
  // (the largest carveout: kCtasPerSm CTAs an SM need nearly all of it at kD = 128)
  const cudaError_t e = raise_smem_limit<kda_prep_kernel<kD, kSoftplus, kPair, kTma>>(Tr::kSmemBytes, true);
  if (e != cudaSuccess) return e;
  return launch_after_prior(kda_prep_kernel<kD, kSoftplus, kPair, kTma>, ctas, Tr::kThreads, Tr::kSmemBytes, stream,
                            a, p, maps);
}

// The raw tiles by tensor copies where the host can describe q, k and g to the TMA engine
// (kda_raw_maps.h), else by cp.async: the same bytes land either way. Not for the softplus gate,
// whose producer then spills (72 bytes a thread) and measured 2 % slower (docs/perf_log.md).
template <int kD, bool kSoftplus, bool kPair = false>
cudaError_t launch_prep_gate(const KdaFwdArgs& a, const PlanArgs& p, int64_t ctas, cudaStream_t stream) {
  RawMaps maps;
  if constexpr (!kSoftplus) {
    if (make_raw_maps<kD>(a, maps)) return launch_prep_with<kD, kSoftplus, kPair, true>(a, p, maps, ctas, stream);
  }
  return launch_prep_with<kD, kSoftplus, kPair, false>(a, p, maps, ctas, stream);
}

template <class Tr, bool kCk>
cudaError_t launch_rec(const KdaFwdArgs& a, const PlanArgs& p, int pass, int64_t ctas, cudaStream_t stream) {
  // (several CTAs an SM: the largest carveout, so that all of them fit)
  const cudaError_t e = raise_smem_limit<kda_rec_kernel<Tr, kCk>>(Tr::kSmemBytes, Tr::kCtasPerSm > 1);
  if (e != cudaSuccess) return e;
  return launch_after_prior(kda_rec_kernel<Tr, kCk>, ctas, Tr::kThreads, Tr::kSmemBytes, stream, a, p, pass);
}

}  // namespace prepared_launch

// The softplus gate has its own preparation kernel (docs/spec.md, "Gate forms"); the recurrence,
// chain and plan kernels serve every gate.
// 32-token steps (PlanArgs::pair; K = V = 128, the sigmoid gate, checkpoint boundaries at ends of
// pairs: the host's plan guarantees it) have their own preparation and recurrence instantiations
// (the recurrence's with and without checkpoints, as for 16-token steps).
template <int kD>
cudaError_t launch_kda_prep(const KdaFwdArgs& a, const PlanArgs& p, int64_t ctas, cudaStream_t stream) {
  if constexpr (kD == 128) {
    if (p.pair) return prepared_launch::launch_prep_gate<kD, false, true>(a, p, ctas, stream);
  }
  return a.softplus_gate ? prepared_launch::launch_prep_gate<kD, true>(a, p, ctas, stream)
                         : prepared_launch::launch_prep_gate<kD, false>(a, p, ctas, stream);
}

template <int kD, int kConsumerWarps>
cudaError_t launch_kda_rec(const KdaFwdArgs& a, const PlanArgs& p, int pass, int64_t ctas, cudaStream_t stream) {
  return with_rec_traits<kD, kConsumerWarps>(a, p, [&](auto tr, auto ck) {
    return prepared_launch::launch_rec<decltype(tr), decltype(ck)::value>(a, p, pass, ctas, stream);
  });
}

// The chain (one of the variants of fwd_plan::by_chain_variant), with the shared-memory carveout at
// its maximum so that two CTAs of the single-buffer variant fit an SM.
template <int kD, int kRows, int kBufs>
cudaError_t launch_kda_chain(const KdaFwdArgs& a, const PlanArgs& p, int64_t ctas, cudaStream_t stream) {
  using Tr = ChainTraits<kD, kRows, kBufs>;
  const cudaError_t e = raise_smem_limit<kda_chain_kernel<Tr>>(Tr::kSmemBytes, /*max_carveout=*/true);
  if (e != cudaSuccess) return e;
  return prepared_launch::launch_after_prior(kda_chain_kernel<Tr>, ctas, Tr::kThreads, Tr::kSmemBytes, stream, a, p);
}

}  // namespace flash_kda::cuda::sm90
