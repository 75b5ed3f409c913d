// The unit of work of the CPU backends: one sequence and one value head, with its inputs located and
// its state slices found. Shared by the float64 reference and the fp32 paths so all read the
// parameters the same way (strides, GVA head mapping, varlen bounds, state dtypes, pool slots);
// because of that the tests check all of them against oracles that share none of this code
// (tests/cpp/test_util.h, tests/python/oracle.py). Sequence bounds and slots come from the host
// copies of the index arrays (HostRun::idx), never from the caller's arrays.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>
#include <vector>

#include "../api/backends.h"
#include "../common/bf16.h"
#include "flash_kda/flash_kda.h"
#include "parallel.h"

namespace flash_kda::cpu {

// Inputs of one (sequence, value head), positioned at the sequence's first token; `*_stride` is the
// element distance between consecutive tokens. Pointers are null when the sequence is empty.
struct HeadTask {
  int64_t length = 0;  // tokens in the sequence
  const uint16_t* q = nullptr;
  const uint16_t* k = nullptr;
  const uint16_t* v = nullptr;
  const uint16_t* g = nullptr;
  const uint16_t* beta = nullptr;
  uint16_t* out = nullptr;
  int64_t q_stride = 0, k_stride = 0, v_stride = 0, g_stride = 0, beta_stride = 0, out_stride = 0;
  float A_log = 0.0f;                   // 0 (a rate exp(0) = 1) when the problem has no A_log
  const float* dt_bias = nullptr;       // [K]
  const void* initial_state = nullptr;  // [V, K] slice, or null (zeros)
  void* final_state = nullptr;          // [V, K] slice, or null (not written)
  // Speculative decoding: the state after token t goes to state_after[t] (null: not written).
  void* state_after[kMaxDecodeTokens] = {};
  bool per_token_states = false;
  // Prefix-cache checkpoints (FwdParams::checkpoint_*): the state after local token
  // checkpoints.first - 1 + m * checkpoints.interval goes to checkpoint_dst(task, m), m < count.
  SeqCheckpoints checkpoints;
  char* checkpoint_base = nullptr;  // head hv of slot 0 of the checkpoint pool
  int64_t checkpoint_slot_bytes = 0;
  DType checkpoint_dtype = DType::kNone;

  // Tokens processed when checkpoint m is due (its boundary, as a local count).
  int64_t checkpoint_end(int64_t m) const { return checkpoints.first + m * checkpoints.interval; }
  // Where checkpoint m goes; null for a slot of -1.
  void* checkpoint_dst(int64_t m) const {
    const int32_t slot = checkpoints.slots[m];
    return slot < 0 ? nullptr : checkpoint_base + slot * checkpoint_slot_bytes;
  }
};

inline HeadTask make_head_task(const HostRun& run, int64_t n, int64_t hv) {
  const ProblemParams& p = run.p;
  const int64_t HV = p.heads_v;
  const int64_t h = hv / (HV / p.heads);  // GVA: HV/H value heads share one q/k head
  const int64_t K = p.head_dim_k, V = p.head_dim_v;

  HeadTask t;
  const SeqRange range = sequence_range(p, run.idx, n);
  t.length = range.end - range.begin;
  t.A_log = p.A_log ? p.A_log[hv] : 0.0f;  // no A_log (GateForm::kSigmoid only): rate exp(0) = 1 exactly
  t.dt_bias = p.dt_bias + hv * K;
  if (t.length > 0) {
    auto at = [&](const void* base, const ActStrides& s, int64_t head) {
      return static_cast<const uint16_t*>(base) + range.row * s.batch + range.begin * s.token + head * s.head;
    };
    t.q = at(p.q, p.q_strides, h);
    t.k = at(p.k, p.k_strides, h);
    t.v = at(p.v, p.v_strides, hv);
    t.g = at(p.g, p.g_strides, hv);
    t.beta = at(p.beta, p.beta_strides, hv);
    t.out = const_cast<uint16_t*>(at(p.out, p.out_strides, hv));
    t.q_stride = p.q_strides.token;
    t.k_stride = p.k_strides.token;
    t.v_stride = p.v_strides.token;
    t.g_stride = p.g_strides.token;
    t.beta_stride = p.beta_strides.token;
    t.out_stride = p.out_strides.token;
  }
  // Slot s of a state tensor holds [HV, V, K]; validation has checked every slot used here.
  const SeqSlots slots = sequence_slots(run.idx, n);
  auto offset = [&](int64_t slot, DType dtype) { return (slot * HV + hv) * V * K * (dtype == DType::kF32 ? 4 : 2); };
  if (run.initial_state && slots.read >= 0)
    t.initial_state = static_cast<const char*>(run.initial_state) + offset(slots.read, run.initial_dtype);
  if (run.final_state && slots.write >= 0)
    t.final_state = static_cast<char*>(run.final_state) + offset(slots.write, run.final_dtype);
  if (run.final_state && slots.per_token) {
    t.per_token_states = true;
    for (int64_t i = 0; i < std::min(t.length, run.idx.slots_per_seq); ++i)
      if (slots.per_token[i] >= 0)
        t.state_after[i] = static_cast<char*>(run.final_state) + offset(slots.per_token[i], run.final_dtype);
  }
  if (run.checkpoint_state) {
    t.checkpoints = sequence_checkpoints(run.idx, n, t.length);
    t.checkpoint_dtype = run.checkpoint_dtype;
    t.checkpoint_base = static_cast<char*>(run.checkpoint_state) + offset(0, run.checkpoint_dtype);
    t.checkpoint_slot_bytes = offset(1, run.checkpoint_dtype) - offset(0, run.checkpoint_dtype);
  }
  return t;
}

// Reads a V×K state slice of initial_state's dtype (zeros when src is null) into `state`, whose
// rows are `pitch` >= K elements apart; the columns past K are left as they are.
template <typename Real>
void load_state(const HostRun& run, const void* src, Real* state, int64_t pitch) {
  const int64_t K = run.p.head_dim_k, V = run.p.head_dim_v;
  for (int64_t r = 0; r < V; ++r) {
    Real* row = state + r * pitch;
    if (!src) {
      std::fill(row, row + K, Real(0));
    } else if (run.initial_dtype == DType::kF32) {
      const float* s = static_cast<const float*>(src) + r * K;
      for (int64_t c = 0; c < K; ++c) row[c] = Real(s[c]);
    } else {
      const uint16_t* s = static_cast<const uint16_t*>(src) + r * K;
      for (int64_t c = 0; c < K; ++c) row[c] = Real(bf16_to_float(s[c]));
    }
  }
}

// Rounds a double to the nearest bf16 (ties to even) with a single rounding: going through float
// could land exactly on a bf16 tie that the double was not on, and then round the wrong way.
inline uint16_t double_to_bf16(double x) {
  float f = float(x);
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0xffffu) == 0x8000u && double(f) != x)
    f = std::nextafter(
        f, x > double(f) ? std::numeric_limits<float>::infinity() : -std::numeric_limits<float>::infinity());
  return float_to_bf16(f);
}

inline uint16_t to_bf16(float x) { return float_to_bf16(x); }
inline uint16_t to_bf16(double x) { return double_to_bf16(x); }

// Writes a V×K state slice (rows `pitch` elements apart) in `dtype`; nothing when dst is null.
template <typename Real>
void store_state_as(const HostRun& run, DType dtype, const Real* state, int64_t pitch, void* dst) {
  if (!dst) return;
  const int64_t K = run.p.head_dim_k, V = run.p.head_dim_v;
  for (int64_t r = 0; r < V; ++r) {
    const Real* row = state + r * pitch;
    if (dtype == DType::kF32) {
      float* d = static_cast<float*>(dst) + r * K;
      for (int64_t c = 0; c < K; ++c) d[c] = float(row[c]);
    } else {
      uint16_t* d = static_cast<uint16_t*>(dst) + r * K;
      for (int64_t c = 0; c < K; ++c) d[c] = to_bf16(row[c]);
    }
  }
}

// The same in final_state's dtype.
template <typename Real>
void store_state(const HostRun& run, const Real* state, int64_t pitch, void* dst) {
  store_state_as(run, run.final_dtype, state, pitch, dst);
}

// Writes checkpoint m of the task (nothing for a slot of -1).
template <typename Real>
void store_checkpoint(const HostRun& run, const HeadTask& task, int64_t m, const Real* state, int64_t pitch) {
  store_state_as(run, task.checkpoint_dtype, state, pitch, task.checkpoint_dst(m));
}

// Runs run_head(task, scratch) for every (active sequence, value head) on p.cpu_threads threads.
// Sequences are handed out longest first so that a long sequence does not start last and run alone.
// Each item reads only its own inputs and state slices (distinct sequences use distinct slots), so
// the schedule cannot change any result (batch invariance). Padding sequences are not visited.
template <typename Scratch, typename RunHead>
Status for_each_head(const HostRun& run, const RunHead& run_head) {
  const ProblemParams& p = run.p;
  const int64_t N = num_sequences(p);
  const int64_t HV = p.heads_v;
  try {
    std::vector<int64_t> order;
    std::vector<int64_t> length(size_t(N), 0);
    order.reserve(size_t(N));
    for (int64_t n = 0; n < N; ++n) {
      const SeqRange r = sequence_range(p, run.idx, n);
      length[size_t(n)] = r.end - r.begin;
      if (sequence_slots(run.idx, n).active) order.push_back(n);
    }
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return length[size_t(a)] > length[size_t(b)]; });
    const int64_t items = int64_t(order.size()) * HV;
    parallel_for<Scratch>(items, p.cpu_threads, [&](int64_t i, Scratch& scratch) {
      run_head(make_head_task(run, order[size_t(i / HV)], i % HV), scratch);
    });
  } catch (const std::bad_alloc&) {
    return {StatusCode::kUnsupported, "cpu backend: out of memory"};
  }
  return Status::Ok();
}

}  // namespace flash_kda::cpu
