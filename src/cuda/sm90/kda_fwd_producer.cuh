// Producer role of the sm90 forward: turns raw chunk tiles into everything the state update needs.
//
// Per chunk of 16 tokens (t, s index tokens, c channels; G_t = sum_{u<=t} a_u in base 2):
//   P1  norms:   rq_t = scale / ||q_t||, rk_t = 1 / ||k_t||, beta_t = sigmoid(beta_t)
//                (allow_neg_eigval: 2 sigmoid(beta_t))
//   P2  gates:   a_t = lower_bound * sigmoid(exp(A_log) (g_t + dt_bias)) (no A_log: rate 1), G_t,
//                and the tiles
//                k_tilde = k_hat 2^{G_t}, q_tilde = q_hat 2^{G_t}, k_bar = k_hat 2^{-G_t},
//                k_dec = k_hat 2^{G_last - G_t}, gamma = 2^{G_last}, -v
//   P3  A = k_tilde k_bar^T (strict lower, scaled by beta_t), M = q_tilde k_bar^T (lower)
//   P4  -T = -(I + diag(beta) A)^{-1} diag(beta) by forward substitution in fp32
// With chunk-start references, 2^{-G_t} <= 2^{115.4} and 2^{G_t} >= 2^{-115.4} for
// lower_bound >= -5, so every factor is a normal fp32/tf32 number; masked entries are selected
// away, never multiplied by zero.
//
// The softplus gate (kSoftplus; docs/spec.md, "Gate forms") has no floor, so those references could
// overflow. Its P2 forms the per-token factors alpha_t = exp(a_t) in [0, 1] and builds every decay
// as a running product of them, never a quotient: k_tilde, q_tilde from the chunk start, k_dec to the
// chunk end, gamma over the chunk; its P3 forms A and M pair by pair in fp32 (each thread the
// contributions of its channel, reduced over the D channels with shuffles and a shared-memory
// combine; docs/kernel.md, "The softplus gate in the producer"). P1, P4 and the sinks are shared.
//
// A producer group has one thread per channel: 4 warps at D = 128, 2 at D = 64. P3 and P4 are
// spread over the group's warps: with 4, warp 0 computes A and the inverse while warps 2 and 3
// compute the two halves of M (the preparation pass: warp 2 both, loading each fragment once); with
// 2, warp 1 computes both halves of M.
//
// Where the prepared chunk goes is a policy (a "sink"): the fused kernel writes it into a ring
// stage its consumers read (StageSink: fp32 tiles; CompactStageSink, kda_fwd_kernel.cuh: the
// compact form); the preparation pass writes it to the workspace in the compact form of
// KdaPrepared (WorkspaceSink, kda_prep.cuh).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <utility>

#include "../common/bulk_copy.cuh"
#include "../common/ptx.cuh"
#include "kda_fwd_scheduler.cuh"
#include "kda_fwd_traits.cuh"
#include "kda_raw_maps.h"

namespace flash_kda::cuda::sm90 {

__device__ __forceinline__ float bf16_bits_to_float(uint16_t h) { return __uint_as_float(uint32_t(h) << 16); }

// (x, y) = swap ? (a, b) : (b, a), as two selp: written as C++ selects of array elements, the
// compiler turns them into a select of addresses and moves the array to local memory.
__device__ __forceinline__ void swap_if(bool swap, float a, float b, float& x, float& y) {
#ifdef FLASH_KDA_SIMT_EMULATION
  x = swap ? a : b, y = swap ? b : a;
#else
  asm("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %2, 0;\n\tselp.f32 %0, %3, %4, p;\n\tselp.f32 %1, %4, %3, p;\n\t}"
      : "=f"(x), "=f"(y)
      : "r"(int(swap)), "f"(a), "f"(b));
#endif
}

// The fused kernel's sink: the prepared chunk lands in a shared-memory ring stage, rounded to tf32.
template <class Stage>
struct StageSink {
  static constexpr bool kTriangle = false;  // -T and M whole (the prepared form stores triangles)
  Stage& st;
  uint32_t t_round;  // neg_t_rounding: -T rounded to tf32, or unrounded (exact_neg_t)
  __device__ const float (*k_tilde() const)[Stage::kPitchKI] { return st.k_tilde; }
  __device__ const float (*q_tilde() const)[Stage::kPitchKI] { return st.q_tilde; }
  // Tokens t and t + 8 of channel c (one interleaved 8-byte store each).
  __device__ void kq(int t, int c, const float (&k)[2], const float (&q)[2]) const {
    *reinterpret_cast<float2*>(&st.k_tilde[t][2 * c]) = make_float2(ptx::round_tf32(k[0]), ptx::round_tf32(k[1]));
    *reinterpret_cast<float2*>(&st.q_tilde[t][2 * c]) = make_float2(ptx::round_tf32(q[0]), ptx::round_tf32(q[1]));
  }
  __device__ void k_dec(int c, const float (&kd)[kChunkTokens]) const {
#pragma unroll
    for (int t = 0; t < kChunkTokens; t += 4)
      *reinterpret_cast<float4*>(&st.k_dec_t[c][t]) = make_float4(
          ptx::round_tf32(kd[t]), ptx::round_tf32(kd[t + 1]), ptx::round_tf32(kd[t + 2]), ptx::round_tf32(kd[t + 3]));
  }
  __device__ void gamma(int c, float g) const { st.gamma[c] = g; }
  __device__ void neg_v(int c, const float (&nv)[kChunkTokens]) const {
#pragma unroll
    for (int t = 0; t < kChunkTokens; t += 4)
      *reinterpret_cast<float4*>(&st.neg_v_t[c][t]) = make_float4(nv[t], nv[t + 1], nv[t + 2], nv[t + 3]);
  }
  __device__ void m(int t, int s, float x) const { st.m[t][s] = ptx::round_tf32(x); }
  __device__ void neg_t(int t, int s, float x) const { st.neg_t[t][s] = ptx::round_tf32_by(x, t_round); }
  __device__ void cross(int) const {}  // (32-token steps only: kda_prep.cuh, PairSink)
};

// kSoftplus: the softplus gate's P2 and P3 (see above); false: the sigmoid gate, whose code is
// unchanged by the other form. kTma (the preparation pass, where the host could make tensor maps of
// q, k and g: kda_raw_maps.h): one thread loads a chunk's raw q, k, g tiles with three tensor copies
// onto the raw buffer's mbarrier instead of every thread issuing cp.async.
template <class Tr, bool kSoftplus = false, bool kTma = false>
struct KdaProducer {
  using Smem = typename Tr::Smem;
  using Group = typename Tr::Group;
  static constexpr int C = Tr::kChunk;
  static constexpr int D = Tr::kDim;
  static constexpr int P = Tr::kGroupThreads;
  static constexpr int kGroups = Tr::kProducerGroups;
  static constexpr int kWarps = P / 32;  // warps of a group: 4 (D = 128) or 2 (D = 64)
  static_assert(P == D && (kWarps == 4 || kWarps == 2), "one producer thread per channel");
  // cp.async vectors (8 bf16) per thread and chunk: q, k, g rows of D channels, v rows of kVRows.
  static constexpr int kQkgVecs = C * D / 8 / P;
  // The preparation pass (no v rows: kVRows 0) computes both halves of M on one warp (m_matrix_both);
  // the fused kernel keeps them on two.
  static constexpr bool kOneWarpM = Tr::kVRows == 0;
  static constexpr int kVVecs = Tr::kLoadV ? (C * Tr::kVRows / 8 + P - 1) / P : 0;
  static constexpr int kVRowVecs = Tr::kLoadV ? Tr::kVRows / 8 : 1;  // 16-byte vectors of one v row

  const KdaFwdArgs& a;
  const WorkUnit& w;
  Group& grp;
  int gidx;  // which producer group: prepares chunks gidx, gidx + kGroups, ...
  int ptid;  // 0 .. kGroupThreads-1
  int nchunks;
  // Per-thread source pointers of the vectors this thread copies (the (token, column) a thread
  // copies is the same in every chunk; only the chunk offset changes).
  const uint16_t *q_src[kQkgVecs], *k_src[kQkgVecs], *g_src[kQkgVecs], *v_src[kVVecs > 0 ? kVVecs : 1];
  const uint16_t* beta_src;
  int shift;  // w.shift, or 0 where the grid is never shifted (known at compile time there)
  // kTma: the maps, and one mbarrier a raw buffer (the copies' bytes complete its phase)
  const RawMaps* maps;
  uint64_t* raw_full;

  __device__ KdaProducer(const KdaFwdArgs& args, const WorkUnit& work, Group& group_smem, int group, int tid,
                         const RawMaps* raw_maps = nullptr, uint64_t* raw_bars = nullptr)
      : a(args),
        w(work),
        grp(group_smem),
        gidx(group),
        ptid(tid),
        nchunks(int(chunk_count(work.len, Tr::kShiftedGrid ? work.shift : 0))),
        shift(Tr::kShiftedGrid ? work.shift : 0),
        maps(raw_maps),
        raw_full(raw_bars) {
    static_assert(!kTma || !Tr::kLoadV, "tensor copies: the preparation pass's raw buffers");
    static_assert(Tr::kRawStages == 1 || Tr::kRawStages == 2, "one or two raw buffers a group");
    const int hq = w.hv / a.group;
    const uint16_t* q_base = a.q + w.row * a.q_s[0] + w.begin * a.q_s[1] + hq * a.q_s[2];
    const uint16_t* k_base = a.k + w.row * a.k_s[0] + w.begin * a.k_s[1] + hq * a.k_s[2];
    const uint16_t* g_base = a.g + w.row * a.g_s[0] + w.begin * a.g_s[1] + int64_t(w.hv) * a.g_s[2];
    const uint16_t* v_base =
        a.v + w.row * a.v_s[0] + w.begin * a.v_s[1] + int64_t(w.hv) * a.v_s[2] + w.slice * Tr::kVRows;
#pragma unroll
    for (int m = 0; m < kQkgVecs; ++m) {
      const int idx = ptid + m * P, t = idx / (D / 8), col = (idx % (D / 8)) * 8;
      q_src[m] = q_base + t * a.q_s[1] + col;
      k_src[m] = k_base + t * a.k_s[1] + col;
      g_src[m] = g_base + t * a.g_s[1] + col;
    }
#pragma unroll
    for (int m = 0; m < kVVecs; ++m) {
      const int idx = ptid + m * P, t = idx / kVRowVecs, col = (idx % kVRowVecs) * 8;
      v_src[m] = v_base + t * a.v_s[1] + col;
    }
    beta_src = a.beta + w.row * a.beta_s[0] + (w.begin + ptid) * a.beta_s[1] + int64_t(w.hv) * a.beta_s[2];
  }

  __device__ void group_sync() const { ptx::bar_sync(Tr::kBarGroup0 + gidx, P); }

  // Issues the cp.async copies of chunk i (q, k, g: all channels; v: this CTA's rows) into the
  // group's raw buffer `buf` if i < limit; tokens past the end, and the virtual ones before the
  // first (w.shift), are zero-filled. Always commits one group.
  __device__ void load_raw(int i, int buf, int limit) {
    if constexpr (kTma) {
      // (int32 coordinates: the host makes no maps past 2^31 tokens; a chunk's box may start before
      // the sequence, or reach past it or past the tensor: run_chunks zeroes those rows)
      if (ptid == 0 && i < limit) {
        typename Tr::Raw& raw = grp.raw[buf];
        const int t = int(w.begin + int64_t(i) * C - shift), row = int(w.row), hq = w.hv / a.group;
        mbarrier_arrive_expect_tx(&raw_full[buf], sizeof(raw.q) + sizeof(raw.k) + sizeof(raw.g));
        tensor_copy_g2s_4d(raw.q, &maps->q, 0, hq, t, row, &raw_full[buf]);
        tensor_copy_g2s_4d(raw.k, &maps->k, 0, hq, t, row, &raw_full[buf]);
        tensor_copy_g2s_4d(raw.g, &maps->g, 0, w.hv, t, row, &raw_full[buf]);
      }
      return;
    }
    if (i < limit) {
      typename Tr::Raw& raw = grp.raw[buf];
      const int64_t t0 = int64_t(i) * C - shift;  // the chunk's first token
#pragma unroll
      for (int m = 0; m < kQkgVecs; ++m) {
        const int idx = ptid + m * P, t = idx / (D / 8), col = (idx % (D / 8)) * 8;
        const bool valid = (!Tr::kShiftedGrid || t0 + t >= 0) && t0 + t < w.len;
        const uint32_t bytes = valid ? 16 : 0;
        // An invalid row copies nothing; its source address is clamped to the sequence start.
        ptx::cp_async_16(&raw.q[t][col], valid ? q_src[m] + t0 * a.q_s[1] : q_src[m], bytes);
        ptx::cp_async_16(&raw.k[t][col], valid ? k_src[m] + t0 * a.k_s[1] : k_src[m], bytes);
        ptx::cp_async_16(&raw.g[t][col], valid ? g_src[m] + t0 * a.g_s[1] : g_src[m], bytes);
      }
#pragma unroll
      for (int m = 0; m < kVVecs; ++m) {
        const int idx = ptid + m * P, t = idx / kVRowVecs, col = (idx % kVRowVecs) * 8;
        if (idx < C * Tr::kVRows / 8) {
          const bool valid = (!Tr::kShiftedGrid || t0 + t >= 0) && t0 + t < w.len;
          ptx::cp_async_16(&raw.v[t][col], valid ? v_src[m] + t0 * a.v_s[1] : v_src[m], valid ? 16 : 0);
        }
      }
    }
    ptx::cp_async_commit();
  }

  // kTma: the rows of a landed raw buffer outside the sequence (before its start on a shifted grid,
  // past its end: another sequence's tokens or the tensor's end) set to zeros, as cp.async's
  // zero-fill leaves them. Rare (a sequence's first and last chunks); the fence orders these writes
  // before the tensor copies that later reuse the buffer.
  __device__ void zero_outside(typename Tr::Raw& raw, int64_t t0) const {
    constexpr int kRowVecs = D / 8, kTileVecs = C * kRowVecs;  // 16-byte pieces
#pragma unroll 1
    for (int idx = ptid; idx < 3 * kTileVecs; idx += P) {
      const int tile = idx / kTileVecs, t = (idx % kTileVecs) / kRowVecs, col = 8 * (idx % kRowVecs);
      uint16_t(*rows)[D] = tile == 0 ? raw.q : tile == 1 ? raw.k : raw.g;
      if (t0 + t < 0 || t0 + t >= w.len) *reinterpret_cast<uint4*>(&rows[t][col]) = make_uint4(0, 0, 0, 0);
    }
    fence_proxy_async_shared();
  }

  __device__ float load_beta(int i, int limit) const {
    const int64_t t0 = int64_t(i) * C - shift, t = t0 + ptid;
    return (ptid < C && i < limit && (!Tr::kShiftedGrid || t >= 0) && t < w.len)
               ? bf16_bits_to_float(beta_src[t0 * a.beta_s[1]])
               : 0.f;
  }

  // -rate * log2(e), rate = exp(A_log), or 1 without A_log (docs/spec.md, "Gate forms").
  __device__ float gate_mul() const { return -(a.A_log ? expf(a.A_log[w.hv]) : 1.f) * 1.4426950408889634f; }

  // Chunk i's gates, norms and tiles into `sink` (the group's raw buffer `raw` holds its inputs and
  // is visible to the whole group). Ends with the group synchronised and the chunk complete.
  // `before_tiles` runs once the norms are visible, before the first write to the sink (the fused
  // kernel waits there for its ring stage to be free); `after_raw` once the group has read `raw` for
  // the last time (after the tiles), every thread of the group calling it.
  template <class Sink, class BeforeTiles, class AfterRaw>
  __device__ void prepare(const typename Tr::Raw& raw, int i, float beta_raw, float gmul, float gadd, const Sink& sink,
                          BeforeTiles before_tiles, AfterRaw after_raw) {
    // Tokens [lo, valid) of the chunk are real ones: not past the end, not virtual ones before the
    // start (lo > 0 only in chunk 0 of a shifted grid; docs/kernel.md, "The shifted chunk grid and
    // checkpoints").
    const int64_t t0 = int64_t(i) * C - shift;
    const int lo = Tr::kShiftedGrid ? int(max(int64_t(0), -t0)) : 0, valid = int(min(int64_t(C), w.len - t0));
    norms(raw, lo, valid, beta_raw);
    if constexpr (kSoftplus) {
      float alpha[C];
      softplus_factors(raw, lo, valid, gmul, gadd, alpha);
      group_sync();  // norms are visible
      before_tiles();
      softplus_tiles(raw, sink, alpha);  // also this warp's partial sums of A and M
      group_sync();                      // the partial sums are visible
      after_raw();
      // Warp 0 combines A and goes on to the inverse; warps 2 and 3 (D = 64: warp 1) combine M
      // meanwhile.
      const int warp = ptid >> 5;
      if (warp == 0) {
        softplus_l_matrix();
        __syncwarp();
        inverse(sink);
      } else if constexpr (kWarps == 4) {
        if (warp >= 2) softplus_m_matrix(sink, warp - 2);
      } else {
        softplus_m_matrix(sink, 0);
        softplus_m_matrix(sink, 1);
      }
      group_sync();
      return;
    }
    float G[C];
    gate_prefix(raw, lo, valid, gmul, gadd, G);
    group_sync();  // norms are visible
    before_tiles();
    tiles(raw, sink, G);
    group_sync();
    after_raw();
    // Warp 0 computes A and goes straight on to the inverse, which needs nothing else; warps 2
    // and 3 compute M meanwhile, or warp 2 alone in the preparation pass (warp 1 computes the cross
    // blocks of a pair's second chunk, else has no work here). D = 64: warp 1 computes M.
    const int warp = ptid >> 5;
    if (warp == 0) {
      l_matrix(sink);
      __syncwarp();
      inverse(sink);
    } else if constexpr (kOneWarpM) {
      if (warp == 2 || kWarps == 2) {
        m_matrix_both(sink);
      } else if (warp == 1) {
        sink.cross(ptid);
      }
    } else if constexpr (kWarps == 4) {
      if (warp >= 2) {
        m_matrix(sink, warp - 2);
      } else {
        sink.cross(ptid);
      }
    } else {
      m_matrix(sink, 0);
      m_matrix(sink, 1);
    }
    group_sync();  // (racecheck does not treat a fenced bar.arrive as ordering the writes before it)
  }

  // Prepares chunks first, first + step, ... < limit, each after its raw tiles arrive; the next
  // one's copies are issued first with two raw buffers, and with one as soon as this chunk's tiles
  // are made (the raw tiles' last reader); `sink_of(i)` gives chunk i's sink and `before_tiles(i)`
  // runs as in prepare(), `done(i)` after it.
  template <class SinkOf, class Before, class Done>
  __device__ void run_chunks(int first, int step, int limit, SinkOf sink_of, Before before_tiles, Done done) {
    // -rate * (g + dt_bias) * log2(e) = g * gate_mul + gate_add: one FMA per element. The softplus
    // gate takes dt_bias itself (softplus(g + dt_bias) is not linear in g).
    const float gmul = gate_mul();
    const float dt_bias = a.dt_bias[w.hv * D + ptid];
    const float gadd = kSoftplus ? dt_bias : gmul * dt_bias;
    if constexpr (kTma) {
      if (ptid == 0) {
        for (int b = 0; b < Tr::kRawStages; ++b) mbarrier_init(&raw_full[b], 1);
      }
      group_sync();  // the mbarriers are initialised
    }
    load_raw(first, 0, limit);
    float beta_next = load_beta(first, limit);
    for (int n = 0, i = first; i < limit; ++n, i += step) {
      // Two buffers: the next own chunk's was last read in the previous iteration, which ended with
      // group barriers; prefetch into it now.
      if constexpr (Tr::kRawStages == 2) load_raw(i + step, (n + 1) % 2, limit);
      const float beta_raw = beta_next;
      beta_next = load_beta(i + step, limit);
      if constexpr (kTma) {
        const int buf = n % Tr::kRawStages;
        mbarrier_wait(&raw_full[buf], uint32_t(n / Tr::kRawStages) & 1);
        const int64_t t0 = int64_t(i) * C - shift;
        if (t0 < 0 || t0 + C > w.len) zero_outside(grp.raw[buf], t0);
      } else {
        ptx::cp_async_wait<Tr::kRawStages - 1>();  // (chunk i's group: the newest with one buffer)
      }
      group_sync();  // chunk i's raw tiles are visible to the whole group
      prepare(grp.raw[n % Tr::kRawStages], i, beta_raw, gmul, gadd, sink_of(i), [&] { before_tiles(i); }, [&] {
        // One buffer: the group is done with it (prepare's barrier after the tiles); the next chunk's
        // copies go in now and land while this chunk's products and inverse run.
        if constexpr (Tr::kRawStages == 1) load_raw(i + step, 0, limit);
      });
      done(i);
    }
    ptx::cp_async_wait<0>();
  }

  // The fused kernel's producer group: chunks gidx, gidx + kGroups, ... into the ring, through the
  // sink `sink_of(i)` of chunk i's stage (StageSink, or CompactStageSink on compact stages).
  template <class SinkOf>
  __device__ void run(SinkOf sink_of) {
    run_chunks(
        gidx, kGroups, nchunks, sink_of,
        [&](int i) {  // stage i % kStages released by the consumers of chunk i - kStages
          if (i >= Tr::kStages) ptx::bar_sync(Tr::empty_bar(i), Tr::kHandoffThreads);
        },
        [&](int i) { ptx::bar_arrive(Tr::kBarFull0 + i % Tr::kStages, Tr::kHandoffThreads); });
  }

  // P1: kGroupThreads / 16 threads per token, reduced with shuffles inside the warp. In step h the
  // kLanes lanes of a token read kLanes adjacent 16-byte pieces of its row (channels 8 part + 8 kLanes h
  // ..): one conflict-free wavefront a quarter-warp (pieces 2 apart put two lanes on each bank group).
  __device__ void norms(const typename Tr::Raw& raw, int lo, int valid, float beta_raw) {
    constexpr int kLanes = P / C, kCh = D / kLanes;  // lanes per token, channels per lane
    const int t = ptid / kLanes, part = ptid % kLanes;
    float ssq_q = 0.f, ssq_k = 0.f;
#pragma unroll
    for (int h = 0; h < kCh / 8; ++h) {
      const int col = 8 * (part + kLanes * h);
      const uint4 qv = *reinterpret_cast<const uint4*>(&raw.q[t][col]);
      const uint4 kv = *reinterpret_cast<const uint4*>(&raw.k[t][col]);
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
    for (int o = 1; o < kLanes; o <<= 1) {
      ssq_q += __shfl_xor_sync(0xffffffffu, ssq_q, o);
      ssq_k += __shfl_xor_sync(0xffffffffu, ssq_k, o);
    }
    if (part == 0) {
      // eps inside the square root, as the contract specifies (not a clamp of the norm);
      // rsqrt.approx is within 2 ulp.
      grp.rq[t] = a.scale * rsqrtf(ssq_q + 1e-6f);
      grp.rk[t] = rsqrtf(ssq_k + 1e-6f);
    }
    // beta_scale is 1, or 2 with allow_neg_eigval (an exact doubling; docs/kernel.md, numerics).
    if (ptid < C)
      grp.beta[ptid] =
          ptid >= lo && ptid < valid ? a.beta_scale * ptx::rcp(1.f + ptx::ex2(-1.4426950408889634f * beta_raw)) : 0.f;
  }

  // P2a: gates of this thread's channel, prefix-summed over the chunk in base 2.
  __device__ void gate_prefix(const typename Tr::Raw& raw, int lo, int valid, float gate_mul, float gate_add,
                              float (&G)[C]) const {
    const int c = ptid;
    float acc = 0.f;
#pragma unroll
    for (int t = 0; t < C; ++t) {
      // sigmoid(x) = 1 / (1 + 2^{-x log2 e}); the approximate ex2/rcp reach 0 and 1 exactly.
      const float sig = ptx::rcp(1.f + ptx::ex2(fmaf(bf16_bits_to_float(raw.g[t][c]), gate_mul, gate_add)));
      acc += t >= lo && t < valid ? a.lower_bound_log2 * sig : 0.f;
      G[t] = acc;
    }
  }

  // Channel c of the chunk's normalised keys and queries (q with scale) and -v (this CTA's
  // columns, 0 past them), from the raw tiles and the norms of P1.
  __device__ void normalised(const typename Tr::Raw& raw, int c, float (&k_hat)[C], float (&q_hat)[C],
                             float (&nv)[C]) const {
#pragma unroll
    for (int t = 0; t < C; t += 4) {
      const float4 rk = *reinterpret_cast<const float4*>(&grp.rk[t]);
      const float4 rq = *reinterpret_cast<const float4*>(&grp.rq[t]);
      const float rk_[4] = {rk.x, rk.y, rk.z, rk.w}, rq_[4] = {rq.x, rq.y, rq.z, rq.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        k_hat[t + j] = bf16_bits_to_float(raw.k[t + j][c]) * rk_[j];
        q_hat[t + j] = bf16_bits_to_float(raw.q[t + j][c]) * rq_[j];
        if constexpr (Tr::kLoadV) nv[t + j] = c < Tr::kVRows ? -bf16_bits_to_float(raw.v[t + j][c]) : 0.f;
      }
    }
  }

  // P2b: the decayed tiles of this thread's channel. Every shared-memory load comes before the
  // first store: the compiler cannot prove the raw and stage tiles apart, and a store between
  // loads would serialise the 16 otherwise independent token chains.
  template <class Sink>
  __device__ void tiles(const typename Tr::Raw& raw, const Sink& sink, const float (&G)[C]) {
    const int c = ptid;
    float k_hat[C], q_hat[C], nv[C];
    normalised(raw, c, k_hat, q_hat, nv);
    const float gamma = ptx::ex2(G[C - 1]);
    float k_dec[C];
#pragma unroll
    for (int t = 0; t < C / 2; ++t) {  // tokens t and t + 8 share one interleaved store
      float k_til[2], q_til[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int u = t + h * C / 2;
        const float e = ptx::ex2(G[u]);   // in [2^-115.4, 1]
        const float r = ptx::ex2(-G[u]);  // in [1, 2^115.4]; independent of e (no MUFU chain)
        k_til[h] = k_hat[u] * e;
        q_til[h] = q_hat[u] * e;
        grp.k_bar[u][c] = ptx::round_tf32(k_hat[u] * r);
        k_dec[u] = k_hat[u] * (gamma * r);  // gamma <= e, so the factor is <= 1
      }
      sink.kq(t, c, k_til, q_til);
    }
    sink.gamma(c, gamma);
    sink.k_dec(c, k_dec);
    if constexpr (Tr::kLoadV) {
      if (c < Tr::kVRows) sink.neg_v(c, nv);
    }
  }

  // Both 8-column halves of tile k_bar^T over the D channels (tile: k_tilde or q_tilde,
  // token-interleaved), in kChains independent accumulator chains a half; sum[n][r] is element r of
  // half n's C fragment (row g + 8 (r / 2), column 8 n + 2 t4 + r % 2).
  template <int kChains, class Tile>
  __device__ void k_bar_products(const Tile& tile, float (&sum)[2][4]) const {
    const int lane = ptid & 31, g = lane >> 2, t4 = lane & 3;
    float acc[2][kChains][4] = {};
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      // (rows g, g + 8) x (channels 2t, 2t + 1) in one load: exactly the A fragment a0..a3.
      const float4 a4 = *reinterpret_cast<const float4*>(&tile[g][2 * (8 * j + 2 * t4)]);
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        const float2 b = *reinterpret_cast<const float2*>(&grp.k_bar[8 * n + g][8 * j + 2 * t4]);
        ptx::mma_tf32(acc[n][j % kChains], a4.x, a4.y, a4.z, a4.w, b.x, b.y);
      }
    }
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        if constexpr (kChains == 4) {
          sum[n][r] = (acc[n][0][r] + acc[n][1][r]) + (acc[n][2][r] + acc[n][3][r]);
        } else {
          static_assert(kChains == 2, "two or four chains");
          sum[n][r] = acc[n][0][r] + acc[n][1][r];
        }
      }
  }

  // f(n, r, t, s) for every element r of the two n8 halves' C fragments: row (token) t, column s.
  template <class F>
  __device__ static void each_element(int g, int t4, F f) {
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int r = 0; r < 4; ++r) f(n, r, g + (r >= 2 ? 8 : 0), 8 * n + 2 * t4 + (r & 1));
  }

  // P3a (warp 0): L = diag(beta) * strict_lower(k_tilde k_bar^T), both 8-column halves, over the
  // D channels in eight independent accumulator chains; stored transposed for the inverse.
  template <class Sink>
  __device__ void l_matrix(const Sink& sink) {
    const int lane = ptid & 31, g = lane >> 2, t4 = lane & 3;
    float sum[2][4];
    k_bar_products<4>(sink.k_tilde(), sum);
    each_element(g, t4, [&](int n, int r, int t, int s) { grp.l_t[s][t] = s < t ? grp.beta[t] * sum[n][r] : 0.f; });
  }

  // P3b (warps 2, 3; D = 64: warp 1, both halves): the 8-column half `half` of
  // M = lower(q_tilde k_bar^T).
  template <class Sink>
  __device__ void m_matrix(const Sink& sink, int half) {
    const int lane = ptid & 31, g = lane >> 2, t4 = lane & 3, n0 = 8 * half;
    float acc[4][4] = {};
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      const float4 a4 = *reinterpret_cast<const float4*>(&sink.q_tilde()[g][2 * (8 * j + 2 * t4)]);
      const float2 b = *reinterpret_cast<const float2*>(&grp.k_bar[n0 + g][8 * j + 2 * t4]);
      ptx::mma_tf32(acc[j % 4], a4.x, a4.y, a4.z, a4.w, b.x, b.y);
    }
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const float sum = (acc[0][r] + acc[1][r]) + (acc[2][r] + acc[3][r]);
      const int t = g + (r >= 2 ? 8 : 0), s = n0 + 2 * t4 + (r & 1);
      sink.m(t, s, s <= t ? sum : 0.f);
    }
  }

  // P3b on one warp: both halves of M, each A fragment of q_tilde loaded once for both (shared-memory
  // wavefronts, not the MMAs, are what the preparation is short of: docs/perf_log.md, session 13).
  template <class Sink>
  __device__ void m_matrix_both(const Sink& sink) {
    const int lane = ptid & 31, g = lane >> 2, t4 = lane & 3;
    float sum[2][4];
    k_bar_products<2>(sink.q_tilde(), sum);
    each_element(g, t4, [&](int n, int r, int t, int s) { sink.m(t, s, s <= t ? sum[n][r] : 0.f); });
  }

  // P4: lanes 0..15 of warp 0 each solve one column j of X = (I + L)^{-1} (L strictly lower), then
  // -T[t][j] = -X[t][j] * beta_j. Accumulating L[t][s] x_s for all t > s right after x_s is known
  // keeps the dependent chain at one FMA per step.
  template <class Sink>
  __device__ void inverse(const Sink& sink) {
    const int j = ptid;
    if (j >= C) return;
    float x[C], acc[C];
#pragma unroll
    for (int t = 0; t < C; ++t) acc[t] = 0.f;
#pragma unroll
    for (int s = 0; s < C; ++s) {
      // Row s of L^T as 16-byte broadcasts (every lane reads the same row): a quarter of the loads.
      float l_row[C];
#pragma unroll
      for (int t4 = (s + 1) / 4; t4 < C / 4; ++t4) {
        const float4 l4 = *reinterpret_cast<const float4*>(&grp.l_t[s][4 * t4]);
        l_row[4 * t4] = l4.x, l_row[4 * t4 + 1] = l4.y, l_row[4 * t4 + 2] = l4.z, l_row[4 * t4 + 3] = l4.w;
      }
      x[s] = (s == j ? 1.f : 0.f) - acc[s];
#pragma unroll
      for (int t = s + 1; t < C; ++t) acc[t] = fmaf(l_row[t], x[s], acc[t]);
    }
    const float beta_j = grp.beta[j];
    __syncwarp(0x0000ffffu);  // every lane has read L^T (a pair's sink stores -T over it)
#pragma unroll
    for (int t = 0; t < C; ++t) sink.neg_t(t, j, -x[t] * beta_j);
  }

  // ---- the softplus gate (kSoftplus) ----------------------------------------------------------------

  // P3 of the softplus gate sums, for each column s, the entries M[t][s] (t >= s) and A[t][s] (t > s)
  // over the channels. Columns s and C - 1 - s together have exactly 32 such entries, one per lane
  // after a warp's transposing reduction: pair p = min(s, C - 1 - s) holds column p in slots
  // 0 .. 30 - 2p and column C - 1 - p in slots 31 - 2p .. 31, each column as M[s][s], then M[t][s],
  // A[t][s] for t = s + 1, s + 2, ...
  static constexpr int kPairs = C / 2;
  __host__ __device__ static constexpr int pair_of(int s) { return s < C / 2 ? s : C - 1 - s; }
  __host__ __device__ static constexpr int column_base(int s) { return s < C / 2 ? 0 : 2 * s + 1; }
  __host__ __device__ static constexpr int slot_m(int t, int s) {
    return column_base(s) + (t == s ? 0 : 2 * (t - s) - 1);
  }
  __host__ __device__ static constexpr int slot_a(int t, int s) { return column_base(s) + 2 * (t - s); }
  static_assert(slot_a(C - 1, C / 2 - 1) + 1 == column_base(C / 2) && slot_a(C - 1, C / 2) == 31,
                "two columns of a pair fill 32 slots");
  // The per-warp partial sums [warp][pair][slot] live in the k_bar tile, which only the sigmoid
  // gate's P3 reads.
  static_assert(sizeof(float) * kWarps * kPairs * 32 <= sizeof(Group::k_bar),
                "the partial sums of A and M fit the k_bar tile");
  __device__ float* partial_sums() const { return &grp.k_bar[0][0]; }

  // P2a (softplus): this thread's channel's factors alpha_t = exp(-rate softplus(g_t + dt_bias)) in
  // [0, 1] (1 past the end of the sequence: no decay). softplus(x) = x for x > 20 (as fla) and
  // log1p(e^x) otherwise: log1pf keeps softplus(x) ~ e^x for a very negative x, where log(1 + e^x)
  // would round to 0 (no decay) too early. gate_mul = -rate log2(e) is finite for A_log < 88 (the
  // contract); rate softplus(x) overflowing gives 2^-Inf = 0 (ex2.approx), an infinite decay. A factor
  // below 1e-30 is 0, as in the CUDA decode and the fp32 CPU paths. NaN stays NaN.
  // Tokens outside [lo, valid) (past the end, or virtual ones before the start of a shifted grid)
  // get alpha = 1. For x < -20, rate * softplus(x) is formed as exp(A_log + x) (softplus(x) = e^x
  // to within e^x / 2 there): the rate may be as large as e^88, and ex2.approx.ftz flushes an e^x
  // below 2^-126 to 0 (A_log = 80, x = -90: a decay of e^-4.5e-5 a token, not none).
  __device__ void softplus_factors(const typename Tr::Raw& raw, int lo, int valid, float gate_mul, float dt_bias,
                                   float (&alpha)[C]) const {
    constexpr float kLog2e = 1.4426950408889634f;
    const int c = ptid;
    const float log_rate = a.A_log[w.hv];  // the softplus gate requires A_log
#pragma unroll
    for (int t = 0; t < C; ++t) {
      const float x = bf16_bits_to_float(raw.g[t][c]) + dt_bias;
      const float sp = x > 20.f ? x : log1pf(ptx::ex2(x * kLog2e));
      const float a2 = x < -20.f ? -ptx::ex2((log_rate + x) * kLog2e) * kLog2e : gate_mul * sp;  // a log2(e)
      const float f = ptx::ex2(a2);
      alpha[t] = t >= lo && t < valid ? (f < 1e-30f ? 0.f : f) : 1.f;
    }
  }

  // P2b + P3a (softplus): the tiles of this thread's channel c from running products of its factors
  // (each a product of numbers in [0, 1]: no overflow, no quotient, one rounding per factor)
  //   k_tilde_t = k_hat_t E_t, q_tilde_t = q_hat_t E_t, E_t = prod_{u <= t} alpha_u, gamma = E_{C-1},
  //   k_dec_s = k_hat_s R_s, R_s = prod_{s < u < C} alpha_u,
  // then its contributions k_hat_t k_hat_s P_ts and q_hat_t k_hat_s P_ts (P_ts = prod_{s < u <= t}
  // alpha_u) to A and M, summed over the warp's 32 channels; lane l stores the sum of slot l.
  template <class Sink>
  __device__ void softplus_tiles(const typename Tr::Raw& raw, const Sink& sink, const float (&alpha)[C]) {
    const int c = ptid, lane = ptid & 31, warp = ptid >> 5;
    float k_hat[C], q_hat[C], nv[C];
    normalised(raw, c, k_hat, q_hat, nv);
    if constexpr (Tr::kLoadV) {
      if (c < Tr::kVRows) sink.neg_v(c, nv);
    }
    float e[C];  // E_t
    e[0] = alpha[0];
#pragma unroll
    for (int t = 1; t < C; ++t) e[t] = e[t - 1] * alpha[t];
#pragma unroll
    for (int t = 0; t < C / 2; ++t) {  // tokens t and t + 8 share one interleaved store
      const float k_til[2] = {k_hat[t] * e[t], k_hat[t + C / 2] * e[t + C / 2]};
      const float q_til[2] = {q_hat[t] * e[t], q_hat[t + C / 2] * e[t + C / 2]};
      sink.kq(t, c, k_til, q_til);
    }
    sink.gamma(c, e[C - 1]);
    float k_dec[C];
    float r = 1.f;  // R_s
#pragma unroll
    for (int s = C - 1; s >= 0; --s) {
      k_dec[s] = k_hat[s] * r;
      r *= alpha[s];
    }
    sink.k_dec(c, k_dec);

    pair_partials(k_hat, q_hat, alpha, partial_sums() + warp * kPairs * 32 + lane, lane,
                  std::make_integer_sequence<int, kPairs>{});
  }

  // Every pair's partial sums (a template parameter each, so that every register index is a
  // compile-time constant).
  template <int... kP>
  __device__ void pair_partials(const float (&k_hat)[C], const float (&q_hat)[C], const float (&alpha)[C], float* part,
                                int lane, std::integer_sequence<int, kP...>) const {
    (pair_partial<kP>(k_hat, q_hat, alpha, part, lane), ...);
  }

  // Pair kP's 32 entries of this thread's channel, summed over the warp, in two halves of 16 slots
  // (each half's values formed just before its reduction: fewer live registers); lane l stores slot l.
  template <int kP>
  __device__ void pair_partial(const float (&k_hat)[C], const float (&q_hat)[C], const float (&alpha)[C], float* part,
                               int lane) const {
    const float lo = reduce16(half_entries<kP, 0>(k_hat, q_hat, alpha), lane);
    const float hi = reduce16(half_entries<kP, 1>(k_hat, q_hat, alpha), lane);
    part[kP * 32] = lane < 16 ? lo : hi;
  }

  struct Sixteen {
    float x[16];
  };
  // Slots 16 kH .. 16 kH + 15 of pair kP: slot j is column s = kP (j < 31 - 2 kP) or C - 1 - kP,
  // local index l = j - column_base(s): M[s][s] for l = 0, M[s + m][s] for l = 2m - 1, A[s + m][s]
  // for l = 2m. Each value is k_hat_s times the factors alpha_{s+1} .. alpha_t in that order, so
  // consecutive slots of a column share their products (one running product after CSE).
  template <int kP, int kH>
  __device__ static Sixteen half_entries(const float (&k_hat)[C], const float (&q_hat)[C], const float (&alpha)[C]) {
    Sixteen v;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const int j = 16 * kH + i;
      const int s = j < 31 - 2 * kP ? kP : C - 1 - kP;
      const int l = j - (j < 31 - 2 * kP ? 0 : 31 - 2 * kP);
      const int t = s + (l + 1) / 2;
      float w = k_hat[s];
#pragma unroll
      for (int u = 1; u < C; ++u)
        if (s + u <= t) w *= alpha[s + u];
      v.x[i] = (l % 2 == 0 && l > 0 ? k_hat[t] : q_hat[t]) * w;
    }
    return v;
  }

  // Transposing reduction of 16 values over the warp: in the step of width h a lane keeps the half
  // of its h + h values whose slots agree with its own bit h and adds its partner's (lane ^ h) copy
  // of that half, sending the other half. Afterwards x[i] (i < h) is slot (lane & (16 - h)) + i
  // summed over the lanes that differ from this one only in bits h .. 8; a last exchange with lane
  // ^ 16 completes the sum. Returns slot lane % 16 summed over the warp: 16 shuffles for 16 sums
  // (half of a 32-value reduction's registers, for one more shuffle).
  __device__ static float reduce16(Sixteen v, int lane) {
    float (&x)[16] = v.x;
#pragma unroll
    for (int step = 0; step < 4; ++step) {
      const int h = 8 >> step;
      const bool upper = lane & h;
#pragma unroll
      for (int i = 0; i < 8; ++i) {  // (a constant trip count: `i < h` would not be unrolled)
        if (i < h) {
          float send, keep;
          swap_if(upper, x[i], x[i + h], send, keep);
          x[i] = keep + __shfl_xor_sync(0xffffffffu, send, h);
        }
      }
    }
    return x[0] + __shfl_xor_sync(0xffffffffu, x[0], 16);
  }

  // Entry `slot` of pair `p` summed over the group's warps.
  __device__ float pair_sum(int p, int slot) const {
    const float* part = partial_sums() + p * 32 + slot;
    constexpr int kW = kPairs * 32;  // one warp's partial sums
    if constexpr (kWarps == 4) {
      return (part[0] + part[kW]) + (part[2 * kW] + part[3 * kW]);
    } else {
      return part[0] + part[kW];
    }
  }

  // P3b (softplus, warp 0): L^T, L = diag(beta) * strict_lower(A), every entry (zeros on and above
  // the diagonal), as l_matrix() stores it.
  __device__ void softplus_l_matrix() {
    const int lane = ptid & 31;
#pragma unroll
    for (int e = 0; e < C * C / 32; ++e) {
      const int idx = 32 * e + lane, s = idx / C, t = idx % C;
      const bool below = s < t;
      const float sum = pair_sum(pair_of(s), below ? slot_a(t, s) : 0);
      grp.l_t[s][t] = below ? grp.beta[t] * sum : 0.f;
    }
  }

  // P3c (softplus, warps 2, 3; D = 64: warp 1, both halves): rows 8 half .. 8 half + 7 of M,
  // M[t][s] = sum_c q_hat_tc k_hat_sc P_ts (q_hat with the scale) for s <= t, every entry (zeros
  // above the diagonal), as m_matrix() stores it.
  template <class Sink>
  __device__ void softplus_m_matrix(const Sink& sink, int half) {
    const int lane = ptid & 31;
#pragma unroll
    for (int e = 0; e < C * C / 64; ++e) {
      const int idx = C * C / 2 * half + 32 * e + lane, t = idx / C, s = idx % C;
      if constexpr (Sink::kTriangle) {
        if (t < 8 && s >= 8) continue;  // the block above the diagonal is not stored
      }
      const bool lower = s <= t;
      const float sum = pair_sum(pair_of(s), lower ? slot_m(t, s) : 0);
      sink.m(t, s, lower ? sum : 0.f);
    }
  }
};

}  // namespace flash_kda::cuda::sm90
