// The public entry point: fill default strides, validate once, dispatch to one backend.
#include "backends.h"
#include "flash_kda/flash_kda.h"

namespace flash_kda {

size_t workspace_size(const FwdParams& p) {
  return p.backend == Backend::kCuda ? cuda::workspace_size(p) : 0;
}

bool cuda_available() { return cuda::available(); }

Status fwd(const FwdParams& params, cudaStream_t stream) {
  FwdParams p = params;
  fill_contiguous_strides(p);
  Status s = validate(p);
  if (!s.ok()) return s;
  switch (p.backend) {
    case Backend::kCpuReference: return cpu::reference_fwd(p, state_map(p));
    case Backend::kCpu: return cpu::chunked_fwd(p, state_map(p));
    case Backend::kCuda: return cuda::fwd(p, stream);
  }
  return {StatusCode::kInvalidArgument, "backend: unknown value"};
}

}  // namespace flash_kda
