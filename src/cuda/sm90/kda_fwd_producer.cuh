// Producer role of the sm90 forward: turns raw chunk tiles into everything the state update needs.
//
// Per chunk of 16 tokens (t, s index tokens, c channels; G_t = sum_{u<=t} a_u in base 2):
//   P1  norms:   rq_t = scale / ||q_t||, rk_t = 1 / ||k_t||, beta_t = sigmoid(beta_t)
//   P2  gates:   a_t = lower_bound * sigmoid(exp(A_log) (g_t + dt_bias)), G_t, and the tiles
//                k_tilde = k_hat 2^{G_t}, q_tilde = q_hat 2^{G_t}, k_bar = k_hat 2^{-G_t},
//                k_dec = k_hat 2^{G_last - G_t}, gamma = 2^{G_last}, -v
//   P3  A = k_tilde k_bar^T (strict lower, scaled by beta_t), M = q_tilde k_bar^T (lower)
//   P4  -T = -(I + diag(beta) A)^{-1} diag(beta) by forward substitution in fp32
// With chunk-start references, 2^{-G_t} <= 2^{115.4} and 2^{G_t} >= 2^{-115.4} for
// lower_bound >= -5, so every factor is a normal fp32/tf32 number; masked entries are selected
// away, never multiplied by zero.
#pragma once

#include <cuda_bf16.h>

#include "../common/ptx.cuh"
#include "kda_fwd_scheduler.cuh"
#include "kda_fwd_traits.cuh"

namespace flash_kda::cuda::sm90 {

__device__ __forceinline__ float bf16_bits_to_float(uint16_t h) { return __uint_as_float(uint32_t(h) << 16); }

template <class Tr>
struct KdaProducer {
  using Smem = typename Tr::Smem;
  static constexpr int C = Tr::kChunk;
  static constexpr int D = Tr::kDim;

  const KdaFwdArgs& a;
  const WorkUnit& w;
  Smem& sm;
  int ptid;  // 0 .. kProducerThreads-1
  int nchunks;
  const uint16_t *q_base, *k_base, *g_base, *v_base, *beta_base;

  __device__ KdaProducer(const KdaFwdArgs& args, const WorkUnit& work, Smem& smem, int tid)
      : a(args), w(work), sm(smem), ptid(tid), nchunks(int((work.len + C - 1) / C)) {
    const int hq = w.hv / a.group;
    q_base = a.q + w.row * a.q_s[0] + w.begin * a.q_s[1] + hq * a.q_s[2];
    k_base = a.k + w.row * a.k_s[0] + w.begin * a.k_s[1] + hq * a.k_s[2];
    g_base = a.g + w.row * a.g_s[0] + w.begin * a.g_s[1] + int64_t(w.hv) * a.g_s[2];
    v_base = a.v + w.row * a.v_s[0] + w.begin * a.v_s[1] + int64_t(w.hv) * a.v_s[2] + w.slice * Tr::kVRows;
    beta_base = a.beta + w.row * a.beta_s[0] + w.begin * a.beta_s[1] + int64_t(w.hv) * a.beta_s[2];
  }

  // Issues the cp.async copies of chunk i's q, k, g (all channels) and v (this CTA's rows) into
  // raw stage i % kRawStages; tokens past the end are zero-filled. Always commits one group.
  __device__ void load_raw(int i) {
    if (i < nchunks) {
      typename Tr::Raw& raw = sm.raw[i % Tr::kRawStages];
      const int64_t t0 = int64_t(i) * C;
      constexpr int kVecPerRow = D / 8;
      for (int idx = ptid; idx < C * kVecPerRow; idx += Tr::kProducerThreads) {
        const int t = idx / kVecPerRow, col = (idx % kVecPerRow) * 8;
        const bool valid = t0 + t < w.len;
        const int64_t tok = valid ? t0 + t : 0;
        ptx::cp_async_16(&raw.q[t][col], q_base + tok * a.q_s[1] + col, valid ? 16 : 0);
        ptx::cp_async_16(&raw.k[t][col], k_base + tok * a.k_s[1] + col, valid ? 16 : 0);
        ptx::cp_async_16(&raw.g[t][col], g_base + tok * a.g_s[1] + col, valid ? 16 : 0);
      }
      constexpr int kVVecPerRow = Tr::kVRows / 8;
      for (int idx = ptid; idx < C * kVVecPerRow; idx += Tr::kProducerThreads) {
        const int t = idx / kVVecPerRow, col = (idx % kVVecPerRow) * 8;
        const bool valid = t0 + t < w.len;
        const int64_t tok = valid ? t0 + t : 0;
        ptx::cp_async_16(&raw.v[t][col], v_base + tok * a.v_s[1] + col, valid ? 16 : 0);
      }
    }
    ptx::cp_async_commit();
  }

  __device__ float load_beta(int i) const {
    const int64_t t = int64_t(i) * C + ptid;
    return (ptid < C && i < nchunks && t < w.len) ? bf16_bits_to_float(beta_base[t * a.beta_s[1]]) : 0.f;
  }

  __device__ void run() {
    if (nchunks == 0) return;
    const float exp_a = expf(a.A_log[w.hv]);
    const float dt_bias_c = a.dt_bias[w.hv * D + ptid];
    load_raw(0);
    load_raw(1);
    float beta_raw0 = load_beta(0), beta_raw1 = load_beta(1);

    for (int i = 0; i < nchunks; ++i) {
      const int s = i % Tr::kStages;
      const int valid = int(min(int64_t(C), w.len - int64_t(i) * C));
      ptx::cp_async_wait<1>();
      ptx::bar_sync(Tr::kBarProducer, Tr::kProducerThreads);  // chunk i's raw tiles are visible
      load_raw(i + 2);
      const float beta_raw = beta_raw0;
      beta_raw0 = beta_raw1;
      beta_raw1 = load_beta(i + 2);
      const typename Tr::Raw& raw = sm.raw[i % Tr::kRawStages];

      norms(raw, valid, beta_raw);
      ptx::bar_sync(Tr::kBarProducer, Tr::kProducerThreads);
      if (i >= Tr::kStages) ptx::bar_sync(Tr::kBarEmpty0 + s, Tr::kThreads);  // consumers released s
      typename Tr::Stage& st = sm.stage[s];
      gates_and_tiles(raw, st, valid, exp_a, dt_bias_c);
      ptx::bar_sync(Tr::kBarProducer, Tr::kProducerThreads);
      intra_chunk_products(st);
      ptx::bar_sync(Tr::kBarProducer, Tr::kProducerThreads);
      if (ptid < 32) inverse(st);
      ptx::bar_arrive(Tr::kBarFull0 + s, Tr::kThreads);
    }
  }

  // P1: 8 threads per token, 16 channels each.
  __device__ void norms(const typename Tr::Raw& raw, int valid, float beta_raw) {
    const int t = ptid >> 3, part = ptid & 7;
    float ssq_q = 0.f, ssq_k = 0.f;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint4 qv = *reinterpret_cast<const uint4*>(&raw.q[t][part * 16 + h * 8]);
      const uint4 kv = *reinterpret_cast<const uint4*>(&raw.k[t][part * 16 + h * 8]);
      const uint32_t qw[4] = {qv.x, qv.y, qv.z, qv.w}, kw[4] = {kv.x, kv.y, kv.z, kv.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float q0 = __uint_as_float(qw[j] << 16), q1 = __uint_as_float(qw[j] & 0xffff0000u);
        const float k0 = __uint_as_float(kw[j] << 16), k1 = __uint_as_float(kw[j] & 0xffff0000u);
        ssq_q = fmaf(q0, q0, fmaf(q1, q1, ssq_q));
        ssq_k = fmaf(k0, k0, fmaf(k1, k1, ssq_k));
      }
    }
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) {
      ssq_q += __shfl_xor_sync(0xffffffffu, ssq_q, o);
      ssq_k += __shfl_xor_sync(0xffffffffu, ssq_k, o);
    }
    if (part == 0) {
      // eps inside the square root, as the contract specifies (not a clamp of the norm).
      sm.rq[t] = a.scale / sqrtf(ssq_q + 1e-6f);
      sm.rk[t] = 1.f / sqrtf(ssq_k + 1e-6f);
    }
    if (ptid < C) sm.beta[ptid] = ptid < valid ? 1.f / (1.f + expf(-beta_raw)) : 0.f;
  }

  // P2: one thread per channel c, looping over the chunk's tokens.
  __device__ void gates_and_tiles(const typename Tr::Raw& raw, typename Tr::Stage& st, int valid, float exp_a,
                                  float dt_bias_c) {
    constexpr float kLog2e = 1.4426950408889634f;
    const int c = ptid;
    float G[C];
    float acc = 0.f;
#pragma unroll
    for (int t = 0; t < C; ++t) {
      const float x = exp_a * (bf16_bits_to_float(raw.g[t][c]) + dt_bias_c);
      const float sig = ptx::rcp(1.f + ptx::ex2(-x * kLog2e));  // exact limits 0 and 1 at +-inf
      acc += t < valid ? a.lower_bound_log2 * sig : 0.f;
      G[t] = acc;
    }
    const float gamma = ptx::ex2(acc);
    st.gamma[c] = gamma;
    float k_dec[C];
#pragma unroll
    for (int t = 0; t < C; ++t) {
      const float e = ptx::ex2(G[t]);  // in [2^-115.4, 1]
      const float r = ptx::rcp(e);     // in [1, 2^115.4]
      const float k_hat = bf16_bits_to_float(raw.k[t][c]) * sm.rk[t];
      const float q_hat = bf16_bits_to_float(raw.q[t][c]) * sm.rq[t];
      st.k_tilde[t][c] = ptx::round_tf32(k_hat * e);
      st.q_tilde[t][c] = ptx::round_tf32(q_hat * e);
      sm.k_bar[t][c] = ptx::round_tf32(k_hat * r);
      k_dec[t] = ptx::round_tf32(k_hat * (gamma * r));  // gamma <= e, so the factor is <= 1
    }
#pragma unroll
    for (int t = 0; t < C; t += 4)
      *reinterpret_cast<float4*>(&st.k_dec_t[c][t]) = make_float4(k_dec[t], k_dec[t + 1], k_dec[t + 2], k_dec[t + 3]);
    if (c < Tr::kVRows) {
      float nv[C];
#pragma unroll
      for (int t = 0; t < C; ++t) nv[t] = -bf16_bits_to_float(raw.v[t][c]);
#pragma unroll
      for (int t = 0; t < C; t += 4)
        *reinterpret_cast<float4*>(&st.neg_v_t[c][t]) = make_float4(nv[t], nv[t + 1], nv[t + 2], nv[t + 3]);
    }
  }

  // P3: warp 0/1 compute A's two 8-column halves, warps 2/3 M's, each over the 128 channels.
  __device__ void intra_chunk_products(typename Tr::Stage& st) {
    const int warp = ptid >> 5, lane = ptid & 31, g = lane >> 2, t4 = lane & 3;
    const bool is_m = warp >= 2;
    const int n0 = (warp & 1) * 8;
    const float(*lhs)[Tr::kPitchK] = is_m ? st.q_tilde : st.k_tilde;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      const float2 lo = *reinterpret_cast<const float2*>(&lhs[g][8 * j + 2 * t4]);
      const float2 hi = *reinterpret_cast<const float2*>(&lhs[g + 8][8 * j + 2 * t4]);
      const float2 b = *reinterpret_cast<const float2*>(&sm.k_bar[n0 + g][8 * j + 2 * t4]);
      ptx::mma_tf32(acc, lo.x, hi.x, lo.y, hi.y, b.x, b.y);
    }
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int t = g + (r >= 2 ? 8 : 0), s = n0 + 2 * t4 + (r & 1);
      if (is_m)
        st.m[t][s] = s <= t ? ptx::round_tf32(acc[r]) : 0.f;
      else
        sm.l_t[s][t] = s < t ? sm.beta[t] * acc[r] : 0.f;
    }
  }

  // P4: lanes 0..15 of warp 0 each solve one column j of X = (I + L)^{-1} (L strictly lower), then
  // -T[t][j] = -X[t][j] * beta_j. Accumulating L[t][s] x_s for all t > s right after x_s is known
  // keeps the dependent chain at one FMA per step.
  __device__ void inverse(typename Tr::Stage& st) {
    const int j = ptid;
    if (j >= C) return;
    float x[C], acc[C];
#pragma unroll
    for (int t = 0; t < C; ++t) acc[t] = 0.f;
#pragma unroll
    for (int s = 0; s < C; ++s) {
      x[s] = (s == j ? 1.f : 0.f) - acc[s];
#pragma unroll
      for (int t = s + 1; t < C; ++t) acc[t] = fmaf(sm.l_t[s][t], x[s], acc[t]);
    }
    const float beta_j = sm.beta[j];
#pragma unroll
    for (int t = 0; t < C; ++t) st.neg_t[t][j] = ptx::round_tf32(-x[t] * beta_j);
  }
};

}  // namespace flash_kda::cuda::sm90
