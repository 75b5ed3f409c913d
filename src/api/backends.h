// Internal: the entry points of each backend. `fwd` and `decode` (src/api/) validate the parameters
// once and then call exactly one of these; a backend may assume validated, stride-filled params.
#pragma once

#include "flash_kda/flash_kda.h"

namespace flash_kda {

// Where each sequence's state is read from and written to. The forward without a pool maps sequence
// n to slot n of initial_state / final_state; a pool prefill maps it through state_indices; a decode
// call through its [N, S] indices. Built by state_map() below; every backend reads it the same way.
struct StateMap {
  const int32_t* indices = nullptr;       // nullptr: sequence n uses slot n
  int64_t stride = 1;                     // elements between the index rows of consecutive sequences
  int64_t slots_per_seq = 1;              // S > 1: the state after token t goes to indices[n][t]
  const int32_t* num_accepted = nullptr;  // S > 1: read column num_accepted[n] - 1 (else 0)
  const uint8_t* has_initial = nullptr;   // zero entry: the sequence starts from zeros
};

StateMap state_map(const FwdParams& p);
StateMap state_map(const DecodeParams& p);

// The forward's view of a decode call: the same inputs, with the pool as both initial_state and
// final_state (its slots located by state_map(p)).
FwdParams forward_view(const DecodeParams& p);

// The slots of sequence n, read from host-resident indices.
struct SeqSlots {
  bool active = true;                  // false: padding; nothing of the sequence is read or written
  int64_t read = -1;                   // slot of the initial state; -1: start from zeros
  int64_t write = -1;                  // slot of the state after the last token; -1: none
  const int32_t* per_token = nullptr;  // S > 1: indices[n][0..S), the slot of the state after token t
};
SeqSlots host_seq_slots(const StateMap& m, int64_t n);

namespace cpu {
// float64 per-token recurrence (src/cpu/reference.cpp): the oracle of fwd and decode.
Status reference_fwd(const FwdParams& p, const StateMap& m);
// fp32 chunked, multi-threaded (src/cpu/chunked.cpp): the forward's fast path.
Status chunked_fwd(const FwdParams& p, const StateMap& m);
// fp32 per-token recurrence (src/cpu/recurrent.cpp): decode's fast path (T <= 8: nothing to chunk).
Status recurrent_fwd(const FwdParams& p, const StateMap& m);
}  // namespace cpu

namespace cuda {
// Workspace bytes the CUDA backend needs (0 today).
size_t workspace_size(const FwdParams& p);
Status fwd(const FwdParams& p, cudaStream_t stream);        // src/cuda/fwd_dispatch.cu
Status decode(const DecodeParams& p, cudaStream_t stream);  // src/cuda/decode_dispatch.cu
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
