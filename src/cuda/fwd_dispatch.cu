// CUDA backend entry: checks the device, picks the kernel shape for the problem and launches it.
// No allocation, no synchronisation, no host read of device memory: safe inside graph capture.
#include "../api/backends.h"
#include "dispatch_common.h"
#include "sm90/kda_fwd_kernel.cuh"

namespace flash_kda::cuda {


bool available() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later calls are unaffected
    return false;
  }
  int sm_count = 0;
  return sm90_sm_count(device, &sm_count) == cudaSuccess && sm_count > 0;
}

size_t workspace_size(const FwdParams&) { return 0; }

Status fwd(const FwdParams& p, cudaStream_t stream) {
  int sm_count = 0;
  Status st = current_sm90_device(&sm_count);
  if (!st.ok()) return st;

  const int64_t N = num_sequences(p);
  const int64_t HV = p.heads_v > 0 ? p.heads_v : p.heads;
  if (N == 0) return Status::Ok();

  sm90::KdaFwdArgs a{};
  copy_activations(a, p);
  a.initial_state = p.initial_state;
  a.final_state = p.final_state;
  a.state_indices = p.state_indices;
  a.has_initial_state = p.has_initial_state;
  a.pool_size = p.pool_size;
  a.seqlen = p.seqlen;
  a.num_seqs = static_cast<int>(N);
  a.heads_v = static_cast<int>(HV);
  a.group = static_cast<int>(HV / p.heads);
  a.scale = p.scale;
  a.lower_bound_log2 = p.lower_bound * 1.4426950408889634f;
  // p is normalised: initial_state_dtype / final_state_dtype are resolved.
  if (p.initial_state && p.final_state && p.initial_state_dtype != p.final_state_dtype)
    return {StatusCode::kUnsupported,
            "final_state: a dtype different from initial_state's is not supported by the CUDA backend yet"};
  a.state_fp32 = (p.initial_state ? p.initial_state_dtype : p.final_state_dtype) == DType::kF32;
  a.cu_seqlens_i64 = p.cu_seqlens_dtype == DType::kI64;

  // Split the 128 state rows over 1, 2, 4 or 8 CTAs: the rows evolve independently given k,
  // alpha and beta, so a slice only repeats the producer's preparation (its q/k/g reads hit L2).
  // More slices while the (sequence, head) pairs alone leave SMs idle; one CTA per SM.
  const int64_t pairs = N * HV;
  int slices = 1;
  while (slices < 8 && pairs * slices * 2 <= sm_count) slices *= 2;
  a.slices = slices;
  const int64_t units = pairs * slices;
  if (units > INT32_MAX) return {StatusCode::kUnsupported, "q: too many (sequence, head) pairs for one launch"};

  cudaError_t e;
  switch (slices) {
    case 1: e = sm90::launch_kda_fwd<8>(a, units, stream); break;
    case 2: e = sm90::launch_kda_fwd<4>(a, units, stream); break;
    case 4: e = sm90::launch_kda_fwd<2>(a, units, stream); break;
    default: e = sm90::launch_kda_fwd<1>(a, units, stream); break;
  }
  if (e != cudaSuccess) return cuda_error("kernel launch", e);
  return Status::Ok();
}

}  // namespace flash_kda::cuda
