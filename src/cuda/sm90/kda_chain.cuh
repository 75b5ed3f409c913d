// The chain of a split sequence's segment states (docs/kernel.md, "The chain"):
// S_{j+1} = S_j P_j + R_j, ChainTraits (kda_plan.cuh) for head dimension kD.
#pragma once

#include "../common/bulk_copy.cuh"
#include "../common/ptx.cuh"
#include "kda_plan.cuh"

namespace flash_kda::cuda::sm90 {

// Tr: ChainTraits<kD, rows, buffers>. Thread (c, q) = (tid % kD, tid / kD) sums column c of the
// CTA's rows over k in [q kD / 4, (q + 1) kD / 4); quarter 0 adds the others' sums and R_j.
template <class Tr>
__global__ void __launch_bounds__(Tr::kThreads)
    kda_chain_kernel(const __grid_constant__ KdaFwdArgs a, const __grid_constant__ PlanArgs p) {
  constexpr int D = Tr::kDim, R = Tr::kRows, kSlices = D / R, kBufs = Tr::kBufs, kQ = D / Tr::kSplit;
  FLASH_KDA_DYNAMIC_SMEM(smem_bytes);
  auto& sm = *reinterpret_cast<typename Tr::Smem*>(smem_bytes);
  if (fused_chosen(a)) return;
  const int b = blockIdx.x, slice = b % kSlices, hv = (b / kSlices) % a.heads_v;
  const int tid = threadIdx.x, c = tid % D, q = tid / D;
  int n;
  int64_t local;
  if (tid < 32) {
    if (!locate(p.seq.split_off, a.num_seqs, b / (kSlices * a.heads_v), n, local)) n = -1;
    if (tid == 0) {
      sm.seq = n;
      for (int i = 0; i < kBufs; ++i) mbarrier_init(&sm.bar[i], 1);
      mbarrier_init(&sm.bar_s, 1);
    }
  }
  __syncthreads();
  n = sm.seq;
  if (n < 0 || p.seq.slot[n] < 0) return;
  const int64_t e0 = p.seq.extra_off[n];
  const int steps = int(p.seq.extra_off[n + 1] - e0) - 1;  // segments - 2
  const int row0 = slice * R;
  auto at = [&](const float* buf, int64_t e, int r) { return buf + state_row_offset<D>(e, a.heads_v, hv, r); };
  constexpr uint32_t kPBytes = D * D * sizeof(float), kRBytes = R * D * sizeof(float);
  // Step j's P_j and R_j (j = 1 .. steps) into buffer (j - 1) % kBufs (one thread).
  auto fetch = [&](int j) {
    const int buf = (j - 1) % kBufs;
    mbarrier_arrive_expect_tx(&sm.bar[buf], kPBytes + kRBytes);
    bulk_copy_g2s(&sm.p[buf][0][0], at(p.seg_p, e0 + j - 1, 0), kPBytes, &sm.bar[buf]);
    bulk_copy_g2s(&sm.r[buf][0][0], at(p.seg_r, e0 + j - 1, row0), kRBytes, &sm.bar[buf]);
  };
  // S_1 (segment 0's end, written by pass 1) lands in the partial sums, then is transposed into s_t.
  static_assert(sizeof(sm.part) >= kRBytes, "S_1's rows fit the partial sums");
  float* s1 = &sm.part[0][0][0];
  if (tid == 0) {
    mbarrier_arrive_expect_tx(&sm.bar_s, kRBytes);
    bulk_copy_g2s(s1, at(p.seg_start, e0, row0), kRBytes, &sm.bar_s);
    for (int j = 1; j <= steps && j <= kBufs; ++j) fetch(j);
  }
  mbarrier_wait(&sm.bar_s, 0);
  for (int i = tid; i < R * D; i += Tr::kThreads) sm.s_t[i % D][i / D] = s1[i];
  __syncthreads();
  for (int j = 1; j <= steps; ++j) {
    const int buf = (j - 1) % kBufs;
    mbarrier_wait(&sm.bar[buf], ((j - 1) / kBufs) & 1);
    const float(*pj)[D] = sm.p[buf];
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.f;
    // Column c of P_j over this quarter's k (consecutive lanes: consecutive columns) against the
    // rows of S_j at k (broadcasts: a warp shares its quarter).
#pragma unroll 4
    for (int k = q * kQ; k < (q + 1) * kQ; ++k) {
      const float pk = pj[k][c];
#pragma unroll
      for (int r4 = 0; r4 < R / 4; ++r4) {
        const float4 s = *reinterpret_cast<const float4*>(&sm.s_t[k][4 * r4]);
        acc[4 * r4] = fmaf(s.x, pk, acc[4 * r4]), acc[4 * r4 + 1] = fmaf(s.y, pk, acc[4 * r4 + 1]);
        acc[4 * r4 + 2] = fmaf(s.z, pk, acc[4 * r4 + 2]), acc[4 * r4 + 3] = fmaf(s.w, pk, acc[4 * r4 + 3]);
      }
    }
    if (q > 0) {
#pragma unroll
      for (int r = 0; r < R; ++r) sm.part[q - 1][r][c] = acc[r];
    }
    __syncthreads();  // the partial sums are visible; nobody reads s_t, P_j or R_j of this step any more
    if (q == 0) {  // S_{j+1} = S_j P_j + R_j
      float* out = const_cast<float*>(at(p.seg_start, e0 + j, row0));
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float x = acc[r] + sm.r[buf][r][c];
#pragma unroll
        for (int i = 0; i < Tr::kSplit - 1; ++i) x += sm.part[i][r][c];
        acc[r] = x;
        out[r * D + c] = x;
      }
#pragma unroll
      for (int r4 = 0; r4 < R / 4; ++r4)
        *reinterpret_cast<float4*>(&sm.s_t[c][4 * r4]) =
            make_float4(acc[4 * r4], acc[4 * r4 + 1], acc[4 * r4 + 2], acc[4 * r4 + 3]);
    }
    __syncthreads();  // S_{j+1} in s_t; buffer `buf` and the partial sums are free
    if (tid == 0 && j + kBufs <= steps) fetch(j + kBufs);
  }
}

}  // namespace flash_kda::cuda::sm90
