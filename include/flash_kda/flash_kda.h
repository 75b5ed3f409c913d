// flash-kda public C++ API.
//
// One parameter struct (FwdParams) carries every argument of the KDA forward described in
// docs/spec.md; one entry point (fwd) validates it and runs it on the chosen backend. The decode
// step of a serving engine (1 to 8 tokens per sequence on a state pool, speculative verification)
// has its own struct and entry point (DecodeParams, decode; docs/serving.md). Errors are reported
// through a Status value whose message names the offending argument; nothing is written to any
// output or state buffer by a call that returns an error, and nothing aborts the process.
//
// Shapes (B batch rows, T tokens per row, H query/key heads, HV value heads; K = V = 128 or
// K = V = 64 on CUDA, forward and decode; the CPU backends any K, V <= 256):
//   q, k        bf16 [B, T, H, K]     raw queries and keys (L2-normalised inside)
//   v           bf16 [B, T, HV, V]
//   g           bf16 [B, T, HV, K]    raw gate
//   beta        bf16 [B, T, HV]       beta logits
//   out         bf16 [B, T, HV, V]    written
//   A_log       fp32 [HV] (may be null with GateForm::kSigmoid: a rate of 1)
//   dt_bias     fp32 [HV * K]
//   initial_state / final_state: bf16 or fp32 [N, HV, V, K], contiguous, V-first layout
//   cu_seqlens  int64 or int32 [N + 1] (requires B == 1), else N = B
//   state pools (FwdParams::state_indices, DecodeParams): [P, HV, V, K], slot s = pool[s]
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#ifndef FLASH_KDA_NO_CUDA_TYPES
#include <cuda_runtime_api.h>
#else
typedef struct CUstream_st* cudaStream_t;
#endif

namespace flash_kda {

// kU8 and kBool are the one-byte flags of FwdParams::has_initial_state.
enum class DType : int { kNone = 0, kBF16, kF32, kI32, kI64, kU8, kBool };

// How the CUDA forward divides the work (docs/kernel.md, "Plans"). kAuto picks per call from the
// sizes the host knows (T, N, HV, the SM count); the others force one plan, for tests and tuning.
// The CPU backends compute the same function whatever the plan.
enum class FwdPlan : int {
  kAuto = 0,
  kFused,     // one kernel: every CTA prepares its chunks itself (best when (sequence, head) pairs fill the GPU)
  kPrepared,  // a chunk-parallel preparation pass into the workspace, then the recurrence walks each sequence
  kSplit,     // as kPrepared, and sequences longer than segment_chunks chunks run as parallel segments
};

// The form of the per-channel gate a_t (docs/spec.md, "Gate forms"); fla's vocabulary in brackets.
// kSigmoid is the default and the only form the CUDA backend runs today (the others: kUnsupported).
enum class GateForm : int {
  // a = lower_bound · sigmoid(exp(A_log) · (g + dt_bias)), -5 <= lower_bound < 0 [safe gate with a
  // lower_bound]; with A_log null the rate is 1: a = lower_bound · sigmoid(g + dt_bias).
  kSigmoid = 0,
  // a = −exp(A_log) · softplus(g + dt_bias), no floor [lower_bound=None: Kimi-Linear-48B's gate]; a
  // token may decay a channel to exactly 0. A_log is required; lower_bound is ignored.
  kSoftplus,
};

// Where the tensors live and which implementation computes the result.
enum class Backend : int {
  kCuda = 0,      // device pointers, the CUDA kernels (sm_90a); asynchronous on `stream`
  kCpu,           // host pointers, the chunked fp32 multi-threaded CPU implementation
  kCpuReference,  // host pointers, the per-token float64 recurrence (slow; the test oracle)
};

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument,  // a value, shape, stride or alignment is wrong (Python: ValueError)
  kTypeMismatch,     // a dtype is wrong (Python: TypeError)
  kUnsupported,      // valid per the spec but not supported by this build/backend/device
  kCudaError,        // a CUDA runtime call failed
};

struct Status {
  StatusCode code = StatusCode::kOk;
  std::string message;

  bool ok() const { return code == StatusCode::kOk; }
  // A named local, not `return {}`: that value-initialises (zero-fills) the whole object first,
  // which compilers emit as a `rep stos`, on every check that passes.
  static Status Ok() {
    Status s;
    return s;
  }
};

// Element strides (not bytes) of a [B, T, heads, D] activation tensor; the last dimension must be
// contiguous. A stride of 0 for `batch` is fine when B == 1.
struct ActStrides {
  int64_t batch = 0;
  int64_t token = 0;
  int64_t head = 0;
};

// The problem the forward and decode share: sizes, activations, gate parameters, the packed-batch
// layout and where it runs. FwdParams and DecodeParams extend it with their states. fwd / decode
// normalise it once (heads_v = 0 becomes H, all-zero strides become contiguous) before checking it.
struct ProblemParams {
  // ---- sizes ----
  int64_t batch = 0;         // B
  int64_t seqlen = 0;        // T (tokens per batch row; with cu_seqlens, the packed length)
  int64_t heads = 0;         // H (heads of q and k)
  int64_t heads_v = 0;       // HV (heads of v, g, beta, out, states); 0 means HV = H
  int64_t head_dim_k = 128;  // K
  int64_t head_dim_v = 128;  // V

  // ---- inputs (bf16 unless noted) ----
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* g = nullptr;
  const void* beta = nullptr;
  const float* A_log = nullptr;        // fp32 [HV]; null only with GateForm::kSigmoid (rate 1)
  const float* dt_bias = nullptr;      // fp32 [HV * K]
  float scale = 0.0f;                  // output scale, usually K^-0.5
  float lower_bound = -5.0f;           // gate floor, -5 <= lower_bound < 0 (GateForm::kSigmoid; else unused)
  GateForm gate = GateForm::kSigmoid;  // the gate's form (CUDA forward: kSigmoid only, for now)
  // beta = 2 · sigmoid(logit) instead of sigmoid(logit): the transition I − beta k kᵀ may have the
  // negative eigenvalue 1 − beta (fla's allow_neg_eigval). Every backend.
  bool allow_neg_eigval = false;

  // ---- output ----
  void* out = nullptr;

  // Element strides of q, k, v, g, out ([B, T, heads, D]) and beta ([B, T, HV], `head` is the
  // stride between heads). Leave all zero for contiguous tensors (filled in by fill_contiguous).
  ActStrides q_strides, k_strides, v_strides, g_strides, out_strides, beta_strides;

  // ---- variable-length batch ----
  const void* cu_seqlens = nullptr;       // nullptr: every batch row is one sequence
  DType cu_seqlens_dtype = DType::kNone;  // kI64 or kI32
  int64_t num_seqs = 0;                   // N: entries of cu_seqlens minus one
  // Optional host copy of a device cu_seqlens (same dtype and length; Backend::kCuda): its contents
  // are checked before the launch. The kernels still read cu_seqlens; the two must hold the same
  // values. Host backends read cu_seqlens itself and check this copy too when it is given.
  const void* cu_seqlens_cpu = nullptr;

  Backend backend = Backend::kCuda;

  // Threads for the CPU backends; 0 means all hardware threads.
  int cpu_threads = 0;
};

struct FwdParams : ProblemParams {
  // ---- recurrent state ----
  const void* initial_state = nullptr;  // nullptr: zeros
  void* final_state = nullptr;          // nullptr: not written; may equal initial_state
  // The dtype (kBF16 or kF32) of both states. initial_state_dtype / final_state_dtype, when not
  // kNone, give one of them its own dtype: fla passes a bf16 initial state with an fp32 final
  // state. A final_state that is initial_state has its dtype.
  DType state_dtype = DType::kNone;
  DType initial_state_dtype = DType::kNone;
  DType final_state_dtype = DType::kNone;

  // ---- state pool (optional; docs/serving.md) ----
  // With state_indices, initial_state and final_state are pools [pool_size, HV, V, K] (usually the
  // same tensor) and sequence n reads and writes slot state_indices[n]. A negative index marks a
  // padding sequence: it is skipped entirely (neither its out rows nor any state are written).
  // Active sequences must use distinct slots.
  const int32_t* state_indices = nullptr;  // int32 [N]
  int64_t pool_size = 0;                   // P: slots in the pool(s), with state_indices
  // Per sequence: nonzero = start from initial_state (its slot), zero = start from zeros. Needs
  // initial_state. nullptr: every sequence starts from initial_state.
  const uint8_t* has_initial_state = nullptr;  // bool / uint8 [N]

  // ---- prefix-cache checkpoints (optional; docs/spec.md, Extensions; docs/serving.md) ----
  // With checkpoint_interval I > 0 (a multiple of 16), sequence n, whose first token sits at the
  // absolute position s_n = checkpoint_start[n] (0 without checkpoint_start), writes its state after
  // the token at absolute position B - 1 for every B = (s_n / I + m + 1) * I <= s_n + L_n (m = 0,
  // 1, ...: the multiples of I it reaches) into slot checkpoint_indices[n * stride + m] of
  // checkpoint_state, for m < checkpoint_columns. A slot of -1 skips that one; slots no boundary
  // names are not touched. The host backends check every slot (in [-1, checkpoint_pool_size), the
  // written ones distinct). checkpoint_state may be the initial_state or final_state pool itself
  // (same pointer, dtype and number of slots); its written checkpoint slots must then be slots no
  // active sequence of the call reads or writes as its state. The CUDA backend reads the slots on
  // the device (not checked before the launch: one outside [-1, P2) is skipped).
  int64_t checkpoint_interval = 0;              // I; 0: no checkpoints
  const void* checkpoint_start = nullptr;       // int32 / int64 [N], each >= 0; nullptr: all 0
  DType checkpoint_start_dtype = DType::kNone;  // kI32 or kI64, with checkpoint_start
  void* checkpoint_state = nullptr;             // [checkpoint_pool_size, HV, V, K], contiguous
  DType checkpoint_state_dtype = DType::kNone;  // kBF16 or kF32
  int64_t checkpoint_pool_size = 0;             // P2
  const int32_t* checkpoint_indices = nullptr;  // int32 [N, checkpoint_columns]
  int64_t checkpoint_columns = 0;               // M: boundaries per sequence that can be written
  int64_t checkpoint_indices_stride = 0;        // elements between rows; 0 means checkpoint_columns

  // ---- scratch memory (caller-owned; see workspace_size) ----
  void* workspace = nullptr;
  size_t workspace_bytes = 0;

  // ---- CUDA plan (docs/kernel.md); leave kAuto outside tests and tuning ----
  FwdPlan plan = FwdPlan::kAuto;
  // kSplit: chunks of 16 tokens per segment (>= 1); 0 lets the planner choose. Ignored otherwise.
  // With walk_tokens = 32 it is rounded up to an even count.
  int64_t segment_chunks = 0;
  // Tokens the prepared plans' recurrence advances per step: 16, or 32 (pairs of prepared chunks;
  // K = V = 128 with the sigmoid gate and no checkpoints or an interval that is a multiple of 32,
  // else the CUDA forward returns kUnsupported); 0 lets the backend choose (32 where the split plan
  // cuts the sequences of a fixed batch, else 16). The fused plan and the CPU backends ignore it. docs/kernel.md, "32-token steps".
  int walk_tokens = 0;
};

// Number of sequences the call processes (num_seqs with cu_seqlens, else batch).
int64_t num_sequences(const ProblemParams& p);

// Fills any all-zero stride triple with the contiguous strides of its tensor.
void fill_contiguous_strides(ProblemParams& p);

// Checks every argument against the contract (docs/spec.md): sizes, scalars, pointers, strides,
// alignment, dtypes, aliasing between the buffers, and the contents of every index array the host
// can read (host backends: cu_seqlens, slots, flags; CUDA: cu_seqlens_cpu). Never reads device
// memory. fwd and decode call it; calling it first is never needed.
Status validate(const FwdParams& p);

// Bytes of scratch memory `fwd` needs for these parameters (0 when none is needed).
size_t workspace_size(const FwdParams& p);

// Validates, then runs the forward on params.backend. For kCuda the call is asynchronous on
// `stream`, performs no allocation and no host synchronisation (CUDA-graph capturable); for the
// CPU backends `stream` is ignored and the call returns when the result is written.
Status fwd(const FwdParams& params, cudaStream_t stream = nullptr);

// ---- decode: 1..8 tokens per sequence on a state pool (docs/serving.md) ----

// Most tokens a decode call takes per sequence (one new token plus up to 7 speculative drafts).
constexpr int64_t kMaxDecodeTokens = 8;

// The decode step of a serving engine. Inputs as in FwdParams with T <= kMaxDecodeTokens tokens per
// sequence; the state lives in a pool [pool_size, HV, V, K] that the call reads and updates in place
// through state_indices (int32 [N, slots_per_seq], rows state_indices_stride elements apart):
//
//   slots_per_seq == 1   sequence n reads slot state_indices[n] and writes its state after the
//                        last token back to the same slot.
//   slots_per_seq == S   speculative verification (S = 1 + number of draft tokens, T <= S): the
//                        state after token t is written to slot state_indices[n][t]; the state is
//                        read from state_indices[n][num_accepted_tokens[n] - 1] (column 0 when
//                        num_accepted_tokens is nullptr). vLLM's convention.
//
// A sequence whose read slot is negative, or whose num_accepted_tokens is < 1, is padding: nothing
// of it is read or written (out rows included). A negative write slot skips that one write. Slots
// used by distinct active sequences must differ (the CPU backends check it, the CUDA backend
// cannot; see docs/serving.md for what the CUDA backend does with values it cannot check).
struct DecodeParams : ProblemParams {
  // ProblemParams: batch is N sequences ([N, T, ...] inputs; 1 with cu_seqlens) and seqlen T
  // tokens per sequence, 0..kMaxDecodeTokens (with cu_seqlens the packed total; each sequence at
  // most kMaxDecodeTokens).

  // ---- state pool ----
  void* state = nullptr;                         // [pool_size, HV, V, K], contiguous; read and written in place
  DType state_dtype = DType::kNone;              // kBF16 or kF32
  int64_t pool_size = 0;                         // P
  const int32_t* state_indices = nullptr;        // int32 [N, slots_per_seq]
  int64_t slots_per_seq = 1;                     // S: 1, or 1 + draft tokens (speculative)
  int64_t state_indices_stride = 0;              // elements between rows; 0 means slots_per_seq
  const int32_t* num_accepted_tokens = nullptr;  // int32 [N], only with slots_per_seq > 1
};

// Checks every argument of a decode call (host-side only, as validate(FwdParams)).
Status validate(const DecodeParams& p);

// Validates, then advances every active sequence by its tokens: writes out and the pool slots. For
// kCuda asynchronous on `stream`, no allocation, no host synchronisation (CUDA-graph capturable);
// the CPU backends return when done (kCpu: the fp32 per-token recurrence; kCpuReference: float64).
Status decode(const DecodeParams& params, cudaStream_t stream = nullptr);

// ---- context parallelism: the pieces of a prefill split across devices (docs/distributed.md) ----
//
// Over the tokens of a shard the state is affine in the state the shard starts from:
// S_end = S_start · P + R, with R the final state of `fwd` from zeros and P the shard's K x K
// transition, the product of its factors Diag(alpha_t) (I - beta_t k_t k_tᵀ). An engine that
// splits a prompt over devices runs, per device, `fwd` from zeros (R) and `transition` (P) on its
// shard, exchanges (R, P) with its own communicator, composes the devices before it with
// `compose` into its true start state, and runs `fwd` from that state.

// The transition of every sequence over its tokens. Inputs as ProblemParams (q, k, g, beta, the
// gate, cu_seqlens, backend); v and out must be null (no values enter P) and head_dim_v is not
// used. `transition` [N, HV, K, K] fp32, contiguous: P of sequence n, head h (row-major; the
// identity for an empty sequence); it must not overlap any input.
struct TransitionParams : ProblemParams {
  float* transition = nullptr;
  // Scratch memory, kCuda only (transition_workspace_size bytes; 256-byte alignment not required).
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

// Bytes of scratch memory `transition` needs (0 on the CPU backends). On CUDA the transition runs as
// the forward with v = 0 from the identity, and the workspace holds that v, the unused output and
// the forward's own workspace: 4 * B * T * HV * K bytes plus workspace_size of that forward.
size_t transition_workspace_size(const TransitionParams& p);

// Validates (before anything is written), then writes `transition`. The cost of one forward pass
// over the tokens. kCuda: asynchronous on `stream`, no allocation (CUDA-graph capturable).
Status transition(const TransitionParams& params, cudaStream_t stream = nullptr);

// state_out[n, h] = state_in[n, h] · transition[n, h] + shard_state[n, h] for every sequence n and
// value head h: the state after a shard whose zero-start final state is shard_state and whose
// transition is `transition`, from state_in. All fp32, contiguous: state_in, shard_state,
// state_out [N, HV, V, K], transition [N, HV, K, K]. state_in null: zeros (state_out =
// shard_state). state_out may be state_in or shard_state itself; no other overlap is allowed.
struct ComposeParams {
  int64_t num_seqs = 0;      // N
  int64_t heads_v = 0;       // HV
  int64_t head_dim_k = 128;  // K
  int64_t head_dim_v = 128;  // V
  const float* state_in = nullptr;
  const float* transition = nullptr;
  const float* shard_state = nullptr;
  float* state_out = nullptr;
  Backend backend = Backend::kCuda;  // kCuda: device pointers; the CPU backends: host pointers
};

// Validates, then writes state_out (kCuda asynchronous on `stream`; fp32 FMA products. The CPU
// backends accumulate in float64).
Status compose(const ComposeParams& params, cudaStream_t stream = nullptr);

// Human-readable name of a dtype ("bf16", "fp32", ...).
const char* dtype_name(DType d);

// True when this build contains the CUDA kernels and a device of compute capability 9.0 is present.
bool cuda_available();

}  // namespace flash_kda
