// CUDA backend entry: checks the device, picks the plan for the problem (docs/kernel.md, "Plans")
// and launches it. No allocation, no synchronisation, no host read of device memory: safe inside
// graph capture.
#include <algorithm>

#include "../api/backends.h"
#include "dispatch_common.h"
#include "fwd_plan.cuh"
#include "sm90/kda_fwd_kernel.cuh"
#include "sm90/kda_prepared.h"

namespace flash_kda::cuda {

namespace {

using namespace fwd_plan;

template <int kD>
Status run_fused(sm90::KdaFwdArgs& a, int64_t pairs, int sm_count, cudaStream_t stream) {
  // Split the D state rows over 1, 2, 4 or 8 CTAs (D = 64: 1, 2 or 4): the rows evolve
  // independently given k, alpha and beta, so a slice only repeats the producer's preparation (its
  // q/k/g reads hit L2). More slices while the (sequence, head) pairs alone leave SMs idle; one CTA
  // per SM.
  const int slices = slices_for(pairs, sm_count, kD / 16);
  a.slices = slices;
  const int64_t units = pairs * slices;
  if (units > INT32_MAX) return {StatusCode::kUnsupported, "q: too many (sequence, head) pairs for one launch"};
  const cudaError_t e =
      by_slices<kD>(slices, [&](auto nc) { return sm90::launch_kda_fwd<kD, decltype(nc)::value>(a, units, stream); });
  if (e != cudaSuccess) return cuda_error("kernel launch", e);
  return Status::Ok();
}

// The CUDA runtime launcher of fwd_plan::run_prepared.
struct CudaLaunch {
  int sm_count;
  cudaStream_t stream;
  cudaError_t plan(const sm90::KdaFwdArgs& a, const sm90::PlanArgs& pa) { return sm90::launch_kda_plan(a, pa, stream); }
  template <int kD>
  Status fused(sm90::KdaFwdArgs& a, int64_t pairs) {
    return run_fused<kD>(a, pairs, sm_count, stream);
  }
  template <int kD>
  cudaError_t prep(const sm90::KdaFwdArgs& a, const sm90::PlanArgs& pa, int64_t ctas) {
    return sm90::launch_kda_prep<kD>(a, pa, ctas, stream);
  }
  template <int kD, int kConsumerWarps>
  cudaError_t rec(const sm90::KdaFwdArgs& a, const sm90::PlanArgs& pa, int pass, int64_t ctas) {
    return sm90::launch_kda_rec<kD, kConsumerWarps>(a, pa, pass, ctas, stream);
  }
  template <class Tr>
  cudaError_t chain(const sm90::KdaFwdArgs& a, const sm90::PlanArgs& pa, int64_t ctas) {
    return sm90::launch_kda_chain<Tr::kDim, Tr::kRows, Tr::kBufs>(a, pa, ctas, stream);
  }
  Status error(const char* what, cudaError_t e) { return cuda_error(what, e); }
};

int current_sm_count_or(int fallback) {
  int sm_count = 0;
  return current_sm90_device(&sm_count).ok() ? sm_count : fallback;
}

}  // namespace

bool available() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later calls are unaffected
    return false;
  }
  int sm_count = 0;
  return sm90_sm_count(device, &sm_count) == cudaSuccess && sm_count > 0;
}

// The plan depends on the SM count of the current device (an H100 or H200 has 132; without one the
// size for 132 SMs is returned) and on the head dimension (the prepared chunks and segment states
// of K = V = 64 are smaller).
size_t workspace_size(const FwdParams& p) {
  const HostPlan h = make_plan(p, current_sm_count_or(132));
  return h.kind == FwdPlan::kFused ? 0 : h.bytes;
}

Status fwd(const FwdParams& p, cudaStream_t stream) {
  int sm_count = 0;
  Status st = current_sm90_device(&sm_count);
  if (!st.ok()) return st;

  const int64_t N = num_sequences(p);
  const int64_t HV = p.heads_v > 0 ? p.heads_v : p.heads;
  if (N == 0) return Status::Ok();

  sm90::KdaFwdArgs a = kernel_args(p);

  const HostPlan h = make_plan(p, sm_count);
  st = check_walk_tokens(p, h);
  if (!st.ok()) return st;
  CudaLaunch launch{sm_count, stream};
  // validate() admits K = V = 128 and 64 for the CUDA forward.
  if (p.head_dim_k == 64) {
    if (h.kind == FwdPlan::kFused) return run_fused<64>(a, N * HV, sm_count, stream);
    return run_prepared<64>(h, a, p, sm_count, launch);
  }
  if (h.kind == FwdPlan::kFused) return run_fused<128>(a, N * HV, sm_count, stream);
  return run_prepared<128>(h, a, p, sm_count, launch);
}

}  // namespace flash_kda::cuda
