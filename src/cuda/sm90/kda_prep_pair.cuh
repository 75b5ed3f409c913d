// The preparation pass for 32-token steps (docs/kernel.md, "The pair preparation"): every pair of
// chunks (a, b) of every (sequence, value head) is prepared once, chunk-parallel, into the pair
// format of KdaPrepared (two slots of kPairSlot bytes), for K = V = 128 and the sigmoid gate.
//
// One CTA of four warps prepares one pair at a time (PlanArgs::prep_chunks / 2 consecutive pairs of
// one head), with the next pair's raw tiles landing meanwhile (two raw buffers, 32 bulk copies of a
// 256-byte row each a tensor, one mbarrier a buffer). Every lane works in the layout of the
// consumers' MMA fragments: lane (g, t4) of warp w owns tokens g and g + 8 of each chunk and, in
// each of the warp's two 16-channel groups i = 2w, 2w + 1, channels 16i + 2t4, +1, +8, +9. Then
//   - the fp16 tiles k_tilde and q_hat leave as one 16-byte unit a lane and group (a warp's store
//     is 512 contiguous bytes), k_dec after one exchange with the lane of the neighbouring token;
//   - A = k_tilde k_bar^T and M = q_tilde k_bar^T (tf32 m16n8k8) take their A and B fragments from
//     the lane's own registers, as do the cross blocks A[b][a] = k_tilde_b k_dec_a^T and
//     M[b][a] (fp16 m16n8k16, every factor at most 1), each warp over its 32 channels;
//   - the gates' prefix sums over a chunk's 16 tokens are a butterfly over the 8 lanes of one t4.
// Three CTA barriers a pair: the norms' partial sums, the warps' partial products (each warp writes
// them over its own columns of the raw buffer it has finished reading), and the two 16 x 16
// inverses before the cross block of -T.
//
// What a slot holds (KdaPrepared; G_t = sum_{u <= t} a_u in base 2 from the chunk's start):
//   slot a: k_tilde, q_hat relative to the pair's start (= a's), k_dec to the pair's end, gamma the
//           pair's decay, -T_a, M_a, and in its cross block (-T)[b][a] = (-T_b) A[b][a] (-T_a);
//   slot b: k_tilde, q_hat relative to the pair's start (times gamma_a), k_dec to the pair's end
//           (= b's), gamma_b, -T_b, M_b, and in its cross block M[b][a] (with the scale).
// With chunk-start references every factor 2^{+-G} is a normal fp32 number for lower_bound >= -5
// (docs/kernel.md, "Numerical choices"); across the pair only products of factors <= 1 are formed.
#pragma once

#include <cuda_fp16.h>

#include "../common/bulk_copy.cuh"
#include "../common/ptx.cuh"
#include "kda_plan.cuh"
#include "kda_prep.cuh"

namespace flash_kda::cuda::sm90 {

namespace pair_prep {

__device__ __forceinline__ float lo_bf16(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float hi_bf16(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
__device__ __forceinline__ uint32_t lo_half(uint32_t w) { return w & 0xffffu; }
__device__ __forceinline__ uint32_t hi_half(uint32_t w) { return w >> 16; }

// The C fragment element r of n8 tile nt: row (token) t, column s.
__device__ __forceinline__ int frag_t(int g, int r) { return g + 8 * (r >> 1); }
__device__ __forceinline__ int frag_s(int t4, int nt, int r) { return 8 * nt + 2 * t4 + (r & 1); }

// Where lane `lane` of warp `warp` keeps partial matrix `mat` (8 floats) in raw buffer `raw`: 16
// rows of one tensor a matrix, chunk a's own products in rows of chunk a (free once the warp has
// read chunk a), the others in rows of chunk b and in the gate rows (read before the first barrier).
__device__ __forceinline__ float* partial_at(PairPrepTraits::Raw& raw, int warp, int mat, int lane) {
  using Tr = PairPrepTraits;
  static_assert(Tr::kPartials == 6, "A_aa, M_aa, A_bb, M_bb, A_ba, M_ba");
  const int tensor = mat < 4 ? (mat & 1) : 2, row = (mat < 4 ? 16 * (mat >> 1) : 16 * (mat - 4)) + (lane >> 1);
  unsigned char* base = reinterpret_cast<unsigned char*>(&raw) + tensor * (Tr::kTokens * Tr::kPitch * 2);
  return reinterpret_cast<float*>(base + row * (Tr::kPitch * 2) + 64 * warp + 32 * (lane & 1));
}

}  // namespace pair_prep

template <int kD>
__global__ void __launch_bounds__(PairPrepTraits::kThreads, PairPrepTraits::kCtasPerSm)
    kda_prep_pair_kernel(const __grid_constant__ KdaFwdArgs a, const __grid_constant__ PlanArgs p) {
  static_assert(kD == 128, "32-token steps are built for K = V = 128");
  using Tr = PairPrepTraits;
  using Prepared = KdaPrepared<kD>;
  using namespace pair_prep;
  constexpr int C = kChunkTokens;
  FLASH_KDA_DYNAMIC_SMEM(smem_bytes);
  auto& sm = *reinterpret_cast<Tr::Smem*>(smem_bytes);
  if (fused_chosen(a)) return;
  const int hv = blockIdx.x % a.heads_v;
  int n;
  int64_t block;
  if (!locate(p.seq.prep_off, a.num_seqs, blockIdx.x / a.heads_v, n, block)) return;
  const WorkUnit w = table_unit(a, p.seq, n, hv, 0);
  if (w.skip) return;  // a padding sequence is never read
  const int nchunks = (int(chunk_count(w.len, w.shift)) + 1) & ~1;
  const int c_begin = int(block) * p.prep_chunks, c_end = min(c_begin + p.prep_chunks, nchunks);
  const int pair0 = c_begin / 2, pair1 = c_end / 2;  // (prep_chunks and nchunks are even)

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;

  // Sources: row r of pair pi is token pi * 32 + r - shift of the sequence.
  const int hq = hv / a.group;
  const uint16_t* q_base = a.q + w.row * a.q_s[0] + w.begin * a.q_s[1] + hq * a.q_s[2];
  const uint16_t* k_base = a.k + w.row * a.k_s[0] + w.begin * a.k_s[1] + hq * a.k_s[2];
  const uint16_t* g_base = a.g + w.row * a.g_s[0] + w.begin * a.g_s[1] + int64_t(hv) * a.g_s[2];
  const uint16_t* b_base = a.beta + w.row * a.beta_s[0] + w.begin * a.beta_s[1] + int64_t(hv) * a.beta_s[2];
  auto first_token = [&](int pi) { return int64_t(pi) * Tr::kTokens - w.shift; };
  auto valid_rows = [&](int pi, int& lo, int& hi) {
    const int64_t t0 = first_token(pi);
    lo = int(max(int64_t(0), -t0));
    hi = int(min(int64_t(Tr::kTokens), w.len - t0));
  };

  // Warp 0 issues pair pi's copies into buffer b (lane r: row r of q, k, g) and returns its lane's
  // raw beta. Rows outside the sequence are not copied (their stale contents are masked below).
  auto issue = [&](int pi, int b) -> float {
    int lo, hi;
    valid_rows(pi, lo, hi);
    if (lane == 0) mbarrier_arrive_expect_tx(&sm.full[b], uint32_t(3 * Tr::kRowBytes * max(hi - lo, 0)));
    __syncwarp();
    const int64_t t = first_token(pi) + lane;
    if (lane >= lo && lane < hi) {
      bulk_copy_g2s(&sm.raw[b].q[lane][0], q_base + t * a.q_s[1], Tr::kRowBytes, &sm.full[b]);
      bulk_copy_g2s(&sm.raw[b].k[lane][0], k_base + t * a.k_s[1], Tr::kRowBytes, &sm.full[b]);
      bulk_copy_g2s(&sm.raw[b].g[lane][0], g_base + t * a.g_s[1], Tr::kRowBytes, &sm.full[b]);
      return __uint_as_float(uint32_t(b_base[t * a.beta_s[1]]) << 16);
    }
    return 0.f;
  };


  // The gate's -rate log2(e), and per channel gmul * dt_bias. Channel index ch = 4 ii + 2 j + e of a
  // lane: group i = 2 warp + ii, channel 16 i + 2 t4 + 8 j + e.
  const float gmul = -(a.A_log ? expf(a.A_log[hv]) : 1.f) * 1.4426950408889634f;
  sm.gate_add[tid] = gmul * a.dt_bias[hv * Tr::kD + tid];
  auto channel = [&](int ch) { return 16 * (2 * warp + (ch >> 2)) + 2 * t4 + 8 * ((ch >> 1) & 1) + (ch & 1); };
  const float inv_log2e_neg = -1.4426950408889634f;
  if (tid == 0) {
    mbarrier_init(&sm.full[0], 1);
    mbarrier_init(&sm.full[1], 1);
  }
  __syncthreads();

  float beta_raw[2] = {0.f, 0.f};
  if (warp == 0) {
    if (pair0 < pair1) beta_raw[0] = issue(pair0, 0);
    if (pair0 + 1 < pair1) beta_raw[1] = issue(pair0 + 1, 1);
  }

  for (int pi = pair0, it = 0; pi < pair1; ++pi, ++it) {
    const int b = it & 1;
    Tr::Raw& raw = sm.raw[b];
    int lo, hi;
    valid_rows(pi, lo, hi);
    unsigned char* slot_a = prepared_chunk<128, true>(p, a.heads_v, n, hv, 2 * pi);
    unsigned char* slot_b = slot_a + Prepared::kPairSlot;
    mbarrier_wait(&sm.full[b], uint32_t(it >> 1) & 1u);

    // ---- phase 1: the norms' partial sums, the gates' prefix sums, beta ---------------------------
    // rows 16 h + g + 8 rr; words [h][rr][ii][j] of q, k (channels 16 i + 2 t4 + 8 j, +1)
    float G[2][8];     // [rr][ch]: chunk a's G relative to its start (chunk b's: sm.g_b)
    float gtot[2][8];  // [chunk][ch]: G of the chunk's last token
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float ssq_q[2] = {0.f, 0.f}, ssq_k[2] = {0.f, 0.f};
      float av[2][8];
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        const int r = 16 * h + g + 8 * rr;
        const bool valid = r >= lo && r < hi;
#pragma unroll
        for (int ii = 0; ii < 2; ++ii)
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            const int col = 16 * (2 * warp + ii) + 2 * t4 + 8 * j;
            const uint32_t qw = valid ? *reinterpret_cast<const uint32_t*>(&raw.q[r][col]) : 0u;
            const uint32_t kw = valid ? *reinterpret_cast<const uint32_t*>(&raw.k[r][col]) : 0u;
            const uint32_t gw = *reinterpret_cast<const uint32_t*>(&raw.g[r][col]);
            const float q0 = lo_bf16(qw), q1 = hi_bf16(qw), k0 = lo_bf16(kw), k1 = hi_bf16(kw);
            ssq_q[rr] = fmaf(q0, q0, fmaf(q1, q1, ssq_q[rr]));
            ssq_k[rr] = fmaf(k0, k0, fmaf(k1, k1, ssq_k[rr]));
            const int ch = 4 * ii + 2 * j;
            // sigmoid(x) = 1 / (1 + 2^{-x log2 e}); past the sequence no decay (a = 0)
            const float2 add = *reinterpret_cast<const float2*>(&sm.gate_add[channel(ch)]);
            const float s0 = ptx::rcp(1.f + ptx::ex2(fmaf(lo_bf16(gw), gmul, add.x)));
            const float s1 = ptx::rcp(1.f + ptx::ex2(fmaf(hi_bf16(gw), gmul, add.y)));
            av[rr][ch] = valid ? a.lower_bound_log2 * s0 : 0.f;
            av[rr][ch + 1] = valid ? a.lower_bound_log2 * s1 : 0.f;
          }
      }
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        ssq_q[rr] += __shfl_xor_sync(0xffffffffu, ssq_q[rr], 1);
        ssq_k[rr] += __shfl_xor_sync(0xffffffffu, ssq_k[rr], 1);
        ssq_q[rr] += __shfl_xor_sync(0xffffffffu, ssq_q[rr], 2);
        ssq_k[rr] += __shfl_xor_sync(0xffffffffu, ssq_k[rr], 2);
        if (t4 == 0)
          *reinterpret_cast<float2*>(&sm.ssq[warp][16 * h + g + 8 * rr][0]) = make_float2(ssq_q[rr], ssq_k[rr]);
      }
      // Inclusive prefix over the 8 lanes g of this t4 (lane bits 2..4), for tokens g and g + 8:
      // partners combine the same two values, so every lane holds the same bits of each total.
#pragma unroll
      for (int ch = 0; ch < 8; ++ch) {
        float pre0 = av[0][ch], tot0 = pre0, pre1 = av[1][ch], tot1 = pre1;
#pragma unroll
        for (int d = 4; d <= 16; d <<= 1) {
          const float o0 = __shfl_xor_sync(0xffffffffu, tot0, d);
          const float o1 = __shfl_xor_sync(0xffffffffu, tot1, d);
          if (lane & d) pre0 += o0, pre1 += o1;
          tot0 += o0, tot1 += o1;
        }
        if (h == 0) {
          G[0][ch] = pre0;
          G[1][ch] = tot0 + pre1;
        } else {
          sm.g_b[ch][tid] = pre0;
          sm.g_b[8 + ch][tid] = tot0 + pre1;
        }
        gtot[h][ch] = tot0 + tot1;
      }
    }
    float gam[2][8];  // 2^{G_last} of chunks a and b
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int ch = 0; ch < 8; ++ch) gam[h][ch] = ptx::ex2(gtot[h][ch]);
    if (g == 0) {  // gamma words of channels 16 i + 2 t4 + {0, 1, 8, 9}: one float4 a group
#pragma unroll
      for (int ii = 0; ii < 2; ++ii) {
        const int word = (4 * (2 * warp + ii) + t4) * 4;
        float* ga = reinterpret_cast<float*>(slot_a + Prepared::kGamma) + word;
        float* gb = reinterpret_cast<float*>(slot_b + Prepared::kGamma) + word;
        const int c = 4 * ii;
        *reinterpret_cast<float4*>(ga) = make_float4(gam[0][c] * gam[1][c], gam[0][c + 1] * gam[1][c + 1],
                                                     gam[0][c + 2] * gam[1][c + 2], gam[0][c + 3] * gam[1][c + 3]);
        *reinterpret_cast<float4*>(gb) = make_float4(gam[1][c], gam[1][c + 1], gam[1][c + 2], gam[1][c + 3]);
      }
    }
    if (warp == 0) {
      const float braw = b ? beta_raw[1] : beta_raw[0];
      sm.beta[lane] =
          lane >= lo && lane < hi ? a.beta_scale * ptx::rcp(1.f + ptx::ex2(inv_log2e_neg * braw)) : 0.f;
    }
    ptx::bar_sync(1, Tr::kThreads);

    // ---- phase 2: the tiles and the warp's partial products --------------------------------------
    // partial products of this warp's channels: [0] A, [1] M of the chunk, [2] A[b][a], [3] M[b][a]
    float acc[4][2][4];
    auto write_partial = [&](int mat, const float (&x)[2][4]) {
      float* d = partial_at(raw, warp, mat, lane);
      *reinterpret_cast<float4*>(d) = make_float4(x[0][0], x[0][1], x[0][2], x[0][3]);
      *reinterpret_cast<float4*>(d + 4) = make_float4(x[1][0], x[1][1], x[1][2], x[1][3]);
    };
#pragma unroll
    for (int m = 0; m < 4; ++m)
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) acc[m][nt][0] = acc[m][nt][1] = acc[m][nt][2] = acc[m][nt][3] = 0.f;
    uint32_t kda[2][2][2];  // chunk a's k_dec relative to a's end, fp16: [ii][rr][j]
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (h == 1) {
        // The warp has read its columns of chunk a's rows: chunk a's products go there.
        __syncwarp();
        write_partial(0, acc[0]);
        write_partial(1, acc[1]);
#pragma unroll
        for (int m = 0; m < 2; ++m)
#pragma unroll
          for (int nt = 0; nt < 2; ++nt) acc[m][nt][0] = acc[m][nt][1] = acc[m][nt][2] = acc[m][nt][3] = 0.f;
      }
      float rq[2], rk[2];
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        const int t = 16 * h + g + 8 * rr;
        const float2 s0 = *reinterpret_cast<const float2*>(&sm.ssq[0][t][0]);
        const float2 s1 = *reinterpret_cast<const float2*>(&sm.ssq[1][t][0]);
        const float2 s2 = *reinterpret_cast<const float2*>(&sm.ssq[2][t][0]);
        const float2 s3 = *reinterpret_cast<const float2*>(&sm.ssq[3][t][0]);
        // eps inside the square root, as the contract specifies; rsqrt.approx is within 2 ulp
        rq[rr] = rsqrtf(((s0.x + s1.x) + (s2.x + s3.x)) + 1e-6f);
        rk[rr] = rsqrtf(((s0.y + s1.y) + (s2.y + s3.y)) + 1e-6f);
      }
      unsigned char* slot = h ? slot_b : slot_a;
#pragma unroll
      for (int ii = 0; ii < 2; ++ii) {
        const int i = 2 * warp + ii;
        float kt[2][2][2], qt[2][2][2], kb[2][2][2], kd[2][2][2];  // [rr][j][e]
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
          const int r = 16 * h + g + 8 * rr;
          const bool valid = r >= lo && r < hi;
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            const int col = 16 * i + 2 * t4 + 8 * j;
            const uint32_t qw = valid ? *reinterpret_cast<const uint32_t*>(&raw.q[r][col]) : 0u;
            const uint32_t kw = valid ? *reinterpret_cast<const uint32_t*>(&raw.k[r][col]) : 0u;
            const float kh[2] = {lo_bf16(kw) * rk[rr], hi_bf16(kw) * rk[rr]};
            const float qh[2] = {lo_bf16(qw) * rq[rr], hi_bf16(qw) * rq[rr]};
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int ch = 4 * ii + 2 * j + e;
              const float gv = h ? sm.g_b[8 * rr + ch][tid] : G[rr][ch];
              const float ev = ptx::ex2(gv);   // in [2^-115.4, 1]
              const float rv = ptx::ex2(-gv);  // in [1, 2^115.4]
              kt[rr][j][e] = kh[e] * ev;
              qt[rr][j][e] = qh[e] * ev;
              kb[rr][j][e] = kh[e] * rv;
              kd[rr][j][e] = kh[e] * (gam[h][ch] * rv);  // relative to the chunk's end (<= 1)
            }
          }
        }
        // A and M of the chunk (tf32; k-index t4 is channel 2 t4, t4 + 4 channel 2 t4 + 1)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const float a0 = ptx::round_tf32(kt[0][j][0]), a1 = ptx::round_tf32(kt[1][j][0]);
          const float a2 = ptx::round_tf32(kt[0][j][1]), a3 = ptx::round_tf32(kt[1][j][1]);
          const float m0 = ptx::round_tf32(qt[0][j][0]), m1 = ptx::round_tf32(qt[1][j][0]);
          const float m2 = ptx::round_tf32(qt[0][j][1]), m3 = ptx::round_tf32(qt[1][j][1]);
#pragma unroll
          for (int nt = 0; nt < 2; ++nt) {
            const float b0 = ptx::round_tf32(kb[nt][j][0]), b1 = ptx::round_tf32(kb[nt][j][1]);
            ptx::mma_tf32(acc[0][nt], a0, a1, a2, a3, b0, b1);
            ptx::mma_tf32(acc[1][nt], m0, m1, m2, m3, b0, b1);
          }
        }
        // the cross blocks: chunk b's k_tilde, q_tilde (relative to b's start) against chunk a's
        // k_dec relative to a's end
        if (h == 0) {
#pragma unroll
          for (int rr = 0; rr < 2; ++rr)
#pragma unroll
            for (int j = 0; j < 2; ++j) kda[ii][rr][j] = ptx::pack_f16(kd[rr][j][0], kd[rr][j][1]);
        } else {
          const uint32_t ak[4] = {ptx::pack_f16(kt[0][0][0], kt[0][0][1]), ptx::pack_f16(kt[1][0][0], kt[1][0][1]),
                                  ptx::pack_f16(kt[0][1][0], kt[0][1][1]), ptx::pack_f16(kt[1][1][0], kt[1][1][1])};
          const uint32_t aq[4] = {ptx::pack_f16(qt[0][0][0], qt[0][0][1]), ptx::pack_f16(qt[1][0][0], qt[1][0][1]),
                                  ptx::pack_f16(qt[0][1][0], qt[0][1][1]), ptx::pack_f16(qt[1][1][0], qt[1][1][1])};
#pragma unroll
          for (int nt = 0; nt < 2; ++nt) {
            ptx::mma_f16(acc[2][nt], ak, kda[ii][nt][0], kda[ii][nt][1]);
            ptx::mma_f16(acc[3][nt], aq, kda[ii][nt][0], kda[ii][nt][1]);
          }
        }
        // the fp16 tiles of the workspace: k_tilde, q_hat relative to the pair's start, k_dec to
        // its end
        float rel[2], to_end[2];  // per e of word j: b's factor gamma_a, a's gamma_b
        uint32_t ukt[4], uqt[4];
#pragma unroll
        for (int rr = 0; rr < 2; ++rr)
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            const int ch = 4 * ii + 2 * j;
            rel[0] = h ? gam[0][ch] : 1.f, rel[1] = h ? gam[0][ch + 1] : 1.f;
            ukt[2 * rr + j] = ptx::pack_f16(kt[rr][j][0] * rel[0], kt[rr][j][1] * rel[1]);
            uqt[2 * rr + j] = ptx::pack_f16(qt[rr][j][0] * rel[0], qt[rr][j][1] * rel[1]);
          }
        const int unit = 32 * i + lane;
        *reinterpret_cast<uint4*>(slot + Prepared::kKTilde + 16 * unit) = make_uint4(ukt[0], ukt[1], ukt[2], ukt[3]);
        *reinterpret_cast<uint4*>(slot + Prepared::kQHat + 16 * unit) = make_uint4(uqt[0], uqt[1], uqt[2], uqt[3]);
        // k_dec: a unit is channels c, c + 8 x tokens 2w, 2w + 1, 2w + 8, 2w + 9 (w = g / 2); the
        // lane of even g builds channel 16 i + 2 t4's, the odd one channel + 1's, each sending the
        // other its tokens of the partner's channel (lane ^ 4 is token g ^ 1)
        uint32_t own[2], send[2];  // [j]: (token g, token g + 8) of one channel
        const bool odd = g & 1;
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int ch = 4 * ii + 2 * j;
          to_end[0] = h ? 1.f : gam[1][ch], to_end[1] = h ? 1.f : gam[1][ch + 1];
          const uint32_t e0 = ptx::pack_f16(kd[0][j][0] * to_end[0], kd[1][j][0] * to_end[0]);
          const uint32_t e1 = ptx::pack_f16(kd[0][j][1] * to_end[1], kd[1][j][1] * to_end[1]);
          own[j] = odd ? e1 : e0;
          send[j] = odd ? e0 : e1;
        }
        uint32_t recv[2];
#pragma unroll
        for (int j = 0; j < 2; ++j) recv[j] = __shfl_xor_sync(0xffffffffu, send[j], 4);
        uint32_t ukd[4];  // words: (c, w), (c, w + 4), (c + 8, w), (c + 8, w + 4)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          // even g: own token g is the low half; odd g: the partner's token g - 1 is
          const uint32_t lo_w = odd ? recv[j] : own[j], hi_w = odd ? own[j] : recv[j];
          ukd[2 * j] = lo_half(lo_w) | (lo_half(hi_w) << 16);      // tokens 2w, 2w + 1
          ukd[2 * j + 1] = hi_half(lo_w) | (hi_half(hi_w) << 16);  // tokens 2w + 8, 2w + 9
        }
        const int kd_unit = (8 * i + 2 * t4 + (g & 1)) * 4 + (g >> 1);
        *reinterpret_cast<uint4*>(slot + Prepared::kKDec + 16 * kd_unit) = make_uint4(ukd[0], ukd[1], ukd[2], ukd[3]);
      }
    }
    // The warp has read all of its columns of the raw buffer: the other products go there.
    __syncwarp();
#pragma unroll
    for (int m = 0; m < 4; ++m) write_partial(2 + m, acc[m]);
    ptx::bar_sync(1, Tr::kThreads);

    // ---- phase 3: sums over the warps; L and the inverses (warps 0, 1), M (2), the cross blocks (3)
    auto sum_partial = [&](int m, float (&s)[2][4]) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float4 v[4];
#pragma unroll
        for (int x = 0; x < 4; ++x) v[x] = *reinterpret_cast<const float4*>(partial_at(raw, x, m, lane) + 4 * half);
        s[half][0] = (v[0].x + v[1].x) + (v[2].x + v[3].x);
        s[half][1] = (v[0].y + v[1].y) + (v[2].y + v[3].y);
        s[half][2] = (v[0].z + v[1].z) + (v[2].z + v[3].z);
        s[half][3] = (v[0].w + v[1].w) + (v[2].w + v[3].w);
      }
    };
    // a 16 x 16 matrix from C fragments into the square layout of a slot (float2 per (t, s pair))
    auto store_square = [&](unsigned char* dst, const float (&s)[2][4], float mul, bool lower) {
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          const int t = frag_t(g, 2 * hr), s0 = frag_s(t4, nt, 0);
          const float x0 = !lower || s0 <= t ? ptx::round_tf32(s[nt][2 * hr] * mul) : 0.f;
          const float x1 = !lower || s0 + 1 <= t ? ptx::round_tf32(s[nt][2 * hr + 1] * mul) : 0.f;
          *reinterpret_cast<float2*>(dst + 4 * Prepared::square_word(t, s0)) = make_float2(x0, x1);
        }
    };
    if (warp < 2) {
      const int h = warp;
      float s[2][4];
      sum_partial(2 * h, s);
      // L^T, L = diag(beta) strict_lower(A)
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int t = frag_t(g, r), sc = frag_s(t4, nt, r);
          sm.lt[h][sc][t] = sc < t ? sm.beta[16 * h + t] * s[nt][r] : 0.f;
        }
      __syncwarp();
      // lanes 0..15 each solve one column j of X = (I + L)^{-1}; -T[t][j] = -X[t][j] beta_j
      if (lane < C) {
        const int j = lane;
        float x[C], xs[C];
#pragma unroll
        for (int t = 0; t < C; ++t) xs[t] = 0.f;
#pragma unroll
        for (int sc = 0; sc < C; ++sc) {
          float l_row[C];
#pragma unroll
          for (int q4 = (sc + 1) / 4; q4 < C / 4; ++q4) {
            const float4 l4 = *reinterpret_cast<const float4*>(&sm.lt[h][sc][4 * q4]);
            l_row[4 * q4] = l4.x, l_row[4 * q4 + 1] = l4.y, l_row[4 * q4 + 2] = l4.z, l_row[4 * q4 + 3] = l4.w;
          }
          x[sc] = (sc == j ? 1.f : 0.f) - xs[sc];
#pragma unroll
          for (int t = sc + 1; t < C; ++t) xs[t] = fmaf(l_row[t], x[sc], xs[t]);
        }
        const float beta_j = sm.beta[16 * h + j];
        unsigned char* slot = h ? slot_b : slot_a;
#pragma unroll
        for (int t = 0; t < C; ++t) {
          const float v = ptx::round_tf32(-x[t] * beta_j);
          reinterpret_cast<float*>(slot + Prepared::kNegT)[Prepared::square_word(t, j)] = v;
          sm.neg_t[h][t][j] = v;
        }
      }
    } else if (warp == 2) {
      float s[2][4];
      sum_partial(1, s);
      store_square(slot_a + Prepared::kM, s, a.scale, true);
      sum_partial(3, s);
      store_square(slot_b + Prepared::kM, s, a.scale, true);
    } else {
      float s[2][4];
      sum_partial(5, s);
      store_square(slot_b + Prepared::kCross, s, a.scale, false);
      sum_partial(4, s);
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr)
          *reinterpret_cast<float2*>(&sm.a_ba[frag_t(g, 2 * hr)][frag_s(t4, nt, 0)]) =
              make_float2(s[nt][2 * hr], s[nt][2 * hr + 1]);
    }
    fence_proxy_async_shared();  // (the partials over the raw buffer, before its next bulk copies)
    ptx::bar_sync(1, Tr::kThreads);

    // ---- phase 4: the next copies into this buffer; (-T)[b][a] = ((-T_b) A[b][a]) (-T_a) ----------
    if (warp == 0 && pi + 2 < pair1) {
      const float braw = issue(pi + 2, b);
      if (b) {
        beta_raw[1] = braw;
      } else {
        beta_raw[0] = braw;
      }
    }
    {
      // warp w: rows 4w .. 4w + 3; lane: row t = 4w + lane / 8, columns 2 (lane % 8), + 1
      const int t = 4 * warp + (lane >> 3), s0 = 2 * (lane & 7);
      float z0 = 0.f, z1 = 0.f;
#pragma unroll
      for (int u = 0; u < C; ++u) {
        const float nt_b = sm.neg_t[1][t][u];
        const float2 ab = *reinterpret_cast<const float2*>(&sm.a_ba[u][s0]);
        z0 = fmaf(nt_b, ab.x, z0);
        z1 = fmaf(nt_b, ab.y, z1);
      }
      float(*z)[C] = sm.lt[0];  // (L^T of chunk a is no longer read)
      *reinterpret_cast<float2*>(&z[t][s0]) = make_float2(z0, z1);
      __syncwarp();
      float r0 = 0.f, r1 = 0.f;
#pragma unroll
      for (int u = 0; u < C; ++u) {
        const float zv = z[t][u];
        const float2 nta = *reinterpret_cast<const float2*>(&sm.neg_t[0][u][s0]);
        r0 = fmaf(zv, nta.x, r0);
        r1 = fmaf(zv, nta.y, r1);
      }
      *reinterpret_cast<float2*>(slot_a + Prepared::kCross + 4 * Prepared::square_word(t, s0)) =
          make_float2(ptx::round_tf32(r0), ptx::round_tf32(r1));
    }
  }
}

}  // namespace flash_kda::cuda::sm90
