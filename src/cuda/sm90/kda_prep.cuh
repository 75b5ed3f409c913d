// The preparation pass of the prepared plans: every chunk of every (sequence, value head) is
// prepared once, chunk-parallel, by the fused kernel's producer code, and stored in the workspace
// in the compact form of KdaPrepared. One producer group a CTA, PlanArgs::prep_chunks consecutive
// chunks (a CTA's start -- finding its sequence, its pointers -- is ~3 us, worth amortising).
#pragma once

#include <cuda_fp16.h>

#include "kda_fwd_producer.cuh"
#include "kda_plan.cuh"

namespace flash_kda::cuda::sm90 {

// The preparation pass's sink (head dimension kD): k_tilde and q_tilde also go to shared memory
// (the A and M products read them there), everything else straight from registers to the
// workspace.
template <int kD>
struct WorkspaceSink {
  using Prepared = KdaPrepared<kD>;
  static constexpr bool kTriangle = true;  // -T and M: the lower triangles' blocks only
  static constexpr int kPitchKI = KdaDims<kD>::kPitchKI;
  typename KdaPrepTraits<kD>::Tiles& tl;
  unsigned char* dst;  // this chunk's KdaPrepared
  float inv_scale;     // q_hat is stored without the output scale
  uint32_t t_round;    // neg_t_rounding: -T rounded to tf32, or unrounded (exact_neg_t)

  __device__ const float (*k_tilde() const)[kPitchKI] { return tl.k_tilde; }
  __device__ const float (*q_tilde() const)[kPitchKI] { return tl.q_tilde; }
  // Tokens t and t + 8 of channel c (this thread's). The workspace pairs adjacent channels of one
  // token, so the two lanes of a channel pair swap one value each: the even lane stores token t of
  // the pair, the odd lane token t + 8.
  __device__ void kq(int t, int c, const float (&k)[2], const float (&q)[2]) const {
    *reinterpret_cast<float2*>(&tl.k_tilde[t][2 * c]) = make_float2(ptx::round_tf32(k[0]), ptx::round_tf32(k[1]));
    *reinterpret_cast<float2*>(&tl.q_tilde[t][2 * c]) = make_float2(ptx::round_tf32(q[0]), ptx::round_tf32(q[1]));
    store_kq(t, c, k, q);
  }
  // The workspace words of kq() (every lane of the warp calls it: the pairs swap through shuffles).
  __device__ void store_kq(int t, int c, const float (&k)[2], const float (&q)[2]) const {
    const bool odd = c & 1;
    const float k_other = __shfl_xor_sync(0xffffffffu, odd ? k[0] : k[1], 1);
    const float q_other = __shfl_xor_sync(0xffffffffu, odd ? q[0] : q[1], 1);
    const int at = 4 * Prepared::kq_word(odd ? t + 8 : t, c >> 1);  // byte offset of the word
    *reinterpret_cast<__half2*>(dst + Prepared::kKTilde + at) =
        odd ? __floats2half2_rn(k_other, k[1]) : __floats2half2_rn(k[0], k_other);
    *reinterpret_cast<__half2*>(dst + Prepared::kQHat + at) =
        odd ? __floats2half2_rn(q_other * inv_scale, q[1] * inv_scale)
            : __floats2half2_rn(q[0] * inv_scale, q_other * inv_scale);
  }
  __device__ void k_dec(int c, const float (&kd)[kChunkTokens]) const {
    uint32_t h[kChunkTokens / 2];
#pragma unroll
    for (int w = 0; w < kChunkTokens / 2; ++w) {
      const __half2 x = __floats2half2_rn(kd[2 * w], kd[2 * w + 1]);
      h[w] = *reinterpret_cast<const uint32_t*>(&x);
    }
    // Token pairs w and w + 4 are adjacent words.
    uint32_t* d = reinterpret_cast<uint32_t*>(dst + Prepared::kKDec);
#pragma unroll
    for (int w = 0; w < 4; ++w) *reinterpret_cast<uint2*>(d + Prepared::k_dec_word(c, w)) = make_uint2(h[w], h[w + 4]);
  }
  __device__ void gamma(int c, float g) const {
    reinterpret_cast<float*>(dst + Prepared::kGamma)[Prepared::gamma_word(c)] = g;
  }
  __device__ void neg_v(int, const float (&)[kChunkTokens]) const {}
  // (the zeros above the diagonal are not stored: Prepared::in_triangle)
  // (M: x carries `scale`, which the fp16 form leaves out)
  __device__ void m(int t, int s, float x) const {
    if (Prepared::in_triangle(t, s))
      reinterpret_cast<__half*>(dst + Prepared::kM)[Prepared::square_word(t, s)] = __float2half_rn(x * inv_scale);
  }
  __device__ void neg_t(int t, int s, float x) const {
    if (Prepared::in_triangle(t, s))
      reinterpret_cast<float*>(dst + Prepared::kNegT)[Prepared::square_word(t, s)] = ptx::round_tf32_by(x, t_round);
  }
  __device__ void cross(int) const {}  // (the producer's warp 1 in P3: only pairs have work there)
};

// 32-token steps (docs/kernel.md, "32-token steps"): the sink of chunk a (second = false) or b of a
// pair. Chunk a is prepared as usual except that its k_dec tile (relative to a's end) goes to the
// stash and its gamma stays in a register; chunk b's k_tilde and q_hat are stored times gamma_a
// (relative to the pair's start: the shared-memory tiles, from which A and M are computed, stay
// relative to b's start), and once b's gamma is known (tiles()) a's k_dec tile is stored times
// gamma_b (relative to the pair's end) and a's gamma slot gets gamma_a gamma_b. In chunk b's P3 the
// producer's otherwise idle warp 1 computes the cross blocks A[b][a] and M[b][a]: with tokens t of b
// and s of a, 2^{G_t - G_s} = 2^{G^b_t} 2^{G^a_last - G^a_s}, so A[b][a] = k_tilde_b k_dec_a^T and
// M[b][a] = q_tilde_b k_dec_a^T over the channels, every factor at most 1 (fp16 operands, fp32
// accumulation). pair_epilogue() then forms (-T)[b][a] = (-T_b) A[b][a] (-T_a).
// Where chunk a's -T waits for the pair's epilogue: element (t, s) in the 16 floats of padding
// that end row t % 8 of the k_tilde (t < 8) or q_tilde tile, which no product reads and no sink
// writes.
template <int kD>
__device__ __forceinline__ float* neg_t_a_home(typename KdaPrepTraits<kD>::Tiles& tl, int t, int s) {
  static_assert(KdaPrepTraits<kD>::kPitchKI - 2 * kD == kChunkTokens, "a row's padding holds one row of -T");
  return &(t < 8 ? tl.k_tilde : tl.q_tilde)[t & 7][2 * kD + s];
}

// Y = A[b][a] (-T_a) of a pair (fp32 [t][s]) at the start of the stash, at a row pitch of kPitchY
// floats: written by warp 1 in chunk b's P3 once every lane has read a's k_dec there, read by the
// epilogue as B fragments (rows 2 t4, 2 t4 + 1 of a k-step, column g: a pitch of 20 puts the 32
// lanes in distinct banks, 16 would put four on each).
constexpr int kPitchY = kChunkTokens + 4;
template <class Stash>
__device__ __forceinline__ float (*pair_y(Stash& stash))[kPitchY] {
  static_assert(sizeof(Stash) >= kPitchY * kChunkTokens * sizeof(float), "Y fits the stash");
  return reinterpret_cast<float(*)[kPitchY]>(&stash);
}

// One tf32 MMA term pair of an fp32 product to ~fp32 accuracy ("3xTF32"): with x = hi + rest (hi
// the MMA's truncation of x, rest = ptx::tf32_rest(x) exact in fp32), d += a_hi b_hi + a_hi b_rest +
// a_rest b_hi; what is left out is a_rest b_rest, ~2^-22 of the product.
__device__ __forceinline__ void mma_tf32_x3(float (&d)[4], const float (&a)[4], float b0, float b1) {
  const float ar[4] = {ptx::tf32_rest(a[0]), ptx::tf32_rest(a[1]), ptx::tf32_rest(a[2]), ptx::tf32_rest(a[3])};
  ptx::mma_tf32(d, ar[0], ar[1], ar[2], ar[3], b0, b1);
  ptx::mma_tf32(d, a[0], a[1], a[2], a[3], ptx::tf32_rest(b0), ptx::tf32_rest(b1));
  ptx::mma_tf32(d, a[0], a[1], a[2], a[3], b0, b1);
}

template <int kD>
struct PairSink {
  static_assert(kD == 128, "32-token steps are built for K = V = 128");
  static constexpr bool kTriangle = true;
  using Prepared = KdaPrepared<kD>;
  using Tr = KdaPrepTraits<kD>;
  static constexpr int C = kChunkTokens;
  WorkspaceSink<kD> ws;          // this chunk's slot
  unsigned char* slot_a;         // the pair's slot a (with second: the other slot)
  typename Tr::PairStash& stash;
  float (*l_t)[C];               // the group's L^T tile
  float& gamma_a;                // this thread's channel: a's decay, carried from a to b
  bool second;

  __device__ const float (*k_tilde() const)[Tr::kPitchKI] { return ws.k_tilde(); }
  __device__ const float (*q_tilde() const)[Tr::kPitchKI] { return ws.q_tilde(); }
  __device__ void kq(int t, int c, const float (&k)[2], const float (&q)[2]) const {
    if (!second) return ws.kq(t, c, k, q);
    // shared tiles relative to b's start (A_bb, M_bb), workspace relative to the pair's start
    *reinterpret_cast<float2*>(&ws.tl.k_tilde[t][2 * c]) = make_float2(ptx::round_tf32(k[0]), ptx::round_tf32(k[1]));
    *reinterpret_cast<float2*>(&ws.tl.q_tilde[t][2 * c]) = make_float2(ptx::round_tf32(q[0]), ptx::round_tf32(q[1]));
    const float ks[2] = {k[0] * gamma_a, k[1] * gamma_a}, qs[2] = {q[0] * gamma_a, q[1] * gamma_a};
    ws.store_kq(t, c, ks, qs);
  }
  __device__ void k_dec(int c, const float (&kd)[C]) const {
    if (second) return ws.k_dec(c, kd);
#pragma unroll
    for (int t = 0; t < C; ++t) stash.k_dec[t][c] = __float2half_rn(kd[t]);
  }
  __device__ void gamma(int c, float g) const {
    if (!second) {
      gamma_a = g;
      return;
    }
    ws.gamma(c, g);
    // a's k_dec relative to the pair's end, and the pair's decay (this thread wrote column c of the
    // stash itself in a's tiles())
    float kd[C];
#pragma unroll
    for (int t = 0; t < C; ++t) kd[t] = __half2float(stash.k_dec[t][c]) * g;
    WorkspaceSink<kD> a_sink{ws.tl, slot_a, ws.inv_scale, ws.t_round};
    a_sink.k_dec(c, kd);
    a_sink.gamma(c, gamma_a * g);
  }
  __device__ void neg_v(int, const float (&)[C]) const {}
  __device__ void m(int t, int s, float x) const { ws.m(t, s, x); }
  // -T also stays in shared memory for the products of pair_epilogue(), in fp32 (they take it in
  // two tf32 terms: round_tf32's value would lose its low bits): chunk a's in the row
  // padding of the tiles (which chunk b's tiles() does not write), chunk b's over L^T (the inverse
  // has read all of it: inverse() synchronises its lanes before the stores).
  __device__ void neg_t(int t, int s, float x) const {
    ws.neg_t(t, s, x);
    *(second ? &l_t[t][s] : neg_t_a_home<kD>(ws.tl, t, s)) = x;
  }

  // Warp 1 in chunk b's P3 (lane = ptid % 32): M[b][a] into slot b's cross block, A[b][a] in
  // registers for Y = A[b][a] (-T_a), which goes over the stash once the warp has read it.
  __device__ void cross(int ptid) const {
    if (!second) return;
    const int lane = ptid & 31, g = lane >> 2, t4 = lane & 3;
    float acc_a[2][4] = {}, acc_m[2][4] = {};
#pragma unroll
    for (int i = 0; i < kD / 16; ++i) {
      const int c = 16 * i + 2 * t4;
      // rows (tokens) g, g + 8 at channels c, c + 1 and c + 8, c + 9 (token-interleaved tiles)
      const float4 k0 = *reinterpret_cast<const float4*>(&ws.tl.k_tilde[g][2 * c]);
      const float4 k1 = *reinterpret_cast<const float4*>(&ws.tl.k_tilde[g][2 * (c + 8)]);
      const float4 q0 = *reinterpret_cast<const float4*>(&ws.tl.q_tilde[g][2 * c]);
      const float4 q1 = *reinterpret_cast<const float4*>(&ws.tl.q_tilde[g][2 * (c + 8)]);
      const uint32_t ak[4] = {ptx::pack_f16(k0.x, k0.z), ptx::pack_f16(k0.y, k0.w), ptx::pack_f16(k1.x, k1.z),
                              ptx::pack_f16(k1.y, k1.w)};
      // q_tilde carries `scale`: without it every factor is at most 1 (fp16 range)
      const float r = ws.inv_scale;
      const uint32_t aq[4] = {ptx::pack_f16(q0.x * r, q0.z * r), ptx::pack_f16(q0.y * r, q0.w * r),
                              ptx::pack_f16(q1.x * r, q1.z * r), ptx::pack_f16(q1.y * r, q1.w * r)};
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        const uint32_t b0 = *reinterpret_cast<const uint32_t*>(&stash.k_dec[8 * n + g][c]);
        const uint32_t b1 = *reinterpret_cast<const uint32_t*>(&stash.k_dec[8 * n + g][c + 8]);
        ptx::mma_f16(acc_a[n], ak, b0, b1);
        ptx::mma_f16(acc_m[n], aq, b0, b1);
      }
    }
    // M[b][a] in fp16 without `scale`, as M (KdaPrepared::kM)
    __half* m_ba = reinterpret_cast<__half*>(ws.dst + Prepared::kCross);
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int t = g + 8 * h, s = 8 * n + 2 * t4;
        *reinterpret_cast<__half2*>(&m_ba[Prepared::square_word(t, s)]) =
            __floats2half2_rn(acc_m[n][2 * h], acc_m[n][2 * h + 1]);
      }
    // The epilogue's first product, beside warp 0's inverse: Y = A[b][a] (-T_a), on the tensor cores
    // from the accumulators of A[b][a] as they stand. Column tile n of them is, read as a tf32 A
    // fragment, k-step n of the product with its k index t4 standing for column 8n + 2 t4 and t4 + 4
    // for 8n + 2 t4 + 1, so -T_a's rows are taken in that order (its fp32 values from the tiles'
    // padding: neg_t_a_home).
    float y[2][4] = {};
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
      const float a4[4] = {acc_a[kk][0], acc_a[kk][2], acc_a[kk][1], acc_a[kk][3]};
#pragma unroll
      for (int n = 0; n < 2; ++n)
        mma_tf32_x3(y[n], a4, *neg_t_a_home<kD>(ws.tl, 8 * kk + 2 * t4, 8 * n + g),
                    *neg_t_a_home<kD>(ws.tl, 8 * kk + 2 * t4 + 1, 8 * n + g));
    }
    __syncwarp();  // every lane has read a's k_dec from the stash, where Y goes
    float(*y_tile)[kPitchY] = pair_y(stash);
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        *reinterpret_cast<float2*>(&y_tile[g + 8 * h][8 * n + 2 * t4]) = make_float2(y[n][2 * h], y[n][2 * h + 1]);
  }
};

// Byte address of prepared chunk `c` of sequence n, head hv (head dimension kD). kPair (32-token
// steps): the two slots of a pair of one head are adjacent (chunk_off is even for every sequence).
// prepared_at: the same from the sequence's chunk_off entry.
template <int kD, bool kPair = false>
__device__ __forceinline__ unsigned char* prepared_at(const PlanArgs& p, int heads_v, int64_t chunk_off, int hv,
                                                      int64_t c) {
  if constexpr (kPair)
    return p.prepared +
           ((chunk_off + (c & ~int64_t(1))) * heads_v + 2 * hv + (c & 1)) * int64_t(KdaPrepared<kD>::kPairSlot);
  return p.prepared + ((chunk_off + c) * heads_v + hv) * int64_t(KdaPrepared<kD>::kBytes);
}
template <int kD, bool kPair = false>
__device__ __forceinline__ unsigned char* prepared_chunk(const PlanArgs& p, int heads_v, int n, int hv, int64_t c) {
  return prepared_at<kD, kPair>(p, heads_v, p.seq.chunk_off[n], hv, c);
}

// A sequence's chunk slots in the workspace (the plan kernel's chunk_off step): with 32-token steps
// rounded up to a whole last pair.
__host__ __device__ constexpr int64_t padded_chunks(int64_t chunks, bool pair) {
  return pair ? (chunks + 1) & ~int64_t(1) : chunks;
}

// After a pair's chunk b (the group synchronised): (-T)[b][a] = (-T_b) A[b][a] (-T_a) into slot a's
// cross block, from T = (I + diag(beta) A)^{-1} diag(beta) by blocks: T[b][a] = -T_b A[b][a] T_a.
// Y = A[b][a] (-T_a) was formed by warp 1 in chunk b's P3 (PairSink::cross, beside the inverse);
// here warp 1 alone forms (-T_b) Y on the tensor cores (mma_tf32_x3: 12 MMAs), -T_b over L^T
// (PairSink::neg_t), Y in the stash; the other warps go on to the next chunk, whose first writes to
// either come after the next group barrier.
template <int kD>
__device__ __forceinline__ void pair_epilogue(typename KdaPrepTraits<kD>::Smem& sm, unsigned char* slot_a, int ptid,
                                              uint32_t t_round) {
  using Prepared = KdaPrepared<kD>;
  if ((ptid >> 5) != 1) return;
  const int lane = ptid & 31, g = lane >> 2, t4 = lane & 3;
  const float(*y_tile)[kPitchY] = pair_y(sm.stash);
  const float(*neg_tb)[kChunkTokens] = sm.group.l_t;
  float d[2][4] = {};
#pragma unroll
  for (int kk = 0; kk < 2; ++kk) {
    // k index t4 stands for column 8 kk + 2 t4 of -T_b, t4 + 4 for the next one (8-byte loads)
    const float2 lo = *reinterpret_cast<const float2*>(&neg_tb[g][8 * kk + 2 * t4]);
    const float2 hi = *reinterpret_cast<const float2*>(&neg_tb[g + 8][8 * kk + 2 * t4]);
    const float a4[4] = {lo.x, hi.x, lo.y, hi.y};
#pragma unroll
    for (int n = 0; n < 2; ++n)
      mma_tf32_x3(d[n], a4, y_tile[8 * kk + 2 * t4][8 * n + g], y_tile[8 * kk + 2 * t4 + 1][8 * n + g]);
  }
  float* cross = reinterpret_cast<float*>(slot_a + Prepared::kCross);
#pragma unroll
  for (int n = 0; n < 2; ++n)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int t = g + 8 * h, s = 8 * n + 2 * t4;
      *reinterpret_cast<float2*>(&cross[Prepared::square_word(t, s)]) =
          make_float2(ptx::round_tf32_by(d[n][2 * h], t_round), ptx::round_tf32_by(d[n][2 * h + 1], t_round));
    }
}

// The body of kda_prep_kernel: this CTA's chunks (nothing where it has none).
template <int kD, bool kSoftplus, bool kPair, bool kTma>
__device__ __forceinline__ void prep_blocks(const KdaFwdArgs& a, const PlanArgs& p, const RawMaps& maps,
                                            typename KdaPrepTraits<kD>::Smem& sm, bool fixed) {
  using Tr = KdaPrepTraits<kD>;
  const int hv = blockIdx.x % a.heads_v;
  int n;
  int64_t block, chunk_off;
  WorkUnit w;
  if (fixed) {
    // the plan kernel's table, computed: sequence n is batch row n, tokens [0, seqlen)
    const int64_t chunks = chunk_count(a.seqlen, 0),
                  per_seq = (padded_chunks(chunks, kPair) + p.prep_chunks - 1) / p.prep_chunks;
    const int64_t r = blockIdx.x / a.heads_v;
    if (per_seq == 0 || r >= per_seq * a.num_seqs) return;
    n = int(r / per_seq);
    block = r % per_seq;
    w.seq = n, w.hv = hv, w.slice = 0, w.row = n, w.begin = 0, w.len = a.seqlen, w.slot = n, w.skip = false,
    w.zero_init = false, w.shift = 0;
    chunk_off = n * padded_chunks(chunks, kPair);
  } else {
    if (fused_chosen(a)) return;
    // Every warp finds the sequence itself (the same answer): no broadcast, no extra barrier.
    if (!locate(p.seq.prep_off, a.num_seqs, blockIdx.x / a.heads_v, n, block)) return;
    w = table_unit(a, p.seq, n, hv, 0);
    if (w.skip) return;  // a padding sequence is never read
    chunk_off = p.seq.chunk_off[n];
  }
  int nchunks = int(chunk_count(w.len, w.shift));
  if constexpr (kPair) nchunks = (nchunks + 1) & ~1;
  const int c0 = int(block) * p.prep_chunks, c1 = min(c0 + p.prep_chunks, nchunks);
  const float inv_scale = a.scale != 0.f ? 1.f / a.scale : 0.f;
  const uint32_t t_round = neg_t_rounding(a);
  KdaProducer<Tr, kSoftplus, kTma> producer(a, w, sm.group, 0, threadIdx.x, &maps, sm.raw_full);
  if constexpr (kPair) {
    static_assert(!kSoftplus, "32-token steps are built for the sigmoid gate");
    float gamma_a = 1.f;  // this thread's channel: chunk a's decay, carried to chunk b
    producer.run_chunks(
        c0, 1, c1,
        [&](int i) {
          return PairSink<kD>{
              WorkspaceSink<kD>{sm.tiles, prepared_at<kD, true>(p, a.heads_v, chunk_off, hv, i), inv_scale, t_round},
              prepared_at<kD, true>(p, a.heads_v, chunk_off, hv, i & ~1),
              sm.stash,
              sm.group.l_t,
              gamma_a,
              (i & 1) != 0};
        },
        [](int) {},
        [&](int i) {
          if (i & 1)
            pair_epilogue<kD>(sm, prepared_at<kD, true>(p, a.heads_v, chunk_off, hv, i - 1), threadIdx.x, t_round);
        });
  } else {
    unsigned char* base = prepared_at<kD>(p, a.heads_v, chunk_off, hv, 0);
    const int64_t stride = int64_t(a.heads_v) * KdaPrepared<kD>::kBytes;
    producer.run_chunks(
        c0, 1, c1,
        [&](int i) {
          return WorkspaceSink<kD>{sm.tiles, base + i * stride, inv_scale, t_round};
        },
        [](int) {}, [](int) {});
  }
}

// kD: the head dimension; kSoftplus: the softplus gate's producer (docs/spec.md, "Gate forms");
// kPair: the pair format of 32-token steps (PairSink; prep_chunks is even, and a sequence's chunk
// count is rounded up to even: a missing chunk b is all past the end, an exact identity); kTma: the
// raw tiles arrive by tensor copies through `maps` (kda_raw_maps.h; unused otherwise).
template <int kD, bool kSoftplus, bool kPair, bool kTma>
__global__ void __launch_bounds__(KdaPrepTraits<kD>::kThreads, KdaPrepTraits<kD>::kCtasPerSm)
    kda_prep_kernel(const __grid_constant__ KdaFwdArgs a, const __grid_constant__ PlanArgs p,
                    const __grid_constant__ RawMaps maps) {
  using Tr = KdaPrepTraits<kD>;
  FLASH_KDA_DYNAMIC_SMEM(smem_bytes);
  auto& sm = *reinterpret_cast<typename Tr::Smem*>(smem_bytes);
  // Launched after the plan kernel, which lets it start at once (kda_plan_kernel). A fixed batch
  // whose grid is not shifted (no cu_seqlens, no checkpoint_start: uniform over the grid) needs
  // nothing the plan kernel writes -- its sequences, chunk counts and workspace offsets are
  // arithmetic, and padding slots (state_indices) are only skipped by the walks -- so it prepares
  // while the plan kernel runs and waits for it only before exiting: the grid completes after the
  // plan kernel, so the walks, which wait for this grid, see the table. Anything else waits first.
  const bool fixed = a.cu_seqlens == nullptr && a.checkpoint_start == nullptr;
  if (!fixed) ptx::wait_for_prior_grid();
  prep_blocks<kD, kSoftplus, kPair, kTma>(a, p, maps, sm, fixed);
  if (fixed) ptx::wait_for_prior_grid();
}

}  // namespace flash_kda::cuda::sm90
