// The decode entry point: normalise once, check once (copying the host index arrays), dispatch to
// one backend (docs/serving.md).
#include "backends.h"
#include "flash_kda/flash_kda.h"

namespace flash_kda {

Status decode(const DecodeParams& params, cudaStream_t stream) {
  DecodeParams p = params;
  normalise(p);
  // The forward's state machinery with the pool as both states, its slots found through the
  // (host-copied) indices.
  HostRun run{p, p.state, p.state_dtype, p.state, p.state_dtype, {}, nullptr, DType::kNone};
  // Every gate form runs on every backend here (docs/spec.md, "Gate forms").
  const Status s = check(p, &run.idx);
  if (!s.ok()) return s;
  switch (p.backend) {
    case Backend::kCpuReference: return cpu::reference_fwd(run);
    case Backend::kCpu: return cpu::recurrent_fwd(run);
    case Backend::kCuda: return cuda::decode(p, stream);
  }
  return {StatusCode::kInvalidArgument, "backend: unknown value"};
}

}  // namespace flash_kda
