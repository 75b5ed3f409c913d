// The preparation pass of the prepared plans: every chunk of every (sequence, value head) is
// prepared once, chunk-parallel, and stored in the workspace in the compact form KdaPrepared
// (kda_fwd_traits.cuh; docs/kernel.md, "Plans").
//
// One warp prepares one chunk alone: no barrier beyond its own __syncwarp, so a CTA's warps never
// wait for each other and the SM's 8 warps (2 CTAs of 4) overlap one another's latencies. A CTA
// takes PlanArgs::prep_chunks consecutive chunks of one (sequence, value head); warp w prepares
// chunks c0 + w, c0 + w + kWarps, ...
//
// Lane l owns the channels c_j of the column set of an m16n8k16 fragment, for all 16 tokens:
// b = l / 4, t = l % 4, c_0..3 = 16b + 2t, 16b + 2t + 1, 16b + 2t + 8, 16b + 2t + 9. With that
// ownership every 16-byte unit of the fp16 tiles (k_tilde, q_hat, k_dec) and of gamma in
// KdaPrepared is one lane's store, the gates are a prefix sum inside the lane, and only the norms
// need the whole warp (a butterfly reduction: 31 shuffles for the 32 sums of squares).
//
// Per chunk (t, s tokens; G_t = sum_{u <= t} a_u in base 2):
//   loads    q, k, g: two 4-byte words a token each; beta: lanes 0..15, one token each
//   norms    rq_t = 1 / ||q_t||, rk_t = 1 / ||k_t|| (eps inside the root), beta_t = sigmoid
//   gates    a_t = lower_bound * sigmoid(exp(A_log) (g_t + dt_bias)), G_t, gamma = 2^{G_last}
//   tiles    k_tilde = k_hat 2^{G_t}, q_hat 2^{G_t}, k_bar = k_hat 2^{-G_t} (tf32, into the warp's
//            shared tiles for the products) and k_dec = k_hat 2^{G_last - G_t} (fp16, out)
//   A, M     k_tilde k_bar^T and q_tilde k_bar^T with tf32 MMAs over the shared tiles
//   -T       -(I + diag(beta) strict_lower(A))^{-1} diag(beta), forward substitution in fp32 on 16
//            lanes (one column each)
// Chunk-start references: with lower_bound >= -5, 2^{-G_t} <= 2^{115.4} and 2^{G_t} >= 2^{-115.4}
// are normal fp32 numbers; the masked entries of A and M are selected away, never multiplied.
#pragma once

#include <cuda_fp16.h>

#include "../common/ptx.cuh"
#include "kda_plan.cuh"

namespace flash_kda::cuda::sm90 {

struct KdaPrepWarp {
  using Tr = KdaPrepTraits;
  // The chunk's 8 x (2 x 128) token-interleaved tf32 tile: element (t, c) at [t % 8][col(2c + t / 8)].
  // An A fragment of the products (tokens g, g + 8; channels c, c + 1) or both B pairs is one
  // 16-byte load. col() flips bit 4 of the column where bit 5 is set, so that the 16-byte stores
  // of a quarter-warp (channel blocks 2i and 2i + 1, 32 floats apart) hit distinct banks too.
  __device__ static int col(int x) { return x ^ ((x & 32) >> 1); }

  static constexpr int C = KdaDims::kChunk;
  static constexpr int D = KdaDims::kDim;
  static constexpr float kLog2e = 1.4426950408889634f;

  const KdaFwdArgs& a;
  KdaPrepTraits::WarpSmem& sm;
  int lane, g, t4;  // MMA fragment coordinates
  int c0;           // this lane's first channel (elementwise phases)
  const uint16_t *q_lane, *k_lane, *g_lane, *beta_lane;
  int64_t q_ts, k_ts, g_ts, beta_ts;  // token strides (elements)
  int64_t len;
  float gmul, gadd[4];  // -exp(A_log) log2(e) (g + dt_bias) = g * gmul + gadd[j]
  float lb2;            // lower_bound * log2(e)

  __device__ KdaPrepWarp(const KdaFwdArgs& args, const WorkUnit& w, KdaPrepTraits::WarpSmem& smem, int ln)
      : a(args), sm(smem), lane(ln), g(ln >> 2), t4(ln & 3), c0(16 * (ln >> 2) + 2 * (ln & 3)) {
    const int hq = w.hv / a.group;
    q_lane = a.q + w.row * a.q_s[0] + w.begin * a.q_s[1] + hq * a.q_s[2] + c0;
    k_lane = a.k + w.row * a.k_s[0] + w.begin * a.k_s[1] + hq * a.k_s[2] + c0;
    g_lane = a.g + w.row * a.g_s[0] + w.begin * a.g_s[1] + int64_t(w.hv) * a.g_s[2] + c0;
    beta_lane = a.beta + w.row * a.beta_s[0] + (w.begin + (ln & 15)) * a.beta_s[1] + int64_t(w.hv) * a.beta_s[2];
    q_ts = a.q_s[1], k_ts = a.k_s[1], g_ts = a.g_s[1], beta_ts = a.beta_s[1];
    len = w.len;
    gmul = (a.A_log != nullptr ? -expf(a.A_log[w.hv]) : -1.f) * kLog2e;
    const float* bias = a.dt_bias + int64_t(w.hv) * D + c0;
    gadd[0] = gmul * bias[0], gadd[1] = gmul * bias[1], gadd[2] = gmul * bias[8], gadd[3] = gmul * bias[9];
    lb2 = a.lower_bound_log2;
  }

  __device__ static float lo(uint32_t w) { return __uint_as_float(w << 16); }
  __device__ static float hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
  // The same conversions, spelled as byte permutes for the norms: the compiler then cannot keep
  // the norms' fp32 copies of all 64 words alive for the tiles (it would, to save the
  // conversions, at twice the registers).
  __device__ static float lo_p(uint32_t w) { return __uint_as_float(__byte_perm(w, 0u, 0x1044)); }
  __device__ static float hi_p(uint32_t w) { return __uint_as_float(__byte_perm(w, 0u, 0x3244)); }
  __device__ static uint32_t ld32(const uint16_t* p) { return __ldg(reinterpret_cast<const unsigned int*>(p)); }

  // One step of the reduction: lanes with bit O set keep items O..2O-1, the others 0..O-1, each
  // adding its partner's copy (lane ^ O) of the items it keeps.
  template <int O>
  __device__ void halve(float (&v)[2 * KdaDims::kChunk]) const {
    const bool up = lane & O;
#pragma unroll
    for (int i = 0; i < O; ++i) {
      const float send = up ? v[i] : v[i + O];
      const float keep = up ? v[i + O] : v[i];
      v[i] = keep + __shfl_xor_sync(0xffffffffu, send, O);
    }
  }

  __device__ void run(int chunk, unsigned char* dst) {
    const int valid = int(min(int64_t(C), len - int64_t(chunk) * C));
    if (valid == C) {
      prepare<true>(chunk, valid, dst);
    } else {
      prepare<false>(chunk, valid, dst);
    }
  }

  template <bool kFull>
  __device__ void prepare(int chunk, int valid, unsigned char* dst) {
    const int64_t tok0 = int64_t(chunk) * C;
    // Loads: every word of the chunk is requested before any is used.
    uint32_t qw[C][2], kw[C][2], gw[C][2];
#pragma unroll
    for (int u = 0; u < C; ++u) {
      const bool ok = kFull || u < valid;
      const uint16_t* qp = q_lane + (tok0 + u) * q_ts;
      const uint16_t* kp = k_lane + (tok0 + u) * k_ts;
      const uint16_t* gp = g_lane + (tok0 + u) * g_ts;
      qw[u][0] = ok ? ld32(qp) : 0u, qw[u][1] = ok ? ld32(qp + 8) : 0u;
      kw[u][0] = ok ? ld32(kp) : 0u, kw[u][1] = ok ? ld32(kp + 8) : 0u;
      gw[u][0] = ok ? ld32(gp) : 0u, gw[u][1] = ok ? ld32(gp + 8) : 0u;
    }
    const int bt = lane & 15;
    const float beta_raw =
        (lane < C && (kFull || bt < valid)) ? lo(uint32_t(__ldg(beta_lane + tok0 * beta_ts))) : 0.f;
    // sigmoid(x) = 1 / (1 + 2^{-x log2 e}); ex2/rcp.approx reach exactly 0 and 1 at the extremes.
    const float beta = (lane < C && (kFull || bt < valid)) ? ptx::rcp(1.f + ptx::ex2(-kLog2e * beta_raw)) : 0.f;

    // Gates of the lane's four channels, prefix-summed in base 2. G of tokens n and n + 8 waits in
    // the q_tilde tile, at the very words q_tilde (n, c), (n + 8, c) will take (this lane's own):
    // the tile loop reads them just before it writes those words.
    const int col_a = KdaPrepWarp::col(2 * c0), col_b = KdaPrepWarp::col(2 * c0 + 16);
    float gsum[4] = {0.f, 0.f, 0.f, 0.f};
    {
      float G_lo[C / 2][4];  // tokens 0..7
#pragma unroll
      for (int u = 0; u < C; ++u) {
        const float x[4] = {lo(gw[u][0]), hi(gw[u][0]), lo(gw[u][1]), hi(gw[u][1])};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float sig = ptx::rcp(1.f + ptx::ex2(fmaf(x[j], gmul, gadd[j])));
          if (kFull || u < valid) gsum[j] = fmaf(lb2, sig, gsum[j]);
          if (u < C / 2) G_lo[u][j] = gsum[j];
        }
        if (u >= C / 2) {
          const int n = u - C / 2;
          *reinterpret_cast<float4*>(&sm.q[n][col_a]) = make_float4(G_lo[n][0], gsum[0], G_lo[n][1], gsum[1]);
          *reinterpret_cast<float4*>(&sm.q[n][col_b]) = make_float4(G_lo[n][2], gsum[2], G_lo[n][3], gsum[3]);
        }
      }
    }
    // Norms: lane l ends with the sum of squares of item l (q of token l for l < 16, else k of
    // token l - 16), reduced over the warp by halving exchanges.
    float v[2 * C];
#pragma unroll
    for (int u = 0; u < C; ++u) {
      float sq = 0.f, sk = 0.f;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float q0 = lo_p(qw[u][h]), q1 = hi_p(qw[u][h]), k0 = lo_p(kw[u][h]), k1 = hi_p(kw[u][h]);
        sq = fmaf(q0, q0, sq), sq = fmaf(q1, q1, sq);
        sk = fmaf(k0, k0, sk), sk = fmaf(k1, k1, sk);
      }
      v[u] = sq, v[C + u] = sk;
    }
    halve<16>(v), halve<8>(v), halve<4>(v), halve<2>(v), halve<1>(v);
    const float rnorm = rsqrtf(v[0] + 1e-6f);  // eps inside the root, as the contract says

    const int b = lane >> 2;
    float gamma[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) gamma[j] = ptx::ex2(gsum[j]);  // G of the last token
    *reinterpret_cast<float4*>(dst + KdaPrepared::kGamma + 16 * (4 * b + t4)) =
        make_float4(gamma[0], gamma[1], gamma[2], gamma[3]);

    // Tiles, tokens n and n + 8 together (they share the 16-byte units of the fp16 tiles and the
    // interleaved pairs of the shared tiles).
    float kd_even[8];  // k_dec of the even token pair, stored with the odd one's
#pragma unroll
    for (int n = 0; n < C / 2; ++n) {
      float kt[2][4], qt[2][4], kb[2][4], kd[2][4];
      const float4 ga = *reinterpret_cast<const float4*>(&sm.q[n][col_a]);
      const float4 gb = *reinterpret_cast<const float4*>(&sm.q[n][col_b]);
      const float G[2][4] = {{ga.x, ga.z, gb.x, gb.z}, {ga.y, ga.w, gb.y, gb.w}};  // [h][j]
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int u = n + 8 * h;
        const float rq = __shfl_sync(0xffffffffu, rnorm, u);
        const float rk = __shfl_sync(0xffffffffu, rnorm, C + u);
        const float kx[4] = {lo(kw[u][0]), hi(kw[u][0]), lo(kw[u][1]), hi(kw[u][1])};
        const float qx[4] = {lo(qw[u][0]), hi(qw[u][0]), lo(qw[u][1]), hi(qw[u][1])};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float e = ptx::ex2(G[h][j]);   // in [2^-115.4, 1]
          const float r = ptx::ex2(-G[h][j]);  // in [1, 2^115.4]; independent of e
          const float kh = kx[j] * rk;
          kt[h][j] = kh * e;
          qt[h][j] = qx[j] * rq * e;
          kb[h][j] = kh * r;
          kd[h][j] = kh * (gamma[j] * r);  // gamma <= e: the factor is <= 1
        }
      }
      // fp16 units of k_tilde and q_hat: words (n, c0..c0+1), (n, c0+8..9), (n+8, ...), (n+8, ...)
      const int unit = 16 * ((8 * b + n) * 4 + t4);
      *reinterpret_cast<uint4*>(dst + KdaPrepared::kKTilde + unit) =
          make_uint4(ptx::pack_f16(kt[0][0], kt[0][1]), ptx::pack_f16(kt[0][2], kt[0][3]),
                     ptx::pack_f16(kt[1][0], kt[1][1]), ptx::pack_f16(kt[1][2], kt[1][3]));
      *reinterpret_cast<uint4*>(dst + KdaPrepared::kQHat + unit) =
          make_uint4(ptx::pack_f16(qt[0][0], qt[0][1]), ptx::pack_f16(qt[0][2], qt[0][3]),
                     ptx::pack_f16(qt[1][0], qt[1][1]), ptx::pack_f16(qt[1][2], qt[1][3]));
      // tf32 shared tiles: (n, c), (n + 8, c), (n, c + 1), (n + 8, c + 1) for c = c0 and c0 + 8.
      using ptx::round_tf32;
      *reinterpret_cast<float4*>(&sm.a[n][col_a]) =
          make_float4(round_tf32(kt[0][0]), round_tf32(kt[1][0]), round_tf32(kt[0][1]), round_tf32(kt[1][1]));
      *reinterpret_cast<float4*>(&sm.a[n][col_b]) =
          make_float4(round_tf32(kt[0][2]), round_tf32(kt[1][2]), round_tf32(kt[0][3]), round_tf32(kt[1][3]));
      *reinterpret_cast<float4*>(&sm.b[n][col_a]) =
          make_float4(round_tf32(kb[0][0]), round_tf32(kb[1][0]), round_tf32(kb[0][1]), round_tf32(kb[1][1]));
      *reinterpret_cast<float4*>(&sm.b[n][col_b]) =
          make_float4(round_tf32(kb[0][2]), round_tf32(kb[1][2]), round_tf32(kb[0][3]), round_tf32(kb[1][3]));
      *reinterpret_cast<float4*>(&sm.q[n][col_a]) =
          make_float4(round_tf32(qt[0][0]), round_tf32(qt[1][0]), round_tf32(qt[0][1]), round_tf32(qt[1][1]));
      *reinterpret_cast<float4*>(&sm.q[n][col_b]) =
          make_float4(round_tf32(qt[0][2]), round_tf32(qt[1][2]), round_tf32(qt[0][3]), round_tf32(qt[1][3]));
      // k_dec: the unit of (channel c0 + e, token pairs w4 and w4 + 4) holds words (c0 + e, w4),
      // (c0 + e, w4 + 4), (c0 + 8 + e, w4), (c0 + 8 + e, w4 + 4); token pair w4 = (n - 1, n) here.
      if (n % 2 == 0) {
#pragma unroll
        for (int x = 0; x < 4; ++x) kd_even[x] = kd[0][x], kd_even[4 + x] = kd[1][x];
      } else {
        const int w4 = n / 2;
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          *reinterpret_cast<uint4*>(dst + KdaPrepared::kKDec + 16 * ((8 * b + 2 * t4 + e) * 4 + w4)) =
              make_uint4(ptx::pack_f16(kd_even[e], kd[0][e]), ptx::pack_f16(kd_even[4 + e], kd[1][e]),
                         ptx::pack_f16(kd_even[2 + e], kd[0][2 + e]), ptx::pack_f16(kd_even[6 + e], kd[1][2 + e]));
        }
      }
    }
    __syncwarp();

    // A = k_tilde k_bar^T: rows t = g, g + 8, columns s = 8 nt + 2 t4 (+1); two chains a tile.
    float acc[2][2][4] = {};
    products(sm.a, acc);
    // L^T for the inverse: l_t[s][t] = beta_t A[t][s] (s < t), 0 elsewhere.
    const float beta_g = __shfl_sync(0xffffffffu, beta, g), beta_g8 = __shfl_sync(0xffffffffu, beta, g + 8);
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int t = g + (r >= 2 ? 8 : 0), s = 8 * nt + 2 * t4 + (r & 1);
        const float sum = acc[nt][0][r] + acc[nt][1][r];
        sm.l_t[s][t] = s < t ? (r >= 2 ? beta_g8 : beta_g) * sum : 0.f;
      }
    // M = scale * lower(q_tilde k_bar^T), stored tf32-rounded.
    float macc[2][2][4] = {};
    products(sm.q, macc);
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int t = g + 8 * h, s = 8 * nt + 2 * t4;
        const float m0 = (macc[nt][0][2 * h] + macc[nt][1][2 * h]) * a.scale;
        const float m1 = (macc[nt][0][2 * h + 1] + macc[nt][1][2 * h + 1]) * a.scale;
        *reinterpret_cast<float2*>(dst + KdaPrepared::kM + 4 * KdaPrepared::square_word(t, s)) =
            make_float2(ptx::round_tf32(s <= t ? m0 : 0.f), ptx::round_tf32(s + 1 <= t ? m1 : 0.f));
      }

    if (lane < C) inverse(beta, dst);
    __syncwarp();  // the next chunk overwrites the shared tiles
  }

  // acc[nt][chain] += tile x (rows: tokens g, g + 8) times the k_bar tile^T (columns: tokens
  // 8 nt + g), over the 128 channels in the permuted order of the pairs (k position t4 = channel
  // 8j + 2t4, t4 + 4 = the next channel), the same for both operands.
  __device__ void products(const float (*x_tile)[KdaDims::kPitchKI], float (&acc)[2][2][4]) const {
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      const int x = KdaPrepWarp::col(16 * j + 4 * t4);
      const float4 a4 = *reinterpret_cast<const float4*>(&x_tile[g][x]);
      const float4 b4 = *reinterpret_cast<const float4*>(&sm.b[g][x]);
      ptx::mma_tf32(acc[0][j & 1], a4.x, a4.y, a4.z, a4.w, b4.x, b4.z);
      ptx::mma_tf32(acc[1][j & 1], a4.x, a4.y, a4.z, a4.w, b4.y, b4.w);
    }
  }

  // Lane j < 16 solves column j of X = (I + L)^{-1} (L strictly lower) by forward substitution,
  // accumulating L[t][s] x_s for every t > s as soon as x_s is known (one FMA deep a step), then
  // stores -T[t][j] = -X[t][j] beta_j.
  __device__ void inverse(float beta_j, unsigned char* dst) const {
    const int j = lane;
    float x[C], acc[C];
#pragma unroll
    for (int t = 0; t < C; ++t) acc[t] = 0.f;
#pragma unroll
    for (int s = 0; s < C; ++s) {
      float l_row[C];  // row s of L^T, as 16-byte broadcasts
#pragma unroll
      for (int q = (s + 1) / 4; q < C / 4; ++q) {
        const float4 l4 = *reinterpret_cast<const float4*>(&sm.l_t[s][4 * q]);
        l_row[4 * q] = l4.x, l_row[4 * q + 1] = l4.y, l_row[4 * q + 2] = l4.z, l_row[4 * q + 3] = l4.w;
      }
      x[s] = (s == j ? 1.f : 0.f) - acc[s];
#pragma unroll
      for (int t = s + 1; t < C; ++t) acc[t] = fmaf(l_row[t], x[s], acc[t]);
    }
    float* neg_t = reinterpret_cast<float*>(dst + KdaPrepared::kNegT);
#pragma unroll
    for (int t = 0; t < C; ++t) neg_t[KdaPrepared::square_word(t, j)] = ptx::round_tf32(-x[t] * beta_j);
  }
};

// Byte address of prepared chunk `c` of sequence n, head hv.
__device__ __forceinline__ unsigned char* prepared_chunk(const PlanArgs& p, int heads_v, int n, int hv, int64_t c) {
  return p.prepared + ((p.seq.chunk_off[n] + c) * heads_v + hv) * int64_t(KdaPrepared::kBytes);
}

__global__ void __launch_bounds__(KdaPrepTraits::kThreads, KdaPrepTraits::kCtasPerSm)
    kda_prep_kernel(const __grid_constant__ KdaFwdArgs a, const __grid_constant__ PlanArgs p) {
  using Tr = KdaPrepTraits;
  extern __shared__ __align__(16) unsigned char smem_bytes[];
  auto& sm = *reinterpret_cast<Tr::Smem*>(smem_bytes);
  ptx::griddep_wait();  // the previous kernel of the plan is complete (docs/kernel.md, "Plans")
  ptx::griddep_launch_dependents();
  if (fused_chosen(a)) return;
  const int hv = blockIdx.x % a.heads_v;
  int n;
  int64_t block;
  // Every warp finds the sequence itself (the same answer): no broadcast, no barrier.
  if (!locate(p.seq.prep_off, a.num_seqs, blockIdx.x / a.heads_v, n, block)) return;
  const WorkUnit w = table_unit(a, p.seq, n, hv, 0);
  if (w.skip) return;  // a padding sequence is never read
  const int nchunks = int((w.len + Tr::kChunk - 1) / Tr::kChunk);
  const int c0 = int(block) * p.prep_chunks, c1 = min(c0 + p.prep_chunks, nchunks);
  const int warp = threadIdx.x >> 5;
  unsigned char* base = prepared_chunk(p, a.heads_v, n, hv, 0);
  const int64_t stride = int64_t(a.heads_v) * KdaPrepared::kBytes;
  KdaPrepWarp prep(a, w, sm.warp[warp], threadIdx.x & 31);
  for (int i = c0 + warp; i < c1; i += Tr::kWarps) prep.run(i, base + i * stride);
}

}  // namespace flash_kda::cuda::sm90
