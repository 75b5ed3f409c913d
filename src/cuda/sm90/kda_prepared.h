// Host-side launchers of the prepared plans' kernels (kda_prepared_launch.cuh; instantiated in
// kda_prepared_sm90.cu for K = V = 128 and kda_prepared64_sm90.cu for 64).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kda_fwd_traits.cuh"

namespace flash_kda::cuda::sm90 {

struct PlanArgs;

cudaError_t launch_kda_plan(const KdaFwdArgs& a, const PlanArgs& p, cudaStream_t stream);
template <int kD>
cudaError_t launch_kda_prep(const KdaFwdArgs& a, const PlanArgs& p, int64_t ctas, cudaStream_t stream);
// pass 1: each sequence's first segment (or all of it) and the split segments' R and P rows;
// pass 3: the split segments from their true start states.
template <int kD, int kConsumerWarps>
cudaError_t launch_kda_rec(const KdaFwdArgs& a, const PlanArgs& p, int pass, int64_t ctas, cudaStream_t stream);
// The chain with kRows rows a CTA and kBufs buffers (ChainTraits, kda_plan.cuh).
template <int kD, int kRows, int kBufs>
cudaError_t launch_kda_chain(const KdaFwdArgs& a, const PlanArgs& p, int64_t ctas, cudaStream_t stream);

}  // namespace flash_kda::cuda::sm90
