// Internal: what `fwd` and `decode` (src/api/) hand to a backend once the arguments are checked.
// The CPU backends get a HostRun: the normalised problem, where each sequence's states live, and
// host copies of every index array, taken once per call and checked; they never read the caller's
// index arrays again (another thread may change those while the call runs). The CUDA backend gets
// the normalised, checked parameters.
#pragma once

#include <cstdint>
#include <vector>

#include "flash_kda/flash_kda.h"

namespace flash_kda {

// heads_v = 0 becomes H, all-zero strides become contiguous, the state dtypes of FwdParams are
// resolved (state_dtype fills initial_state_dtype / final_state_dtype where those are kNone).
void normalise(ProblemParams& p);
void normalise(FwdParams& p);

// The index arrays of one call, copied from host memory once. Rows of speculative slots are
// compacted to slots_per_seq entries.
struct HostIndices {
  std::vector<int64_t> cu;           // [N + 1] offsets; empty: fixed batch (sequence n is row n)
  std::vector<int32_t> slots;        // [N * slots_per_seq]; empty: sequence n uses slot n
  int64_t slots_per_seq = 1;         // > 1: the state after token t goes to slots[n * S + t]
  std::vector<int32_t> accepted;     // [N] read column + 1 (speculative); empty: column 0
  std::vector<uint8_t> has_initial;  // [N]; empty: every sequence reads its slot
  // Checkpoints (FwdParams::checkpoint_*): the interval (0: none), each sequence's absolute start
  // (empty: all 0) and its checkpoint slots, rows compacted to checkpoint_columns entries.
  int64_t checkpoint_interval = 0;
  std::vector<int64_t> checkpoint_start;  // [N]
  std::vector<int32_t> checkpoint_slots;  // [N * checkpoint_columns]
  int64_t checkpoint_columns = 0;
};

// The checkpoints sequence n of `length` tokens writes: the state after local token first - 1 +
// m * interval goes to column m of its row, for m < count (count 0: none).
struct SeqCheckpoints {
  int64_t first = 0;     // tokens before the first boundary, in [1, interval]
  int64_t interval = 0;  // I
  int64_t count = 0;     // boundaries reached and within the columns
  const int32_t* slots = nullptr;
};
SeqCheckpoints sequence_checkpoints(const HostIndices& idx, int64_t n, int64_t length);

// Everything a CPU backend reads: the problem and, per sequence, its states located through the
// host indices. Decode runs with the pool as both states.
struct HostRun {
  const ProblemParams& p;
  const void* initial_state;
  DType initial_dtype;
  void* final_state;
  DType final_dtype;
  HostIndices idx;
  void* checkpoint_state = nullptr;  // the checkpoint pool (FwdParams::checkpoint_state), or null
  DType checkpoint_dtype = DType::kNone;
};

// Tokens [begin, end) of batch row `row`: sequence n of the call.
struct SeqRange {
  int64_t row;
  int64_t begin;
  int64_t end;
};
SeqRange sequence_range(const ProblemParams& p, const HostIndices& idx, int64_t n);

// The slots of sequence n.
struct SeqSlots {
  bool active = true;                  // false: padding; nothing of the sequence is read or written
  int64_t read = -1;                   // slot of the initial state; -1: start from zeros
  int64_t write = -1;                  // slot of the state after the last token; -1: none
  const int32_t* per_token = nullptr;  // S > 1: the slots of the states after tokens 0..S-1
};
SeqSlots sequence_slots(const HostIndices& idx, int64_t n);

// The checks of validate(), on normalised parameters. `idx` receives the host copies of the index
// arrays the backend will read (nullptr: copy, check and discard them). With data_free the
// pointers are not real (torch's fake tensors): nothing that needs an address or memory contents
// is checked.
Status check(const FwdParams& p, HostIndices* idx, bool data_free = false);
Status check(const DecodeParams& p, HostIndices* idx, bool data_free = false);

namespace cpu {
// float64 per-token recurrence (src/cpu/reference.cpp): the oracle of fwd and decode.
Status reference_fwd(const HostRun& run);
// fp32 chunked, multi-threaded (src/cpu/chunked.cpp): the forward's fast path.
Status chunked_fwd(const HostRun& run);
// fp32 per-token recurrence (src/cpu/recurrent.cpp): decode's fast path (T <= 8: nothing to chunk).
Status recurrent_fwd(const HostRun& run);
}  // namespace cpu

namespace cuda {
// Workspace bytes the CUDA backend needs (0 today).
size_t workspace_size(const FwdParams& p);
Status fwd(const FwdParams& p, cudaStream_t stream);        // src/cuda/fwd_dispatch.cu
Status decode(const DecodeParams& p, cudaStream_t stream);  // src/cuda/decode_dispatch.cu
bool available();
// Context parallelism (src/cuda/context_parallel.cu): `bytes` zeros at `dst`, `count` K x K
// identity matrices into `dst`, and compose (flash_kda.h) on checked parameters.
Status zero_bytes(void* dst, size_t bytes, cudaStream_t stream);
Status fill_identity(float* dst, int64_t count, int64_t K, cudaStream_t stream);
Status compose(const ComposeParams& p, cudaStream_t stream);
}  // namespace cuda

}  // namespace flash_kda
