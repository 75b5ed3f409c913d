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
#pragma once

#include <cstdint>

namespace flash_kda::cuda::sm90 {

// Arguments of one launch, copied from the validated FwdParams (element strides).
struct KdaFwdArgs {
  const uint16_t* q;
  const uint16_t* k;
  const uint16_t* v;
  const uint16_t* g;
  const uint16_t* beta;
  uint16_t* out;
  const float* A_log;
  const float* dt_bias;
  const void* initial_state;
  void* final_state;
  const void* cu_seqlens;
  const int32_t* state_indices;      // pool slot of each sequence, or nullptr (slot n)
  const uint8_t* has_initial_state;  // per sequence: 0 = start from zeros, or nullptr
  int64_t pool_size;                 // slots in the pools (with state_indices)
  int64_t q_s[3], k_s[3], v_s[3], g_s[3], out_s[3], beta_s[3];  // batch, token, head
  int64_t seqlen;      // T (per batch row; the packed length with cu_seqlens)
  int num_seqs;        // N
  int heads_v;         // HV
  int group;           // HV / H (value heads per q/k head)
  int slices;          // 128 / kVRows: CTAs per (sequence, head)
  float scale;
  float lower_bound_log2;  // lower_bound * log2(e): gates are kept in base 2
  bool state_fp32;
  bool cu_seqlens_i64;
};

template <int kConsumerWarps_>
struct KdaFwdTraits {
  static constexpr int kDim = 128;  // K = V
  static constexpr int kChunk = 16;  // tokens per chunk: |lower_bound| * 16 * log2(e) <= 115.4 < 126
  static constexpr int kConsumerWarps = kConsumerWarps_;
  static constexpr int kVRows = 16 * kConsumerWarps;  // state rows per CTA
  // 8 consumer warps make 512 threads: 128 registers a thread, which both roles nearly fit.
  static constexpr int kProducerGroups = 2;
  static constexpr int kGroupThreads = 128;  // one thread per channel in the gate/tile phase
  static constexpr int kProducerWarps = kProducerGroups * kGroupThreads / 32;
  static constexpr int kThreads = 32 * (kProducerWarps + kConsumerWarps);
  // Threads taking part in one FULL/EMPTY hand-off: the chunk's producer group and the consumers.
  static constexpr int kHandoffThreads = kGroupThreads + 32 * kConsumerWarps;
  // Three prepared chunks in flight decouple the producer's latency from the consumers': with
  // two, the producer could not start chunk i+2 before the consumers finished chunk i.
  static constexpr int kStages = 3;
  static constexpr int kRawStages = 2;  // per group: its next chunk loads while this one is prepared

  // Row pitches (floats) chosen so that the 8-byte fragment loads of a half-warp (rows g = 0..3,
  // columns 2t..2t+1) hit 16 distinct bank pairs: pitch mod 32 = 8 or 24.
  static constexpr int kPitchK = kDim + 8;     // [token][channel] tiles
  // Token-interleaved tiles hold element (t, c) at [t % 8][2c + t / 8]: the four values a tf32 A
  // fragment needs (rows g and g + 8, channels 2t and 2t + 1), or the B pairs of both token
  // halves, are then one 16-byte load. A pitch of 272 (16 mod 32 banks) keeps a quarter-warp's
  // 16-byte loads conflict-free.
  static constexpr int kPitchKI = 2 * kDim + 16;
  static constexpr int kPitchT = kChunk + 8;   // [channel][token] and [token][token] tiles

  // Named barrier ids.
  static constexpr int kBarFull0 = 1;                 // + stage: producers arrive, consumers wait
  static constexpr int kBarEmpty0 = 1 + kStages;      // + stage: consumers arrive, producers wait
  static constexpr int kBarGroup0 = 1 + 2 * kStages;  // + group: the group's own barrier

  struct Stage {  // one prepared chunk, all values already rounded to tf32
    float k_tilde[kChunk / 2][kPitchKI];  // k_hat_t * 2^{G_t}, token-interleaved
    float q_tilde[kChunk / 2][kPitchKI];  // scale * q_hat_t * 2^{G_t}, token-interleaved
    float k_dec_t[kDim][kPitchT];     // k_hat_s * 2^{G_last - G_s}, [channel][token]
    float neg_v_t[kVRows][kPitchT];   // -v, [value row][token]
    float neg_t[kChunk][kPitchT];     // -(I + diag(beta) A)^{-1} diag(beta), [t][s]
    float m[kChunk][kPitchT];         // masked (s <= t) q_tilde_t . k_bar_s, [t][s]
    float gamma[kDim];                // 2^{G_last}: decay of the whole chunk
  };
  struct Raw {  // one chunk of inputs as stored in memory (bf16)
    uint16_t q[kChunk][kDim];
    uint16_t k[kChunk][kDim];
    uint16_t g[kChunk][kDim];
    uint16_t v[kChunk][kVRows];
  };
  struct Group {  // private to one producer group
    Raw raw[kRawStages];
    float k_bar[kChunk][kPitchK];  // k_hat_s * 2^{-G_s} (A and M only)
    float l_t[kChunk][kChunk];     // L^T with L = diag(beta) * strict_lower(A)
    float rq[kChunk];              // scale / ||q_t||
    float rk[kChunk];              // 1 / ||k_t||
    float beta[kChunk];            // sigmoid(beta_t), 0 past the end of the sequence
  };
  struct Smem {
    Stage stage[kStages];
    Group group[kProducerGroups];
    uint16_t out_stage[kConsumerWarps][kChunk][16];
    int scheduled_seq;  // the scheduler's pick, shared by the CTA
  };
  static constexpr int kSmemBytes = sizeof(Smem);
};

}  // namespace flash_kda::cuda::sm90
