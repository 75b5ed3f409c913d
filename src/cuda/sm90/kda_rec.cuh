// The recurrence kernel of the prepared plans: one CTA per (part, value head, slice of rows).
// A part is what kda_plan.cuh lists: a sequence's real rows over a chunk range (written out, from
// the true start state), or a segment's zero-start rows R or transition rows P (pass 1 of a split).
//
//   loader (one warp)   bulk-copies each prepared chunk (KdaPrepared) and cp.asyncs this slice's
//                       v columns from global memory into a ring of kStages shared-memory stages,
//                       up to kStages chunks ahead (mbarriers: FULL counts the loader lanes, whose
//                       arrivals wait for their copies, and the bulk copy's bytes; EMPTY the
//                       consumer warps that released a stage)
//   consumers           the fused kernel's (kda_fwd_consumer.cuh) reading the copied chunk in place
//                       (PackedStageView), on the RowsIO of the part
#pragma once

#include <type_traits>

#include "../common/bulk_copy.cuh"
#include "../common/ptx.cuh"
#include "kda_fwd_consumer.cuh"
#include "kda_plan.cuh"
#include "kda_prep.cuh"

namespace flash_kda::cuda::sm90 {

template <class Tr, bool kCk>
struct KdaLoader {
  static constexpr int C = Tr::kChunk;
  static constexpr int kVRowBytes = Tr::kVRows * 2;

  const WorkUnit& w;
  const RowsIO& io;
  typename Tr::Smem& sm;
  const unsigned char* src0;  // prepared chunk io.chunk0
  int64_t stride;             // bytes between consecutive steps (chunks, or pairs) of one head
  const uint16_t* v_base;     // v of the sequence's first token, this slice's first column
  int64_t v_token_stride;     // elements between tokens of v
  const int32_t* ck_row;      // the sequence's row of checkpoint_indices (with io.ck_next >= 0)
  int lane;

  // Chunk i into stage i % kStages once the consumers released it: lane 0 announces the bytes and
  // bulk-copies the prepared chunk (the parts without output only its first kOutputFree bytes, a
  // pair's only the prefixes and (-T)[b][a]);
  // the v rows (kVRows columns of 16 tokens, one 16-byte piece a cp.async) are spread over the 32
  // lanes, zero-filled past the end of the sequence and for the virtual tokens before its start
  // (w.shift; docs/kernel.md, "The shifted chunk grid and checkpoints"), so the delta rule sees
  // v = 0 for a token whose beta is 0 (no NaN can come from stale shared memory). Each lane's
  // arrival on FULL (its count is 32) is made once its own copies have landed. One bulk copy a chunk instead of one a v
  // row: the bulk-copy engine's cost per copy, not bytes, set the loader's pace (docs/perf_log.md,
  // session 5). A chunk that ends at a checkpoint boundary also brings its checkpoint slot (lane 0,
  // one 4-byte cp.async, covered by the same arrival).
  __device__ void run() {
    // (the v columns of the rows the CTA's consumers own: all, or half with RowsIO::warps)
    if (io.warps == Tr::kConsumerWarps) {
      copy_steps<kVRowBytes / 16>();
    } else {
      copy_steps<kVRowBytes / 32>();
    }
  }

  // The loader's loop, with kPieces 16-byte pieces of v a token.
  template <int kPieces>
  __device__ void copy_steps() {
    using Prepared = typename Tr::Prepared;
    // Pairs with output: both slots whole (their cross blocks follow each slot's chunk). Pairs
    // without output need slot a's output-free prefix, its cross block (-T)[b][a] and slot b's
    // prefix: two copies, the second from a's cross block on (which slot b follows), 19,968
    // bytes of 29,952 at D = 128 (q_hat, M and M[b][a] are read only with output).
    constexpr uint32_t kPairTail = uint32_t(Prepared::kPairSlot - Prepared::kCross + Prepared::kOutputFree);
    const uint32_t prepared_bytes =
        Tr::kPair ? (io.write_out ? uint32_t(Tr::kStepBytes) : uint32_t(Prepared::kOutputFree) + kPairTail)
                  : (io.write_out ? Prepared::kBytes : Prepared::kOutputFree);
    const bool pair_prefix = Tr::kPair && !io.write_out;
    int ck_next = io.ck_next, ck_m = io.ck_m;  // the walk's next boundary chunk and its column
    for (int i = 0; i < io.nchunks; ++i) {
      const int s = i % Tr::kStages;
      if (i >= Tr::kStages) mbarrier_wait(&sm.empty[s], ((i / Tr::kStages) - 1) & 1);
      auto& st = sm.stage[s];
      if (lane == 0) {
        mbarrier_expect_tx(&sm.full[s], prepared_bytes);
        if (pair_prefix) {
          bulk_copy_g2s(st.prepared, src0 + i * stride, Prepared::kOutputFree, &sm.full[s]);
          bulk_copy_g2s(st.prepared + Prepared::kCross, src0 + i * stride + Prepared::kCross, kPairTail, &sm.full[s]);
        } else {
          bulk_copy_g2s(st.prepared, src0 + i * stride, prepared_bytes, &sm.full[s]);
        }
      }
      if (io.has_v) {
        const int64_t tok0 = int64_t(io.chunk0) * kChunkTokens + int64_t(i) * C - w.shift;  // the step's first token
        const int lo = int(max(int64_t(0), -tok0)), hi = int(min(int64_t(C), w.len - tok0));
        copy_v<kPieces>(st, tok0, lo, hi);
      }
      if (kCk && i == ck_next) {
        if (lane == 0) ptx::cp_async_4(&sm.ck_slot[i % (Tr::kStages + 1)], ck_row + ck_m);
        ++ck_m;
        ck_next = ck_next + io.ck_step <= io.ck_last ? ck_next + io.ck_step : -1;
      }
      cp_async_mbarrier_arrive(&sm.full[s]);
    }
  }

  // The v rows of a step (kPieces 16-byte pieces a token) into stage `st`: tokens outside [lo, hi)
  // of the step are zero-filled. A step of real tokens only (all but a sequence's first and last)
  // takes the short path: a lane copies the same piece of every (32 / kPieces)-th token from one
  // pointer, with no predicate (the loader's per-step instructions set its pace; docs/perf_log.md).
  template <int kPieces, class Stage>
  __device__ void copy_v(Stage& st, int64_t tok0, int lo, int hi) const {
    static_assert(32 % kPieces == 0, "a warp covers whole tokens");
    constexpr int kTokens = 32 / kPieces;  // tokens one pass of the warp covers
    if (lo == 0 && hi == C) {
      const int piece = lane % kPieces, t0 = lane / kPieces;
      if (kTokens > C && t0 >= C) return;  // (more lanes than pieces)
      const uint16_t* src = v_base + (tok0 + t0) * v_token_stride + 8 * piece;
      const int64_t pass_stride = int64_t(kTokens) * v_token_stride;
#pragma unroll
      for (int k = 0; k < (C + kTokens - 1) / kTokens; ++k)
        ptx::cp_async_16(&st.v[t0 + k * kTokens][8 * piece], src + k * pass_stride, 16u);
      return;
    }
#pragma unroll
    for (int x = lane; x < C * kPieces; x += 32) {
      const int t = x / kPieces, piece = x % kPieces;
      const bool ok = t >= lo && t < hi;
      ptx::cp_async_16(&st.v[t][8 * piece], ok ? v_base + (tok0 + t) * v_token_stride + 8 * piece : v_base,
                       ok ? 16u : 0u);
    }
  }
};

// The rows of part `local` of sequence w.seq in pass 1 or 3 (kda_plan.cuh lists them), for head
// dimension kD.
template <int kD>
__device__ __forceinline__ RowsIO part_rows(const KdaFwdArgs& a, const PlanArgs& p, const WorkUnit& w, int pass,
                                            int64_t local, int rows) {
  constexpr int C = kChunkTokens;
  const int n = w.seq;
  const int64_t nc = chunk_count(w.len, w.shift), L = p.seg_chunks, L0 = p.seg0_chunks;
  const int64_t e0 = p.seq.extra_off[n];
  const int segs = int(p.seq.extra_off[n + 1] - e0) + 1;
  // Pass 1 of a split sequence: its first seg0_split parts are segment 0, each on rows / seg0_split
  // of the slice's rows (PlanArgs::seg0_split).
  const int sub0 = pass == 1 && segs > 1 ? p.seg0_split : 1;
  int sub = 0;
  if (pass == 1 && local < sub0) {
    sub = int(local);
    local = 0;
  } else if (pass == 1) {
    local -= sub0 - 1;
  }
  RowsIO io;
  io.row0 = w.slice * rows;
  io.warps = rows / 16;
  if (pass == 1 && local == 0) {
    io.warps /= sub0;
    io.row0 += sub * 16 * io.warps;
  }
  io.identity = false;
  io.has_v = true;
  io.write_out = true;
  const int64_t own = state_row_offset<kD>(w.slot, a.heads_v, w.hv, io.row0);
  auto to_final = [&] {
    io.dst = a.final_state;
    io.dst_fp32 = a.final_fp32;
    io.dst_offset = own;
  };
  auto segment_rows = [&](float* buf, int64_t e, void*& ptr, int64_t& offset, bool& fp32) {
    ptr = buf;
    offset = state_row_offset<kD>(e, a.heads_v, w.hv, io.row0);
    fp32 = true;
  };
  if (pass == 1 && local == 0) {  // segment 0 (or the whole sequence) from its true start
    io.chunk0 = 0;
    io.nchunks = int(segs == 1 ? nc : L0);
    io.init = (a.initial_state != nullptr && !w.zero_init) ? a.initial_state : nullptr;
    io.init_fp32 = a.initial_fp32;
    io.init_offset = own;
    if (segs == 1) {
      to_final();
    } else {
      segment_rows(p.seg_start, e0, io.dst, io.dst_offset, io.dst_fp32);
    }
  } else if (pass == 1) {  // segment j's R (from zeros) or P (from I, v = 0)
    const int j = 1 + int(local - 1) / 2;
    const bool transition = (local - 1) % 2 == 1;
    io.chunk0 = int(L0 + (j - 1) * L);
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
    io.chunk0 = int(L0 + (j - 1) * L);
    io.nchunks = int(min(L, nc - io.chunk0));
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
  // Checkpoints: only the rows that carry the real state (those writing out) write them.
  io.ck_next = io.ck_last = -1;
  io.ck_step = io.ck_m = 0;
  if (p.seq.ck_first != nullptr && io.write_out && io.nchunks > 0) {
    // Boundary m (column m) is the end of local token first + m I, i.e. of chunk cb0 + m I / 16 on
    // the shifted grid (first + shift is a multiple of 16: first = -start mod I, shift = start mod
    // 16); the sequence reaches count of them within its columns (docs/spec.md).
    const int64_t I = a.checkpoint_interval, first = p.seq.ck_first[n];
    const int64_t count = w.len >= first ? min((w.len - first) / I + 1, a.checkpoint_columns) : 0;
    const int64_t cb0 = (first + w.shift) / C - 1, step = I / C;
    const int64_t m0 = io.chunk0 <= cb0 ? 0 : (io.chunk0 - cb0 + step - 1) / step;  // first in the walk
    const int64_t next = cb0 + m0 * step - io.chunk0;                               // >= 0
    if (m0 < count && next < io.nchunks) {
      // k boundaries in this walk: columns m0 .. m0 + k - 1, walk chunks next + j step.
      const int64_t k = min(count - m0, (io.nchunks - 1 - next) / step + 1);
      io.ck_next = int(next);
      io.ck_last = int(next + (k - 1) * step);           // <= nchunks - 1
      io.ck_step = int(min(step, int64_t(io.nchunks)));  // (clamped: past the walk's end either way)
      io.ck_m = int(m0);
    }
  }
  return io;
}

// kCk: the call writes checkpoints (its sequences' grids may be shifted); without, the shift is 0 at
// compile time.
template <class Tr, bool kCk>
__global__ void __launch_bounds__(Tr::kThreads, Tr::kCtasPerSm)
    kda_rec_kernel(const __grid_constant__ KdaFwdArgs a, const __grid_constant__ PlanArgs p, int pass) {
  FLASH_KDA_DYNAMIC_SMEM(smem_bytes);
  auto& sm = *reinterpret_cast<typename Tr::Smem*>(smem_bytes);
  // Launched after the previous kernel of the call (kda_prepared_launch.cuh), possibly before it has
  // finished: nothing it wrote is read before the wait.
  ptx::wait_for_prior_grid();
  if (fused_chosen(a)) return;
  const int b = blockIdx.x, slice = b % p.slices, hv = (b / p.slices) % a.heads_v;
  int n;
  int64_t local;
  // Every warp finds its part itself (the same answer): no broadcast needed.
  if (!locate(pass == 1 ? p.seq.p1_off : p.seq.p3_off, a.num_seqs, b / (p.slices * a.heads_v), n, local)) return;
  WorkUnit w = table_unit(a, p.seq, n, hv, slice);
  if (w.skip) return;  // padding: nothing is read or written
  if constexpr (!kCk) w.shift = 0;
  RowsIO io = part_rows<Tr::kDim>(a, p, w, pass, local, Tr::kVRows);
  // Pairs: the walk's chunk range (even start, docs/kernel.md "32-token steps") in steps of two; a
  // last odd chunk's partner is all past the end (an identity). Checkpoint boundaries end pairs (the
  // grid is shifted by start mod 32 and the interval is a multiple of 32): boundary walk chunk b
  // (odd) is walk step b / 2.
  if constexpr (Tr::kPair) {
    io.nchunks = (io.nchunks + 1) / 2;
    if (io.ck_next >= 0) {
      io.ck_next /= 2;
      io.ck_last /= 2;
      io.ck_step = max(1, io.ck_step / 2);
    }
  }
  if (threadIdx.x == 0) {
    for (int s = 0; s < Tr::kStages; ++s) {
      mbarrier_init(&sm.full[s], 32);  // every loader lane
      mbarrier_init(&sm.empty[s], io.warps * 32);  // every lane of a consumer warp that owns rows
    }
    sm.ck_step = io.ck_step;
    sm.ck_last = io.ck_last;
  }
  __syncthreads();
  const int warp = threadIdx.x >> 5;
  // Warp 0 loads; warps kLoaderWarps.. consume (those owning rows). With kRegRealloc the loader
  // warpgroup's registers go to the consumers (KdaRecTraits); each setmaxnreg sits in its role's
  // branch, so the compiler allots each role's code its own register count.
  if (warp < Tr::kLoaderWarps) {
    if constexpr (Tr::kRegRealloc) ptx::setmaxnreg_dec<Tr::kLoaderRegs>();
    if (warp != 0) return;
    const uint16_t* v_base = a.v + w.row * a.v_s[0] + w.begin * a.v_s[1] + int64_t(hv) * a.v_s[2] + io.row0;
    KdaLoader<Tr, kCk>{w,
                       io,
                       sm,
                       prepared_chunk<Tr::kDim, Tr::kPair>(p, a.heads_v, n, hv, io.chunk0),
                       Tr::kPair ? 2 * int64_t(a.heads_v) * Tr::Prepared::kPairSlot
                                 : int64_t(a.heads_v) * Tr::Prepared::kBytes,
                       v_base,
                       a.v_s[1],
                       a.checkpoint_indices + int64_t(n) * a.checkpoint_stride,
                       int(threadIdx.x & 31)}
        .run();
  } else {
    if constexpr (Tr::kRegRealloc) ptx::setmaxnreg_inc<Tr::kConsumerRegs>();
    if (warp - Tr::kLoaderWarps < io.warps)
      KdaConsumer<Tr, PackedStageView<Tr, kCk>>(a, w, io, sm, warp - Tr::kLoaderWarps, threadIdx.x & 31).run();
  }
}

// The recurrence instantiation a launch of `p` runs, for the device launcher and the emulated one
// alike: f(KdaRecTraits<...>{}, std::bool_constant<kCk>{}) with 32-token steps (pairs), three CTAs
// an SM (PlanArgs::packed) or neither, and with or without checkpoints.
template <int kD, int kConsumerWarps, class F>
auto with_rec_traits(const KdaFwdArgs& a, const PlanArgs& p, F f) {
  auto by_ck = [&](auto tr) {
    return a.checkpoint_interval > 0 ? f(tr, std::true_type{}) : f(tr, std::false_type{});
  };
  if constexpr (kD == 128) {
    if (p.pair) return by_ck(KdaRecTraits<kD, kConsumerWarps, true>{});
    if constexpr (kConsumerWarps == 2) {
      if (p.packed == 3) return by_ck(KdaRecTraits<kD, kConsumerWarps, false, 3>{});
    }
  }
  return by_ck(KdaRecTraits<kD, kConsumerWarps>{});
}

}  // namespace flash_kda::cuda::sm90
