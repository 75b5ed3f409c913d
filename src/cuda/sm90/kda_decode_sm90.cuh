// The sm_90a decode kernel: 1..8 tokens per sequence on a state pool (docs/serving.md), for head
// dimensions K = V = D = 128 and 64.
//
// Decode is memory-bound: per (sequence, value head) and step the D×D state is read once and written
// once (D = 128, fp32: 64 KB each way; bf16: 32 KB) while the inputs are ~1 KB. The kernel therefore
// streams the state through once: bulk copies (TMA) of the CTA's rows — contiguous in the pool —
// into shared memory, issued by one thread before anything else so that it is in flight while the
// CTA prepares the token vectors; then registers; then 16-byte streaming stores straight from the
// registers. Loading through the bulk copy rather than into registers keeps no register busy while
// the load is in flight: with register loads overlapping the preparation, 4 rows a thread needed 160
// registers (3 CTAs an SM) or spilled.
//
// Work unit (one CTA of D threads): (sequence, value head, slice of kRows = 16·kRowsPerThread·kRowPasses
// state rows). The CTA holds 16·kRowsPerThread rows in registers at a time, kRowPasses times in turn
// (docs/serving.md, "The decode kernel (sm_90a)": two passes for bf16 pools with one token a step, so
// that a CTA's copy is as many bytes as an fp32 one's and an SM keeps as many bytes in flight); each
// pass's rows arrive by a bulk copy of their own, so the first pass starts while the second's bytes are
// still in flight. Within a warp, D/16 lanes share a
// row — lane lr holds the 16 columns {j·(D/16)·kVec + lr·kVec + e} of it, so the lanes' 16-byte accesses
// of chunk j cover D contiguous bytes (D = 128: whole 128-byte lines; D = 64: half lines, whole 32-byte
// sectors) — and the warp's row groups take kRowsPerThread rows each. Every thread thus holds
// 16·kRowsPerThread state values and does the same work for either D; D = 64 halves the CTA (2 warps) and
// the lanes of a row (one butterfly round fewer). Per token, with q_tilde = scale · q_hat and
// S_a = S · Diag(alpha):
//
//   one pass over the registers:   S_a = S ⊙ alpha,   pk = S_a k_hat,   pq = S_a q_tilde
//   butterfly sums of pk, pq over a row's lanes; delta = beta (v − pk); out = pq + delta (k_hat · q_tilde)
//   second pass:                   S = S_a + delta k_hatᵀ
//
// which is the recurrence of docs/spec.md in exact arithmetic, with one reduction round a token
// (steps of several tokens fold the decays into the token vectors instead: "several tokens a step"
// in the kernel, docs/serving.md). On bf16 pools at D = 128 with enough pairs, steps of several
// tokens are instead one "matrix step": tensor-core products over the whole step, a kernel of its own
// (below: KdaDecodeTraits::kMatrix_, decode_shape). The per-token vectors (k_hat, q_tilde, alpha, v, beta,
// k_hat · q_tilde) are prepared once per CTA in shared memory, D/4 lanes per token (4 channels a
// lane: a warp per token at D = 128, a half-warp at D = 64), while the state loads are in flight.
// Every gate form of docs/spec.md ("Gate forms") is computed there, per token: alpha = exp(a) of
// the sigmoid gate (with A_log, or at rate 1 without) or of the softplus gate (no floor; factors
// below 1e-30 flushed to 0), and beta = sigmoid(logit) or, with allow_neg_eigval, 2 sigmoid(logit).
// The token loop is the same for all of them.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "../common/bulk_copy.cuh"
#include "../common/ptx.cuh"
#include "../dispatch_common.h"
#include "flash_kda/flash_kda.h"

namespace flash_kda::cuda::sm90 {

// Everything the kernel reads, filled by src/cuda/decode_dispatch.cu from DecodeParams.
struct KdaDecodeArgs {
  const uint16_t *q, *k, *v, *g, *beta;                         // bf16
  uint16_t* out;                                                // bf16
  const float* A_log;                                           // [HV]; nullptr: rate 1 (sigmoid gate only)
  const float* dt_bias;                                         // [HV * D]
  void* state;                                                  // pool [pool_size, HV, D, D], bf16 or fp32
  const int32_t* state_indices;                                 // [N, indices_stride]
  const int32_t* num_accepted;                                  // [N] or nullptr
  const void* cu_seqlens;                                       // [N + 1] or nullptr
  int64_t q_s[3], k_s[3], v_s[3], g_s[3], out_s[3], beta_s[3];  // (batch, token, head) strides
  int64_t seqlen;                                               // T (fixed batch) or the packed length (cu_seqlens)
  int64_t pool_size;                                            // P
  int64_t indices_stride;                                       // elements between index rows
  int slots_per_seq;                                            // S: 1, or 1 + drafts (speculative)
  int heads_v;                                                  // HV
  int group;                                                    // HV / H
  float scale;
  float lower_bound;   // the sigmoid gate's floor (unused by the softplus gate)
  float beta_scale;    // 1, or 2 with allow_neg_eigval (beta = 2 sigmoid(logit))
  bool softplus_gate;  // GateForm::kSoftplus: a = -exp(A_log) softplus(g + dt_bias), no floor
  bool cu_seqlens_i64;
  bool fold_steps;  // steps of several tokens fold the decays into the token vectors (kDecodeFoldSteps)
};

// Whether decode steps of several tokens fold the decays into the token vectors (the kernel's
// "several tokens a step"; docs/serving.md). On since it was timed (H100, against the unfolded walk:
// b256_t4_bf16 -7 %, b64_t4_bf16 -5 %, b8_t4_bf16 -3.5 %, b256_t4_bf16_d64 -3 %, the fp32 rows within
// +-0.7 % but b1_t4_fp32 +3 %; docs/perf_log.md, session 30);
// the emulated tests run every multi-token case both ways.
inline constexpr bool kDecodeFoldSteps = true;

// Whether decode steps run as tensor-core products over the whole step (the kernel's "matrix step";
// docs/serving.md): a kernel of its own (KdaDecodeTraits::kMatrix_, decode_shape), for steps that are
// not speculative and not a fixed batch of one token, on bf16 pools at D = 128 where the grid holds
// at least 4 (sequence, head) pairs an SM — each CTA then owns a whole head in two passes of 64 rows
// (32 KB in flight a CTA, as bf16 steps of one token). Measured on the H100 against the folded token
// walk (docs/perf_log.md, session 30): b256_t4_bf16 -10 %, b64_t4_bf16 -9 %; the matrix step on one
// pass, on fp32 pools, at D = 64 or for one token a step measured at best even, so those keep the
// token walk. The emulated tests run every multi-token case in each form, and the matrix step with
// one token a step and on every shape it can run on.
inline constexpr bool kDecodeMatrixSteps = true;

// Compile-time shape of the kernel: StateT is float or __nv_bfloat16, kHeadDim (K = V) 128 or 64,
// kRowsPerThread 1, 2 or 4, kRowPasses 1 or 2 (2: D = 128 with 4 rows a thread only, the whole head a CTA).
template <typename StateT, int kHeadDim, int kRowsPerThread, int kRowPasses = 1, bool kMatrix = false>
struct KdaDecodeTraits {
  using State = StateT;
  static constexpr int kDim = kHeadDim;              // K = V
  static constexpr int kMaxTokens = 8;               // kMaxDecodeTokens
  static constexpr int kCols = 16;                   // columns a lane holds per row (for either D)
  static constexpr int kLanesPerRow = kDim / kCols;  // lanes sharing one row of S: 8 (D = 128), 4 (D = 64)
  static constexpr int kThreads = kDim;              // the CTA: 4 warps (D = 128), 2 (D = 64)
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kRowGroups = 32 / kLanesPerRow;
  static constexpr int kRowsPerThread_ = kRowsPerThread;
  static constexpr int kRowPasses_ = kRowPasses;
  // every step a matrix step (the host launches this kernel only for steps that are not speculative)
  static constexpr bool kMatrix_ = kMatrix;
  // rows in registers at a time (16·kRowsPerThread), and of the CTA
  static constexpr int kPassRows = kWarps * kRowGroups * kRowsPerThread;
  static constexpr int kRows = kPassRows * kRowPasses;
  static constexpr int kSlices = kDim / kRows;                               // CTAs per (sequence, head)
  static constexpr int kVec = 16 / int(sizeof(StateT));                      // state elements per 16 bytes
  static constexpr int kChunks = kCols / kVec;                               // 16-byte accesses per row a lane
  static constexpr int kPassBytes = kPassRows * kDim * int(sizeof(StateT));  // one bulk copy: a pass's rows
  // Lanes preparing one token's vectors (4 channels each): a warp (D = 128) or a half-warp (D = 64).
  static constexpr int kTokenLanes = kDim / 4;
  static constexpr int kTokensPerWarp = 32 / kTokenLanes;
  // CTAs per SM the register allocation must allow: 4 rows a thread fit 128 registers (D = 128: 4
  // CTAs, 16 warps, 128 KB of fp32 state in flight per SM; shared memory allows 4 as well). D = 64
  // keeps the registers per thread, the 16 warps and the 128 KB per SM with twice the CTAs (8 of
  // ~26 KB of shared memory fit as well).
  // (Two passes: ~50 KB of shared memory a CTA, 4 CTAs an SM as well.)
  static constexpr int kMinBlocks = (kRowsPerThread >= 4 ? 4 : kRowsPerThread == 2 ? 5 : 6) * 128 / kThreads;
  static_assert(kDim == 128 || kDim == 64, "the decode kernel is built for K = V = 128 and 64");
  static_assert(kRowPasses == 1 || kRowPasses == 2, "one or two passes over a CTA's rows");
  static_assert(!kMatrix || kRowsPerThread == 4, "the matrix step: 4 rows a thread");
  static_assert(kDim % kRows == 0, "the rows of S must split evenly over the CTAs of a head");
  static_assert(kRows % 8 == 0, "out is written in 16-byte pieces of 8 rows");
  static_assert(kMaxTokens * kRows / 8 <= kThreads, "one thread per 16-byte piece of out");
  static_assert(kMaxTokens <= kThreads, "one thread per token's write slot");

  // Column of element e of chunk j in lane lr's part of a row.
  static __device__ __forceinline__ int column(int lr, int j, int e) { return j * kLanesPerRow * kVec + lr * kVec + e; }
};

namespace decode_detail {

__device__ __forceinline__ float bf16_bits_to_float(uint32_t bits16) { return __uint_as_float(bits16 << 16); }

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return reinterpret_cast<const uint32_t&>(h);
}

__device__ __forceinline__ float sigmoid(float x) { return __fdividef(1.0f, 1.0f + __expf(-x)); }

// The softplus gate's factor exp(-rate · softplus(x)) in [0, 1] (docs/spec.md, "Gate forms"), with
// the accurate expf / log1pf: softplus(x) is x for x > 20 (as fla; the difference is below 2.1e-9)
// and log1p(e^x) otherwise, which is 0 (no decay) once e^x underflows. rate · softplus(x) may
// overflow to +Inf (an infinite decay): expf(-Inf) = 0. A factor below 1e-30 is flushed to 0, as the
// fp32 CPU recurrence does (it changes the state by less than 1e-30 of itself). NaN stays NaN.
__device__ __forceinline__ float softplus_decay(float rate, float x) {
  const float sp = x > 20.0f ? x : log1pf(expf(x));
  const float f = expf(-rate * sp);
  return f < 1e-30f ? 0.0f : f;
}

// The sum over each aligned group of kLanes lanes (32: the whole warp), on every lane of the group.
template <int kLanes>
__device__ __forceinline__ float lane_group_sum(float x) {
#pragma unroll
  for (int o = kLanes / 2; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// Reads one 16-byte piece of the state (in shared memory) as kVec floats.
__device__ __forceinline__ void load_state_vec(const float* p, float* x) {
  const float4 f = *reinterpret_cast<const float4*>(p);
  x[0] = f.x, x[1] = f.y, x[2] = f.z, x[3] = f.w;
}
__device__ __forceinline__ void load_state_vec(const __nv_bfloat16* p, float* x) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    x[2 * i] = bf16_bits_to_float(w[i] & 0xffffu);
    x[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

// Writes kVec floats as one 16-byte piece of the pool. Streaming hint (.cs): the pool is touched once
// a step, so its lines should not evict the inputs from L2.
__device__ __forceinline__ void store_state_vec(float* p, const float* x) {
  __stcs(reinterpret_cast<float4*>(p), make_float4(x[0], x[1], x[2], x[3]));
}
__device__ __forceinline__ void store_state_vec(__nv_bfloat16* p, const float* x) {
  __stcs(reinterpret_cast<uint4*>(p), make_uint4(pack_bf16x2(x[0], x[1]), pack_bf16x2(x[2], x[3]),
                                                 pack_bf16x2(x[4], x[5]), pack_bf16x2(x[6], x[7])));
}

// Four consecutive bf16 values (8-byte aligned) as floats.
__device__ __forceinline__ void load_bf16x4(const uint16_t* p, float* x) {
  const uint2 u = *reinterpret_cast<const uint2*>(p);
  x[0] = bf16_bits_to_float(u.x & 0xffffu);
  x[1] = __uint_as_float(u.x & 0xffff0000u);
  x[2] = bf16_bits_to_float(u.y & 0xffffu);
  x[3] = __uint_as_float(u.y & 0xffff0000u);
}

}  // namespace decode_detail

// One work unit (sequence n, value head hv, slice of Tr::kRows rows) as the kernel reads it. Every
// value is the same for the whole CTA. Contents the host could not check are clamped or treated as
// padding, never used to address outside the tensors; `live` is false where nothing is read or
// written (no token, a padding sequence, an invalid num_accepted or a read slot outside the pool).
struct KdaDecodeUnit {
  int n, slice, hv, h;
  int64_t batch_row, begin;
  int length;
  const int32_t* indices;
  uint32_t read_slot;  // (live only: in [0, pool_size))
  bool live;
};

// The unit's tokens (slice, heads, batch row, token range, the sequence's row of state_indices), not
// whether it is live: what the token vectors need.
template <typename Tr>
__device__ __forceinline__ KdaDecodeUnit decode_unit_tokens(const KdaDecodeArgs& a, int64_t u) {
  KdaDecodeUnit x{};
  x.slice = int(u % Tr::kSlices);
  const int pair = int(u / Tr::kSlices);
  x.hv = pair % a.heads_v;
  const int n = pair / a.heads_v;
  x.n = n;
  x.h = x.hv / a.group;
  x.batch_row = n;
  x.begin = 0;
  x.length = int(a.seqlen);
  if (a.cu_seqlens) {
    int64_t b, e;
    if (a.cu_seqlens_i64) {
      b = static_cast<const int64_t*>(a.cu_seqlens)[n];
      e = static_cast<const int64_t*>(a.cu_seqlens)[n + 1];
    } else {
      b = static_cast<const int32_t*>(a.cu_seqlens)[n];
      e = static_cast<const int32_t*>(a.cu_seqlens)[n + 1];
    }
    b = min(max(b, int64_t(0)), a.seqlen);
    e = min(max(e, b), a.seqlen);
    x.batch_row = 0;
    x.begin = b;
    x.length = int(min(e - b, int64_t(Tr::kMaxTokens)));
  }
  x.indices = a.state_indices + int64_t(n) * a.indices_stride;
  return x;  // (not live: decode_unit decides)
}

// The unit whose tokens are `x` (decode_unit_tokens), with its liveness and read slot.
__device__ __forceinline__ KdaDecodeUnit decode_unit(const KdaDecodeArgs& a, KdaDecodeUnit x) {
  if (x.length == 0) return x;  // no token: the state stays as it is
  const int n = x.n;
  int read_column = 0;
  if (a.num_accepted) {
    const int accepted = a.num_accepted[n];
    if (accepted < 1 || accepted > a.slots_per_seq) return x;  // padding (or invalid): nothing written
    read_column = accepted - 1;
  }
  const int32_t read_index = x.indices[read_column];
  if (read_index < 0 || read_index >= a.pool_size) return x;  // padding sequence
  // Non-negative from here on: zero-extended, its 64-bit products need no register for a sign word.
  x.read_slot = uint32_t(read_index);
  x.live = true;
  return x;
}

// The per-token vectors by column, as the token loop reads them.
template <typename Tr>
struct KdaDecodeTokenVectors {
  alignas(16) float k_hat[Tr::kMaxTokens][Tr::kDim];
  alignas(16) float q_tilde[Tr::kMaxTokens][Tr::kDim];  // times scale
  alignas(16) float alpha[Tr::kMaxTokens][Tr::kDim];
};

// The matrix step's operands (decode_detail::matrix_operands), in the fragment order of the MMAs that
// read them, one float2 a lane (b0, b1), for the state's kDim / 8 column tiles.
template <typename Tr>
struct KdaDecodeMatrixOperands {
  float2 x[2][Tr::kDim / 8][32];  // the products' B: the columns (c_t ⊙ k_hat_t, c_t ⊙ q_tilde_t)
  float2 k[Tr::kDim / 8][32];     // the update's B: the rows k_hat_s ⊙ (alpha_{s+1} ⊙ ... ⊙ alpha_last)
};

template <typename Tr>
struct KdaDecodeSmem {
  alignas(128) typename Tr::State state[Tr::kRows][Tr::kDim];  // the CTA's rows, as in the pool
  union {  // the token vectors, which the matrix step's operands replace once read (the walks use one)
    KdaDecodeTokenVectors<Tr> vec;
    KdaDecodeMatrixOperands<Tr> mat;
  };
  // the matrix step's token-pair sums and each warp's share of them (one word in the other kernels,
  // whose shared memory stays as it was: up to 48 KB with one pass, no function attribute)
  static constexpr int kPairSums = Tr::kMatrix_ ? Tr::kMaxTokens * Tr::kMaxTokens : 1;
  float ab[kPairSums];
  float ab_part[Tr::kWarps][kPairSums];
  float v[Tr::kMaxTokens][Tr::kRows];  // this CTA's rows
  alignas(16) __nv_bfloat16 out[Tr::kMaxTokens][Tr::kRows];
  float beta[Tr::kMaxTokens];
  float kq[Tr::kMaxTokens];                // k_hat · q_tilde
  int64_t write_slot[Tr::kMaxTokens];      // speculative: slot of the state after token t, or -1
  uint64_t state_loaded[Tr::kRowPasses_];  // mbarriers of the bulk copies, one a pass
  int64_t read_slot;  // the slot thread 0 copied the rows from, or -1: the unit is not live (decode_unit)
  int64_t out_begin;  // thread 0's token range, which the rows of out written at the end follow
  int out_length;
  int fold_unsafe;                    // some column's decay product is out of the folded walk's range
  alignas(16) float decay[Tr::kDim];  // the folded walk: c_T, each column's decay over the step's tokens
};

// ---- the matrix step: a step of several tokens as tensor-core products ----
//
// With tokens 0 .. T-1 of the step, c_t = alpha_0 ⊙ ... ⊙ alpha_t and r_ts = alpha_{s+1} ⊙ ... ⊙ alpha_t
// (per column; r_tt = 1: products of factors in [0, 1], no division), the recurrence unrolls, per row
// of the state S0 the step starts from, to
//
//   pk_t  = S0 (c_t ⊙ k_t) + Σ_{s<t} δ_s A_ts,    A_ts = Σ_c k_s k_t r_ts
//   δ_t   = β_t (v_t − pk_t)
//   out_t = S0 (c_t ⊙ q_t) + Σ_{s≤t} δ_s B_ts,    B_ts = Σ_c k_s q_t r_ts      (k = k_hat, q = q_tilde)
//   S     = S0 ⊙ c_{T-1} + Σ_s δ_s (k_s ⊙ r_{T-1,s})ᵀ
//
// so each state element is touched twice a step whatever T: as the A operand of the products
// S0 [c_t ⊙ k_t | c_t ⊙ q_t] (m16n8k8 MMAs over 2T columns), and as the accumulator of the rank-T
// update (after one multiplication by c_{T-1}); against four operations an element and token for the
// token walk. The T × T sums A and B are the CTA's (one thread a column, then a reduction); δ is a
// forward substitution per row (T² / 2 operations). The MMAs read tf32 operands (the top 19 bits of
// an fp32 value), so each operand is split into its tf32 part and the rest: a bf16 state is exact in
// tf32 (2 MMAs: S0 b + S0 rest(b)); an fp32 state takes 3 (+ rest(S0) b), as the update (δ and k'
// both split): the products are then as accurate as fp32 sums.
//
// Fragments (g = lane / 4, tq = lane % 4; ptx.cuh): a warp holds 16 rows a tile (kMTiles tiles) of
// all kDim columns as accumulators: tile j's registers are (row g, column(j, tq, 0)), (g, column(j, tq,
// 1)), (g + 8, ...0), (g + 8, ...1). Read as the A operand of the products, the k index tq stands for
// column(j, tq, 0) and tq + 4 for column(j, tq, 1), where
//   column(j, tq, e) = (j / kTileVec) kGroup + tq kVec + 2 (j % kTileVec) + e
// gives each lane kVec contiguous columns (16 bytes of the pool) for every kTileVec = kVec / 2 tiles,
// so the state moves by 16-byte accesses (the walk's loads and stores, the operands' inverse map).
template <class Tr>
struct DecodeMatrixShape {
  static constexpr int kTiles = Tr::kDim / 8;                   // 8-column tiles of a row
  static constexpr int kTileVec = Tr::kVec / 2;                 // tiles a 16-byte piece covers
  static constexpr int kGroup = 8 * kTileVec;                   // columns of kTileVec tiles
  static constexpr int kWarpRows = Tr::kPassRows / Tr::kWarps;  // rows a warp holds
  static constexpr int kMTiles = kWarpRows / 16;                // 16-row tiles a warp holds
};

namespace decode_detail {

// The sums over a warp of kN values a lane, transposed: round by round each lane keeps half of its
// values and adds the partner's half, so that after the rounds lane l holds the warp's sum of value
// (l >> (5 - log2 kN)) in v[0] (kN <= 32; lanes sharing those bits hold the same sum), or of values
// l (kN / 32) + i in v[i] (kN >= 32): kN - 1 shuffles instead of 5 kN.
template <int kN, int kO = 16>
__device__ __forceinline__ void warp_transposed_sums(float* v, int lane) {
  if constexpr (kO >= 1) {
    if constexpr (kN > 1) {
      constexpr int H = kN / 2;
      const bool upper = (lane & kO) != 0;
#pragma unroll
      for (int i = 0; i < H; ++i) {
        const float send = upper ? v[i] : v[i + H];
        const float keep = upper ? v[i + H] : v[i];
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, kO);
      }
      warp_transposed_sums<H, kO / 2>(v, lane);
    } else {
      v[0] += __shfl_xor_sync(0xffffffffu, v[0], kO);
      warp_transposed_sums<1, kO / 2>(v, lane);
    }
  }
}

constexpr int log2_int(int n) { return n <= 1 ? 0 : 1 + log2_int(n / 2); }

// The matrix step's operands for a step of `length` tokens (1 .. kTT; tokens past it count as k = q = 0,
// alpha = 1), from the token vectors: thread c makes column c's entries of sm.mat (which replaces the
// token vectors), sm.decay[c] = c_{T-1}, and its share of the pair sums sm.ab (ab[t kTT + s] = B_ts for
// s <= t, ab[s kTT + t] = A_ts for s < t). Three CTA barriers.
template <class Tr, int kTT>
__device__ __forceinline__ void matrix_operands(KdaDecodeSmem<Tr>& sm, int length, int tid) {
  using Shape = DecodeMatrixShape<Tr>;
  constexpr int kAB = kTT * kTT, kXTiles = 2 * kTT / 8;
  const int c = tid, lane = tid % 32, warp = tid / 32;
  float kv[kTT], qv[kTT], al[kTT];
#pragma unroll
  for (int t = 0; t < kTT; ++t) {
    const bool live = t < length;
    kv[t] = live ? sm.vec.k_hat[t][c] : 0.f;
    qv[t] = live ? sm.vec.q_tilde[t][c] : 0.f;
    al[t] = live ? sm.vec.alpha[t][c] : 1.f;
  }
  float ab[kAB];
#pragma unroll
  for (int s0 = 0; s0 < kTT; ++s0) {
    float rr = 1.f;
#pragma unroll
    for (int t = s0; t < kTT; ++t) {
      if (t > s0) rr *= al[t];
      const float ks = kv[s0] * rr;
      ab[t * kTT + s0] = ks * qv[t];
      if (t > s0) ab[s0 * kTT + t] = ks * kv[t];
    }
  }
  warp_transposed_sums<kAB>(ab, lane);
  // (after the sums, which leave each lane kAB / 32 of its kAB registers)
  float kc[kTT], qc[kTT], ct = 1.f;
#pragma unroll
  for (int t = 0; t < kTT; ++t) {
    ct *= al[t];
    kc[t] = ct * kv[t];
    qc[t] = ct * qv[t];
  }
  float kr[kTT], r = 1.f;
#pragma unroll
  for (int t = kTT - 1; t >= 0; --t) {
    kr[t] = kv[t] * r;
    r *= al[t];
  }
  __syncthreads();  // every thread has read its column of the token vectors: sm.mat may replace them
  if constexpr (kAB >= 32) {
#pragma unroll
    for (int i = 0; i < kAB / 32; ++i) sm.ab_part[warp][lane * (kAB / 32) + i] = ab[i];
  } else {
    constexpr int kShift = 5 - log2_int(kAB);
    if ((lane & ((1 << kShift) - 1)) == 0) sm.ab_part[warp][lane >> kShift] = ab[0];
  }
  // Column c is element e of tile j in quad position tq (column(j, tq, e) above).
  const int w = c % Shape::kGroup, tq = w / Tr::kVec, e = w % 2;
  const int j = (c / Shape::kGroup) * Shape::kTileVec + (w % Tr::kVec) / 2;
  // The products' B (k = columns, n = 8 columns of [c_t ⊙ k_t | c_t ⊙ q_t] a tile): lane (g, tq) of
  // tile (x, j) holds n = g at column(j, tq, 0) and column(j, tq, 1).
#pragma unroll
  for (int x = 0; x < kXTiles; ++x) {
#pragma unroll
    for (int g = 0; g < 8; ++g) {
      const int u = 8 * x + g;
      reinterpret_cast<float*>(&sm.mat.x[x][j][4 * g + tq])[e] = u < kTT ? kc[u] : qc[u - kTT];
    }
  }
  // The update's B (k = tokens, n = the tile's columns, n = 2 tq + e at column(j, tq, e)): lane
  // (g, tq') holds tokens tq' and tq' + 4 of n = g; zeros for tokens past kTT.
#pragma unroll
  for (int t = 0; t < 8; ++t)
    reinterpret_cast<float*>(&sm.mat.k[j][4 * (2 * tq + e) + (t & 3)])[t >> 2] = t < kTT ? kr[t] : 0.f;
  sm.decay[c] = ct;
  __syncthreads();
  if (tid < kAB) {
    float z = 0.f;
#pragma unroll
    for (int q = 0; q < Tr::kWarps; ++q) z += sm.ab_part[q][tid];
    sm.ab[tid] = z;
  }
  __syncthreads();
}

// The matrix step's walk, each warp its kWarpRows rows of each pass: the state from shared memory
// into the accumulator fragments, the products, δ and out for each row, the update, the rows back to
// `dst` (the slot's rows of this CTA). `length` as for matrix_operands.
template <class Tr, int kTT>
__device__ __forceinline__ void matrix_walk(KdaDecodeSmem<Tr>& sm, typename Tr::State* dst, int length, int warp,
                                            int lane) {
  using Shape = DecodeMatrixShape<Tr>;
  using State = typename Tr::State;
  constexpr int NT = Shape::kTiles, MT = Shape::kMTiles, V = Tr::kVec, TV = Shape::kTileVec, D = Tr::kDim;
  constexpr int kXTiles = 2 * kTT / 8;
  constexpr bool kF32 = std::is_same_v<State, float>;
  const int g = lane / 4, tq = lane % 4, quad = lane & ~3;
#pragma unroll 1
  for (int pass = 0; pass < Tr::kRowPasses_; ++pass) {
    // rows row0 + 16 mt and row0 + 16 mt + 8 (of the CTA's slice)
    const int row0 = (pass * Tr::kWarps + warp) * Shape::kWarpRows + g;
    mbarrier_wait(&sm.state_loaded[pass], 0);
    float st[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int grp = 0; grp < NT / TV; ++grp) {
          float x[V];
          load_state_vec(&sm.state[row0 + 16 * mt + 8 * h][grp * Shape::kGroup + tq * V], x);
#pragma unroll
          for (int jj = 0; jj < TV; ++jj) {
            st[mt][grp * TV + jj][2 * h] = x[2 * jj];
            st[mt][grp * TV + jj][2 * h + 1] = x[2 * jj + 1];
          }
        }
    // The products: acc[mt][x] = S0 rows × the 8 columns of tile x of [c_t ⊙ k_t | c_t ⊙ q_t].
    // (kChains independent accumulators a tile, summed at the end: the main products of tile j go to
    // chain j % kChains and the rest terms to the next chain, so that no chain of dependent MMAs is
    // longer than ~NT MMAs where a warp has one row tile and one column tile (with two tiles they are two
    // chains already); measured -2.5 % on b256_t4_bf16 in one pass)
    constexpr int kChains = MT == 1 && kXTiles == 1 ? 2 : 1;
    float acc[MT][kXTiles][kChains][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int x = 0; x < kXTiles; ++x)
#pragma unroll
        for (int ch = 0; ch < kChains; ++ch)
          acc[mt][x][ch][0] = acc[mt][x][ch][1] = acc[mt][x][ch][2] = acc[mt][x][ch][3] = 0.f;
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int x = 0; x < kXTiles; ++x) {
        const float2 b = sm.mat.x[x][j][lane];
        const float b0r = ptx::tf32_rest(b.x), b1r = ptx::tf32_rest(b.y);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          const float* f = st[mt][j];
          float(&rest)[4] = acc[mt][x][(j + 1) % kChains];
          float(&main)[4] = acc[mt][x][j % kChains];
          if constexpr (kF32)
            ptx::mma_tf32(rest, ptx::tf32_rest(f[0]), ptx::tf32_rest(f[2]), ptx::tf32_rest(f[1]), ptx::tf32_rest(f[3]),
                          b.x, b.y);
          ptx::mma_tf32(rest, f[0], f[2], f[1], f[3], b0r, b1r);
          ptx::mma_tf32(main, f[0], f[2], f[1], f[3], b.x, b.y);
        }
      }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int x = 0; x < kXTiles; ++x)
#pragma unroll
        for (int ch = 1; ch < kChains; ++ch)
#pragma unroll
          for (int r = 0; r < 4; ++r) acc[mt][x][0][r] += acc[mt][x][ch][r];
    const float* ab = sm.ab;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      // δ of rows g and g + 8 (h = 0, 1) by forward substitution; out_t of them; the update's A
      // fragment (m = rows, k = tokens): (g, tq), (g + 8, tq), (g, tq + 4), (g + 8, tq + 4).
      float a_frag[2][2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float xs[2 * kTT];  // the row's products: [S0 (c_t ⊙ k_t) | S0 (c_t ⊙ q_t)]
#pragma unroll
        for (int src = 0; src < 4; ++src)
#pragma unroll
          for (int x = 0; x < kXTiles; ++x)
#pragma unroll
            for (int e = 0; e < 2; ++e)
              xs[8 * x + 2 * src + e] = __shfl_sync(0xffffffffu, acc[mt][x][0][2 * h + e], quad | src);
        const int row = row0 + 16 * mt + 8 * h;
        float d[kTT];
#pragma unroll
        for (int t = 0; t < kTT; ++t) {
          float z = 0.f;
          if (t < length) {
            z = sm.v[t][row] - xs[t];
#pragma unroll
            for (int s0 = 0; s0 < t; ++s0) z = fmaf(-d[s0], ab[s0 * kTT + t], z);
            z *= sm.beta[t];
          }
          d[t] = z;
        }
#pragma unroll
        for (int t = 0; t < kTT; ++t)
          if (t < length && (t & 3) == tq) {
            float o = xs[kTT + t];
#pragma unroll
            for (int s0 = 0; s0 <= t; ++s0) o = fmaf(d[s0], ab[t * kTT + s0], o);
            sm.out[t][row] = __float2bfloat16_rn(o);
          }
        a_frag[h][0] = a_frag[h][1] = 0.f;
#pragma unroll
        for (int t = 0; t < kTT; ++t) {
          if (t < 4)
            a_frag[h][0] = ptx::select_eq(tq, t, d[t], a_frag[h][0]);
          else
            a_frag[h][1] = ptx::select_eq(tq, t - 4, d[t], a_frag[h][1]);
        }
      }
      const float a0 = a_frag[0][0], a1 = a_frag[1][0], a2 = a_frag[0][1], a3 = a_frag[1][1];
      const float a0r = ptx::tf32_rest(a0), a1r = ptx::tf32_rest(a1), a2r = ptx::tf32_rest(a2),
                  a3r = ptx::tf32_rest(a3);
#pragma unroll
      for (int grp = 0; grp < NT / TV; ++grp) {
        float dec[V];
#pragma unroll
        for (int i = 0; i < V; i += 4) load_state_vec(&sm.decay[grp * Shape::kGroup + tq * V + i], dec + i);
#pragma unroll
        for (int jj = 0; jj < TV; ++jj) {
          const int j = grp * TV + jj;
          float* f = st[mt][j];
          f[0] *= dec[2 * jj], f[1] *= dec[2 * jj + 1], f[2] *= dec[2 * jj], f[3] *= dec[2 * jj + 1];
          const float2 kb = sm.mat.k[j][lane];
          ptx::mma_tf32(st[mt][j], a0r, a1r, a2r, a3r, kb.x, kb.y);
          ptx::mma_tf32(st[mt][j], a0, a1, a2, a3, ptx::tf32_rest(kb.x), ptx::tf32_rest(kb.y));
          ptx::mma_tf32(st[mt][j], a0, a1, a2, a3, kb.x, kb.y);
        }
      }
      // The rows back, 16 bytes a store.
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int grp = 0; grp < NT / TV; ++grp) {
          float x[V];
#pragma unroll
          for (int jj = 0; jj < TV; ++jj) {
            x[2 * jj] = st[mt][grp * TV + jj][2 * h];
            x[2 * jj + 1] = st[mt][grp * TV + jj][2 * h + 1];
          }
          store_state_vec(dst + int64_t(row0 + 16 * mt + 8 * h) * D + grp * Shape::kGroup + tq * V, x);
        }
    }
  }
}

}  // namespace decode_detail

namespace decode_detail {

// out, after the walk: 16-byte pieces of 8 rows from the staging buffer, the tokens of thread 0's
// reading (sm.out_begin, sm.out_length).
template <class Tr>
__device__ __forceinline__ void write_out(KdaDecodeSmem<Tr>& sm, const KdaDecodeArgs& a, int64_t batch_row, int hv,
                                          int slice, int tid) {
  __syncthreads();
  constexpr int kPieces = Tr::kRows / 8;
  const int64_t begin = sm.out_begin;
  if (tid < sm.out_length * kPieces) {
    const int t = tid / kPieces, piece = tid % kPieces;
    uint16_t* dst =
        a.out + batch_row * a.out_s[0] + (begin + t) * a.out_s[1] + hv * a.out_s[2] + slice * Tr::kRows + piece * 8;
    *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(&sm.out[t][piece * 8]);
  }
}

}  // namespace decode_detail

// One CTA a work unit: unit blockIdx.x (grid = sequences × heads × Tr::kSlices).
template <typename Tr>
__global__ void __launch_bounds__(Tr::kThreads, Tr::kMinBlocks)
    kda_decode_kernel(const __grid_constant__ KdaDecodeArgs a) {
  using namespace decode_detail;
  using State = typename Tr::State;
  constexpr int D = Tr::kDim, RPT = Tr::kRowsPerThread_, kVec = Tr::kVec;
  FLASH_KDA_DYNAMIC_SMEM(smem_bytes);  // (sizeof(KdaDecodeSmem<Tr>): launch_kda_decode)
  auto& sm = *reinterpret_cast<KdaDecodeSmem<Tr>*>(smem_bytes);

  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int lr = lane % Tr::kLanesPerRow, row_group = lane / Tr::kLanesPerRow;
  State* const pool = static_cast<State*>(a.state);

  // Thread 0 reads the CTA's unit (decode_unit) and, if it is live, issues the bulk copy of each
  // pass's rows, in flight while the CTA prepares the token vectors below; it leaves the slot it
  // copied from (or -1) in sm.read_slot. Whether the CTA waits for a copy and where the rows go back
  // follow that one reading, taken after the barrier that ends the token vectors, so the copy, the
  // wait for it and the write-back agree even if the caller changed cu_seqlens, num_accepted or the
  // slots during the call (a wait on a copy never issued would hang the CTA). Everything else --
  // the token vectors and the walk's tokens -- comes from each thread's own reading of the token
  // range, at once, as before thread 0 read the unit: waiting at a barrier for thread 0's reading
  // first measured 1-4 % slower on most rows, and taking the walk's tokens from shared memory 9-14 %
  // on the bf16 T = 4 ones (H100, docs/perf_log.md session 28). Those loads and the walk stay inside
  // the tensors and buffers whatever a reading says; only a caller racing the call could make two
  // readings differ.
  const KdaDecodeUnit own = decode_unit_tokens<Tr>(a, int64_t(blockIdx.x));
  // (the unit's head and slice are blockIdx.x's: the same in every thread's reading)
  const int64_t head_offset = int64_t(own.hv) * D * D + int64_t(own.slice) * Tr::kRows * D;
  if (tid == 0) {
#pragma unroll
    for (int p = 0; p < Tr::kRowPasses_; ++p) mbarrier_init(&sm.state_loaded[p], 1);
    const KdaDecodeUnit x = decode_unit(a, own);
    sm.read_slot = x.live ? int64_t(x.read_slot) : -1;
    sm.out_begin = x.begin, sm.out_length = x.length;
    sm.fold_unsafe = 0;
    if (x.live) {
      const State* src = pool + int64_t(x.read_slot) * a.heads_v * D * D + head_offset;
#pragma unroll
      for (int p = 0; p < Tr::kRowPasses_; ++p) {
        mbarrier_arrive_expect_tx(&sm.state_loaded[p], Tr::kPassBytes);
        bulk_copy_g2s(&sm.state[p * Tr::kPassRows][0], src + p * Tr::kPassRows * D, Tr::kPassBytes,
                      &sm.state_loaded[p]);
      }
    }
  }
  const int hv = own.hv, h = own.h, slice = own.slice;
  const int64_t batch_row = own.batch_row;
  const bool speculative = a.slots_per_seq > 1;
  // Speculative: the slot of the state after token t (every entry a walk may read, whatever length
  // thread 0 read).
  if (tid < Tr::kMaxTokens) {
    int64_t slot = -1;
    if (speculative && tid < a.slots_per_seq) {
      slot = own.indices[tid];
      if (slot >= a.pool_size) slot = -1;
    }
    sm.write_slot[tid] = slot;
  }

  // ---- per-token vectors, kTokenLanes lanes per token (a warp at D = 128, a half-warp at D = 64) ----
  // The gate form is the same for the whole grid: the branches below are uniform, and the default
  // form (sigmoid with A_log) computes exactly what it did before the other forms existed.
  const float gate_rate = a.softplus_gate ? expf(a.A_log[hv]) : a.A_log ? __expf(a.A_log[hv]) : 1.0f;
  constexpr int kTokenLanes = Tr::kTokenLanes, kTokensPerWarp = Tr::kTokensPerWarp;
  const int tl = lane % kTokenLanes;  // this lane within its token's group
  // Every lane of a warp takes part in each pass (the sums shuffle over the full mask); a group past
  // the last token repeats the pass's first token and stores nothing.
  for (int t0 = warp * kTokensPerWarp; t0 < own.length; t0 += Tr::kWarps * kTokensPerWarp) {
    const int t = t0 + lane / kTokenLanes;
    const bool live = t < own.length;
    const int64_t token = own.begin + (live ? t : t0);
    const int c0 = 4 * tl;  // this lane's 4 channels
    float q[4], k[4], g[4];
    load_bf16x4(a.q + batch_row * a.q_s[0] + token * a.q_s[1] + h * a.q_s[2] + c0, q);
    load_bf16x4(a.k + batch_row * a.k_s[0] + token * a.k_s[1] + h * a.k_s[2] + c0, k);
    load_bf16x4(a.g + batch_row * a.g_s[0] + token * a.g_s[1] + hv * a.g_s[2] + c0, g);
    const uint16_t* v_row = a.v + batch_row * a.v_s[0] + token * a.v_s[1] + hv * a.v_s[2] + slice * Tr::kRows;
    for (int r = 4 * tl; r < Tr::kRows && live; r += 4 * kTokenLanes) {
      float v4[4];
      load_bf16x4(v_row + r, v4);
#pragma unroll
      for (int e = 0; e < 4; ++e) sm.v[t][r + e] = v4[e];
    }
    float qq = 0.f, kk = 0.f;
#pragma unroll
    for (int e = 0; e < 4; ++e) qq += q[e] * q[e], kk += k[e] * k[e];
    // The eps inside the root, as docs/spec.md: an all-zero key stays zero.
    const float q_factor = a.scale * rsqrtf(lane_group_sum<kTokenLanes>(qq) + 1e-6f);
    const float k_factor = rsqrtf(lane_group_sum<kTokenLanes>(kk) + 1e-6f);
    float kq = 0.f;
    float4 k4, q4, a4;
    float* kp = &k4.x;
    float* qp = &q4.x;
    float* ap = &a4.x;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      kp[e] = k[e] * k_factor;
      qp[e] = q[e] * q_factor;
      kq += kp[e] * qp[e];
    }
    if (a.softplus_gate) {
#pragma unroll
      for (int e = 0; e < 4; ++e) ap[e] = softplus_decay(gate_rate, g[e] + a.dt_bias[hv * D + c0 + e]);
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e)
        ap[e] = __expf(a.lower_bound * sigmoid(gate_rate * (g[e] + a.dt_bias[hv * D + c0 + e])));
    }
    kq = lane_group_sum<kTokenLanes>(kq);
    if (!live) continue;
    *reinterpret_cast<float4*>(&sm.vec.k_hat[t][c0]) = k4;
    *reinterpret_cast<float4*>(&sm.vec.q_tilde[t][c0]) = q4;
    *reinterpret_cast<float4*>(&sm.vec.alpha[t][c0]) = a4;
    if (tl == 0) {
      sm.beta[t] =
          a.beta_scale *
          sigmoid(bf16_bits_to_float(a.beta[batch_row * a.beta_s[0] + token * a.beta_s[1] + hv * a.beta_s[2]]));
      sm.kq[t] = kq;
    }
  }
  __syncthreads();  // the token vectors, sm.read_slot and the mbarriers' initialisation for every thread
  const int64_t read_slot = sm.read_slot;
  if (read_slot < 0) return;  // not live (the same word for the whole CTA: a uniform return)
  // The walk's token count is this thread's own reading: no CTA barrier lies inside the walk, so
  // threads that read differently (a caller changing cu_seqlens during the call) walk different
  // counts of tokens inside the buffers, without a hang or an access out of bounds.
  const int length = own.length;

  // ---- several tokens a step: the decays folded into the token vectors ----
  // With c_t = alpha_1 ⊙ ... ⊙ alpha_t (per column) and S = S~ ⊙ c_t (S~ starts as S), token t is
  //   pk = S~ (c_t ⊙ k_hat),  pq = S~ (c_t ⊙ q_tilde),  S~ += delta (k_hat / c_t)ᵀ,
  // and the state after the last token T is S~ ⊙ c_T: three operations an element and token instead
  // of four, and one more at the end (docs/serving.md, "The decode kernel (sm_90a)"). Exact in real
  // arithmetic; in fp32 each S~ entry carries terms scaled by 1 / c_t, which only the range can
  // spoil: the step folds only where every column's c_T lies in [2^-64, 1] (k_hat / c_t at most
  // 2^64; a NaN fails the test), else it walks as one token at a time. Not with one token (nothing
  // to save) nor speculative steps (every token's state is stored, which would cost the
  // multiplication back each token). Thread d prepares column d; thread 0's token count decides for
  // the whole CTA (the barriers below are the CTA's), and a thread whose own count differs (a
  // caller racing the call) reads vectors inside the buffers either way.
  const int fold_length = sm.out_length;  // thread 0's count: decides the step's form for the whole CTA
  // ---- the matrix step (above): a kernel of its own, for steps that are not speculative ----
  if constexpr (Tr::kMatrix_) {
    State* dst = pool + read_slot * a.heads_v * D * D + head_offset;
    if (fold_length <= 4) {
      matrix_operands<Tr, 4>(sm, fold_length, tid);
      matrix_walk<Tr, 4>(sm, dst, fold_length, warp, lane);
    } else {
      matrix_operands<Tr, 8>(sm, fold_length, tid);
      matrix_walk<Tr, 8>(sm, dst, fold_length, warp, lane);
    }
    write_out(sm, a, batch_row, hv, slice, tid);
  } else {
    bool folded = false;
    if (a.fold_steps && !speculative && fold_length >= 2) {
      float c = 1.f, kc[Tr::kMaxTokens], qc[Tr::kMaxTokens], kd[Tr::kMaxTokens];
#pragma unroll
      for (int t = 0; t < Tr::kMaxTokens; ++t) {
        if (t < fold_length) {
          c *= sm.vec.alpha[t][tid];
          const float k = sm.vec.k_hat[t][tid];
          kc[t] = c * k;
          qc[t] = c * sm.vec.q_tilde[t][tid];
          kd[t] = k / c;
        }
      }
      if (!(c >= 0x1p-64f && c <= 1.0f)) sm.fold_unsafe = 1;
      sm.decay[tid] = c;
      __syncthreads();
      folded = sm.fold_unsafe == 0;
      if (folded) {
#pragma unroll
        for (int t = 0; t < Tr::kMaxTokens; ++t) {
          if (t < fold_length) {
            sm.vec.k_hat[t][tid] = kc[t];
            sm.vec.q_tilde[t][tid] = qc[t];
            sm.vec.alpha[t][tid] = kd[t];
          }
        }
      }
      __syncthreads();
    }

    // ---- the passes: this thread's rows of pass `pass` into registers, the tokens, the rows back ----
    // (kFold: the folded walk above; sm.vec.k_hat, q_tilde and alpha then hold c_t ⊙ k_hat, c_t ⊙ q_tilde
    // and k_hat / c_t)
    auto walk = [&](auto fold) {
      constexpr bool kFold = decltype(fold)::value;
#pragma unroll 1
      for (int pass = 0; pass < Tr::kRowPasses_; ++pass) {
        // (row within the slice)
        auto row_of = [&](int i) { return ((pass * Tr::kWarps + warp) * RPT + i) * Tr::kRowGroups + row_group; };
        float s[RPT][Tr::kCols];
        mbarrier_wait(&sm.state_loaded[pass], 0);
#pragma unroll
        for (int i = 0; i < RPT; ++i)
#pragma unroll
          for (int j = 0; j < Tr::kChunks; ++j)
            load_state_vec(&sm.state[row_of(i)][Tr::column(lr, j, 0)], &s[i][j * kVec]);

        auto store_rows = [&](int64_t slot) {
          State* dst = pool + slot * a.heads_v * D * D + head_offset;
#pragma unroll
          for (int i = 0; i < RPT; ++i)
#pragma unroll
            for (int j = 0; j < Tr::kChunks; ++j)
              store_state_vec(dst + row_of(i) * D + Tr::column(lr, j, 0), &s[i][j * kVec]);
        };

        // ---- the tokens ----
        for (int t = 0; t < length; ++t) {
          float pk[RPT], pq[RPT];
#pragma unroll
          for (int i = 0; i < RPT; ++i) pk[i] = pq[i] = 0.f;
#pragma unroll
          for (int j = 0; j < Tr::kChunks; ++j) {
#pragma unroll
            for (int e4 = 0; e4 < kVec; e4 += 4) {
              const int c = Tr::column(lr, j, e4);
              const float4 kh = *reinterpret_cast<const float4*>(&sm.vec.k_hat[t][c]);
              const float4 qt = *reinterpret_cast<const float4*>(&sm.vec.q_tilde[t][c]);
              const float khv[4] = {kh.x, kh.y, kh.z, kh.w}, qtv[4] = {qt.x, qt.y, qt.z, qt.w};
              float alv[4] = {};
              if constexpr (!kFold) {
                const float4 al = *reinterpret_cast<const float4*>(&sm.vec.alpha[t][c]);
                alv[0] = al.x, alv[1] = al.y, alv[2] = al.z, alv[3] = al.w;
              }
#pragma unroll
              for (int i = 0; i < RPT; ++i)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                  float& v = s[i][j * kVec + e4 + e];
                  if constexpr (!kFold) v *= alv[e];
                  pk[i] = fmaf(v, khv[e], pk[i]);
                  pq[i] = fmaf(v, qtv[e], pq[i]);
                }
            }
          }
#pragma unroll
          for (int o = 1; o < Tr::kLanesPerRow; o <<= 1)
#pragma unroll
            for (int i = 0; i < RPT; ++i) {
              pk[i] += __shfl_xor_sync(0xffffffffu, pk[i], o);
              pq[i] += __shfl_xor_sync(0xffffffffu, pq[i], o);
            }
          const float beta = sm.beta[t], kq = sm.kq[t];
          float delta[RPT];
#pragma unroll
          for (int i = 0; i < RPT; ++i) {
            delta[i] = beta * (sm.v[t][row_of(i)] - pk[i]);
            if (lr == 0) sm.out[t][row_of(i)] = __float2bfloat16_rn(fmaf(delta[i], kq, pq[i]));
          }
#pragma unroll
          for (int j = 0; j < Tr::kChunks; ++j)
#pragma unroll
            for (int e4 = 0; e4 < kVec; e4 += 4) {
              // (folded: k_hat / c_t, in sm.vec.alpha)
              const float4 kh = *reinterpret_cast<const float4*>(kFold ? &sm.vec.alpha[t][Tr::column(lr, j, e4)]
                                                                       : &sm.vec.k_hat[t][Tr::column(lr, j, e4)]);
              const float khv[4] = {kh.x, kh.y, kh.z, kh.w};
#pragma unroll
              for (int i = 0; i < RPT; ++i)
#pragma unroll
                for (int e = 0; e < 4; ++e) s[i][j * kVec + e4 + e] = fmaf(delta[i], khv[e], s[i][j * kVec + e4 + e]);
            }
          if (!kFold && speculative) {  // (speculative steps never fold)
            const int64_t slot = sm.write_slot[t];
            if (slot >= 0) store_rows(slot);
          }
        }
        if constexpr (kFold) {  // S = S~ ⊙ c_T
#pragma unroll
          for (int j = 0; j < Tr::kChunks; ++j)
#pragma unroll
            for (int e4 = 0; e4 < kVec; e4 += 4) {
              const float4 c4 = *reinterpret_cast<const float4*>(&sm.decay[Tr::column(lr, j, e4)]);
              const float cv[4] = {c4.x, c4.y, c4.z, c4.w};
#pragma unroll
              for (int i = 0; i < RPT; ++i)
#pragma unroll
                for (int e = 0; e < 4; ++e) s[i][j * kVec + e4 + e] *= cv[e];
            }
        }
        // One slot per sequence: the state after the last token goes back where it came from, in place
        // (the pass's bulk copy completed before any thread got past its mbarrier_wait, and each thread
        // writes only its rows; the other pass's rows are other bytes).
        if (!speculative) store_rows(read_slot);
      }
    };
    if (folded)
      walk(std::true_type{});
    else
      walk(std::false_type{});
    write_out(sm, a, batch_row, hv, slice, tid);
  }
}

// Launches the kernel for `units` = sequences × heads × Tr::kSlices work units, one CTA each
// (kda_decode_sm90.cu).
template <typename StateT, int kHeadDim, int kRowsPerThread, int kRowPasses, bool kMatrix>
cudaError_t launch_kda_decode(const KdaDecodeArgs& args, int64_t units, cudaStream_t stream);

// ---- the host side of a launch, shared by src/cuda/decode_dispatch.cu (the GPU) and
// tests/emu/test_emu_decode.cpp (the emulation), so that both run the same arguments and shapes ----

// The kernel arguments of normalised, checked parameters.
inline KdaDecodeArgs decode_kernel_args(const DecodeParams& p) {
  KdaDecodeArgs a{};
  copy_activations(a, p);
  a.state = p.state;
  a.state_indices = p.state_indices;
  a.num_accepted = p.slots_per_seq > 1 ? p.num_accepted_tokens : nullptr;
  a.seqlen = p.seqlen;
  a.pool_size = p.pool_size;
  a.slots_per_seq = static_cast<int>(p.slots_per_seq);
  a.indices_stride = p.state_indices_stride > 0 ? p.state_indices_stride : p.slots_per_seq;
  const int64_t HV = p.heads_v > 0 ? p.heads_v : p.heads;
  a.heads_v = static_cast<int>(HV);
  a.group = static_cast<int>(HV / p.heads);
  a.scale = p.scale;
  a.lower_bound = p.lower_bound;
  // The gate forms (docs/spec.md, "Gate forms"): A_log may be null (rate 1) with the sigmoid gate.
  a.softplus_gate = p.gate == GateForm::kSoftplus;
  a.beta_scale = p.allow_neg_eigval ? 2.0f : 1.0f;
  a.cu_seqlens_i64 = p.cu_seqlens_dtype == DType::kI64;
  a.fold_steps = kDecodeFoldSteps;
  return a;
}

// Rows of S per thread: as many as keep at least ~16 warps per SM in the grid (4 rows: ~128
// registers, 16 resident warps per SM: D = 128, 2 CTAs of 4 warps per (sequence, head) and 4 CTAs
// per SM; D = 64, 1 CTA of 2 warps and 8 per SM); fewer rows per thread split a head over more CTAs
// when the batch alone cannot fill the GPU (B=1, H=32, D = 128: 32 heads × 8 slices). A CTA has
// D threads and owns 16 rows per row a thread: D / (16 r) CTAs per head, of D / 32 warps each.
inline int decode_rows_per_thread(int64_t pairs, int64_t D, int sm_count) {
  int rows_per_thread = 4;
  auto ctas = [&](int r) { return pairs * (D / (16 * r)); };
  while (rows_per_thread > 1 && ctas(rows_per_thread) * (D / 32) < 16 * int64_t(sm_count)) rows_per_thread /= 2;
  return rows_per_thread;
}

// Passes over a CTA's rows (KdaDecodeTraits::kRowPasses_): 2 for bf16 pools at D = 128 with 4 rows a
// thread, one token a step (`one_token`: a fixed batch of T = 1), where the grid of whole-head CTAs
// still puts 4 on every SM (pairs >= 4 SMs): a CTA's bulk copies are then 32 KB as an fp32 pool's,
// and the SM keeps the same bytes in flight (with one pass, 16 KB a CTA and 4 CTAs an SM: half as
// many). Else 1: with several tokens a step the second pass repeats the tokens' work and measured
// slower (docs/perf_log.md, session 18).
inline int decode_row_passes(DType state, int64_t pairs, int64_t D, int rows_per_thread, int sm_count, bool one_token) {
  return one_token && state == DType::kBF16 && D == 128 && rows_per_thread == 4 && pairs >= 4 * int64_t(sm_count) ? 2
                                                                                                                  : 1;
}

// The kernel's shape for a problem: decode_rows_per_thread's rows, decode_row_passes's passes, and
// whether the steps are matrix steps (kDecodeMatrixSteps: bf16 pools at D = 128 with two passes, steps
// that are neither speculative nor a fixed batch of one token).
struct DecodeShape {
  int rows_per_thread;
  int row_passes;
  bool matrix = false;
};

inline DecodeShape decode_shape(DType state, int64_t pairs, int64_t D, int sm_count, bool one_token, bool speculative) {
  const int rows_per_thread = decode_rows_per_thread(pairs, D, sm_count);
  DecodeShape shape{rows_per_thread, decode_row_passes(state, pairs, D, rows_per_thread, sm_count, one_token)};
  // (the shape two passes would have with one token a step: bf16, D = 128, 4 rows, 4 pairs an SM)
  const bool two_passes = decode_row_passes(state, pairs, D, rows_per_thread, sm_count, /*one_token=*/true) == 2;
  if (kDecodeMatrixSteps && !speculative && !one_token && two_passes) {
    shape.matrix = true;
    shape.row_passes = 2;
  }
  return shape;
}

// Calls f(Tr{}) with the traits of the state dtype, D (128 or 64), rows per thread (4, 2, else 1),
// passes (2 only with a bf16 state, D = 128 and 4 rows a thread, else 1) and the matrix step (4 rows
// a thread).
template <class F>
auto with_decode_traits(DType state, int64_t D, const DecodeShape& shape, F&& f) {
  auto rows = [&](auto st, auto d) {
    using S = decltype(st);
    constexpr int kD = decltype(d)::value;
    switch (shape.rows_per_thread) {
      case 4:
        if constexpr (kD == 128 && std::is_same_v<S, __nv_bfloat16>)
          if (shape.row_passes == 2)
            return shape.matrix ? f(KdaDecodeTraits<S, kD, 4, 2, true>{}) : f(KdaDecodeTraits<S, kD, 4, 2>{});
        if (shape.matrix) return f(KdaDecodeTraits<S, kD, 4, 1, true>{});
        return f(KdaDecodeTraits<S, kD, 4>{});
      case 2: return f(KdaDecodeTraits<S, kD, 2>{});
      default: return f(KdaDecodeTraits<S, kD, 1>{});
    }
  };
  auto dims = [&](auto st) {
    return D == 64 ? rows(st, std::integral_constant<int, 64>{}) : rows(st, std::integral_constant<int, 128>{});
  };
  return state == DType::kF32 ? dims(float{}) : dims(__nv_bfloat16{});
}

}  // namespace flash_kda::cuda::sm90
