// The forward entry point: normalise once, check once (copying the host index arrays), dispatch to
// one backend.
#include "backends.h"
#include "flash_kda/flash_kda.h"

namespace flash_kda {

size_t workspace_size(const FwdParams& p) { return p.backend == Backend::kCuda ? cuda::workspace_size(p) : 0; }

bool cuda_available() { return cuda::available(); }

Status cuda_gate_support(const ProblemParams& p) {
  if (p.backend != Backend::kCuda) return Status::Ok();
  // The CUDA forward computes the sigmoid gate (with A_log or at rate 1) and either beta; the softplus
  // gate runs on the CPU backends for now (docs/spec.md, "Gate forms"). The CUDA decode computes every
  // form and does not call this.
  if (p.gate != GateForm::kSigmoid)
    return {StatusCode::kUnsupported,
            "lower_bound: the softplus gate (GateForm::kSoftplus, lower_bound=None) is not supported by the CUDA "
            "forward yet (the CUDA decode supports it); use a CPU backend"};
  return Status::Ok();
}

Status fwd(const FwdParams& params, cudaStream_t stream) {
  FwdParams p = params;
  normalise(p);
  HostRun run{p,  p.initial_state,    p.initial_state_dtype,   p.final_state, p.final_state_dtype,
              {}, p.checkpoint_state, p.checkpoint_state_dtype};
  Status s = check(p, &run.idx);
  if (!s.ok()) return s;
  s = cuda_gate_support(p);
  if (!s.ok()) return s;
  switch (p.backend) {
    case Backend::kCpuReference: return cpu::reference_fwd(run);
    case Backend::kCpu: return cpu::chunked_fwd(run);
    case Backend::kCuda: return cuda::fwd(p, stream);
  }
  return {StatusCode::kInvalidArgument, "backend: unknown value"};
}

}  // namespace flash_kda
