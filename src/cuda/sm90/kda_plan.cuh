// The plan of the prepared forward, made on the device (docs/kernel.md, "Plans").
//
// The host picks the segment length L (chunks) and the launch bounds from sizes it knows (T, N, HV,
// the SM count); one small kernel then reads cu_seqlens, state_indices and has_initial_state once
// and writes, per sequence, its token range, slot and the exclusive prefix sums that the other
// kernels search to find their work:
//
//   chunks    ceil((len + shift) / 16)       where its prepared chunks start in the workspace
//             (0 if len = 0; shift = 0 without checkpoints: docs/kernel.md, "The shifted chunk
//             grid and checkpoints")
//   prep      ceil(chunks / prep_chunks)     preparation CTAs
//   segments  1 + ceil((chunks - L0) / L),   segment 0 has L0 chunks, the others L; a sequence of 2
//             or 1                           segments is not split: it would gain nothing (segment
//                                            1 must wait for segment 0 either way)
//   pass 1    1 (unsplit) or 1 + 2 (m - 2)   segment 0 from the true start state, and for each of
//                                            segments 1 .. m-2 its zero-start rows R and transition
//                                            rows P (the last segment needs neither)
//   pass 3    m - 1                          segments 1 .. m-1 re-run from their true start states
//   split     1 if m >= 3                    which sequences the chain kernel walks
//
// Segment j of a split sequence (j >= 1) owns slot extra_off[n] + j - 1 of the three segment-state
// buffers: its true start state S_j, and (j <= m - 2) its R_j and P_j, with S_{j+1} = S_j P_j + R_j.
#pragma once

#include "kda_fwd_scheduler.cuh"
#include "kda_fwd_traits.cuh"

namespace flash_kda::cuda::sm90 {

// What the plan kernel writes into the workspace: per-sequence arrays, N entries (N + 1 for the
// prefix sums, whose last entry is the total).
struct SeqTable {
  int64_t* begin;      // first token within the batch row (clamped into [0, T])
  int64_t* len;        // tokens
  int64_t* slot;       // state slot; -1: padding (nothing is read or written)
  uint8_t* zero_init;  // 1: start from zeros
  int64_t* chunk_off;
  int64_t* prep_off;
  int64_t* extra_off;
  int64_t* p1_off;
  int64_t* p3_off;
  int64_t* split_off;
  // With checkpoints only (else nullptr): the sequence's grid shift (checkpoint_start[n] % 16) and
  // the tokens before its first checkpoint boundary, I - checkpoint_start[n] % I, in [1, I].
  int32_t* shift;
  int64_t* ck_first;
};
constexpr int kSeqTableSums = 6;  // chunk, prep, extra, p1, p3, split

// Segment 0 of a split sequence: pass 1 runs it with output while the other parts only advance
// rows (cheaper a chunk). On the rows of one CTA each (seg0_split 1) it is L0 = 3L/4 long, the best
// of 60, 75, 90 and 100 % of L on the H200; on half the rows a CTA (seg0_split 2: two CTAs share
// it, each as fast a chunk as a pass-3 CTA) it is L0 = 9L/8 for m = 3 segments and L0 = L for more,
// the best of 100, 112.5, 125 (the rule before), 137.5 and 150 % of L on each split BENCH row
// (docs/kernel.md, "Segment 0"). Segment j >= 1 covers chunks [L0 + (j - 1) L, L0 + j L).
__host__ __device__ constexpr int64_t first_segment_eighths(int seg0_split, int64_t m) {
  return seg0_split == 2 ? (m <= 3 ? 9 : 8) : 6;
}
__host__ __device__ constexpr int64_t first_segment_chunks(int64_t L, int64_t eighths) {
  return L > 1 ? (eighths * L + 4) / 8 : 1;
}

// Segments of a sequence of `chunks` chunks: 1 (not split) unless it has at least three.
__host__ __device__ constexpr int64_t segment_count(int64_t chunks, int64_t L, int64_t L0) {
  return chunks > L0 + L ? 1 + (chunks - L0 + L - 1) / L : 1;
}

struct PlanArgs {
  SeqTable seq;
  unsigned char* prepared;  // [chunk slot][HV][KdaPrepared<D>::kBytes]
  float* seg_start;         // [extra slot][HV][D][D]: S_j
  float* seg_r;             // R_j
  float* seg_p;             // P_j
  int* device_plan;         // with KdaFwdArgs::device_plan: the plan kernel writes 1 (fused) or 0
  int sm_count;
  int seg_chunks;   // L; a value >= every sequence's chunk count means no split
  int seg0_chunks;  // L0 = first_segment_chunks(L, eighths): segment 0 of a split sequence
  // CTAs that share segment 0's rows in pass 1 (1 or 2; 2 only where a CTA has >= 2 consumer
  // warps): a split sequence's first seg0_split parts of pass 1 are segment 0, on D / slices /
  // seg0_split rows each.
  int seg0_split;
  int prep_chunks;  // consecutive chunks one preparation CTA prepares
  int slices;       // CTAs sharing the D rows of one part in this launch
  // Recurrence CTAs an SM this launch is built for (host side only: it picks the instantiation,
  // KdaRecTraits::kCtasPerSm): 1, or 3 for the 2-warp CTAs of an unsplit walk whose parts leave SMs
  // idle (docs/kernel.md, "Plans").
  int packed;
  // 32-token steps (docs/kernel.md): chunks are prepared and walked in pairs; every sequence's
  // chunk count is rounded up to even in chunk_off, and L, L0 and prep_chunks are even.
  int pair;
};

// The last n in [0, N) with off[n] <= r (off non-decreasing, off[0] = 0 <= r): a warp-wide search,
// 32 pivots a step. Every lane of the warp must call it; all get the answer.
__device__ __forceinline__ int find_sequence(const int64_t* off, int N, int64_t r) {
  const int lane = threadIdx.x & 31;
  int lo = 0, hi = N;  // the answer is in [lo, hi)
  while (hi - lo > 1) {
    const int step = (hi - lo + 31) / 32;
    const int idx = lo + lane * step;
    const bool le = idx < hi && off[idx] <= r;
    const int count = __popc(__ballot_sync(0xffffffffu, le));  // pivots <= r: a prefix, >= 1
    lo += (count - 1) * step;
    hi = min(hi, lo + step);
  }
  return lo;
}

// True when this launch of a prepared-plan kernel has nothing to do because the device chose the
// fused kernel (uniform over the grid).
__device__ __forceinline__ bool fused_chosen(const KdaFwdArgs& a) {
  return a.device_plan != nullptr && *a.device_plan == 1;
}

// The sequence and local index of work item r of a list whose per-sequence prefix sums are `off`;
// false when r is past the end (the launch is sized by a host-side bound). Warp-wide.
__device__ __forceinline__ bool locate(const int64_t* off, int N, int64_t r, int& n, int64_t& local) {
  if (r >= off[N]) return false;
  n = find_sequence(off, N, r);
  local = r - off[n];
  return true;
}

// Fills the WorkUnit of sequence n (head hv, slice) from the table.
__device__ __forceinline__ WorkUnit table_unit(const KdaFwdArgs& a, const SeqTable& t, int n, int hv, int slice) {
  WorkUnit w;
  w.seq = n;
  w.hv = hv;
  w.slice = slice;
  w.row = a.cu_seqlens ? 0 : n;
  w.begin = t.begin[n];
  w.len = t.len[n];
  w.slot = t.slot[n];
  w.skip = w.slot < 0;
  w.zero_init = t.zero_init[n] != 0;
  w.shift = t.shift != nullptr ? t.shift[n] : 0;
  return w;
}

// The chain of a split sequence: S_{j+1} = S_j P_j + R_j for j = 1 .. m-2, in fp32 (every P_j is a
// product of factors Diag(alpha)(I - beta k k^T) of norm <= 1, so the chain cannot amplify the
// rounding of earlier steps). One CTA per (split sequence, head, kRows rows); a thread sums two
// adjacent columns of the CTA's rows over a 1 / kSplit of the k range (docs/kernel.md, "The chain").
// The CTA's rows of S_j stay in shared memory from step to step; P_j (all of it) and the CTA's rows of
// R_j arrive by bulk copies into one of kBufs buffers, so with two the next step's copies land while
// this step computes. kD: the head dimension (the states are kD x kD).
template <int kD, int kRows_, int kBufs_>
struct ChainTraits {
  static constexpr int kDim = kD;
  static constexpr int kRows = kRows_;  // state rows per CTA
  static constexpr int kBufs = kBufs_;  // P / R buffers
  static constexpr int kCols = 2;       // columns per thread (one 8-byte load of P per k)
  // k parts: 8 with two buffers (one CTA an SM, 4 D threads), 4 with one (two CTAs an SM, 2 D each)
  static constexpr int kSplit = kBufs == 2 ? 8 : 4;
  static constexpr int kThreads = kSplit * kD / kCols;
  // s_t row pitch (floats): 16-byte rows, padded where the shared memory allows (two single-buffer
  // CTAs fill an SM without it).
  static constexpr int kPitchT = kRows + (kBufs == 2 ? 4 : 0);
  static_assert(kRows % 4 == 0 && kRows % kSplit == 0 && kD % kSplit == 0, "float4 rows, whole k parts and rows");
  struct Smem {
    alignas(128) float p[kBufs][kD][kD];        // P_j
    alignas(128) float r[kBufs][kRows][kD];     // this CTA's rows of R_j
    alignas(16) float part[kSplit][kRows][kD];  // each k part's sums (S_1's rows before the first step)
    alignas(16) float s_t[kD][kPitchT];         // the current rows, transposed: s_t[k][row]
    uint64_t bar[kBufs];                        // buffer b's copies landed
    uint64_t bar_s;                             // S_1 landed
    int seq;
  };
  static constexpr int kSmemBytes = sizeof(Smem);
};

}  // namespace flash_kda::cuda::sm90
