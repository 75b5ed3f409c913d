// The plan kernel of the prepared plans (kda_plan.cuh lists what it writes). It serves every head
// dimension and is compiled in one translation unit, kda_prepared_sm90.cu; the chain of a split
// sequence's segment states is kda_chain.cuh.
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
  // The next kernel (the preparation) may start now: where it needs this table it waits for this
  // grid, and where it does not (fixed batches) it prepares meanwhile (kda_prep.cuh).
  ptx::allow_dependents();
  __shared__ int64_t warp_sums[32][kSeqTableSums];
  __shared__ unsigned long long longest;
  constexpr int C = kChunkTokens;
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
      int shift = 0;
      if (p.seq.shift != nullptr) {
        // The contract says start >= 0 (checked on the host backends only); a negative one is taken
        // as 0 here so that nothing is out of range.
        int64_t start = 0;
        if (a.checkpoint_start != nullptr)
          start = a.checkpoint_start_i64 ? static_cast<const int64_t*>(a.checkpoint_start)[n]
                                         : int64_t(static_cast<const int32_t*>(a.checkpoint_start)[n]);
        if (start < 0) start = 0;
        shift = int(start % (p.pair ? 2 * C : C));  // (32-token steps: boundaries end pairs)
        p.seq.shift[n] = shift;
        p.seq.ck_first[n] = a.checkpoint_interval - start % a.checkpoint_interval;
      }
      const int64_t chunks = chunk_count(len, shift);
      atomicMax(&longest, static_cast<unsigned long long>(chunks));
      const int64_t segs = segment_count(chunks, p.seg_chunks, p.seg0_chunks);
      v[0] = p.pair ? (chunks + 1) & ~int64_t(1) : chunks;  // (pairs: slots for a whole last pair)
      v[1] = (v[0] + p.prep_chunks - 1) / p.prep_chunks;
      v[2] = segs - 1;
      v[3] = segs == 1 ? 1 : 2 * segs - 3 + (p.seg0_split - 1);
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

}  // namespace flash_kda::cuda::sm90
