// The kernels of the prepared plans' bookkeeping: the plan (kda_plan.cuh lists what it writes)
// and the chain of a split sequence's segment states.
#pragma once

#include "../common/ptx.cuh"
#include "kda_plan.cuh"

namespace flash_kda::cuda::sm90 {

// Block-wide exclusive prefix sum of kSeqTableSums values per thread (blockDim.x a multiple of 32,
// at most 1024); returns the block totals in `total`.
__device__ __forceinline__ void block_exclusive_scan(int64_t (&v)[kSeqTableSums], int64_t (&total)[kSeqTableSums],
                                                     int64_t (*warp_sums)[kSeqTableSums]) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  int64_t incl[kSeqTableSums];
#pragma unroll
  for (int q = 0; q < kSeqTableSums; ++q) {
    incl[q] = v[q];
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int64_t y = __shfl_up_sync(0xffffffffu, incl[q], o);
      if (lane >= o) incl[q] += y;
    }
  }
  if (lane == 31)
    for (int q = 0; q < kSeqTableSums; ++q) warp_sums[warp][q] = incl[q];
  __syncthreads();
  if (warp == 0) {
    for (int q = 0; q < kSeqTableSums; ++q) {
      int64_t x = lane < warps ? warp_sums[lane][q] : 0;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int64_t y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
      }
      if (lane < warps) warp_sums[lane][q] = x;  // inclusive over warps
    }
  }
  __syncthreads();
  for (int q = 0; q < kSeqTableSums; ++q) {
    total[q] = warp_sums[warps - 1][q];
    v[q] = incl[q] - v[q] + (warp > 0 ? warp_sums[warp - 1][q] : 0);
  }
  __syncthreads();  // warp_sums is reused by the next call
}

// One CTA of 1024 threads builds the SeqTable (reads the caller's index arrays exactly once).
__global__ void __launch_bounds__(1024)
    kda_plan_kernel(const __grid_constant__ KdaFwdArgs a, const __grid_constant__ PlanArgs p) {
  __shared__ int64_t warp_sums[32][kSeqTableSums];
  __shared__ unsigned long long longest;
  constexpr int C = KdaDims::kChunk;
  int64_t carry[kSeqTableSums] = {};
  if (threadIdx.x == 0) longest = 0;
  __syncthreads();
  for (int base = 0; base < a.num_seqs; base += blockDim.x) {
    const int n = base + threadIdx.x;
    int64_t v[kSeqTableSums] = {};
    if (n < a.num_seqs) {
      int64_t begin = 0, len = a.seqlen;
      if (a.cu_seqlens) sequence_bounds(a, n, begin, len);
      int64_t slot = n;
      if (a.state_indices) {
        slot = a.state_indices[n];
        if (slot < 0 || slot >= a.pool_size) slot = -1;
      }
      p.seq.begin[n] = begin;
      p.seq.len[n] = len;
      p.seq.slot[n] = slot;
      p.seq.zero_init[n] = a.has_initial_state != nullptr && a.has_initial_state[n] == 0;
      const int64_t chunks = (len + C - 1) / C;
      atomicMax(&longest, static_cast<unsigned long long>(chunks));
      const int64_t segs = segment_count(chunks, p.seg_chunks, p.seg0_chunks);
      v[0] = chunks;
      v[1] = (chunks + p.prep_chunks - 1) / p.prep_chunks;
      v[2] = segs - 1;
      v[3] = segs == 1 ? 1 : 2 * segs - 3;
      v[4] = segs - 1;
      v[5] = segs >= 3;
    }
    int64_t total[kSeqTableSums];
    block_exclusive_scan(v, total, warp_sums);
    if (n < a.num_seqs) {
      int64_t* offs[kSeqTableSums] = {p.seq.chunk_off, p.seq.prep_off, p.seq.extra_off,
                                      p.seq.p1_off,    p.seq.p3_off,   p.seq.split_off};
      for (int q = 0; q < kSeqTableSums; ++q) offs[q][n] = carry[q] + v[q];
    }
    for (int q = 0; q < kSeqTableSums; ++q) carry[q] += total[q];
  }
  if (threadIdx.x == 0) {
    int64_t* offs[kSeqTableSums] = {p.seq.chunk_off, p.seq.prep_off, p.seq.extra_off,
                                    p.seq.p1_off,    p.seq.p3_off,   p.seq.split_off};
    for (int q = 0; q < kSeqTableSums; ++q) offs[q][a.num_seqs] = carry[q];
    // Device-decided plan (a packed batch whose pairs fill the GPU): the fused kernel walks each
    // (sequence, head) alone, so it pays when no sequence is much longer than the balanced load
    // per SM; a sequence 4x longer than that runs split instead.
    if (p.device_plan != nullptr) {
      const int64_t balanced = carry[0] * a.heads_v / p.sm_count;
      *p.device_plan = int64_t(longest) > 4 * balanced ? 0 : 1;
    }
  }
}

__global__ void __launch_bounds__(ChainTraits::kThreads)
    kda_chain_kernel(const __grid_constant__ KdaFwdArgs a, const __grid_constant__ PlanArgs p) {
  constexpr int D = KdaDims::kDim, R = ChainTraits::kRows, kSlices = D / R, kT = ChainTraits::kThreads;
  extern __shared__ __align__(16) unsigned char smem_bytes[];
  auto& sm = *reinterpret_cast<ChainTraits::Smem*>(smem_bytes);
  ptx::griddep_wait();  // the previous kernel of the plan is complete (docs/kernel.md, "Plans")
  ptx::griddep_launch_dependents();
  if (fused_chosen(a)) return;
  const int b = blockIdx.x, slice = b % kSlices, hv = (b / kSlices) % a.heads_v;
  int n;
  int64_t local;
  if (threadIdx.x < 32) {
    if (!locate(p.seq.split_off, a.num_seqs, b / (kSlices * a.heads_v), n, local)) n = -1;
    if (threadIdx.x == 0) sm.seq = n;
  }
  __syncthreads();
  n = sm.seq;
  if (n < 0 || p.seq.slot[n] < 0) return;
  const int64_t e0 = p.seq.extra_off[n];
  const int segs = int(p.seq.extra_off[n + 1] - e0) + 1;
  const int tid = threadIdx.x, row0 = slice * R;
  auto at = [&](const float* buf, int64_t e, int r) { return buf + state_row_offset(e, a.heads_v, hv, r); };
  // The steps j = 1 .. segs - 2 read P_j as kTiles tiles of kTileK rows, one stream of tiles
  // q = (j - 1) kTiles + kt through a kRing-deep cp.async ring; the group of a step's first tile
  // also brings this CTA's rows of R_j (read only at that tile, before the next step's arrive).
  constexpr int kTileK = ChainTraits::kTileK, kTiles = D / kTileK, kRing = ChainTraits::kRing;
  static_assert(kRing - 1 < kTiles, "R_{j+1} must not land before every thread has read R_j");
  static_assert(kT == D && R == 8, "one thread a column, eight rows");
  const int steps = segs - 2;
  const int tiles = steps > 0 ? steps * kTiles : 0;
  auto fetch = [&](int q) {
    if (q < tiles) {
      const int j = 1 + q / kTiles, kt = q % kTiles;
      const float* pj = at(p.seg_p, e0 + j - 1, kt * kTileK);
      float* dst = &sm.p[q % kRing][0][0];
      for (int i = tid; i < kTileK * D / 4; i += kT) ptx::cp_async_16(dst + 4 * i, pj + 4 * i, 16);
      if (kt == 0) {
        const float* rj = at(p.seg_r, e0 + j - 1, row0);
        for (int i = tid; i < R * D / 4; i += kT) ptx::cp_async_16(&sm.r[0][0] + 4 * i, rj + 4 * i, 16);
      }
    }
    ptx::cp_async_commit();  // (empty groups keep the count uniform)
  };
  for (int q = 0; q < kRing - 1; ++q) fetch(q);
  {  // S_1 (segment 0's end, written by pass 1), transposed into shared memory
    const float* s1 = at(p.seg_start, e0, row0);
    for (int i = tid; i < R * D; i += kT) sm.s_t[i % D][i / D] = s1[i];
  }
  float acc[R];
  for (int q = 0; q < tiles; ++q) {
    const int j = 1 + q / kTiles, kt = q % kTiles;
    fetch(q + kRing - 1);  // into the slot tile q - 1 used: every thread left it at the last barrier
    ptx::cp_async_wait<kRing - 1>();
    __syncthreads();  // tile q (and R_j with the first tile) visible
    if (kt == 0) {
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r] = sm.r[r][tid];
    }
    const float(*pt)[D] = sm.p[q % kRing];
    // Column tid of the tile's rows, and the CTA's rows of S at the tile's k (broadcasts): all
    // loads of the tile first, then the FMAs (independent per row).
    float pk[kTileK];
#pragma unroll
    for (int k = 0; k < kTileK; ++k) pk[k] = pt[k][tid];
#pragma unroll
    for (int k = 0; k < kTileK; ++k) {
      const float4 s0 = *reinterpret_cast<const float4*>(&sm.s_t[kt * kTileK + k][0]);
      const float4 s1 = *reinterpret_cast<const float4*>(&sm.s_t[kt * kTileK + k][4]);
      acc[0] = fmaf(s0.x, pk[k], acc[0]), acc[1] = fmaf(s0.y, pk[k], acc[1]);
      acc[2] = fmaf(s0.z, pk[k], acc[2]), acc[3] = fmaf(s0.w, pk[k], acc[3]);
      acc[4] = fmaf(s1.x, pk[k], acc[4]), acc[5] = fmaf(s1.y, pk[k], acc[5]);
      acc[6] = fmaf(s1.z, pk[k], acc[6]), acc[7] = fmaf(s1.w, pk[k], acc[7]);
    }
    __syncthreads();  // every thread is done with tile q's slot (and, at a step's end, the rows)
    if (kt == kTiles - 1) {  // S_{j+1} = S_j P_j + R_j complete
      float* out = const_cast<float*>(at(p.seg_start, e0 + j, row0));
      *reinterpret_cast<float4*>(&sm.s_t[tid][0]) = make_float4(acc[0], acc[1], acc[2], acc[3]);
      *reinterpret_cast<float4*>(&sm.s_t[tid][4]) = make_float4(acc[4], acc[5], acc[6], acc[7]);
#pragma unroll
      for (int r = 0; r < R; ++r) out[r * D + tid] = acc[r];
    }
  }
  ptx::cp_async_wait<0>();
}

}  // namespace flash_kda::cuda::sm90
