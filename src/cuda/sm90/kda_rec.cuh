// The recurrence kernel of the prepared plans: one CTA per (part, value head, slice of rows).
// A part is what kda_plan.cuh lists: a sequence's real rows over a chunk range (written out, from
// the true start state), or a segment's zero-start rows R or transition rows P (pass 1 of a split).
//
//   loader (one warpgroup)   copies prepared chunks (and this slice's v columns) from the workspace
//                            into a landing ring (cp.async, kLandStages - 1 chunks ahead), then
//                            expands them into the consumers' stage layout: fp16 -> fp32, scale
//                            into q, v transposed and negated; FULL/EMPTY named barriers as in the
//                            fused kernel
//   consumers                the fused kernel's (kda_fwd_consumer.cuh), on the RowsIO of the part
#pragma once

#include <cuda_fp16.h>

#include "kda_fwd_consumer.cuh"
#include "kda_plan_kernels.cuh"
#include "kda_prep.cuh"

namespace flash_kda::cuda::sm90 {

template <class Tr>
struct KdaLoader {
  static constexpr int C = Tr::kChunk;
  static constexpr int P = Tr::kGroupThreads;
  static constexpr int kVVecs = C * Tr::kVRows / 8;  // 16-byte vectors of v a chunk

  const KdaFwdArgs& a;
  const WorkUnit& w;
  const RowsIO& io;
  typename Tr::Smem& sm;
  const unsigned char* src0;  // prepared chunk io.chunk0
  int64_t stride;             // bytes between consecutive chunks of one head
  const uint16_t* v_base;     // v of the sequence's first token, this slice's first column
  int tid;

  __device__ void loader_sync() const { ptx::bar_sync(Tr::kBarLoader, P); }

  // Byte offset of the i-th 16-byte vector a part reads: all of KdaPrepared with out, else only
  // k_tilde, k_dec, -T and gamma (q_hat and M feed only the output).
  __device__ static int vector_offset(int i, bool out) {
    if (out) return 16 * i;
    constexpr int kK = (KdaPrepared::kQHat - KdaPrepared::kKTilde) / 16;  // 256 vectors of k_tilde
    constexpr int kDT = (KdaPrepared::kM - KdaPrepared::kKDec) / 16;      // 320 of k_dec and -T
    return i < kK ? 16 * i
                  : (i < kK + kDT ? KdaPrepared::kKDec + 16 * (i - kK) : KdaPrepared::kGamma + 16 * (i - kK - kDT));
  }

  __device__ void issue(int i, int buf) {
    if (i < io.nchunks) {
      auto& land = sm.land[buf];
      const unsigned char* src = src0 + i * stride;
      const int vectors = io.write_out ? KdaPrepared::kBytes / 16 : (KdaPrepared::kBytes - 4096 - 1024) / 16;
      for (int idx = tid; idx < vectors; idx += P) {
        const int off = vector_offset(idx, io.write_out);
        ptx::cp_async_16(land.prepared + off, src + off, 16);
      }
      if (io.has_v) {
        for (int idx = tid; idx < kVVecs; idx += P) {
          const int t = idx / (Tr::kVRows / 8), col = (idx % (Tr::kVRows / 8)) * 8;
          const int64_t tok = int64_t(io.chunk0 + i) * C + t;
          const bool valid = tok < w.len;  // tokens past the end are zero-filled, nothing read
          ptx::cp_async_16(&land.v[t][col], valid ? v_base + tok * a.v_s[1] + col : v_base, valid ? 16 : 0);
        }
      }
    }
    ptx::cp_async_commit();
  }

  __device__ static float4 half4_to_float4(uint32_t lo, uint32_t hi) {
    const float2 x = __half22float2(*reinterpret_cast<const __half2*>(&lo));
    const float2 y = __half22float2(*reinterpret_cast<const __half2*>(&hi));
    return make_float4(x.x, x.y, y.x, y.y);
  }

  // k_tilde or q_hat: vector idx holds channels c .. c + 3 of tokens t8 and t8 + 8, which is 8
  // consecutive floats of the token-interleaved stage row t8.
  __device__ static void expand_kq(const unsigned char* src, float (*dst)[KdaDims::kPitchKI], float mul, bool round,
                                   int tid) {
    for (int idx = tid; idx < 256; idx += P) {
      const uint4 u = reinterpret_cast<const uint4*>(src)[idx];
      const int t8 = idx >> 5, c = (idx & 31) * 4;
      float4 lo = half4_to_float4(u.x, u.y), hi = half4_to_float4(u.z, u.w);
      if (round) {
        lo = make_float4(ptx::round_tf32(lo.x * mul), ptx::round_tf32(lo.y * mul), ptx::round_tf32(lo.z * mul),
                         ptx::round_tf32(lo.w * mul));
        hi = make_float4(ptx::round_tf32(hi.x * mul), ptx::round_tf32(hi.y * mul), ptx::round_tf32(hi.z * mul),
                         ptx::round_tf32(hi.w * mul));
      }
      *reinterpret_cast<float4*>(&dst[t8][2 * c]) = lo;
      *reinterpret_cast<float4*>(&dst[t8][2 * c + 4]) = hi;
    }
  }

  __device__ static void copy_square(const unsigned char* src, float (*dst)[KdaDims::kPitchT], int tid) {
    for (int idx = tid; idx < C * C / 4; idx += P)
      *reinterpret_cast<float4*>(&dst[idx / 4][4 * (idx % 4)]) = reinterpret_cast<const float4*>(src)[idx];
  }

  __device__ void expand(const typename Tr::Landing& land, typename Tr::Stage& st) const {
    const unsigned char* pr = land.prepared;
    // fp16 values are exact in tf32: no rounding needed; q_hat takes the scale and is rounded.
    expand_kq(pr + KdaPrepared::kKTilde, st.k_tilde, 1.f, false, tid);
    if (io.write_out) {
      expand_kq(pr + KdaPrepared::kQHat, st.q_tilde, a.scale, true, tid);
      copy_square(pr + KdaPrepared::kM, st.m, tid);
    }
    for (int idx = tid; idx < 256; idx += P) {  // k_dec: channel idx / 2, tokens 8 (idx % 2) ..
      const uint4 u = reinterpret_cast<const uint4*>(pr + KdaPrepared::kKDec)[idx];
      float* d = &st.k_dec_t[idx >> 1][8 * (idx & 1)];
      *reinterpret_cast<float4*>(d) = half4_to_float4(u.x, u.y);
      *reinterpret_cast<float4*>(d + 4) = half4_to_float4(u.z, u.w);
    }
    copy_square(pr + KdaPrepared::kNegT, st.neg_t, tid);
    if (tid < KdaDims::kDim / 4)
      reinterpret_cast<float4*>(st.gamma)[tid] = reinterpret_cast<const float4*>(pr + KdaPrepared::kGamma)[tid];
    if (io.has_v && tid < Tr::kVRows) {  // v[t][row] -> -v_t[row][t]
      float nv[C];
#pragma unroll
      for (int t = 0; t < C; ++t) nv[t] = -bf16_bits_to_float(land.v[t][tid]);
#pragma unroll
      for (int t = 0; t < C; t += 4)
        *reinterpret_cast<float4*>(&st.neg_v_t[tid][t]) = make_float4(nv[t], nv[t + 1], nv[t + 2], nv[t + 3]);
    }
  }

  __device__ void run() {
#pragma unroll
    for (int d = 0; d < Tr::kLandStages - 1; ++d) issue(d, d);
    for (int i = 0; i < io.nchunks; ++i) {
      issue(i + Tr::kLandStages - 1, (i + Tr::kLandStages - 1) % Tr::kLandStages);
      ptx::cp_async_wait<Tr::kLandStages - 1>();
      loader_sync();  // chunk i has landed, for every loader thread
      const int s = i % Tr::kStages;
      if (i >= Tr::kStages) ptx::bar_sync(Tr::kBarEmpty0 + s, Tr::kHandoffThreads);
      expand(sm.land[i % Tr::kLandStages], sm.stage[s]);
      loader_sync();
      ptx::bar_arrive(Tr::kBarFull0 + s, Tr::kHandoffThreads);
    }
    ptx::cp_async_wait<0>();
  }
};

// The rows of part `local` of sequence w.seq in pass 1 or 3 (kda_plan.cuh lists them).
__device__ __forceinline__ RowsIO part_rows(const KdaFwdArgs& a, const PlanArgs& p, const WorkUnit& w, int pass,
                                            int64_t local, int rows) {
  constexpr int C = KdaDims::kChunk;
  const int n = w.seq;
  const int64_t nc = (w.len + C - 1) / C, L = p.seg_chunks;
  const int64_t e0 = p.seq.extra_off[n];
  const int segs = int(p.seq.extra_off[n + 1] - e0) + 1;
  RowsIO io;
  io.row0 = w.slice * rows;
  io.identity = false;
  io.has_v = true;
  io.write_out = true;
  const int64_t own = state_row_offset(w.slot, a.heads_v, w.hv, io.row0);
  auto to_final = [&] {
    io.dst = a.final_state;
    io.dst_fp32 = a.state_fp32;
    io.dst_offset = own;
  };
  auto segment_rows = [&](float* buf, int64_t e, void*& ptr, int64_t& offset, bool& fp32) {
    ptr = buf;
    offset = state_row_offset(e, a.heads_v, w.hv, io.row0);
    fp32 = true;
  };
  if (pass == 1 && local == 0) {  // segment 0 (or the whole sequence) from its true start
    io.chunk0 = 0;
    io.nchunks = int(segs == 1 ? nc : L);
    io.init = (a.initial_state != nullptr && !w.zero_init) ? a.initial_state : nullptr;
    io.init_fp32 = a.state_fp32;
    io.init_offset = own;
    if (segs == 1) {
      to_final();
    } else {
      segment_rows(p.seg_start, e0, io.dst, io.dst_offset, io.dst_fp32);
    }
  } else if (pass == 1) {  // segment j's R (from zeros) or P (from I, v = 0)
    const int j = 1 + int(local - 1) / 2;
    const bool transition = (local - 1) % 2 == 1;
    io.chunk0 = int(j * L);
    io.nchunks = int(L);
    io.init = nullptr;
    io.init_fp32 = true;
    io.init_offset = 0;
    io.identity = transition;
    io.has_v = !transition;
    io.write_out = false;
    segment_rows(transition ? p.seg_p : p.seg_r, e0 + j - 1, io.dst, io.dst_offset, io.dst_fp32);
  } else {  // pass 3: segment j from S_j
    const int j = 1 + int(local);
    io.chunk0 = int(j * L);
    io.nchunks = int(min(L, nc - j * L));
    void* init = nullptr;
    segment_rows(p.seg_start, e0 + j - 1, init, io.init_offset, io.init_fp32);
    io.init = init;
    if (j == segs - 1) {
      to_final();
    } else {
      io.dst = nullptr;
      io.dst_fp32 = true;
      io.dst_offset = 0;
    }
  }
  return io;
}

template <class Tr>
__global__ void __launch_bounds__(Tr::kThreads, 1)
    kda_rec_kernel(const __grid_constant__ KdaFwdArgs a, const __grid_constant__ PlanArgs p, int pass) {
  extern __shared__ __align__(16) unsigned char smem_bytes[];
  auto& sm = *reinterpret_cast<typename Tr::Smem*>(smem_bytes);
  const int b = blockIdx.x, slice = b % p.slices, hv = (b / p.slices) % a.heads_v;
  int n;
  int64_t local;
  // Every warp finds its part itself (the same answer): no broadcast, no extra barrier.
  if (!locate(pass == 1 ? p.seq.p1_off : p.seq.p3_off, a.num_seqs, b / (p.slices * a.heads_v), n, local)) return;
  const WorkUnit w = table_unit(a, p.seq, n, hv, slice);
  if (w.skip) return;  // padding: nothing is read or written
  const RowsIO io = part_rows(a, p, w, pass, local, Tr::kVRows);
  const int warp = threadIdx.x >> 5;
  if (warp < Tr::kLoaderWarps) {
    const uint16_t* v_base = a.v + w.row * a.v_s[0] + w.begin * a.v_s[1] + int64_t(hv) * a.v_s[2] + io.row0;
    KdaLoader<Tr>{a,
                  w,
                  io,
                  sm,
                  prepared_chunk(p, a.heads_v, n, hv, io.chunk0),
                  int64_t(a.heads_v) * KdaPrepared::kBytes,
                  v_base,
                  int(threadIdx.x)}
        .run();
  } else {
    KdaConsumer<Tr>(a, w, io, sm.stage, sm.out_stage, warp - Tr::kLoaderWarps, threadIdx.x & 31).run();
  }
}

}  // namespace flash_kda::cuda::sm90
