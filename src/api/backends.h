// Internal: the entry points of each backend. `fwd` (src/api/fwd.cpp) validates the parameters
// once and then calls exactly one of these; a backend may assume validated, stride-filled params.
#pragma once

#include "flash_kda/flash_kda.h"

namespace flash_kda {
namespace cpu {
Status reference_fwd(const FwdParams& p);  // float64 per-token recurrence (src/cpu/reference.cpp)
Status chunked_fwd(const FwdParams& p);    // fp32 chunked, multi-threaded (src/cpu/chunked.cpp)
}  // namespace cpu

namespace cuda {
// Workspace bytes the CUDA backend needs (0 today).
size_t workspace_size(const FwdParams& p);
Status fwd(const FwdParams& p, cudaStream_t stream);  // src/cuda/fwd_dispatch.cu
bool available();
}  // namespace cuda

// Reads the bounds of sequence n from host-resident cu_seqlens (or the fixed batch layout):
// tokens [begin, end) of batch row `row`.
struct SeqRange {
  int64_t row;
  int64_t begin;
  int64_t end;
};
SeqRange host_sequence_range(const FwdParams& p, int64_t n);

}  // namespace flash_kda
