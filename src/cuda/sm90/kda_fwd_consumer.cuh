// Consumer role of the sm90 forward: the state-dependent part of every chunk, on 16 rows of the
// V x K state held in registers as the fp32 accumulator of the MMAs (fp16 m16n8k16 for the three
// large products, with a tf32 fallback for a chunk whose operands do not fit fp16, on the compact
// stages of the prepared plans and of the fused kernel; tf32 m16n8k8 on the fused kernel's fp32
// stages, KdaFwdTraits::kCompact false).
//
// With S the state at the chunk start (rows v of this warp), per chunk:
//   step 1   X  = S k_tilde^T - v^T,  Xq = S q_tilde^T          [16 x 16] each, k = D channels
//   step 2   U^T = X (-T)^T = (v - S k_tilde^T)^T-solve          [16 x 16], k = 16 tokens
//   step 3   O^T = Xq + U^T M^T                                  -> out (bf16)
//   step 4   S  = S Diag(gamma) + U^T k_dec                      [16 x D], k = 16 tokens
// (D = K = V: 128 or 64, Tr::kDim; the state's 16 rows are D / 8 accumulator tiles.)
//
// What the rows start from, whether v enters, where they end and which chunks they walk are set per
// CTA by a RowsIO (kda_fwd_scheduler.cuh): the fused kernel and a sequence's real rows start from
// the initial state and write out and the final state; the split plan's transition rows start
// from the identity with v = 0 and its zero-start rows from zeros, and neither writes out.
//
// Channel order: an accumulator tile holds columns (2t, 2t+1) in lane t of a quad, while a tf32
// A fragment wants k positions (t, t+4). Reading accumulator columns 2t, 2t+1 as k positions t,
// t+4 is a permutation of the contraction index inside each 8-block; every B operand is loaded
// with the same permutation (the adjacent pair [8j + 2t, 8j + 2t + 1] as one 8-byte load), so the
// state feeds the next product straight from registers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "../common/bulk_copy.cuh"
#include "../common/ptx.cuh"
#include "kda_fwd_scheduler.cuh"
#include "kda_fwd_traits.cuh"

namespace flash_kda::cuda::sm90 {

// A consumer's place in the ring of stages: chunk i is in stage i % kStages, whose barrier phase
// parity is (i / kStages) % 2; kept incrementally (no division in the chunk loop).
template <int kStages>
struct RingPos {
  int stage = 0;
  uint32_t parity = 0;
  __device__ void advance() {
    if (++stage == kStages) stage = 0, parity ^= 1u;
  }
};

// How consumers reach a prepared chunk, per kernel. Fragment accessors take the first of a pair:
// channel c = 8j + 2t (k/q: the four values (t=g, c), (t=g+8, c), (t=g, c+1), (t=g+8, c+1)), or
// token t even (pairs (t, t+1)).
//
// The fused kernel on fp32 stages (KdaFwdTraits::kCompact false): fp32 tiles its producers wrote
// (tf32-rounded, scale in q), named barriers.
template <class Tr>
struct Fp32StageView {
  using Stage = typename Tr::Stage;
  static constexpr bool kScaleQ = false;
  static constexpr bool kHalfProducts = false;  // tf32 products only
  static constexpr bool kCheckpoints = false;   // the fused kernel never writes checkpoints
  template <int kPitch>
  __device__ static float2 pair(const float (*m)[kPitch], int n, int kp) {
    return *reinterpret_cast<const float2*>(&m[n][kp]);
  }
  __device__ static const Stage& acquire(typename Tr::Smem& sm, RingPos<Tr::kStages> r) {
    ptx::bar_sync(Tr::kBarFull0 + r.stage, Tr::kHandoffThreads);
    return sm.stage[r.stage];
  }
  __device__ static void release(typename Tr::Smem& sm, RingPos<Tr::kStages> r, int i, int nchunks, int lane) {
    if (i + Tr::kStages < nchunks) ptx::bar_arrive(Tr::empty_bar(i + Tr::kStages), Tr::kHandoffThreads);
  }
  __device__ static float4 k_frag(const Stage& st, int g, int c) {
    return *reinterpret_cast<const float4*>(&st.k_tilde[g][2 * c]);
  }
  __device__ static float4 q_frag(const Stage& st, int g, int c) {
    return *reinterpret_cast<const float4*>(&st.q_tilde[g][2 * c]);
  }
  // -v of CTA rows r0 .. r0 + 15 as the C fragments of xk (tiles n: tokens 8n .. 8n + 7).
  __device__ static void neg_v(const Stage& st, int r0, int lane, float (&xk)[2][4]) {
    const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      const float2 lo = pair(st.neg_v_t, r0 + g, 8 * n + 2 * t4), hi = pair(st.neg_v_t, r0 + g + 8, 8 * n + 2 * t4);
      xk[n][0] = lo.x, xk[n][1] = lo.y, xk[n][2] = hi.x, xk[n][3] = hi.y;
    }
  }
  __device__ static float2 neg_t(const Stage& st, int t, int s) { return pair(st.neg_t, t, s); }
  __device__ static float2 m(const Stage& st, int t, int s) { return pair(st.m, t, s); }
  __device__ static float2 k_dec(const Stage& st, int c, int t) { return pair(st.k_dec_t, c, t); }
  __device__ static float2 gamma(const Stage& st, int c) { return *reinterpret_cast<const float2*>(&st.gamma[c]); }
};

// The recurrence kernel: the chunk as the preparation pass stored it (KdaPrepared, copied in by
// the loader), v as stored, mbarriers. The large products take their fp16 fragments straight from
// the copied tiles (one 16-byte load a lane and step); the tf32 accessors below serve the fallback
// of a chunk whose state or U does not fit fp16. kCk: the launch writes checkpoints (a separate
// instantiation, so that a call without them runs the same code as before they existed).
template <class Tr, bool kCk>
struct PackedStageView {
  using Stage = typename Tr::Stage;
  using Prepared = KdaPrepared<Tr::kDim>;  // the chunk format of this head dimension
  static constexpr bool kScaleQ = true;        // q_hat and M come without the output scale (M in fp16)
  static constexpr bool kHalfProducts = true;  // fp16 MMAs for S k_tilde^T, S q_hat^T, U^T k_dec
  static constexpr bool kCheckpoints = kCk;    // RowsIO::ck_* (prefix-cache checkpoints)
  __device__ static const Stage& acquire(typename Tr::Smem& sm, RingPos<Tr::kStages> r) {
    mbarrier_wait(&sm.full[r.stage], r.parity);
    return sm.stage[r.stage];
  }
  __device__ static void release(typename Tr::Smem& sm, RingPos<Tr::kStages> r, int i, int nchunks, int lane) {
    // Every lane arrives (EMPTY counts 32 a consumer warp): an arrival releases the arriving
    // thread's own reads of the stage, so the loader's copies into it are ordered after every
    // lane's, without relying on the warp barrier's ordering (compute-sanitizer's racecheck flags
    // a single lane's arrival; 32 arrivals cost nothing measurable, docs/perf_log.md).
    mbarrier_arrive(&sm.empty[r.stage]);
  }
  // Checkpoints: the slot of boundary walk chunk i (the loader brought it with the chunk, into a
  // ring one entry longer than the stages: the entry is not reused before every consumer warp has
  // released chunk i + 1), and the walk's schedule (RowsIO::ck_*; volatile: read between pieces of
  // the walk, not kept in registers).
  __device__ static int32_t checkpoint_slot(typename Tr::Smem& sm, int i) {
    return *static_cast<volatile int32_t*>(&sm.ck_slot[i % (Tr::kStages + 1)]);
  }
  __device__ static int checkpoint_step(typename Tr::Smem& sm) { return *static_cast<volatile int*>(&sm.ck_step); }
  __device__ static int checkpoint_last(typename Tr::Smem& sm) { return *static_cast<volatile int*>(&sm.ck_last); }
  __device__ static float2 word(const Stage& st, int offset, int w) {
    return __half22float2(*reinterpret_cast<const __half2*>(st.prepared + offset + 4 * w));
  }
  // fp16 B fragments of step i (k_tilde / q_hat: channels 16i..16i+15; k_dec: channels 16i..16i+15
  // as two n8 tiles): {tile 0 b0, b1, tile 1 b0, b1}.
  __device__ static uint4 frag16(const Stage& st, int offset, int i, int lane) {
    return *reinterpret_cast<const uint4*>(st.prepared + offset + 16 * (32 * i + lane));
  }
  // gamma of channels (16i + 2t, +1, 16i + 8 + 2t, +1)
  __device__ static float4 gamma4(const Stage& st, int i, int t4) {
    return *reinterpret_cast<const float4*>(st.prepared + Prepared::kGamma + 16 * (4 * i + t4));
  }
  __device__ static float4 kq(const Stage& st, int offset, int g, int c) {
    const float2 lo = word(st, offset, Prepared::kq_word(g, c >> 1));
    const float2 hi = word(st, offset, Prepared::kq_word(g + 8, c >> 1));
    return make_float4(lo.x, hi.x, lo.y, hi.y);
  }
  __device__ static float4 k_frag(const Stage& st, int g, int c) { return kq(st, Prepared::kKTilde, g, c); }
  __device__ static float4 q_frag(const Stage& st, int g, int c) { return kq(st, Prepared::kQHat, g, c); }
  // -v of CTA rows r0 .. r0 + 15 as the C fragments of xk, by one transposing ldmatrix: matrix m is
  // tokens 8 (m / 2) .. + 7 of rows r0 + 8 (m % 2) .. + 7 (v is stored [token][row], bf16), so lane l
  // receives rows r0 + l / 4 (+ 8) at tokens 2 (l % 4), + 1 (+ 8): exactly xk[m / 2][2 (m % 2) ..].
  // bf16 -> fp32 is a shift (or a mask) of the 16 bits; the sign flip is one xor of the pair.
  __device__ static void neg_v(const Stage& st, int r0, int lane, float (&xk)[2][4]) {
    const int m = lane >> 3, r = lane & 7;
    const uint4 p = ptx::ldmatrix_x4_trans(&st.v[8 * (m >> 1) + r][r0 + 8 * (m & 1)]);
    const uint32_t w[4] = {p.x ^ 0x80008000u, p.y ^ 0x80008000u, p.z ^ 0x80008000u, p.w ^ 0x80008000u};
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      xk[q >> 1][2 * (q & 1)] = __uint_as_float(w[q] << 16);
      xk[q >> 1][2 * (q & 1) + 1] = __uint_as_float(w[q] & 0xffff0000u);
    }
  }
  __device__ static float2 square(const Stage& st, int offset, int t, int s) {
    return *reinterpret_cast<const float2*>(st.prepared + offset + 4 * Prepared::square_word(t, s));
  }
  // fp16 squares (M, and M[b][a] of a pair; KdaPrepared::kM): elements (t, s), (t, s + 1) as the
  // fp16 pair an m16n8k16 B fragment takes (k = s), or as two floats for a tf32 one.
  __device__ static uint32_t half_square(const Stage& st, int offset, int t, int s) {
    return *reinterpret_cast<const uint32_t*>(st.prepared + offset + 2 * Prepared::square_word(t, s));
  }
  __device__ static float2 half_square_f(const Stage& st, int offset, int t, int s) {
    return __half22float2(*reinterpret_cast<const __half2*>(st.prepared + offset + 2 * Prepared::square_word(t, s)));
  }
  __device__ static float2 neg_t(const Stage& st, int t, int s) { return square(st, Prepared::kNegT, t, s); }
  // M without `scale` (kScaleQ: the consumers multiply the output by it)
  __device__ static float2 m(const Stage& st, int t, int s) { return half_square_f(st, Prepared::kM, t, s); }
  __device__ static uint32_t m16(const Stage& st, int t, int s) { return half_square(st, Prepared::kM, t, s); }
  __device__ static float2 k_dec(const Stage& st, int c, int t) {
    return word(st, Prepared::kKDec, Prepared::k_dec_word(c, t / 2));
  }
  __device__ static float2 gamma(const Stage& st, int c) {
    return *reinterpret_cast<const float2*>(st.prepared + Prepared::kGamma + 4 * Prepared::gamma_word(c));
  }
};

// The fused kernel on compact stages (KdaFwdTraits::kCompact): its producers write the chunk in the
// recurrence kernel's form (KdaCompactStage), so the consumers read it as PackedStageView does (fp16
// products, the tf32 fallback), handed over as Fp32StageView's are (named barriers).
template <class Tr>
struct CompactStageView : PackedStageView<Tr, false> {
  using Stage = typename Tr::Stage;
  __device__ static const Stage& acquire(typename Tr::Smem& sm, RingPos<Tr::kStages> r) {
    return Fp32StageView<Tr>::acquire(sm, r);
  }
  __device__ static void release(typename Tr::Smem& sm, RingPos<Tr::kStages> r, int i, int nchunks, int lane) {
    Fp32StageView<Tr>::release(sm, r, i, nchunks, lane);
  }
};

// Step 2's product U^T = xk (-T)^T over NT n8 token tiles (tf32 MMAs; tile (n, kk) of -T is zero
// for kk > n and skipped); b_of(n, kk) loads this lane's B fragment of tile (n, kk).
//
// kSplit (exact_neg_t: allow_neg_eigval): -T is stored exactly in fp32 and enters in two terms, its
// tf32 truncation (the MMA reads the top 19 bits) and the rest (exact in fp32, its own accumulators),
// so that -T carries ~2^-21 of relative error instead of tf32's 2^-11. With beta up to 2 and nearly
// collinear keys, -T's entries are ~2 in magnitude and alternate in sign while U is ~X: the one-term
// product loses ~T / U of tf32's precision, and that rounding is what the reflections carry on
// (docs/kernel.md, "Numerical choices"; the kernel emulation measured it, docs/perf_log.md session 14).
template <int NT, bool kSplit, class LoadB>
__device__ __forceinline__ void solve_terms(const float (&xk)[NT][4], float (&u)[NT][4], LoadB b_of) {
  float rest[kSplit ? NT : 1][4];
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      u[n][r] = 0.f;
      if constexpr (kSplit) rest[n][r] = 0.f;
    }
#pragma unroll
  for (int kk = 0; kk < NT; ++kk) {
    const float a0 = ptx::round_tf32(xk[kk][0]), a1 = ptx::round_tf32(xk[kk][2]);
    const float a2 = ptx::round_tf32(xk[kk][1]), a3 = ptx::round_tf32(xk[kk][3]);
#pragma unroll
    for (int n = kk; n < NT; ++n) {
      const float2 b = b_of(n, kk);
      ptx::mma_tf32(u[n], a0, a1, a2, a3, b.x, b.y);
      if constexpr (kSplit) ptx::mma_tf32(rest[n], a0, a1, a2, a3, ptx::tf32_rest(b.x), ptx::tf32_rest(b.y));
    }
  }
  if constexpr (kSplit) {
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int r = 0; r < 4; ++r) u[n][r] += rest[n][r];
  }
}
template <int NT, class LoadB>
__device__ __forceinline__ void solve_u_t(bool split, const float (&xk)[NT][4], float (&u)[NT][4], LoadB b_of) {
  if (split) {
    solve_terms<NT, true>(xk, u, b_of);
  } else {
    solve_terms<NT, false>(xk, u, b_of);
  }
}

// The arithmetic of one chunk on one warp's 16 rows (steps 1-4 above), from a stage as the view
// reads it; nothing but the lane's coordinates, whether v enters, the output scale and whether -T
// is solved in two terms.
template <class Tr, class View>
struct ChunkMath {
  using Stage = typename Tr::Stage;
  static constexpr int D = Tr::kDim;
  static constexpr int kTiles = D / 8;  // n8 tiles of the state
  using Prepared = KdaPrepared<D>;

  int cwarp, lane, g, t4;
  bool has_v;
  float scale;
  bool split_t;  // -T is stored exactly and solved in two terms (allow_neg_eigval; solve_u_t)

  // The whole chunk with tf32 products (the fused kernel's only path; the prepared plans' fallback).
  template <bool kOut>
  __device__ __forceinline__ void tf32_chunk(const Stage& st, float (&S)[kTiles][4], float (&xq)[2][4]) const {
    float xk[2][4], u[2][4];
    init_products(st, xk, xq);
    products_tf32<kOut>(st, S, xk, xq);
    solve_u(st, xk, u);
    finish<kOut, false, true>(st, S, xq, u);
  }
  // Out of line: by value, so that nothing of the caller's (its shared-memory references, the
  // consumer object) has to live in memory for the call.
  template <bool kOut>
  __device__ static __noinline__ void tf32_chunk_out_of_line(const ChunkMath m, const Stage& st,
                                                             float (&S)[kTiles][4], float (&xq)[2][4]) {
    m.tf32_chunk<kOut>(st, S, xq);
  }
  // Steps 3 and 4 in tf32 on an already decayed S (U does not fit fp16).
  template <bool kOut>
  __device__ static __noinline__ void tf32_finish_out_of_line(const ChunkMath m, const Stage& st,
                                                              float (&S)[kTiles][4], float (&xq)[2][4],
                                                              const float (&u)[2][4]) {
    m.finish<kOut, false, false>(st, S, xq, u);
  }

  // step 2: U^T = xk (-T)^T (tf32 MMAs; split_t: -T in two terms, solve_u_t's)
  __device__ void solve_u(const Stage& st, const float (&xk)[2][4], float (&u)[2][4]) const {
    solve_u_t<2>(split_t, xk, u, [&](int n, int kk) { return View::neg_t(st, 8 * n + g, 8 * kk + 2 * t4); });
  }

  // Whether every |U| of the warp fits fp16 (fmaxf skips NaN: a NaN u passes and propagates).
  __device__ static bool fits_f16(const float (&u)[2][4]) {
    const float b0 = fmaxf(fmaxf(fabsf(u[0][0]), fabsf(u[0][1])), fmaxf(fabsf(u[0][2]), fabsf(u[0][3])));
    const float b1 = fmaxf(fmaxf(fabsf(u[1][0]), fabsf(u[1][1])), fmaxf(fabsf(u[1][2]), fabsf(u[1][3])));
    return __all_sync(0xffffffffu, fmaxf(b0, b1) < 65504.f);
  }

  // Steps 3 and 4 from xq and U: O^T = xq scale + U^T M^T, S = S Diag(gamma) + U^T k_dec (U^T in
  // fp16 with kHalf, else tf32; kDecay: S Diag(gamma) here, else the caller has done it). The
  // prepared form (kScaleQ) has q_hat and M without `scale`, M in fp16: with kHalf the output
  // product is one m16n8k16 a token tile on U^T's fp16 fragments (those of the update), and `scale`
  // multiplies the sum; the fused kernel's fp32 stages have q_tilde and M with `scale` (tf32 products).
  template <bool kOut, bool kHalf, bool kDecay>
  __device__ __forceinline__ void finish(const Stage& st, float (&S)[kTiles][4], float (&xq)[2][4],
                                         const float (&u)[2][4]) const {
    float ua[2][4];  // U^T as tf32 A fragments (k positions t, t + 4 = tokens 2t, 2t + 1)
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
      ua[kk][0] = ptx::round_tf32(u[kk][0]), ua[kk][1] = ptx::round_tf32(u[kk][2]);
      ua[kk][2] = ptx::round_tf32(u[kk][1]), ua[kk][3] = ptx::round_tf32(u[kk][3]);
    }
    if constexpr (kOut && View::kScaleQ && kHalf) {
      const uint32_t af[4] = {ptx::pack_f16(u[0][0], u[0][1]), ptx::pack_f16(u[0][2], u[0][3]),
                              ptx::pack_f16(u[1][0], u[1][1]), ptx::pack_f16(u[1][2], u[1][3])};
      // tokens 0..7 (tile 0) see columns 0..7 only: the block above the diagonal is zero (b1 = 0)
      ptx::mma_f16(xq[0], af, View::m16(st, g, 2 * t4), 0u);
      ptx::mma_f16(xq[1], af, View::m16(st, 8 + g, 2 * t4), View::m16(st, 8 + g, 8 + 2 * t4));
    } else if constexpr (kOut) {
      // (tile n = 0, kk = 1 of M is above the diagonal: zero, and not stored in the prepared form)
#pragma unroll
      for (int kk = 0; kk < 2; ++kk)
#pragma unroll
        for (int n = kk; n < 2; ++n) {
          const float2 b = View::m(st, 8 * n + g, 8 * kk + 2 * t4);
          ptx::mma_tf32(xq[n], ua[kk][0], ua[kk][1], ua[kk][2], ua[kk][3], b.x, b.y);
        }
    }
    if constexpr (View::kScaleQ && kOut) {
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int r = 0; r < 4; ++r) xq[n][r] *= scale;
    }
    if constexpr (kDecay) decay(st, S);
    if constexpr (kHalf) {
      update_f16(st, S, u);
    } else {
      update_tf32(st, S, ua);
    }
  }

  __device__ void init_products(const Stage& st, float (&xk)[2][4], float (&xq)[2][4]) const {
    if (has_v) {
      View::neg_v(st, cwarp * 16, lane, xk);
    } else {
#pragma unroll
      for (int n = 0; n < 2; ++n) xk[n][0] = xk[n][1] = xk[n][2] = xk[n][3] = 0.f;
    }
#pragma unroll
    for (int n = 0; n < 2; ++n) xq[n][0] = xq[n][1] = xq[n][2] = xq[n][3] = 0.f;
  }

  // Step 1 with tf32 operands. Even and odd channel blocks of xk (needed first) go to separate
  // accumulators: six independent MMA chains instead of four.
  template <bool kOut>
  __device__ void products_tf32(const Stage& st, const float (&S)[kTiles][4], float (&xk)[2][4],
                                float (&xq)[2][4]) const {
    float xk_odd[2][4] = {};
#pragma unroll
    for (int j = 0; j < kTiles; ++j) {
      const float a0 = ptx::round_tf32(S[j][0]), a1 = ptx::round_tf32(S[j][2]);
      const float a2 = ptx::round_tf32(S[j][1]), a3 = ptx::round_tf32(S[j][3]);
      // (tokens g, g + 8) x (channels 2t, 2t + 1): the B pairs of both token halves.
      const float4 bk = View::k_frag(st, g, 8 * j + 2 * t4);
      float(&ck)[2][4] = j % 2 ? xk_odd : xk;
      ptx::mma_tf32(ck[0], a0, a1, a2, a3, bk.x, bk.z);
      ptx::mma_tf32(ck[1], a0, a1, a2, a3, bk.y, bk.w);
      if constexpr (kOut) {
        const float4 bq = View::q_frag(st, g, 8 * j + 2 * t4);
        ptx::mma_tf32(xq[0], a0, a1, a2, a3, bq.x, bq.z);
        ptx::mma_tf32(xq[1], a0, a1, a2, a3, bq.y, bq.w);
      }
    }
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int r = 0; r < 4; ++r) xk[n][r] += xk_odd[n][r];
  }

  // Step 1 with fp16 operands (the prepared plans): the state's accumulator tiles 2i and 2i + 1 are
  // the A fragment of step i as they stand (columns 2t, 2t + 1 and 8 + 2t, 9 + 2t), so no
  // permutation is needed; fp16 keeps tf32's 10-bit mantissa. A state entry of 65520 or more
  // becomes an infinity in fp16, and every product of an infinity is infinite or NaN (inf * 0 =
  // NaN), so xk alone shows it: some row's xk is then not finite, the whole warp returns false
  // and the caller recomputes the chunk's products in tf32 (which also covers inputs that are not
  // finite themselves). xq needs no check of its own: with the state finite in fp16 and
  // |q_hat| <= 1 its sums stay below D * 65504 (fp32 accumulation), and a non-finite q makes
  // xq non-finite on either path.
  template <bool kOut>
  __device__ bool products_f16(const Stage& st, const float (&S)[kTiles][4], float (&xk)[2][4],
                               float (&xq)[2][4]) const {
    // Four accumulators each for xk and xq (tiles n, even and odd steps i): a chain's next MMA
    // comes eight MMAs after its last one, so the warp does not wait on the accumulation.
    float xk_odd[2][4] = {}, xq_odd[2][4] = {};
#pragma unroll
    for (int i = 0; i < kTiles / 2; ++i) {
      // Each A fragment serves xk and xq at once and is dead after it (registers: 168 a thread with
      // 8 consumer warps).
      const uint32_t af[4] = {ptx::pack_f16(S[2 * i][0], S[2 * i][1]), ptx::pack_f16(S[2 * i][2], S[2 * i][3]),
                              ptx::pack_f16(S[2 * i + 1][0], S[2 * i + 1][1]),
                              ptx::pack_f16(S[2 * i + 1][2], S[2 * i + 1][3])};
      const uint4 bk = View::frag16(st, Prepared::kKTilde, i, lane);
      float(&ck)[2][4] = i % 2 ? xk_odd : xk;
      ptx::mma_f16(ck[0], af, bk.x, bk.y);
      ptx::mma_f16(ck[1], af, bk.z, bk.w);
      if constexpr (kOut) {
        const uint4 bq = View::frag16(st, Prepared::kQHat, i, lane);
        float(&cq)[2][4] = i % 2 ? xq_odd : xq;
        ptx::mma_f16(cq[0], af, bq.x, bq.y);
        ptx::mma_f16(cq[1], af, bq.z, bq.w);
      }
    }
    if constexpr (kOut) {
#pragma unroll
      for (int r = 0; r < 4; ++r) xq[0][r] += xq_odd[0][r], xq[1][r] += xq_odd[1][r];
    }
    float check[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      xk[0][r] += xk_odd[0][r], xk[1][r] += xk_odd[1][r];
      check[r] = xk[0][r] + xk[1][r];
    }
    const float sum = (check[0] + check[1]) + (check[2] + check[3]);  // non-finite if any term is
    return __all_sync(0xffffffffu, isfinite(sum));
  }

  // S <- S Diag(gamma): the chunk's decay of every state column.
  __device__ void decay(const Stage& st, float (&S)[kTiles][4]) const {
#pragma unroll
    for (int i = 0; i < kTiles / 2; ++i) {
      float4 gm;
      if constexpr (View::kHalfProducts) {
        gm = View::gamma4(st, i, t4);  // channels 16i + 2t, +1, 16i + 8 + 2t, +1 in one load
      } else {
        const float2 lo = View::gamma(st, 16 * i + 2 * t4), hi = View::gamma(st, 16 * i + 8 + 2 * t4);
        gm = make_float4(lo.x, lo.y, hi.x, hi.y);
      }
      float(&s0)[4] = S[2 * i];
      float(&s1)[4] = S[2 * i + 1];
      s0[0] *= gm.x, s0[1] *= gm.y, s0[2] *= gm.x, s0[3] *= gm.y;
      s1[0] *= gm.z, s1[1] *= gm.w, s1[2] *= gm.z, s1[3] *= gm.w;
    }
  }

  // Step 4 with tf32 operands (S already decayed): U^T as permuted A fragments, k_dec pairs in the
  // same permutation.
  __device__ void update_tf32(const Stage& st, float (&S)[kTiles][4], const float (&ua)[2][4]) const {
#pragma unroll
    for (int j = 0; j < kTiles; ++j) {
#pragma unroll
      for (int kk = 0; kk < 2; ++kk) {
        const float2 b = View::k_dec(st, 8 * j + g, 8 * kk + 2 * t4);
        ptx::mma_tf32(S[j], ua[kk][0], ua[kk][1], ua[kk][2], ua[kk][3], b.x, b.y);
      }
    }
  }

  // Step 4 with U^T in fp16 (one m16n8k16 per state tile, all 16 tokens; S already decayed; the
  // caller checked that U fits fp16).
  __device__ void update_f16(const Stage& st, float (&S)[kTiles][4], const float (&u)[2][4]) const {
    const uint32_t af[4] = {ptx::pack_f16(u[0][0], u[0][1]), ptx::pack_f16(u[0][2], u[0][3]),
                            ptx::pack_f16(u[1][0], u[1][1]), ptx::pack_f16(u[1][2], u[1][3])};
#pragma unroll
    for (int i = 0; i < kTiles / 2; ++i) {
      const uint4 kd = View::frag16(st, Prepared::kKDec, i, lane);
      ptx::mma_f16(S[2 * i], af, kd.x, kd.y);
      ptx::mma_f16(S[2 * i + 1], af, kd.z, kd.w);
    }
  }

};


// 32-token steps (docs/kernel.md, "32-token steps"): the arithmetic of one pair of chunks (a, b) on
// one warp's 16 rows, the prepared pair as KdaPrepared's pair format stores it (slot a, slot b of
// kPairSlot bytes each). The four steps above over 32 tokens: X and Xq have four n8 tiles (tokens
// 8n .. 8n + 7; n / 2 is the chunk), -T and M are 32 x 32 lower triangles made of the slots' own
// 16 x 16 blocks and the cross block [b][a], and the state is decayed and fed to the fp16
// products once per 32 tokens. Only the recurrence kernel walks pairs (PackedStageView, K = V = 128).
template <class Tr, class View>
struct PairMath {
  using Stage = typename Tr::Stage;
  static constexpr int D = Tr::kDim;
  static constexpr int kTiles = D / 8;
  static constexpr int NT = 4;  // n8 token tiles of a step
  using Prepared = KdaPrepared<D>;
  static constexpr int kSlot = Prepared::kPairSlot;
  static_assert(Tr::kChunk == 32 && View::kHalfProducts, "pairs of prepared chunks");

  int cwarp, lane, g, t4;
  bool has_v;
  float scale;
  bool split_t;  // -T is stored exactly and solved in two terms (allow_neg_eigval; solve_u_t)

  // the 16 x 16 block (token tiles n, kk of the step; kk <= n) of -T or M: a slot's own block, or
  // the cross block [b][a] (in slot a for -T, in slot b for M)
  __device__ static int block(int own, int n, int kk, bool neg_t) {
    return n / 2 == kk / 2 ? (n / 2) * kSlot + own : (neg_t ? 0 : kSlot) + Prepared::kCross;
  }

  template <bool kOut>
  __device__ __forceinline__ void tf32_chunk(const Stage& st, float (&S)[kTiles][4], float (&xq)[NT][4]) const {
    float xk[NT][4], u[NT][4];
    init_products(st, xk, xq);
    products_tf32<kOut>(st, S, xk, xq);
    solve_u(st, xk, u);
    finish<kOut, false, true>(st, S, xq, u);
  }
  template <bool kOut>
  __device__ static __noinline__ void tf32_chunk_out_of_line(const PairMath m, const Stage& st,
                                                             float (&S)[kTiles][4], float (&xq)[NT][4]) {
    m.tf32_chunk<kOut>(st, S, xq);
  }
  template <bool kOut>
  __device__ static __noinline__ void tf32_finish_out_of_line(const PairMath m, const Stage& st,
                                                              float (&S)[kTiles][4], float (&xq)[NT][4],
                                                              const float (&u)[NT][4]) {
    m.finish<kOut, false, false>(st, S, xq, u);
  }

  // step 2: U^T = xk (-T)^T over the 32 tokens (as ChunkMath's; blocks above the diagonal are zero)
  __device__ void solve_u(const Stage& st, const float (&xk)[NT][4], float (&u)[NT][4]) const {
    solve_u_t<NT>(split_t, xk, u, [&](int n, int kk) {
      return View::square(st, block(Prepared::kNegT, n, kk, true), 8 * (n % 2) + g, 8 * (kk % 2) + 2 * t4);
    });
  }

  __device__ static bool fits_f16(const float (&u)[NT][4]) {
    float b = 0.f;
#pragma unroll
    for (int n = 0; n < NT; ++n)
      b = fmaxf(b, fmaxf(fmaxf(fabsf(u[n][0]), fabsf(u[n][1])), fmaxf(fabsf(u[n][2]), fabsf(u[n][3]))));
    return __all_sync(0xffffffffu, b < 65504.f);
  }

  // (as ChunkMath::finish; M, M[b][a] in fp16 without `scale`: with kHalf the output product is
  // one m16n8k16 per token tile and chunk of U, on the update's fp16 fragments)
  template <bool kOut, bool kHalf, bool kDecay>
  __device__ __forceinline__ void finish(const Stage& st, float (&S)[kTiles][4], float (&xq)[NT][4],
                                         const float (&u)[NT][4]) const {
    float ua[NT][4];
#pragma unroll
    for (int kk = 0; kk < NT; ++kk) {
      ua[kk][0] = ptx::round_tf32(u[kk][0]), ua[kk][1] = ptx::round_tf32(u[kk][2]);
      ua[kk][2] = ptx::round_tf32(u[kk][1]), ua[kk][3] = ptx::round_tf32(u[kk][3]);
    }
    if constexpr (kOut && kHalf) {
      uint32_t af[2][4];  // U^T of chunk h's 16 tokens (k), as update_f16 forms them
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        af[h][0] = ptx::pack_f16(u[2 * h][0], u[2 * h][1]), af[h][1] = ptx::pack_f16(u[2 * h][2], u[2 * h][3]);
        af[h][2] = ptx::pack_f16(u[2 * h + 1][0], u[2 * h + 1][1]);
        af[h][3] = ptx::pack_f16(u[2 * h + 1][2], u[2 * h + 1][3]);
      }
      // token tile n (chunk n / 2, rows 8 (n % 2) ..) against chunk h's tokens: M_aa, M[b][a], M_bb;
      // the block above a diagonal square's diagonal is zero (b1 = 0)
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int h = 0; h <= n / 2; ++h) {
          const int off = block(Prepared::kM, n, 2 * h, false), t = 8 * (n % 2) + g;
          const uint32_t b0 = View::half_square(st, off, t, 2 * t4);
          const uint32_t b1 = (h < n / 2 || n % 2) ? View::half_square(st, off, t, 8 + 2 * t4) : 0u;
          ptx::mma_f16(xq[n], af[h], b0, b1);
        }
    } else if constexpr (kOut) {
#pragma unroll
      for (int kk = 0; kk < NT; ++kk)
#pragma unroll
        for (int n = kk; n < NT; ++n) {
          const float2 b =
              View::half_square_f(st, block(Prepared::kM, n, kk, false), 8 * (n % 2) + g, 8 * (kk % 2) + 2 * t4);
          ptx::mma_tf32(xq[n], ua[kk][0], ua[kk][1], ua[kk][2], ua[kk][3], b.x, b.y);
        }
    }
    if constexpr (kOut) {
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int r = 0; r < 4; ++r) xq[n][r] *= scale;
    }
    if constexpr (kDecay) decay(st, S);
    if constexpr (kHalf) {
      update_f16(st, S, u);
    } else {
      update_tf32(st, S, ua);
    }
  }

  // -v of this warp's rows as the C fragments of xk: one transposing ldmatrix a chunk (as
  // PackedStageView::neg_v, tokens 16h ..).
  __device__ void init_products(const Stage& st, float (&xk)[NT][4], float (&xq)[NT][4]) const {
#pragma unroll
    for (int n = 0; n < NT; ++n) xq[n][0] = xq[n][1] = xq[n][2] = xq[n][3] = 0.f;
    if (!has_v) {
#pragma unroll
      for (int n = 0; n < NT; ++n) xk[n][0] = xk[n][1] = xk[n][2] = xk[n][3] = 0.f;
      return;
    }
    const int m = lane >> 3, r = lane & 7, r0 = cwarp * 16;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint4 p = ptx::ldmatrix_x4_trans(&st.v[16 * h + 8 * (m >> 1) + r][r0 + 8 * (m & 1)]);
      const uint32_t w[4] = {p.x ^ 0x80008000u, p.y ^ 0x80008000u, p.z ^ 0x80008000u, p.w ^ 0x80008000u};
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        xk[2 * h + (q >> 1)][2 * (q & 1)] = __uint_as_float(w[q] << 16);
        xk[2 * h + (q >> 1)][2 * (q & 1) + 1] = __uint_as_float(w[q] & 0xffff0000u);
      }
    }
  }

  template <bool kOut>
  __device__ void products_tf32(const Stage& st, const float (&S)[kTiles][4], float (&xk)[NT][4],
                                float (&xq)[NT][4]) const {
#pragma unroll
    for (int j = 0; j < kTiles; ++j) {
      const float a0 = ptx::round_tf32(S[j][0]), a1 = ptx::round_tf32(S[j][2]);
      const float a2 = ptx::round_tf32(S[j][1]), a3 = ptx::round_tf32(S[j][3]);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float4 bk = View::kq(st, h * kSlot + Prepared::kKTilde, g, 8 * j + 2 * t4);
        ptx::mma_tf32(xk[2 * h], a0, a1, a2, a3, bk.x, bk.z);
        ptx::mma_tf32(xk[2 * h + 1], a0, a1, a2, a3, bk.y, bk.w);
        if constexpr (kOut) {
          const float4 bq = View::kq(st, h * kSlot + Prepared::kQHat, g, 8 * j + 2 * t4);
          ptx::mma_tf32(xq[2 * h], a0, a1, a2, a3, bq.x, bq.z);
          ptx::mma_tf32(xq[2 * h + 1], a0, a1, a2, a3, bq.y, bq.w);
        }
      }
    }
  }

  // Step 1 in fp16 (ChunkMath::products_f16 over both chunks: the four token tiles are four
  // independent accumulator chains each for xk and xq).
  template <bool kOut>
  __device__ bool products_f16(const Stage& st, const float (&S)[kTiles][4], float (&xk)[NT][4],
                               float (&xq)[NT][4]) const {
#pragma unroll
    for (int i = 0; i < kTiles / 2; ++i) {
      const uint32_t af[4] = {ptx::pack_f16(S[2 * i][0], S[2 * i][1]), ptx::pack_f16(S[2 * i][2], S[2 * i][3]),
                              ptx::pack_f16(S[2 * i + 1][0], S[2 * i + 1][1]),
                              ptx::pack_f16(S[2 * i + 1][2], S[2 * i + 1][3])};
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint4 bk = View::frag16(st, h * kSlot + Prepared::kKTilde, i, lane);
        ptx::mma_f16(xk[2 * h], af, bk.x, bk.y);
        ptx::mma_f16(xk[2 * h + 1], af, bk.z, bk.w);
        if constexpr (kOut) {
          const uint4 bq = View::frag16(st, h * kSlot + Prepared::kQHat, i, lane);
          ptx::mma_f16(xq[2 * h], af, bq.x, bq.y);
          ptx::mma_f16(xq[2 * h + 1], af, bq.z, bq.w);
        }
      }
    }
    float check[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) check[r] = (xk[0][r] + xk[1][r]) + (xk[2][r] + xk[3][r]);
    const float sum = (check[0] + check[1]) + (check[2] + check[3]);
    return __all_sync(0xffffffffu, isfinite(sum));
  }

  // S <- S Diag(gamma_a gamma_b): slot a's gamma is the pair's decay, where ChunkMath reads a
  // chunk's
  __device__ void decay(const Stage& st, float (&S)[kTiles][4]) const {
    ChunkMath<Tr, View>{cwarp, lane, g, t4, has_v, scale, split_t}.decay(st, S);
  }

  __device__ void update_tf32(const Stage& st, float (&S)[kTiles][4], const float (&ua)[NT][4]) const {
#pragma unroll
    for (int j = 0; j < kTiles; ++j)
#pragma unroll
      for (int kk = 0; kk < NT; ++kk) {
        const float2 b = View::word(st, (kk / 2) * kSlot + Prepared::kKDec,
                                    Prepared::k_dec_word(8 * j + g, (8 * (kk % 2) + 2 * t4) / 2));
        ptx::mma_tf32(S[j], ua[kk][0], ua[kk][1], ua[kk][2], ua[kk][3], b.x, b.y);
      }
  }

  // Step 4 with U^T in fp16: one m16n8k16 per state tile and chunk (k = the chunk's 16 tokens).
  __device__ void update_f16(const Stage& st, float (&S)[kTiles][4], const float (&u)[NT][4]) const {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t af[4] = {ptx::pack_f16(u[2 * h][0], u[2 * h][1]), ptx::pack_f16(u[2 * h][2], u[2 * h][3]),
                              ptx::pack_f16(u[2 * h + 1][0], u[2 * h + 1][1]),
                              ptx::pack_f16(u[2 * h + 1][2], u[2 * h + 1][3])};
#pragma unroll
      for (int i = 0; i < kTiles / 2; ++i) {
        const uint4 kd = View::frag16(st, h * kSlot + Prepared::kKDec, i, lane);
        ptx::mma_f16(S[2 * i], af, kd.x, kd.y);
        ptx::mma_f16(S[2 * i + 1], af, kd.z, kd.w);
      }
    }
  }
};

template <class Tr, class View>
struct KdaConsumer {
  using Stage = typename Tr::Stage;
  static constexpr int C = Tr::kChunk;  // tokens a step: 16, or 32 (pairs)
  static constexpr int NT = C / 8;      // n8 token tiles of a step
  static constexpr int D = Tr::kDim;
  static constexpr int kTiles = D / 8;  // n8 tiles of the state
  using Math = std::conditional_t<Tr::kPair, PairMath<Tr, View>, ChunkMath<Tr, View>>;

  const KdaFwdArgs& a;
  const WorkUnit& w;
  const RowsIO& io;
  typename Tr::Smem& sm;
  int cwarp, lane, g, t4;
  Math m;

  __device__ KdaConsumer(const KdaFwdArgs& args, const WorkUnit& work, const RowsIO& rows, typename Tr::Smem& smem,
                         int warp, int ln)
      : a(args),
        w(work),
        io(rows),
        sm(smem),
        cwarp(warp),
        lane(ln),
        g(ln >> 2),
        t4(ln & 3),
        m{warp, ln, ln >> 2, ln & 3, rows.has_v, args.scale, exact_neg_t(args)} {}

  __device__ void load_state(float (&S)[kTiles][4]) const {
    if (io.init == nullptr) {
      // Zeros, or the identity: row r of the slice is e_r (the transition rows start as I).
      const int r0 = io.row0 + cwarp * 16 + g;
#pragma unroll
      for (int j = 0; j < kTiles; ++j) {
        const int c = 8 * j + 2 * t4;
        S[j][0] = io.identity && r0 == c ? 1.f : 0.f;
        S[j][1] = io.identity && r0 == c + 1 ? 1.f : 0.f;
        S[j][2] = io.identity && r0 + 8 == c ? 1.f : 0.f;
        S[j][3] = io.identity && r0 + 8 == c + 1 ? 1.f : 0.f;
      }
      return;
    }
    const int64_t base = io.init_offset + int64_t(cwarp) * 16 * D;
#pragma unroll
    for (int j = 0; j < kTiles; ++j) {
      const int64_t o0 = base + int64_t(g) * D + 8 * j + 2 * t4, o1 = o0 + 8 * D;
      if (io.init_fp32) {
        const float* s = static_cast<const float*>(io.init);
        const float2 lo = *reinterpret_cast<const float2*>(s + o0), hi = *reinterpret_cast<const float2*>(s + o1);
        S[j][0] = lo.x, S[j][1] = lo.y, S[j][2] = hi.x, S[j][3] = hi.y;
      } else {
        const __nv_bfloat16* s = static_cast<const __nv_bfloat16*>(io.init);
        const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(s + o0));
        const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(s + o1));
        S[j][0] = lo.x, S[j][1] = lo.y, S[j][2] = hi.x, S[j][3] = hi.y;
      }
    }
  }

  __device__ void store_state(const float (&S)[kTiles][4]) const {
    if (io.dst == nullptr) return;
    store_rows(S, io.dst, io.dst_offset, io.dst_fp32);
  }

  // This warp's 16 rows of S into a [*, HV, D, D] state tensor whose slice starts at element
  // `offset` (row io.row0 of the slot and head).
  __device__ void store_rows(const float (&S)[kTiles][4], void* dst, int64_t offset, bool fp32) const {
    const int64_t base = offset + int64_t(cwarp) * 16 * D;
#pragma unroll
    for (int j = 0; j < kTiles; ++j) {
      const int64_t o0 = base + int64_t(g) * D + 8 * j + 2 * t4, o1 = o0 + 8 * D;
      if (fp32) {
        float* s = static_cast<float*>(dst);
        *reinterpret_cast<float2*>(s + o0) = make_float2(S[j][0], S[j][1]);
        *reinterpret_cast<float2*>(s + o1) = make_float2(S[j][2], S[j][3]);
      } else {
        __nv_bfloat16* s = static_cast<__nv_bfloat16*>(dst);
        *reinterpret_cast<__nv_bfloat162*>(s + o0) = __floats2bfloat162_rn(S[j][0], S[j][1]);
        *reinterpret_cast<__nv_bfloat162*>(s + o1) = __floats2bfloat162_rn(S[j][2], S[j][3]);
      }
    }
  }

  __device__ void run() {
    if (io.write_out) {
      walk<true>();
    } else {
      walk<false>();
    }
  }

  // kOut: the rows produce out (q_tilde and M are read); otherwise only the state advances.
  template <bool kOut>
  __device__ void walk() {
    float S[kTiles][4];
    load_state(S);  // the whole slice is read before anything is written: in-place updates are safe
    const int nchunks = io.nchunks;
    RingPos<Tr::kStages> ring;
    OutCursor out = out_cursor();
    if constexpr (View::kCheckpoints && kOut) {
      // Checkpoints (RowsIO::ck_*): the walk runs in pieces that end at a boundary chunk, so the
      // chunk loop itself carries nothing more than without checkpoints (the schedule is read
      // from shared memory between pieces).
      // A piece ends after a boundary chunk or at the walk's end; past the last boundary (or with
      // none, ck_last = -1) b > ck_last.
      int i = 0, stop = io.ck_next >= 0 ? io.ck_next + 1 : nchunks;
      for (;;) {
        for (; i < stop; ++i) chunk<kOut>(S, ring, out, i, nchunks);
        const int b = i - 1, last = View::checkpoint_last(sm);
        stop = nchunks;
        if (b >= 0 && b <= last) {  // S is the state after a boundary token
          const int32_t slot = View::checkpoint_slot(sm, b);
          // A slot outside [0, P2) is skipped like -1 (device contents are not checked on the host).
          if (slot >= 0 && slot < a.checkpoint_pool_size)
            store_rows(S, a.checkpoint_state, state_row_offset<D>(slot, a.heads_v, w.hv, io.row0), a.checkpoint_fp32);
          const int step = View::checkpoint_step(sm);
          if (b + step <= last) stop = b + step + 1;
        }
        if (i >= nchunks) break;
      }
    } else {
      for (int i = 0; i < nchunks; ++i) chunk<kOut>(S, ring, out, i, nchunks);
    }
    store_state(S);
  }

  // Where this lane writes out: 8 value channels (16 bytes) of token `tok` of the sequence (on the
  // walk's grid; tokens outside [0, w.len) are not written). 32-bit token counts: a sequence of 2^31
  // tokens would need 512 GB of q alone.
  struct OutCursor {
    uint16_t* ptr;  // the lane's channels at token `tok`
    int tok;
  };
  __device__ OutCursor out_cursor() const {
    const int t = lane >> 1, half = lane & 1;
    // (below 0: a virtual token, docs/kernel.md; the fused kernel's grid is never shifted)
    const int tok = io.chunk0 * kChunkTokens + t - (View::kCheckpoints ? int(w.shift) : 0);
    uint16_t* base = a.out + w.row * a.out_s[0] + w.begin * a.out_s[1] + int64_t(w.hv) * a.out_s[2] +
                     io.row0 + cwarp * 16 + half * 8;
    return OutCursor{base + int64_t(tok) * a.out_s[1], tok};
  }

  // A rare tf32 step runs out of line on a copy of S (and xq), so that it shapes neither the fast
  // path's registers nor its code (with 8 consumer warps a thread has 168 registers).
  template <int kRows>
  __device__ __forceinline__ static void copy(float (&dst)[kRows][4], const float (&src)[kRows][4]) {
#pragma unroll
    for (int j = 0; j < kRows; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) dst[j][r] = src[j][r];
  }
  template <class Step>
  __device__ __forceinline__ static void rare_path(float (&S)[kTiles][4], float (&xq)[NT][4], Step step) {
    float s_copy[kTiles][4], xq_copy[NT][4];
    copy(s_copy, S);
    copy(xq_copy, xq);
    step(s_copy, xq_copy);
    copy(S, s_copy);
    copy(xq, xq_copy);
  }

  // Walk chunk i: S from the state before chunk io.chunk0 + i to the state after it, out written.
  // The prepared plans take the fp16 path when its range checks pass: non-finite products redo the
  // whole chunk in tf32 from the unchanged S, a U that does not fit fp16 runs steps 3 and 4 in tf32.
  template <bool kOut>
  __device__ __forceinline__ void chunk(float (&S)[kTiles][4], RingPos<Tr::kStages>& ring, OutCursor& out, int i,
                                        int nchunks) {
    const Stage& st = View::acquire(sm, ring);
    float xq[NT][4];
    if constexpr (View::kHalfProducts) {
      float xk[NT][4], u[NT][4];
      m.init_products(st, xk, xq);
      if (m.template products_f16<kOut>(st, S, xk, xq)) {  // step 1 (S unchanged)
        m.decay(st, S);  // S Diag(gamma) of step 4 needs nothing of U: it overlaps step 2
        m.solve_u(st, xk, u);
        if (m.fits_f16(u)) {
          m.template finish<kOut, true, false>(st, S, xq, u);
        } else {
          rare_path(S, xq, [&](float(&s_copy)[kTiles][4], float(&xq_copy)[NT][4]) {
            float u_copy[NT][4];  // (u itself stays in registers)
            copy(u_copy, u);
            Math::template tf32_finish_out_of_line<kOut>(m, st, s_copy, xq_copy, u_copy);
          });
        }
      } else {
        rare_path(S, xq, [&](float(&s_copy)[kTiles][4], float(&xq_copy)[NT][4]) {
          Math::template tf32_chunk_out_of_line<kOut>(m, st, s_copy, xq_copy);
        });
      }
    } else {
      m.template tf32_chunk<kOut>(st, S, xq);
    }
    View::release(sm, ring, i, nchunks, lane);
    ring.advance();
    if constexpr (kOut) store_output(xq, out);
  }

  // Stages the warp's 16 rows x C tokens of O^T through shared memory so that every lane writes
  // 16 contiguous bytes (8 value channels of one token; C = 32: two tokens 16 apart), and moves the
  // cursor to the next step.
  __device__ void store_output(const float (&o)[NT][4], OutCursor& out) {
    uint16_t(*stage)[16] = sm.out_stage[cwarp];
    __syncwarp();
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      const int t = 8 * n + 2 * t4;
      stage[t][g] = __bfloat16_as_ushort(__float2bfloat16_rn(o[n][0]));
      stage[t + 1][g] = __bfloat16_as_ushort(__float2bfloat16_rn(o[n][1]));
      stage[t][g + 8] = __bfloat16_as_ushort(__float2bfloat16_rn(o[n][2]));
      stage[t + 1][g + 8] = __bfloat16_as_ushort(__float2bfloat16_rn(o[n][3]));
    }
    __syncwarp();
    if (out.tok >= 0 && out.tok < w.len)
      *reinterpret_cast<uint4*>(out.ptr) = *reinterpret_cast<const uint4*>(&stage[lane >> 1][(lane & 1) * 8]);
    if constexpr (C == 32) {
      if (out.tok + 16 >= 0 && out.tok + 16 < w.len)  // (a shifted grid: up to 31 virtual tokens)
        *reinterpret_cast<uint4*>(out.ptr + 16 * a.out_s[1]) =
            *reinterpret_cast<const uint4*>(&stage[16 + (lane >> 1)][(lane & 1) * 8]);
    }
    out.ptr += C * a.out_s[1];
    out.tok += C;
  }
};

}  // namespace flash_kda::cuda::sm90
