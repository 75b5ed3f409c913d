// The chain of a split sequence's segment states (docs/kernel.md, "The chain"):
// S_{j+1} = S_j P_j + R_j, ChainTraits (kda_plan.cuh) for head dimension kD.
#pragma once

#include "../common/bulk_copy.cuh"
#include "../common/ptx.cuh"
#include "kda_plan.cuh"

namespace flash_kda::cuda::sm90 {

// Tr: ChainTraits<kD, rows, buffers>. Thread (cp, q) = (tid % (kD / 2), tid / (kD / 2)) sums columns
// c0 = 2 cp and c0 + 1 of the CTA's rows over k in [q kQ, (q + 1) kQ), kQ = kD / kSplit; then forms
// its share of the rows of S_{j+1} from R_j and every part's sums.
template <class Tr>
__global__ void __launch_bounds__(Tr::kThreads)
    kda_chain_kernel(const __grid_constant__ KdaFwdArgs a, const __grid_constant__ PlanArgs p) {
  constexpr int D = Tr::kDim, R = Tr::kRows, kSlices = D / R, kBufs = Tr::kBufs, kQ = D / Tr::kSplit;
  constexpr int kRowsPer = R / Tr::kSplit;  // rows of S_{j+1} a thread forms
  static_assert(Tr::kCols == 2, "two columns a thread");
  FLASH_KDA_DYNAMIC_SMEM(smem_bytes);
  auto& sm = *reinterpret_cast<typename Tr::Smem*>(smem_bytes);
  // Launched after the previous kernel of the call (kda_prepared_launch.cuh), possibly before it has
  // finished: nothing it wrote is read before the wait.
  ptx::wait_for_prior_grid();
  if (fused_chosen(a)) return;
  const int b = blockIdx.x, slice = b % kSlices, hv = (b / kSlices) % a.heads_v;
  const int tid = threadIdx.x, c0 = 2 * (tid % (D / 2)), q = tid / (D / 2);
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
    float acc[R][2];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = 0.f;
    // Columns c0, c0 + 1 of P_j over this part's k (consecutive lanes: consecutive column pairs)
    // against the rows of S_j at k (broadcasts: a warp shares its part).
    const float* pk_at = &pj[q * kQ][c0];
#pragma unroll 4
    for (int k = q * kQ; k < (q + 1) * kQ; ++k, pk_at += D) {
      const float2 pk = *reinterpret_cast<const float2*>(pk_at);
#pragma unroll
      for (int r4 = 0; r4 < R / 4; ++r4) {
        const float4 s = *reinterpret_cast<const float4*>(&sm.s_t[k][4 * r4]);
        const float sv[4] = {s.x, s.y, s.z, s.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          acc[4 * r4 + i][0] = fmaf(sv[i], pk.x, acc[4 * r4 + i][0]);
          acc[4 * r4 + i][1] = fmaf(sv[i], pk.y, acc[4 * r4 + i][1]);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) *reinterpret_cast<float2*>(&sm.part[q][r][c0]) = make_float2(acc[r][0], acc[r][1]);
    __syncthreads();  // the partial sums are visible; nobody reads s_t, P_j or R_j of this step any more
    // S_{j+1} = S_j P_j + R_j: thread (cp, q) forms rows q kRowsPer .. of columns c0, c0 + 1.
    float* out = const_cast<float*>(at(p.seg_start, e0 + j, row0));
#pragma unroll
    for (int i = 0; i < kRowsPer; ++i) {
      const int r = q * kRowsPer + i;
      float2 x = *reinterpret_cast<const float2*>(&sm.r[buf][r][c0]);
#pragma unroll
      for (int h = 0; h < Tr::kSplit; ++h) {
        const float2 y = *reinterpret_cast<const float2*>(&sm.part[h][r][c0]);
        x.x += y.x, x.y += y.y;
      }
      *reinterpret_cast<float2*>(&out[r * D + c0]) = x;
      sm.s_t[c0][r] = x.x;
      sm.s_t[c0 + 1][r] = x.y;
    }
    __syncthreads();  // S_{j+1} in s_t; buffer `buf` and the partial sums are free
    if (tid == 0 && j + kBufs <= steps) fetch(j + kBufs);
  }
}

}  // namespace flash_kda::cuda::sm90
