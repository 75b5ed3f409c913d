// The host side of the CUDA forward that does not touch the CUDA runtime: the plan made from
// host-known sizes (docs/kernel.md, "Plans"), the workspace layout, the kernel arguments, and the
// prepared plans' launch sequence over a launcher policy. fwd_dispatch.cu launches the kernels
// through the CUDA runtime; the CPU tests of the kernels (tests/emu) run the same sequence on the
// host emulation of the device (docs/testing.md, "Kernels on the CPU").
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>

#include "dispatch_common.h"
#include "flash_kda/flash_kda.h"
#include "sm90/kda_fwd_traits.cuh"
#include "sm90/kda_plan.cuh"

namespace flash_kda::cuda::fwd_plan {

constexpr int64_t kChunk = sm90::kChunkTokens;
// A split never makes segments shorter than this (chunks): each segment costs a chain step
// (~2 us) and pass 1 and 3 restart latency.
constexpr int64_t kMinSegmentChunks = 16;
constexpr size_t kAlign = 256;
// kAuto runs the fused kernel when no sequence can be longer than this (chunks).
constexpr int64_t kShortChunks = 32;

inline size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

// What the plan needs of the head dimension D = K = V (validate() admits 128 and 64 on CUDA; any
// other value is sized as 128, the larger).
struct DimSizes {
  int64_t state_bytes;     // one fp32 D x D state
  int64_t prepared_bytes;  // one prepared chunk (KdaPrepared)
  int prep_ctas_per_sm;    // preparation CTAs resident on an SM
  int max_slices;          // CTAs that may share one state's rows: D / 16 (16 rows a consumer warp)
};

template <int kD>
constexpr DimSizes dim_sizes_of() {
  return {int64_t(kD) * kD * 4, sm90::KdaPrepared<kD>::kBytes, sm90::KdaPrepTraits<kD>::kCtasPerSm, kD / 16};
}

inline DimSizes dim_sizes(const FwdParams& p) { return p.head_dim_k == 64 ? dim_sizes_of<64>() : dim_sizes_of<128>(); }

// What the host decides from the sizes it knows; the device refines it per sequence (kda_plan.cuh).
struct HostPlan {
  FwdPlan kind = FwdPlan::kFused;
  // kAuto on a packed batch whose pairs fill the GPU: the plan kernel looks at the lengths and
  // runs either the fused kernel or the split plan (both launched; the other returns at once).
  bool device_decides = false;
  int64_t seg_chunks = 0;   // L
  int64_t seg0_chunks = 0;  // L0: segment 0 (docs/kernel.md, "Plans")
  int64_t max_chunks = 0;   // bound on the sum of every sequence's chunks
  int64_t max_extra = 0;    // bound on the split segments beyond each sequence's first
  int prep_chunks = 4;      // chunks per preparation CTA
  bool pair = false;        // 32-token steps (docs/kernel.md, "32-token steps")
  int slices1 = 1, slices3 = 1;
  int packed1 = 1;  // recurrence CTAs an SM in pass 1 (PlanArgs::packed)
  int seg0_split = 1;  // PlanArgs::seg0_split
  // The chain (docs/kernel.md, "The chain"): a bound on the split sequences, and the variant (rows a
  // CTA, buffers) by_chain_variant launches.
  int64_t chain_seqs = 0;
  int chain_rows = 8, chain_bufs = 2;
  // Workspace layout (byte offsets from the aligned base).
  size_t off_table = 0, off_prepared = 0, off_segments = 0, bytes = 0;
};

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The largest power of two s <= max_slices (8 at D = 128, 4 at 64) with parts * s CTAs fitting one
// per SM (at least 1).
inline int slices_for(int64_t parts, int sm_count, int max_slices) {
  int s = 1;
  while (s < max_slices && parts * s * 2 <= sm_count) s *= 2;
  return s;
}

// Chunks per preparation CTA (4 to 32: enough to amortise a CTA's start): the count whose waves
// of `slots` CTAs (4 an SM) end soonest for `chunks` chunks, counting a partly filled last wave
// whole; the larger count on a tie (fewer CTAs). fixed32's 16,384 chunks: 32 a CTA in one wave,
// where 15 a CTA took three waves (45 chunks' time against 32).
inline int prep_chunks_for(int64_t chunks, int64_t slots, int step) {
  int best = 4;
  int64_t best_span = INT64_MAX;
  for (int c = 4; c <= 32; c += step) {  // (step 2 with pairs: whole pairs a CTA)
    const int64_t ctas = ceil_div(std::max<int64_t>(chunks, 1), c);
    const int64_t span = ceil_div(ctas, slots) * c;
    if (span <= best_span) best = c, best_span = span;
  }
  return best;
}

// Whether the prepared plans can walk 32-token steps for this call: K = V = 128, the sigmoid gate,
// and checkpoint boundaries at ends of pairs (none, or an interval that is a multiple of 32: the
// grid is then shifted by start mod 32).
inline bool pair_steps_supported(const FwdParams& p) {
  return p.head_dim_k != 64 && p.gate != GateForm::kSoftplus && p.checkpoint_interval % 32 == 0;
}

inline int64_t even_up(int64_t x) { return (x + 1) & ~int64_t(1); }

// The split plan's segment count m for HV value heads: m segments of one sequence make HV * (2m - 3)
// CTAs of D rows in pass 1 (HV * (2m - 2) with segment 0 on two CTAs, seg0_split) and HV * (m - 1)
// parts in pass 3, run as 2 CTAs of D / 2 rows each: as many as fit one CTA per SM in all of them
// (h4_64k: m = 17, 128 CTAs in each pass). Fewer than 3 segments gain nothing.
inline int64_t split_segments(int64_t HV, int sm_count) {
  return std::min<int64_t>((sm_count / HV + 3) / 2, sm_count / (2 * HV) + 1);
}

// Segment 0's length in eighths of L for the plan's segment count (sm90::first_segment_eighths).
inline int64_t seg0_eighths(int64_t HV, int sm_count, int seg0_split) {
  return sm90::first_segment_eighths(seg0_split, split_segments(HV, sm_count));
}

// The split plan's segment length L in chunks for a longest sequence of `longest` chunks
// (longest + 1: no split): the least L with L0 + (m - 1) L >= longest, where L0 =
// first_segment_chunks(L, r) = (r L + 4) / 8 >= (r L - 3) / 8 (r = seg0_eighths: 6 on one CTA; 9 or 8
// with seg0_split 2), so L (8 (m - 1) + r) >= 8 longest suffices (as integers).
inline int64_t split_segment_chunks(const FwdParams& p, int64_t HV, int64_t longest, int sm_count, int seg0_split) {
  if (p.segment_chunks > 0) return p.segment_chunks;
  const int64_t m = split_segments(HV, sm_count), r = seg0_eighths(HV, sm_count, seg0_split);
  return m >= 3 ? std::max(kMinSegmentChunks, ceil_div(8 * longest, 8 * (m - 1) + r)) : longest + 1;
}

inline HostPlan make_plan(const FwdParams& p, int sm_count) {
  HostPlan h;
  const int64_t N = num_sequences(p), HV = p.heads_v > 0 ? p.heads_v : p.heads;
  const DimSizes dim = dim_sizes(p);
  // Checkpoints run on the prepared plans only (the consumers of the recurrence kernel write them;
  // docs/kernel.md, "The shifted chunk grid and checkpoints"): kAuto becomes kSplit (which splits
  // only where the planner below finds it pays), a forced kFused kPrepared, and the device never
  // decides.
  const bool checkpoints = p.checkpoint_interval > 0;
  h.kind = p.plan;
  if (checkpoints && h.kind == FwdPlan::kAuto) h.kind = FwdPlan::kSplit;
  if (checkpoints && h.kind == FwdPlan::kFused) h.kind = FwdPlan::kPrepared;
  if (h.kind == FwdPlan::kAuto) {
    // Pairs that fill the GPU: a fixed batch (every pair the same length: the walk is bound by the
    // total work, not by one long pair) runs the prepared plan, measured 8 % faster than the fused
    // kernel on b16x2048_32 (docs/perf_log.md, session 25); a packed batch runs the fused kernel,
    // which starts every walk at once (a long sequence among short ones is not held back by the
    // preparation of the whole batch: varlen6_64 measured 3 % slower prepared). A packed batch may
    // still hide one long sequence that only a split helps: the device decides, where a split is
    // possible at all (m >= 3 below, i.e. HV <= SMs / 3).
    // Short prompts: the fused kernel's one launch and no workspace (the prepared plans cost 3-5
    // launches, ~10 us of host time, for a walk of at most 32 chunks).
    const bool short_walk = ceil_div(p.seqlen, kChunk) <= kShortChunks;
    const bool filled = N * HV >= sm_count;
    h.kind = short_walk ? FwdPlan::kFused
             : filled   ? (p.cu_seqlens == nullptr ? FwdPlan::kPrepared : FwdPlan::kFused)
                        : FwdPlan::kSplit;
    if (filled && !short_walk && p.cu_seqlens != nullptr && N > 1 && 3 * HV <= sm_count) {
      h.kind = FwdPlan::kSplit;
      h.device_decides = true;
    }
  }
  if (h.kind == FwdPlan::kFused || N == 0) {
    h.kind = FwdPlan::kFused;
    h.device_decides = false;
    return h;
  }
  // With checkpoints a sequence's grid is shifted by checkpoint_start mod 16, or mod 32 with 32-token
  // steps (ceil((len + shift) / 16) chunks): at most one or two more chunks each. (31 wherever pairs
  // may be chosen below: a bound either way.) The starts are device data, so the plan takes the
  // bound; without checkpoint_start every start is 0 and no grid is shifted: the plan is the one
  // without checkpoints (the bound lengthened fixed12's segments from 82 to 84 chunks).
  const bool shifted = checkpoints && p.checkpoint_start != nullptr;
  const bool pairs_possible = pair_steps_supported(p) && p.walk_tokens != 16;
  const int64_t slack = shifted ? (pairs_possible ? 2 * kChunk - 1 : kChunk - 1) : 0;
  const int64_t longest = ceil_div(p.seqlen + slack, kChunk);  // no sequence has more chunks
  // Segment 0 on two CTAs of half the rows each (PlanArgs::seg0_split) where pass 1 then still fits
  // one CTA an SM: a fixed batch split by the plan, at least two consumer warps a CTA. Tried first;
  // otherwise the plan is made with segment 0 on one CTA.
  for (int seg0_split : {2, 1}) {
    if (seg0_split == 2 && (h.kind != FwdPlan::kSplit || p.cu_seqlens != nullptr)) continue;
    h.seg0_split = seg0_split;
    const int64_t r0 = seg0_eighths(HV, sm_count, seg0_split);
    h.seg_chunks = h.kind == FwdPlan::kSplit ? split_segment_chunks(p, HV, longest, sm_count, seg0_split) : longest + 1;
    // 32-token steps where walk_tokens asks for them, and by default (0) where they measured faster
    // on the H200: fixed batches whose sequences the split plan cuts (docs/kernel.md, "32-token
    // steps": -1 to -3 % there; +2 % on a split packed batch and up to +6 % unsplit, where the
    // preparation's extra cost is not repaid).
    const bool pairs_pay =
        p.cu_seqlens == nullptr && sm90::first_segment_chunks(h.seg_chunks, r0) + h.seg_chunks < longest;
    h.pair = (p.walk_tokens == 32 || (p.walk_tokens == 0 && pairs_pay)) && pair_steps_supported(p);
    // Sum of ceil((len + shift) / 16) over the sequences, each at most floor(len / 16) + 1 (+ 2
    // with a shift of up to 15, + 3 with up to 31): T / 16 + N packed (T / 16 + 2N with shifted
    // grids), B * ceil((T + slack) / 16) fixed. Pairs round every count up to even: one more chunk
    // each (T / 16 + 4N with shifted grids).
    const int64_t per_seq = shifted && h.pair ? 4 : shifted || h.pair ? 2 : 1;
    h.max_chunks = p.cu_seqlens ? p.seqlen / kChunk + per_seq * N : N * ceil_div(p.seqlen + slack, kChunk);
    if (h.pair && !p.cu_seqlens) h.max_chunks = N * even_up(ceil_div(p.seqlen + slack, kChunk));
    if (h.pair) h.seg_chunks = even_up(h.seg_chunks);  // segments of whole pairs
    h.seg0_chunks = sm90::first_segment_chunks(h.seg_chunks, r0);
    if (h.pair) h.seg0_chunks = even_up(h.seg0_chunks);
    h.max_extra = 0;
    const bool split = h.seg0_chunks + h.seg_chunks < longest;
    if (split) {
      // Extra segments of a split sequence of c chunks: ceil((c - L0) / L) <= (c + L - 1 - L0) / L,
      // and at most max_chunks / (L0 + L + 1) sequences are split.
      const int64_t L = h.seg_chunks, L0 = h.seg0_chunks;
      h.max_extra = p.cu_seqlens ? (h.max_chunks + (h.max_chunks / (L0 + L + 1)) * std::max<int64_t>(0, L - 1 - L0)) / L
                                 : N * ceil_div(longest - L0, L);
    }
    h.slices1 = slices_for((seg0_split * N + 2 * h.max_extra) * HV, sm_count, dim.max_slices);
    if (seg0_split == 1) break;
    // Pass 1 of a split fixed batch: per sequence, segment 0's two parts and the R and P parts of
    // its extra segments but the last (max_extra / N of them), 2 + 2 (max_extra / N - 1) parts in
    // all: one wave of CTAs or not at all.
    const int64_t p1_parts = 2 * h.max_extra * HV;
    if (split && dim.max_slices / h.slices1 >= 2 && p1_parts * h.slices1 <= sm_count) break;
  }
  // An unsplit walk whose parts leave SMs idle but do not fit twice (fixed96: 96 parts of one
  // 8-warp CTA each on 96 of 132 SMs): four 2-warp CTAs a part, three an SM, so that the busiest SM
  // holds 6 consumer warps instead of 8 (a walk step's time grows with the consumer warps an SM
  // holds; docs/kernel.md, "Plans"). 16-token walks at D = 128 only.
  const int64_t parts1 = (h.seg0_split * N + 2 * h.max_extra) * HV;
  if (h.max_extra == 0 && !h.pair && dim.max_slices == 8 && 2 * parts1 > sm_count && 4 * parts1 <= 3 * sm_count) {
    h.slices1 = 4;
    h.packed1 = 3;
  }
  // The chain: 8 rows a CTA with two buffers (one CTA an SM) where its CTAs fit the SMs, else 16
  // rows with two, else 16 rows with one (two CTAs an SM; more than 2 SMs' worth runs in waves).
  h.chain_seqs = h.max_extra == 0 ? 0 : p.cu_seqlens ? std::min<int64_t>(N, h.max_extra / 2) : N;
  const int64_t chain_parts = h.chain_seqs * HV * (p.head_dim_k == 64 ? 64 : 128);  // rows in all
  h.chain_rows = chain_parts / 8 <= sm_count ? 8 : 16;
  h.chain_bufs = chain_parts / 16 <= sm_count ? 2 : 1;
  h.prep_chunks = prep_chunks_for(h.max_chunks * HV, int64_t(sm_count) * dim.prep_ctas_per_sm, h.pair ? 2 : 1);
  h.slices3 = slices_for(std::max<int64_t>(h.max_extra, 1) * HV, sm_count, dim.max_slices);

  // As plan_args() carves it: the device plan flag, begin, len, slot, zero_init, the prefix sums,
  // then (checkpoints) shift and ck_first, each aligned.
  const size_t table = align_up(sizeof(int)) + 3 * align_up(N * sizeof(int64_t)) + align_up(N) +
                       sm90::kSeqTableSums * align_up((N + 1) * sizeof(int64_t)) +
                       (checkpoints ? align_up(N * sizeof(int32_t)) + align_up(N * sizeof(int64_t)) : 0);
  h.off_table = 0;
  h.off_prepared = align_up(table);
  const int64_t slot_bytes = h.pair ? sm90::KdaPrepared<128>::kPairSlot : dim.prepared_bytes;
  h.off_segments = h.off_prepared + align_up(size_t(h.max_chunks) * HV * slot_bytes);
  h.bytes = h.off_segments + 3 * size_t(h.max_extra) * HV * dim.state_bytes + kAlign;  // + base alignment
  return h;
}

inline sm90::PlanArgs plan_args(const HostPlan& h, const FwdParams& p) {
  const int64_t N = num_sequences(p), HV = p.heads_v > 0 ? p.heads_v : p.heads;
  auto base = reinterpret_cast<unsigned char*>(align_up(reinterpret_cast<uintptr_t>(p.workspace)));
  sm90::PlanArgs a{};
  unsigned char* t = base + h.off_table;
  auto take = [&](size_t bytes) {
    unsigned char* r = t;
    t += align_up(bytes);
    return r;
  };
  int* device_plan = reinterpret_cast<int*>(take(sizeof(int)));
  a.device_plan = h.device_decides ? device_plan : nullptr;
  a.seq.begin = reinterpret_cast<int64_t*>(take(N * sizeof(int64_t)));
  a.seq.len = reinterpret_cast<int64_t*>(take(N * sizeof(int64_t)));
  a.seq.slot = reinterpret_cast<int64_t*>(take(N * sizeof(int64_t)));
  a.seq.zero_init = take(N);
  int64_t** sums[sm90::kSeqTableSums] = {&a.seq.chunk_off, &a.seq.prep_off, &a.seq.extra_off,
                                         &a.seq.p1_off,    &a.seq.p3_off,   &a.seq.split_off};
  for (int64_t** s : sums) *s = reinterpret_cast<int64_t*>(take((N + 1) * sizeof(int64_t)));
  a.seq.shift = nullptr;
  a.seq.ck_first = nullptr;
  if (p.checkpoint_interval > 0) {
    a.seq.shift = reinterpret_cast<int32_t*>(take(N * sizeof(int32_t)));
    a.seq.ck_first = reinterpret_cast<int64_t*>(take(N * sizeof(int64_t)));
  }
  a.prepared = base + h.off_prepared;
  auto* seg = reinterpret_cast<float*>(base + h.off_segments);
  const size_t per = size_t(h.max_extra) * HV * (dim_sizes(p).state_bytes / 4);
  a.seg_start = seg, a.seg_r = seg + per, a.seg_p = seg + 2 * per;
  a.seg_chunks = int(std::min<int64_t>(h.seg_chunks, INT32_MAX));
  a.seg0_chunks = int(std::min<int64_t>(h.seg0_chunks, INT32_MAX));
  a.seg0_split = h.seg0_split;
  a.prep_chunks = h.prep_chunks;
  a.pair = h.pair ? 1 : 0;
  a.packed = 1;  // (run_prepared sets each pass's)
  return a;
}

// Calls launch(ChainTraits<kD, rows, bufs>{}) for the chain variant (rows, bufs) of HostPlan.
template <int kD, class Launch>
auto by_chain_variant(int rows, int bufs, Launch launch) {
  if (rows == 8) return launch(sm90::ChainTraits<kD, 8, 2>{});
  if (bufs == 2) return launch(sm90::ChainTraits<kD, 16, 2>{});
  return launch(sm90::ChainTraits<kD, 16, 1>{});
}

// Calls launch(consumer warps) for the CTAs of `slices` sharing one state of kD rows: 16 rows a
// consumer warp (D = 128: 8, 4, 2, 1 warps; D = 64: 4, 2, 1).
template <int kD, class Launch>
auto by_slices(int slices, Launch launch) {
  switch (slices) {
    case 1: return launch(std::integral_constant<int, kD / 16>{});
    case 2: return launch(std::integral_constant<int, kD / 32>{});
    case 4: return launch(std::integral_constant<int, kD / 64>{});
    default: return launch(std::integral_constant<int, 1>{});  // 8 (D = 128; D = 64 never has more than 4)
  }
}

// The kernels' argument block from validated, normalised parameters (the plan-independent part).
inline sm90::KdaFwdArgs kernel_args(const FwdParams& p) {
  const int64_t N = num_sequences(p);
  const int64_t HV = p.heads_v > 0 ? p.heads_v : p.heads;
  sm90::KdaFwdArgs a{};
  copy_activations(a, p);
  a.initial_state = p.initial_state;
  a.final_state = p.final_state;
  a.state_indices = p.state_indices;
  a.has_initial_state = p.has_initial_state;
  a.pool_size = p.pool_size;
  a.seqlen = p.seqlen;
  a.num_seqs = static_cast<int>(N);
  a.heads_v = static_cast<int>(HV);
  a.group = static_cast<int>(HV / p.heads);
  a.scale = p.scale;
  a.lower_bound_log2 = p.lower_bound * 1.4426950408889634f;
  // Gate forms (docs/spec.md): A_log may be null (rate 1, sigmoid gate only); the softplus gate
  // ignores lower_bound.
  a.softplus_gate = p.gate == GateForm::kSoftplus;
  a.beta_scale = p.allow_neg_eigval ? 2.0f : 1.0f;
  // p is normalised: initial_state_dtype / final_state_dtype are resolved (they may differ: the
  // state is loaded in one dtype and stored in the other).
  a.initial_fp32 = p.initial_state_dtype == DType::kF32;
  a.final_fp32 = p.final_state_dtype == DType::kF32;
  a.cu_seqlens_i64 = p.cu_seqlens_dtype == DType::kI64;
  if (p.checkpoint_interval > 0) {  // (docs/spec.md, "Prefix-cache checkpoints")
    a.checkpoint_interval = p.checkpoint_interval;
    a.checkpoint_start = p.checkpoint_start;
    a.checkpoint_start_i64 = p.checkpoint_start_dtype == DType::kI64;
    a.checkpoint_state = p.checkpoint_state;
    a.checkpoint_fp32 = p.checkpoint_state_dtype == DType::kF32;
    a.checkpoint_pool_size = p.checkpoint_pool_size;
    a.checkpoint_indices = p.checkpoint_indices;
    a.checkpoint_columns = p.checkpoint_columns;
    a.checkpoint_stride = p.checkpoint_indices_stride > 0 ? p.checkpoint_indices_stride : p.checkpoint_columns;
  }
  return a;
}

// The prepared plans' kernels in order (plan, [fused: the device decides], preparation, pass 1,
// chain, pass 3) through `launch`, which provides plan(a, pa), fused<kD>(a, pairs) -> Status,
// prep<kD>(a, pa, ctas), rec<kD, kConsumerWarps>(a, pa, pass, ctas), chain<ChainTraits>(a, pa, ctas) and
// error(what, e) -> Status (the others return the runtime's error code).
template <int kD, class Launch>
Status run_prepared(const HostPlan& h, sm90::KdaFwdArgs& a, const FwdParams& p, int sm_count, Launch& launch) {
  const int64_t N = num_sequences(p), HV = a.heads_v;
  sm90::PlanArgs pa = plan_args(h, p);
  pa.sm_count = sm_count;
  const int64_t prep_ctas = HV * (h.max_chunks / h.prep_chunks + N);
  const int64_t p1_ctas = (h.seg0_split * N + 2 * h.max_extra) * HV * h.slices1;
  const int64_t p3_ctas = h.max_extra * HV * h.slices3;
  const int64_t chain_ctas = h.chain_seqs * HV * (kD / h.chain_rows);
  for (int64_t c : {prep_ctas, p1_ctas, p3_ctas, chain_ctas})
    if (c > INT32_MAX) return {StatusCode::kUnsupported, "q: too many chunks for one launch"};
  auto e = launch.plan(a, pa);
  if (e == decltype(e){} && h.device_decides) {
    a.device_plan = pa.device_plan;
    const Status st = launch.template fused<kD>(a, N * HV);  // returns at once unless chosen
    if (!st.ok()) return st;
  }
  if (e == decltype(e){} && prep_ctas > 0) e = launch.template prep<kD>(a, pa, prep_ctas);
  if (e == decltype(e){}) {
    pa.slices = h.slices1;
    pa.packed = h.packed1;
    e = by_slices<kD>(h.slices1, [&](auto nc) { return launch.template rec<kD, decltype(nc)::value>(a, pa, 1, p1_ctas); });
  }
  if (e == decltype(e){} && chain_ctas > 0)
    e = by_chain_variant<kD>(h.chain_rows, h.chain_bufs,
                             [&](auto tr) { return launch.template chain<decltype(tr)>(a, pa, chain_ctas); });
  if (e == decltype(e){} && p3_ctas > 0) {
    pa.slices = h.slices3;
    pa.packed = 1;
    e = by_slices<kD>(h.slices3, [&](auto nc) { return launch.template rec<kD, decltype(nc)::value>(a, pa, 3, p3_ctas); });
  }
  if (e != decltype(e){}) return launch.error("kernel launch", e);
  return Status::Ok();
}

// 32-token steps asked for where they cannot run.
inline Status check_walk_tokens(const FwdParams& p, const HostPlan& h) {
  if (p.walk_tokens == 32 && h.kind != FwdPlan::kFused && !h.pair)
    return {StatusCode::kUnsupported,
            "walk_tokens: 32-token steps need K = V = 128, the sigmoid gate and no checkpoints or a "
            "checkpoint_interval that is a multiple of 32 (use 0 or 16)"};
  return Status::Ok();
}

}  // namespace flash_kda::cuda::fwd_plan
