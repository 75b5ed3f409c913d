// Compile-time sizes and the shared-memory layout of the sm90 forward kernel, in one place.
//
// One CTA owns one work unit: (sequence, value head, slice of kVRows rows of the V x K state).
//   two producer warpgroups, ping-pong (group c % 2 prepares chunk c): each loads its chunk tiles
//     (cp.async, one own chunk ahead), computes norms, gates, decay factors, the intra-chunk
//     matrices and the 16x16 inverse, and hands the prepared chunk to the consumers through a
//     kStages-deep ring (named barriers FULL/EMPTY). A group's work on one chunk is a latency-
//     bound chain; two groups keep two chunks in preparation at once.
//   consumer warps (kVRows / 16): each keeps 16 rows of the fp32 state in registers as the MMA
//     accumulator and runs the state-dependent part of every chunk.
//
// Every size below is a template on the head dimension kD = K = V (128 or 64): the tiles, the
// prepared format's byte offsets, the producer group (one thread per channel: 4 warps at 128, 2 at
// 64), the rows a CTA may own (at most kD) and the chain's kD x kD states.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace flash_kda::cuda::sm90 {

// Arguments of one launch, copied from the validated FwdParams (element strides).
struct KdaFwdArgs {
  const uint16_t* q;
  const uint16_t* k;
  const uint16_t* v;
  const uint16_t* g;
  const uint16_t* beta;
  uint16_t* out;
  const float* A_log;  // nullptr: the sigmoid gate at rate 1
  const float* dt_bias;
  const void* initial_state;
  void* final_state;
  const void* cu_seqlens;
  const int32_t* state_indices;      // pool slot of each sequence, or nullptr (slot n)
  const uint8_t* has_initial_state;  // per sequence: 0 = start from zeros, or nullptr
  int64_t pool_size;                 // slots in the pools (with state_indices)
  // Set when the plan is decided on the device (docs/kernel.md, "Plans"): 1 = the fused kernel
  // runs, 0 = the prepared kernels run; each launched kernel returns at once when it is not its
  // turn. nullptr: the host decided.
  const int* device_plan;
  // Prefix-cache checkpoints (docs/spec.md, "Prefix-cache checkpoints"; docs/kernel.md, "The
  // shifted chunk grid and checkpoints"): only the prepared plans write them. Interval 0: none.
  const void* checkpoint_start;                                 // int32 / int64 [N], or nullptr (all 0)
  void* checkpoint_state;                                       // [checkpoint_pool_size, HV, D, D]
  const int32_t* checkpoint_indices;                            // [N, checkpoint_columns], rows checkpoint_stride apart
  int64_t checkpoint_interval;                                  // I (a multiple of 16), 0: no checkpoints
  int64_t checkpoint_pool_size;                                 // P2: a slot outside [0, P2) is skipped like -1
  int64_t checkpoint_columns;                                   // M
  int64_t checkpoint_stride;                                    // elements between rows of checkpoint_indices
  int64_t q_s[3], k_s[3], v_s[3], g_s[3], out_s[3], beta_s[3];  // batch, token, head
  int64_t seqlen;                                               // T (per batch row; the packed length with cu_seqlens)
  int num_seqs;                                                 // N
  int heads_v;                                                  // HV
  int group;                                                    // HV / H (value heads per q/k head)
  int slices;                                                   // D / kVRows: CTAs per (sequence, head)
  float scale;
  float lower_bound_log2;         // lower_bound * log2(e): gates are kept in base 2 (sigmoid gate)
  float beta_scale;               // 1, or 2 with allow_neg_eigval (beta = 2 sigmoid(logit))
  bool softplus_gate;             // GateForm::kSoftplus: a = -exp(A_log) softplus(g + dt_bias), no floor
  bool initial_fp32, final_fp32;  // state dtypes (they may differ; docs/spec.md)
  bool cu_seqlens_i64;
  bool checkpoint_start_i64, checkpoint_fp32;
};

// Whether -T is stored exactly in fp32 (not rounded to tf32) and solved in two terms (the consumer's
// solve_terms): with allow_neg_eigval (beta up to 2), where tf32's rounding of -T would be carried on
// by the reflections (docs/kernel.md, "Numerical choices").
__host__ __device__ inline bool exact_neg_t(const KdaFwdArgs& a) { return a.beta_scale > 1.f; }
// What the producers add to -T's bit pattern before storing it (ptx::round_tf32_by): half a tf32 ulp,
// or 0 where exact_neg_t.
__host__ __device__ inline uint32_t neg_t_rounding(const KdaFwdArgs& a) { return exact_neg_t(a) ? 0u : 0x1000u; }

// Tokens per chunk: |lower_bound| * 16 * log2(e) <= 115.4 < 126 (docs/kernel.md, numerics).
constexpr int kChunkTokens = 16;

// Sizes shared by every kernel of the forward (fused, preparation, recurrence), for head dimension
// kD = K = V.
template <int kD>
struct KdaDims {
  static_assert(kD == 128 || kD == 64, "the forward kernels are built for K = V = 128 and 64");
  static constexpr int kDim = kD;              // K = V
  static constexpr int kChunk = kChunkTokens;  // tokens per chunk
  static constexpr int kGroupThreads = kD;     // one producer/loader thread per channel
  // Row pitches (floats) chosen so that the 8-byte fragment loads of a half-warp (rows g = 0..3,
  // columns 2t..2t+1) hit 16 distinct bank pairs: pitch mod 32 = 8 or 24.
  static constexpr int kPitchK = kDim + 8;  // [token][channel] tiles
  // Token-interleaved tiles hold element (t, c) at [t % 8][2c + t / 8]: the four values a tf32 A
  // fragment needs (rows g and g + 8, channels 2t and 2t + 1), or the B pairs of both token
  // halves, are then one 16-byte load. A pitch of 272 or 144 (16 mod 32 banks) keeps a
  // quarter-warp's 16-byte loads conflict-free.
  static constexpr int kPitchKI = 2 * kDim + 16;
  static constexpr int kPitchT = kChunk + 8;  // [channel][token] and [token][token] tiles
};

// One prepared chunk of one value head as the preparation pass stores it in the workspace and the
// recurrence kernel copies it, unchanged, into shared memory (byte offsets, for head dimension kD;
// 13,952 bytes at kD = 128 against 16.4 KB of raw q, k, v, g, beta, 7,552 at kD = 64). The three
// 16 x kD tiles are fp16: every element is at most 1 in magnitude (unit-norm k_hat and q_hat times
// decays <= 1), fp16 keeps tf32's 10-bit mantissa, and what underflows below 2^-24 is an absolute
// error under 6e-8 on a unit-norm vector. q_hat is stored without `scale` (any finite scale then
// fits); the consumers multiply it in. The 16 x 16 matrices and gamma stay fp32 (tf32-rounded like
// the fused kernel's stage; -T exact where exact_neg_t).
//
// The tiles are laid out in the order the consumers' fp16 MMA fragments (m16n8k16) take them:
// lane l = 4 g + t of a warp reads 16-byte unit 32 i + l for step i, so a warp's fragment load is
// 512 contiguous bytes (no bank conflicts) and one instruction. A word is a half2 of two adjacent
// contraction indices (channels for k_tilde and q_hat, tokens for k_dec). The parts that produce
// no output read only the first kOutputFree bytes. The word layouts do not depend on kD (a smaller
// kD has fewer steps i); only the offsets of the parts do.
template <int kD>
struct KdaPrepared {
  // fp16 words (token n, channel pair p = channels 2p, 2p + 1): unit (8 (p / 8) + n % 8) * 4 + p % 4,
  // word 2 (n / 8) + (p % 8) / 4 of it: k_hat 2^{G_t}
  static constexpr int kKTilde = 0;
  // fp16 words (channel c, token pair w = tokens 2w, 2w + 1) of k_hat_s 2^{G_last - G_s}:
  // unit (8 (c / 16) + c % 8) * 4 + w % 4, word 2 ((c / 8) % 2) + w / 4 of it
  static constexpr int kKDec = 32 * kD;
  // fp32, the lower triangle's three 8 x 8 blocks of the 16 x 16 square (square_word; the block
  // above the diagonal is zero and no consumer reads it): -(I + diag(beta) A)^{-1} diag(beta)
  static constexpr int kNegT = 64 * kD;
  static constexpr int kTriangle = 3 * 64 * 4;  // bytes of a stored lower triangle
  // fp32 [kD]: 2^{G_last}; channel c at unit 4 (c / 16) + (c % 8) / 2, word 2 ((c / 8) % 2) + c % 2
  static constexpr int kGamma = kNegT + kTriangle;
  static constexpr int kOutputFree = kGamma + 4 * kD;
  static constexpr int kQHat = kOutputFree;   // fp16, as k_tilde: q_hat 2^{G_t} (no scale)
  // fp16, the lower triangle's three 8 x 8 blocks as -T's (element (t, s) at half square_word(t, s)):
  // M = lower(q_hat k_bar^T) without `scale` (the consumers multiply it in), every entry at most 1 in
  // magnitude (unit q_hat, k_hat and decays <= 1), so fp16 keeps tf32's 10-bit mantissa; its B
  // fragments are the walk's fp16 output product's as they stand (fp16 U, k = the tokens s).
  static constexpr int kM = kQHat + 32 * kD;
  static constexpr int kTriangleHalf = 3 * 64 * 2;  // bytes of a stored fp16 lower triangle
  static constexpr int kBytes = kM + kTriangleHalf;
  // 32-token steps (docs/kernel.md, "32-token steps"): a pair of chunks (a, b) is two slots of
  // kPairSlot bytes, adjacent in the workspace. Each slot is the format above with every tile taken
  // relative to the pair (a's k_dec to the pair's end and its gamma the pair's decay; b's k_tilde and
  // q_hat to the pair's start), followed by a 16 x 16 cross block at kCross in the square layout,
  // all four blocks: slot a holds (-T)[b][a] (fp32), slot b M[b][a] (fp16 as M, its first 512 bytes).
  static constexpr int kCross = kBytes;
  static constexpr int kPairSlot = kBytes + 1024;
  static_assert(kD != 128 || (kKDec == 4096 && kNegT == 8192 && kGamma == 8960 && kQHat == 9472 && kM == 13568 &&
                              kBytes == 13952),
                "the K = V = 128 format");
  static_assert(kOutputFree % 16 == 0 && kBytes % 16 == 0, "bulk copies move multiples of 16 bytes");

  __host__ __device__ static constexpr int kq_word(int n, int p) {
    return ((8 * (p >> 3) + (n & 7)) * 4 + (p & 3)) * 4 + 2 * (n >> 3) + ((p >> 2) & 1);
  }
  __host__ __device__ static constexpr int k_dec_word(int c, int w) {
    return ((8 * (c >> 4) + (c & 7)) * 4 + (w & 3)) * 4 + 2 * ((c >> 3) & 1) + (w >> 2);
  }
  __host__ __device__ static constexpr int gamma_word(int c) {
    return (4 * (c >> 4) + ((c & 7) >> 1)) * 4 + 2 * ((c >> 3) & 1) + (c & 1);
  }
  // Element (t, s) of a 16 x 16 square: its 8 x 8 block (t / 8, s / 8) holds 64 consecutive words,
  // row-major, the blocks in the order (0, 0), (1, 0), (1, 1), (0, 1) -- so a lower triangle is the
  // first 192 words, and a consumer's B fragment load (lanes 4 g + t4: element (8 r + g, 8 c + 2 t4)
  // and the next) is 256 contiguous bytes of one block, each half-warp's 128 in distinct banks.
  __host__ __device__ static constexpr int square_word(int t, int s) {
    return 64 * ((t >> 3) ? 1 + (s >> 3) : 3 * (s >> 3)) + 8 * (t & 7) + (s & 7);
  }
  // Whether (t, s) of -T or M is stored (the block above the diagonal is not).
  __host__ __device__ static constexpr bool in_triangle(int t, int s) { return t >= 8 || s < 8; }
};

// The shared-memory tiles of one prepared chunk as the consumers read them (all values already
// rounded to tf32), for a CTA owning kVRows rows of the state.
template <int kD, int kVRows>
struct KdaStage {
  // (no base class: an empty base shared with a member's type would shift the first member)
  static constexpr int kChunk = KdaDims<kD>::kChunk, kDim = KdaDims<kD>::kDim;
  static constexpr int kPitchK = KdaDims<kD>::kPitchK, kPitchKI = KdaDims<kD>::kPitchKI;
  static constexpr int kPitchT = KdaDims<kD>::kPitchT;
  float k_tilde[kChunk / 2][kPitchKI];  // k_hat_t * 2^{G_t}, token-interleaved
  float q_tilde[kChunk / 2][kPitchKI];  // scale * q_hat_t * 2^{G_t}, token-interleaved
  float k_dec_t[kDim][kPitchT];         // k_hat_s * 2^{G_last - G_s}, [channel][token]
  float neg_v_t[kVRows][kPitchT];       // -v, [value row][token]
  float neg_t[kChunk][kPitchT];         // -(I + diag(beta) A)^{-1} diag(beta), [t][s]
  float m[kChunk][kPitchT];             // masked (s <= t) q_tilde_t . k_bar_s, [t][s]
  float gamma[kDim];                    // 2^{G_last}: decay of the whole chunk
};

// One chunk of inputs as stored in memory (bf16); v holds this CTA's kVRows columns (none: 0).
template <int kD, int kVRows>
struct KdaRaw {
  static constexpr int kChunk = KdaDims<kD>::kChunk, kDim = KdaDims<kD>::kDim;
  uint16_t q[kChunk][kDim];
  uint16_t k[kChunk][kDim];
  uint16_t g[kChunk][kDim];
  uint16_t v[kChunk][kVRows > 0 ? kVRows : 8];
};

// Private to one producer group: its raw buffers and the tiles only the preparation reads.
template <int kD, int kVRows, int kRawStages>
struct KdaGroup {
  using Raw = KdaRaw<kD, kVRows>;
  static constexpr int kChunk = KdaDims<kD>::kChunk, kDim = KdaDims<kD>::kDim;
  static constexpr int kPitchK = KdaDims<kD>::kPitchK;
  Raw raw[kRawStages];
  float k_bar[kChunk][kPitchK];  // k_hat_s * 2^{-G_s} (A and M only); the softplus gate: partial sums of A, M
  float l_t[kChunk][kChunk];     // L^T with L = diag(beta) * strict_lower(A)
  float rq[kChunk];              // scale / ||q_t||
  float rk[kChunk];              // 1 / ||k_t||
  float beta[kChunk];            // beta_scale * sigmoid(beta_t), 0 past the end of the sequence
};

// k_tilde and q_tilde (fp32, tf32-rounded, token-interleaved) in the layout the producer's A and M
// products read, where the chunk's sink stores them in the compact form (KdaPrepared) elsewhere:
// the preparation pass's CTA, and each producer group of the fused kernel on compact stages.
template <int kD>
struct KdaTiles {
  static constexpr int kPitchKI = KdaDims<kD>::kPitchKI;
  float k_tilde[kChunkTokens / 2][kPitchKI];
  float q_tilde[kChunkTokens / 2][kPitchKI];
};

// A ring stage of the fused kernel on compact stages: the prepared chunk in the form the
// recurrence kernel copies from the workspace (KdaPrepared; fp16 tiles, triangles), and this CTA's
// kVRows columns of v as stored (bf16, [token][row], rows padded by 16 bytes for the transposing
// ldmatrix), so that its consumers are the recurrence kernel's (PackedStageView's accessors).
template <int kD, int kVRows>
struct KdaCompactStage {
  alignas(16) unsigned char prepared[KdaPrepared<kD>::kBytes];
  uint16_t v[kChunkTokens][kVRows + 8];
};

// The fused kernel: every CTA prepares its chunks itself (two producer groups) and runs the
// recurrence on its rows.
//
// kCompact: the producers write each chunk in the compact form of the prepared plans
// (KdaCompactStage: fp16 tiles, 18.3 KB a stage at kD = 128 and 128 rows against 41 KB of fp32
// tiles) and the consumers run the recurrence kernel's fp16 products on it (CompactStageView,
// kda_fwd_consumer.cuh); false: fp32 tiles and tf32 products (KdaStage, Fp32StageView).
template <int kD, int kConsumerWarps_, bool kCompact_ = false>
struct KdaFwdTraits : KdaDims<kD> {
  using Dims = KdaDims<kD>;
  using Dims::kChunk, Dims::kDim, Dims::kGroupThreads;
  static constexpr bool kCompact = kCompact_;
  static constexpr int kConsumerWarps = kConsumerWarps_;
  static constexpr int kVRows = 16 * kConsumerWarps;  // state rows per CTA
  static_assert(kVRows <= kDim && kDim % kVRows == 0, "a CTA owns a slice of the kD state rows");
  // 8 consumer warps make 512 threads: 128 registers a thread, which both roles nearly fit.
  static constexpr int kProducerGroups = 2;
  static constexpr bool kPair = false;         // 16-token steps (pairs: the recurrence kernel only)
  static constexpr bool kLoadV = true;         // the producer stages this CTA's v columns
  static constexpr bool kShiftedGrid = false;  // never runs with checkpoints: WorkUnit::shift is 0
  static constexpr int kProducerWarps = kProducerGroups * kGroupThreads / 32;
  static constexpr int kThreads = 32 * (kProducerWarps + kConsumerWarps);
  // Threads taking part in one FULL/EMPTY hand-off: the chunk's producer group and the consumers.
  static constexpr int kHandoffThreads = kGroupThreads + 32 * kConsumerWarps;
  // Three prepared chunks in flight decouple the producer's latency from the consumers': with
  // two, the producer could not start chunk i+2 before the consumers finished chunk i.
  // Compact stages (18.3 KB each at kD = 128) leave room for a fourth: measured on an H100 against
  // three, the fused rows 0.6-1.7 % faster (docs/perf_log.md, session 28).
  static constexpr int kStages = kCompact ? 4 : 3;
  static constexpr int kRawStages = 2;  // per group: its next chunk loads while this one is prepared

  // Named barrier ids. EMPTY has one barrier per (stage, group), kEmptyBars in all: the barrier
  // of chunk i (i >= kStages) is empty_bar(i), on which chunk i - kStages's consumers arrive and
  // chunk i's producer group waits. With one a stage, the stage's next two producers (chunks
  // i and i + kStages, of different groups) wait on the same barrier, and a group that ran ahead
  // could complete the other group's wait with the consumers' one arrival: it then writes its
  // chunk into the stage first and the consumers read the two chunks swapped. Chunks i and
  // i + kEmptyBars share a barrier and belong to the same group, which waits in chunk order.
  static constexpr int kEmptyBars = kStages * kProducerGroups;
  static constexpr int kBarFull0 = 1;                            // + stage: producers arrive, consumers wait
  static constexpr int kBarEmpty0 = 1 + kStages;                 // + i % kEmptyBars: consumers arrive, producers wait
  static constexpr int kBarGroup0 = 1 + kStages + kEmptyBars;    // + group: the group's own barrier
  static_assert(kBarGroup0 + kProducerGroups <= 16, "16 named barriers a CTA");
  __device__ static constexpr int empty_bar(int i) { return kBarEmpty0 + i % kEmptyBars; }

  using Stage = std::conditional_t<kCompact, KdaCompactStage<kD, kVRows>, KdaStage<kD, kVRows>>;
  using Raw = KdaRaw<kD, kVRows>;
  using Group = KdaGroup<kD, kVRows, kRawStages>;
  struct NoTiles {};
  using Tiles = std::conditional_t<kCompact, KdaTiles<kD>, NoTiles>;
  struct Smem {
    Stage stage[kStages];
    Group group[kProducerGroups];
    Tiles tiles[kProducerGroups];  // (compact stages: each group's k_tilde and q_tilde for A and M)
    alignas(16) uint16_t out_stage[kConsumerWarps][kChunk][16];  // (16-byte rows: vector accesses)
    int scheduled_seq;  // the scheduler's pick, shared by the CTA
  };
  static constexpr int kSmemBytes = sizeof(Smem);
  static_assert(kSmemBytes <= 227 * 1024, "one CTA an SM");
};

// The preparation pass: one producer group a CTA, several CTAs an SM, each preparing a few
// consecutive chunks of one (sequence, value head) into the workspace (KdaPrepared).
template <int kD>
struct KdaPrepTraits : KdaDims<kD> {
  using Dims = KdaDims<kD>;
  using Dims::kChunk, Dims::kDim, Dims::kGroupThreads, Dims::kPitchKI;
  static constexpr int kVRows = 0;
  static constexpr bool kLoadV = false;
  static constexpr bool kShiftedGrid = true;  // WorkUnit::shift may be nonzero (checkpoints)
  static constexpr int kProducerGroups = 1;
  static constexpr int kThreads = kGroupThreads;
  // kD = 128: five CTAs an SM (96 registers a thread, ~44 KB of shared memory a CTA), which leaves
  // room for one raw buffer a CTA: the next chunk's copies are issued once this chunk's tiles are
  // made (KdaProducer::run_chunks). Measured against four CTAs with two buffers (H100, docs/perf_log.md,
  // session 18): the pass 1.6 % faster under ncu (L1/TEX 75 -> 77 %, DRAM 63 -> 65 % of peak: near
  // both limits already), fixed32 -1.1 %, mix20k -4.7 %, the 16-token rows within +-1 %. kD = 64:
  // CTAs of 64 threads and ~28 KB, 8 an SM, two raw buffers.
  static constexpr int kRawStages = kD == 128 ? 1 : 2;
  static constexpr int kCtasPerSm = kD == 128 ? 5 : 8;
  static constexpr int kBarGroup0 = 1;
  using Raw = KdaRaw<kD, 0>;
  using Group = KdaGroup<kD, 0, kRawStages>;
  using Tiles = KdaTiles<kD>;  // k_tilde and q_tilde in the layout the A and M products read
  // 32-token steps (kD = 128 only): chunk a's k_dec tile (relative to a's end) kept for the pair's
  // cross blocks; the row pitch of 136 halves puts a B fragment load's 32 words in distinct banks.
  // After chunk b's products it holds A[b][a] (fp32).
  struct PairStash {
    __half k_dec[kChunk][kDim + 8];
  };
  struct NoStash {};
  struct Smem {
    alignas(128) Group group;  // (its raw tiles are tensor copies' destinations: 128-byte aligned)
    Tiles tiles;
    std::conditional_t<kD == 128, PairStash, NoStash> stash;
    uint64_t raw_full[kRawStages];  // with tensor maps: a raw buffer's copies landed
  };
  static_assert(sizeof(typename Group::Raw) % 128 == 0, "every raw tile starts 128-byte aligned");
  static constexpr int kSmemBytes = sizeof(Smem);
  // (an SM has 228 KB of shared memory, 1 KB of it reserved per CTA)
  static_assert(kCtasPerSm * (kSmemBytes + 1024) <= 228 * 1024, "kCtasPerSm CTAs fit an SM");
};

// The recurrence kernel of the prepared plans: one loader warp copies prepared chunks from the
// workspace into a ring of shared-memory stages with bulk copies (mbarrier hand-offs); the
// consumers read them in place (fp16 tiles converted as they load their fragments).
// kPair: the walk advances 32 tokens a step, a pair of prepared chunks (KdaPrepared::kPairSlot).
// kCtasPerSm: CTAs that share an SM (1, or 3 for 2-warp CTAs: a 68 KB ring each); the ring is sized
// for it and the kernel's register bound with it.
template <int kD, int kConsumerWarps_, bool kPair_ = false, int kCtasPerSm_ = 1>
struct KdaRecTraits : KdaDims<kD> {
  using Dims = KdaDims<kD>;
  using Dims::kDim;
  using Prepared = KdaPrepared<kD>;
  static constexpr bool kPair = kPair_;
  static_assert(!kPair || kD == 128, "32-token steps are built for K = V = 128");
  static constexpr int kChunk = kPair ? 2 * kChunkTokens : kChunkTokens;  // tokens a step
  static constexpr int kStepBytes = kPair ? 2 * Prepared::kPairSlot : Prepared::kBytes;
  static constexpr int kConsumerWarps = kConsumerWarps_;
  static constexpr int kVRows = 16 * kConsumerWarps;
  static_assert(kVRows <= kDim && kDim % kVRows == 0, "a CTA owns a slice of the kD state rows");
  // Eight consumer warps and a loader warp would be 9 warps: one SM sub-partition then holds 3 of
  // them, which caps every thread at 168 registers (16,384 a sub-partition), where the walk of 4
  // consumer warps takes 202-214. So the 16-token 8-warp CTA has a whole loader warpgroup (warp 0
  // loads, warps 1-3 only give their registers back) and moves registers from it to the consumers
  // (setmaxnreg): 384 threads at 168 = 128 at kLoaderRegs + 256 at kConsumerRegs. Measured on an
  // H100 (docs/perf_log.md, session 21): fixed96 -1.9 %, mix20k -2.2 %, fixed32_sp -1.9 %; the pair
  // walk lost with it (fixed32 +1.1 %, and with checkpoints +2-3 %: it spills at 216), so pairs
  // keep 9 warps at 168.
  static constexpr bool kRegRealloc = kConsumerWarps == 8 && !kPair;
  static constexpr int kLoaderWarps = kRegRealloc ? 4 : 1;
  static constexpr int kThreads = 32 * (kLoaderWarps + kConsumerWarps);
  static constexpr int kLaunchRegs = 168, kLoaderRegs = 72, kConsumerRegs = 216;
  static_assert(!kRegRealloc || (kThreads * kLaunchRegs == 128 * kLoaderRegs + 256 * kConsumerRegs &&
                                 kThreads * kLaunchRegs <= 65536),
                "the reallocated registers balance the CTA's pool");
  struct Stage {
    alignas(16) unsigned char prepared[kStepBytes];
    // this CTA's v columns, as stored (bf16); rows padded by 16 bytes so that the eight 16-byte rows
    // of a transposing ldmatrix fall in distinct bank groups
    uint16_t v[kChunk][kVRows + 8];
  };
  // A consumer step is ~1 us and a load from HBM 1-2 us: as many chunks in flight as ~208 KB
  // hold (11 with 128 rows, 14 with 16; 16 at kD = 64); a third of it where three CTAs share an SM
  // (4 stages of 2-warp CTAs: ~4 us of lookahead).
  static constexpr int kCtasPerSm = kCtasPerSm_;
  static_assert(kCtasPerSm == 1 || (kCtasPerSm == 3 && kConsumerWarps == 2 && !kPair),
                "three CTAs an SM: 2-warp CTAs of 16-token walks");
  static constexpr int kRingBytes = (kCtasPerSm == 1 ? 208 : 68) * 1024;
  static constexpr int kStages = int(kRingBytes / sizeof(Stage)) < 16 ? int(kRingBytes / sizeof(Stage)) : 16;
  struct Smem {
    Stage stage[kStages];
    uint64_t full[kStages];   // the loader's copies landed (its 32 lanes' arrivals + transaction bytes)
    uint64_t empty[kStages];  // every consumer warp is done with the stage
    uint16_t out_stage[kConsumerWarps][kChunk][16];
    int32_t ck_slot[kStages + 1];  // checkpoint slot of boundary walk chunk i at i % (kStages + 1)
    int ck_step, ck_last;          // RowsIO's (read by the consumers between pieces of the walk)
  };
  static constexpr int kSmemBytes = sizeof(Smem);
};

}  // namespace flash_kda::cuda::sm90
