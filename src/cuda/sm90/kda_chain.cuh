// The chain of a split sequence's segment states (docs/kernel.md, "Splitting a sequence"):
// S_{j+1} = S_j P_j + R_j, ChainTraits (kda_plan.cuh) for head dimension kD.
#pragma once

#include "../common/ptx.cuh"
#include "kda_plan.cuh"

namespace flash_kda::cuda::sm90 {

// kD: the head dimension.
template <int kD>
__global__ void __launch_bounds__(ChainTraits<kD>::kThreads)
    kda_chain_kernel(const __grid_constant__ KdaFwdArgs a, const __grid_constant__ PlanArgs p) {
  using Tr = ChainTraits<kD>;
  constexpr int D = kD, R = Tr::kRows, kSlices = D / R, kT = Tr::kThreads;
  FLASH_KDA_DYNAMIC_SMEM(smem_bytes);
  auto& sm = *reinterpret_cast<typename Tr::Smem*>(smem_bytes);
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
  auto at = [&](const float* buf, int64_t e, int r) { return buf + state_row_offset<D>(e, a.heads_v, hv, r); };
  // The steps j = 1 .. segs - 2 read P_j as kTiles tiles of kTileK rows, one stream of tiles
  // q = (j - 1) kTiles + kt through a kRing-deep cp.async ring; the group of a step's first tile
  // also brings this CTA's rows of R_j (read only at that tile, before the next step's arrive).
  constexpr int kTileK = Tr::kTileK, kTiles = D / kTileK, kRing = Tr::kRing;
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
    __syncthreads();         // every thread is done with tile q's slot (and, at a step's end, the rows)
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
