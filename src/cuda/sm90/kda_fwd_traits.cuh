// Compile-time sizes and the shared-memory layout of the sm90 forward kernel, in one place.
//
// One CTA owns one work unit: (sequence, value head, slice of kVRows rows of the V x K state).
//   producer warpgroup (4 warps): loads chunk tiles (cp.async, kRawStages deep), computes norms,
//     gates, decay factors, the intra-chunk matrices and the 16x16 inverse, and hands a prepared
//     chunk to the consumers through a kStages-deep ring (named barriers FULL/EMPTY).
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
  static constexpr int kProducerWarps = 4;
  static constexpr int kProducerThreads = 32 * kProducerWarps;
  static constexpr int kThreads = 32 * (kProducerWarps + kConsumerWarps);
  static constexpr int kStages = 2;     // prepared-chunk ring
  static constexpr int kRawStages = 3;  // raw tile ring: chunk i+2 loads while chunk i is prepared

  // Row pitches (floats) chosen so that the 8-byte fragment loads of a half-warp (rows g = 0..3,
  // columns 2t..2t+1) hit 16 distinct bank pairs: pitch mod 32 = 8 or 24.
  static constexpr int kPitchK = kDim + 8;     // [token][channel] tiles
  static constexpr int kPitchT = kChunk + 8;   // [channel][token] and [token][token] tiles

  // Named barrier ids.
  static constexpr int kBarFull0 = 1;   // kBarFull0 + stage: producers arrive, consumers wait
  static constexpr int kBarEmpty0 = 3;  // kBarEmpty0 + stage: consumers arrive, producers wait
  static constexpr int kBarProducer = 5;

  struct Stage {  // one prepared chunk, all values already rounded to tf32
    float k_tilde[kChunk][kPitchK];   // k_hat_t * 2^{G_t}                    (state product)
    float q_tilde[kChunk][kPitchK];   // scale * q_hat_t * 2^{G_t}            (state product)
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
  struct Smem {
    Stage stage[kStages];
    Raw raw[kRawStages];
    float k_bar[kChunk][kPitchK];  // k_hat_s * 2^{-G_s} (producer only: A and M)
    float l_t[kChunk][kChunk];     // L^T with L = diag(beta) * strict_lower(A)
    float rq[kChunk];              // scale / ||q_t||
    float rk[kChunk];              // 1 / ||k_t||
    float beta[kChunk];            // sigmoid(beta_t), 0 past the end of the sequence
    uint16_t out_stage[kConsumerWarps][kChunk][16];
  };
  static constexpr int kSmemBytes = sizeof(Smem);
};

}  // namespace flash_kda::cuda::sm90
