// The forward entry point: normalise once, check once (copying the host index arrays), dispatch to
// one backend.
#include "backends.h"
#include "flash_kda/flash_kda.h"

namespace flash_kda {

size_t workspace_size(const FwdParams& p) { return p.backend == Backend::kCuda ? cuda::workspace_size(p) : 0; }

bool cuda_available() { return cuda::available(); }

Status fwd(const FwdParams& params, cudaStream_t stream) {
  FwdParams p = params;
  normalise(p);
  HostRun run{p,  p.initial_state,    p.initial_state_dtype,   p.final_state, p.final_state_dtype,
              {}, p.checkpoint_state, p.checkpoint_state_dtype};
  Status s = check(p, &run.idx);
  if (!s.ok()) return s;
  // Every backend computes every gate form (docs/spec.md, "Gate forms").
  switch (p.backend) {
    case Backend::kCpuReference: return cpu::reference_fwd(run);
    case Backend::kCpu: return cpu::chunked_fwd(run);
    case Backend::kCuda: return cuda::fwd(p, stream);
  }
  return {StatusCode::kInvalidArgument, "backend: unknown value"};
}

}  // namespace flash_kda
