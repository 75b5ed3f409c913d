// CUDA backend entry: checks the device, picks the plan for the problem (docs/kernel.md, "Plans")
// and launches it. No allocation, no synchronisation, no host read of device memory: safe inside
// graph capture.
#include <algorithm>

#include "../api/backends.h"
#include "dispatch_common.h"
#include "sm90/kda_fwd_kernel.cuh"
#include "sm90/kda_plan.cuh"
#include "sm90/kda_prepared.h"

namespace flash_kda::cuda {

namespace {

constexpr int64_t kChunk = sm90::KdaDims::kChunk;
constexpr int64_t kStateBytes = sm90::KdaDims::kDim * sm90::KdaDims::kDim * 4;  // one fp32 128 x 128 state
// A split never makes segments shorter than this (chunks): each segment costs a chain step
// (~2 us) and pass 1 and 3 restart latency.
constexpr int64_t kMinSegmentChunks = 16;
constexpr size_t kAlign = 256;
// kAuto runs the fused kernel when no sequence can be longer than this (chunks).
constexpr int64_t kShortChunks = 32;

size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

// What the host decides from the sizes it knows; the device refines it per sequence (kda_plan.cuh).
struct HostPlan {
  FwdPlan kind = FwdPlan::kFused;
  // kAuto on a packed batch whose pairs fill the GPU: the plan kernel looks at the lengths and
  // runs either the fused kernel or the split plan (both launched; the other returns at once).
  bool device_decides = false;
  int64_t seg_chunks = 0;   // L
  int64_t seg0_chunks = 0;  // L0: segment 0 (docs/kernel.md, "Plans")
  int64_t max_chunks = 0;  // bound on the sum of every sequence's chunks
  int64_t max_extra = 0;   // bound on the split segments beyond each sequence's first
  int prep_chunks = 4;     // chunks per preparation CTA
  int slices1 = 1, slices3 = 1;
  // Workspace layout (byte offsets from the aligned base).
  size_t off_table = 0, off_prepared = 0, off_segments = 0, bytes = 0;
};

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The largest power of two s <= 8 with parts * s CTAs fitting one per SM (at least 1).
int slices_for(int64_t parts, int sm_count) {
  int s = 1;
  while (s < 8 && parts * s * 2 <= sm_count) s *= 2;
  return s;
}

HostPlan make_plan(const FwdParams& p, int sm_count) {
  HostPlan h;
  const int64_t N = num_sequences(p), HV = p.heads_v > 0 ? p.heads_v : p.heads;
  h.kind = p.plan;
  if (h.kind == FwdPlan::kAuto) {
    // Pairs that fill the GPU: the fused kernel (measured faster on every such BENCH row). A packed
    // batch may still hide one long sequence that only a split helps: the device decides, where a
    // split is possible at all (m >= 3 below, i.e. HV <= SMs / 3).
    // Short prompts: the fused kernel's one launch and no workspace (the prepared plans cost 3-5
    // launches, ~10 us of host time, for a walk of at most 32 chunks).
    const bool short_walk = ceil_div(p.seqlen, kChunk) <= kShortChunks;
    const bool filled = N * HV >= sm_count;
    h.kind = filled || short_walk ? FwdPlan::kFused : FwdPlan::kSplit;
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
  // Sum of ceil(len / 16) over the sequences: at most T / 16 + N packed, B * ceil(T / 16) fixed.
  h.max_chunks = p.cu_seqlens ? p.seqlen / kChunk + N : N * ceil_div(p.seqlen, kChunk);
  const int64_t longest = ceil_div(p.seqlen, kChunk);  // no sequence has more chunks
  h.seg_chunks = longest + 1;                          // no split
  if (h.kind == FwdPlan::kSplit) {
    if (p.segment_chunks > 0) {
      h.seg_chunks = p.segment_chunks;
    } else {
      // m segments of one sequence make HV * (2m - 3) CTAs of 128 rows in pass 1 and HV * (m - 1)
      // parts in pass 3, run as 2 CTAs of 64 rows each: as many as fit one CTA per SM in both
      // (h4_64k: m = 17, 124 and 128 CTAs). Fewer than 3 segments gain nothing.
      // Segment 0 is L0 = 3L/5 long: pass 1 runs it with output beside the other segments' R and P
      // rows, which cost ~0.6 of it a chunk (H200), so the passes end together: longest = L0 +
      // (m - 1) L.
      const int64_t m = std::min<int64_t>((sm_count / HV + 3) / 2, sm_count / (2 * HV) + 1);
      if (m >= 3) h.seg_chunks = std::max(kMinSegmentChunks, ceil_div(5 * longest, 5 * m - 2));
    }
  }
  h.seg0_chunks = sm90::first_segment_chunks(h.seg_chunks);
  if (h.seg0_chunks + h.seg_chunks < longest) {
    // Extra segments of a split sequence of c chunks: ceil((c - L0) / L) <= (c + L - 1 - L0) / L,
    // and at most max_chunks / (L0 + L + 1) sequences are split.
    const int64_t L = h.seg_chunks, L0 = h.seg0_chunks;
    h.max_extra = p.cu_seqlens ? (h.max_chunks + (h.max_chunks / (L0 + L + 1)) * std::max<int64_t>(0, L - 1 - L0)) / L
                               : N * ceil_div(longest - L0, L);
  }
  h.slices1 = slices_for((N + 2 * h.max_extra) * HV, sm_count);
  // Enough chunks per preparation warp (2 to 8) to amortise a CTA's start (finding its sequence:
  // a few dependent loads), few enough for two waves or more.
  constexpr int kPrepWarps = sm90::KdaPrepTraits::kWarps;
  const int64_t per_wave = int64_t(sm_count) * sm90::KdaPrepTraits::kCtasPerSm * kPrepWarps;
  h.prep_chunks = kPrepWarps * int(std::clamp<int64_t>(h.max_chunks * HV / (2 * per_wave), 2, 8));
  h.slices3 = slices_for(std::max<int64_t>(h.max_extra, 1) * HV, sm_count);

  // As plan_args() carves it: the device plan flag, begin, len, slot, zero_init, then the prefix
  // sums, each aligned.
  const size_t table = align_up(sizeof(int)) + 3 * align_up(N * sizeof(int64_t)) + align_up(N) +
                       sm90::kSeqTableSums * align_up((N + 1) * sizeof(int64_t));
  h.off_table = 0;
  h.off_prepared = align_up(table);
  h.off_segments = h.off_prepared + align_up(size_t(h.max_chunks) * HV * sm90::KdaPrepared::kBytes);
  h.bytes = h.off_segments + 3 * size_t(h.max_extra) * HV * kStateBytes + kAlign;  // + base alignment
  return h;
}

sm90::PlanArgs plan_args(const HostPlan& h, const FwdParams& p) {
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
  a.prepared = base + h.off_prepared;
  auto* seg = reinterpret_cast<float*>(base + h.off_segments);
  const size_t per = size_t(h.max_extra) * HV * (kStateBytes / 4);
  a.seg_start = seg, a.seg_r = seg + per, a.seg_p = seg + 2 * per;
  a.seg_chunks = int(std::min<int64_t>(h.seg_chunks, INT32_MAX));
  a.seg0_chunks = int(std::min<int64_t>(h.seg0_chunks, INT32_MAX));
  a.prep_chunks = h.prep_chunks;
  return a;
}

template <class Launch>
cudaError_t by_slices(int slices, Launch launch) {
  switch (slices) {
    case 1: return launch(std::integral_constant<int, 8>{});
    case 2: return launch(std::integral_constant<int, 4>{});
    case 4: return launch(std::integral_constant<int, 2>{});
    default: return launch(std::integral_constant<int, 1>{});
  }
}

Status run_fused(sm90::KdaFwdArgs& a, int64_t pairs, int sm_count, cudaStream_t stream) {
  // Split the 128 state rows over 1, 2, 4 or 8 CTAs: the rows evolve independently given k,
  // alpha and beta, so a slice only repeats the producer's preparation (its q/k/g reads hit L2).
  // More slices while the (sequence, head) pairs alone leave SMs idle; one CTA per SM.
  const int slices = slices_for(pairs, sm_count);
  a.slices = slices;
  const int64_t units = pairs * slices;
  if (units > INT32_MAX) return {StatusCode::kUnsupported, "q: too many (sequence, head) pairs for one launch"};
  const cudaError_t e =
      by_slices(slices, [&](auto nc) { return sm90::launch_kda_fwd<decltype(nc)::value>(a, units, stream); });
  if (e != cudaSuccess) return cuda_error("kernel launch", e);
  return Status::Ok();
}

Status run_prepared(const HostPlan& h, sm90::KdaFwdArgs& a, const FwdParams& p, int sm_count, cudaStream_t stream) {
  const int64_t N = num_sequences(p), HV = a.heads_v;
  sm90::PlanArgs pa = plan_args(h, p);
  pa.sm_count = sm_count;
  const int64_t prep_ctas = HV * (h.max_chunks / h.prep_chunks + N);
  const int64_t p1_ctas = (N + 2 * h.max_extra) * HV * h.slices1;
  const int64_t p3_ctas = h.max_extra * HV * h.slices3;
  const int64_t chain_ctas = (h.max_extra / 2) * HV * (sm90::KdaDims::kDim / sm90::ChainTraits::kRows);
  for (int64_t c : {prep_ctas, p1_ctas, p3_ctas, chain_ctas})
    if (c > INT32_MAX) return {StatusCode::kUnsupported, "q: too many chunks for one launch"};
  cudaError_t e = sm90::launch_kda_plan(a, pa, stream);
  if (e == cudaSuccess && h.device_decides) {
    a.device_plan = pa.device_plan;
    const Status st = run_fused(a, N * HV, sm_count, stream);  // returns at once unless chosen
    if (!st.ok()) return st;
  }
  if (e == cudaSuccess && prep_ctas > 0) e = sm90::launch_kda_prep(a, pa, prep_ctas, stream);
  if (e == cudaSuccess) {
    pa.slices = h.slices1;
    e = by_slices(h.slices1,
                  [&](auto nc) { return sm90::launch_kda_rec<decltype(nc)::value>(a, pa, 1, p1_ctas, stream); });
  }
  if (e == cudaSuccess && chain_ctas > 0) e = sm90::launch_kda_chain(a, pa, chain_ctas, stream);
  if (e == cudaSuccess && p3_ctas > 0) {
    pa.slices = h.slices3;
    e = by_slices(h.slices3,
                  [&](auto nc) { return sm90::launch_kda_rec<decltype(nc)::value>(a, pa, 3, p3_ctas, stream); });
  }
  if (e != cudaSuccess) return cuda_error("kernel launch", e);
  return Status::Ok();
}

int current_sm_count_or(int fallback) {
  int sm_count = 0;
  return current_sm90_device(&sm_count).ok() ? sm_count : fallback;
}

}  // namespace

bool available() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later calls are unaffected
    return false;
  }
  int sm_count = 0;
  return sm90_sm_count(device, &sm_count) == cudaSuccess && sm_count > 0;
}

// The plan depends on the SM count of the current device (an H100 or H200 has 132); without one
// the size for 132 SMs is returned.
size_t workspace_size(const FwdParams& p) {
  const HostPlan h = make_plan(p, current_sm_count_or(132));
  return h.kind == FwdPlan::kFused ? 0 : h.bytes;
}

Status fwd(const FwdParams& p, cudaStream_t stream) {
  if (p.checkpoint_interval > 0)
    return {StatusCode::kUnsupported, "checkpoint_state: checkpoints are not supported by the CUDA backend yet"};
  int sm_count = 0;
  Status st = current_sm90_device(&sm_count);
  if (!st.ok()) return st;

  const int64_t N = num_sequences(p);
  const int64_t HV = p.heads_v > 0 ? p.heads_v : p.heads;
  if (N == 0) return Status::Ok();

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
  // p is normalised: initial_state_dtype / final_state_dtype are resolved (they may differ: the
  // state is loaded in one dtype and stored in the other).
  a.initial_fp32 = p.initial_state_dtype == DType::kF32;
  a.final_fp32 = p.final_state_dtype == DType::kF32;
  a.cu_seqlens_i64 = p.cu_seqlens_dtype == DType::kI64;

  const HostPlan h = make_plan(p, sm_count);
  if (h.kind == FwdPlan::kFused) return run_fused(a, N * HV, sm_count, stream);
  return run_prepared(h, a, p, sm_count, stream);
}

}  // namespace flash_kda::cuda
