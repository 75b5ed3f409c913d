// The launcher of the sm90 fused forward kernel, for the translation units that instantiate it (one
// per head dimension: kda_fwd_sm90.cu for K = V = 128, kda_fwd64_sm90.cu for 64).
#pragma once

#include "../dispatch_common.h"
#include "kda_fwd_kernel.cuh"

namespace flash_kda::cuda::sm90 {

namespace fwd_launch {

template <class Tr, bool kSoftplus>
cudaError_t launch_gate(const KdaFwdArgs& args, int64_t num_units, cudaStream_t stream) {
  const cudaError_t attr_status = raise_smem_limit<kda_fwd_kernel<Tr, kSoftplus>>(Tr::kSmemBytes);
  if (attr_status != cudaSuccess) return attr_status;
  kda_fwd_kernel<Tr, kSoftplus><<<dim3(static_cast<unsigned>(num_units)), Tr::kThreads, Tr::kSmemBytes, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace fwd_launch

template <int kD, int kConsumerWarps>
cudaError_t launch_kda_fwd(const KdaFwdArgs& args, int64_t num_units, cudaStream_t stream) {
  using Tr = KdaFwdTraits<kD, kConsumerWarps, kFusedCompactStages>;
  return args.softplus_gate ? fwd_launch::launch_gate<Tr, true>(args, num_units, stream)
                            : fwd_launch::launch_gate<Tr, false>(args, num_units, stream);
}

}  // namespace flash_kda::cuda::sm90
