// Prefix-cache checkpoints of fwd (FwdParams::checkpoint_*; docs/spec.md, Extensions) on both CPU
// backends: every checkpoint equals the state of the naive float64 oracle of test_util.h after the
// same tokens, slots no boundary names keep their bytes, a prefill resumed from a checkpoint
// continues the uninterrupted one, and every rejection names its argument and writes nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "test_util.h"

namespace flash_kda::test {
namespace {

constexpr double kFp32CheckpointTolerance = 1e-3;
constexpr double kBf16CheckpointTolerance = 5e-3;

// A checkpoint pool filled with distinct recognisable finite bytes, so an untouched slot can be
// compared byte for byte and a slot written by mistake shows.
StateBuffer patterned_pool(DType dtype, int64_t slots, int64_t per_slot) {
  StateBuffer pool(dtype, size_t(slots * per_slot));
  for (size_t i = 0; i < pool.size(); ++i) {
    if (dtype == DType::kF32)
      pool.f32[i] = 1000.0f + float(i % 4099);
    else
      pool.bf16[i] = uint16_t(0x4400 + i % 251);
  }
  return pool;
}

struct CheckpointSetup {
  int64_t interval = 16;
  std::vector<int64_t> starts;  // empty: no checkpoint_start (all 0)
  bool starts_i32 = false;
  std::vector<std::vector<int32_t>> slots;  // [N][M]
  int64_t row_stride = 0;                   // 0: contiguous rows; else > M, padded with -7
  int64_t pool_slots = 12;
  DType dtype = DType::kF32;
};

// The owned index arrays of one call.
struct CheckpointArrays {
  std::vector<int32_t> indices;
  std::vector<int64_t> start64;
  std::vector<int32_t> start32;
  int64_t columns = 0;

  CheckpointArrays(const CheckpointSetup& c, int64_t N) {
    columns = c.slots.empty() ? 0 : int64_t(c.slots[0].size());
    const int64_t stride = c.row_stride > 0 ? c.row_stride : columns;
    indices.assign(size_t(std::max<int64_t>(N * stride, 1)), -7);  // -7 in the padding: never read
    for (int64_t n = 0; n < N; ++n)
      std::copy(c.slots[size_t(n)].begin(), c.slots[size_t(n)].end(), indices.begin() + n * stride);
    start64 = c.starts;
    start32.assign(c.starts.begin(), c.starts.end());
  }

  void apply(const CheckpointSetup& c, FwdParams& p, StateBuffer& pool) const {
    p.checkpoint_interval = c.interval;
    p.checkpoint_state = pool.data();
    p.checkpoint_state_dtype = pool.dtype;
    p.checkpoint_pool_size = c.pool_slots;
    p.checkpoint_indices = indices.data();
    p.checkpoint_columns = columns;
    p.checkpoint_indices_stride = c.row_stride;
    if (!c.starts.empty()) {
      p.checkpoint_start = c.starts_i32 ? static_cast<const void*>(start32.data()) : start64.data();
      p.checkpoint_start_dtype = c.starts_i32 ? DType::kI32 : DType::kI64;
    }
  }
};

// The local token counts after which sequence n of `length` tokens starting at `start` checkpoints
// (all boundaries, not limited to the columns), written out from the definition.
std::vector<int64_t> boundaries(int64_t start, int64_t length, int64_t interval) {
  std::vector<int64_t> b;
  for (int64_t pos = interval; pos <= start + length; pos += interval)
    if (pos > start) b.push_back(pos - start);
  return b;
}

class Checkpoints : public SeededTest, public ::testing::WithParamInterface<std::tuple<Backend, DType>> {
 protected:
  Backend backend() const { return std::get<0>(GetParam()); }
  DType dtype() const { return std::get<1>(GetParam()); }
  double tolerance() const { return dtype() == DType::kF32 ? kFp32CheckpointTolerance : kBf16CheckpointTolerance; }

  // Runs pb with checkpoints `c` and checks every checkpoint slot against the oracle and every
  // other slot byte for byte; returns the result (out and final state).
  Result run_and_check(const Problem& pb, CheckpointSetup c, int* written_count = nullptr) {
    c.dtype = dtype();
    const int64_t per_slot = pb.HV * pb.V * pb.K;
    StateBuffer pool = patterned_pool(c.dtype, c.pool_slots, per_slot);
    const StateBuffer before = pool;
    const CheckpointArrays arrays(c, pb.N);
    Result r = poisoned_result(pb);
    FwdParams p = params_for(pb, backend(), r);
    arrays.apply(c, p, pool);
    r.status = fwd(p);
    EXPECT_TRUE(r.status.ok()) << r.status.message;

    const NaiveResult ref = naive_forward(pb, /*keep_token_states=*/true);
    std::vector<bool> written(size_t(c.pool_slots), false);
    int count = 0;
    for (int64_t n = 0; n < pb.N; ++n) {
      const int64_t start = c.starts.empty() ? 0 : c.starts[size_t(n)];
      const std::vector<int64_t> b = boundaries(start, pb.end(n) - pb.begin(n), c.interval);
      for (size_t m = 0; m < b.size() && m < c.slots[size_t(n)].size(); ++m) {
        const int32_t slot = c.slots[size_t(n)][m];
        if (slot < 0) continue;
        SCOPED_TRACE("sequence " + std::to_string(n) + ", boundary " + std::to_string(m) + ", slot " +
                     std::to_string(slot));
        written[size_t(slot)] = true;
        ++count;
        const int64_t token = pb.row(n) * pb.T + pb.begin(n) + b[m] - 1;
        std::vector<double> got(static_cast<size_t>(per_slot)), want(static_cast<size_t>(per_slot));
        for (int64_t i = 0; i < per_slot; ++i) {
          got[size_t(i)] = pool.at(size_t(slot * per_slot + i));
          want[size_t(i)] = ref.token_states[size_t(token * per_slot + i)];
        }
        EXPECT_TRUE(all_finite(got));
        EXPECT_LE(rel_error(got, want), tolerance());
      }
    }
    for (int64_t s = 0; s < c.pool_slots; ++s) {
      if (written[size_t(s)]) continue;
      const size_t bytes = size_t(per_slot) * (c.dtype == DType::kF32 ? 4 : 2);
      EXPECT_EQ(std::memcmp(static_cast<const char*>(pool.data()) + s * bytes,
                            static_cast<const char*>(before.data()) + s * bytes, bytes),
                0)
          << "slot " << s << " is named by no boundary but was written";
    }
    // The rest of the call is unchanged by checkpoints: out and the final state within the spec.
    EXPECT_LE(rel_error(r.out_double(), ref.out), kOutTolerance);
    if (!r.final_state.empty()) {
      EXPECT_LE(rel_error(r.final_state.to_double(), ref.state), kStateTolerance);
    }
    if (written_count) *written_count = count;
    return r;
  }
};

Config small(std::vector<int64_t> seq_lens) {
  Config cfg;
  cfg.seq_lens = std::move(seq_lens);
  cfg.heads = 2;
  cfg.heads_v = 4;  // GVA: checkpoints are per value head
  cfg.head_dim_k = 32;
  cfg.head_dim_v = 16;
  return cfg;
}

TEST_P(Checkpoints, VarlenStartsOffTheInterval) {
  // Sequence 0: start 5, 70 tokens: boundaries after 11, 27, 43, 59 tokens (4 > M = 3 columns).
  // Sequence 1: empty. Sequence 2: start 16 (a boundary itself, not reached again until 32): 16, 32.
  // Sequence 3: start 0, 16 tokens: a boundary at the last token. Sequence 4: start 11, 5 tokens:
  // the boundary at its last token. Sequence 5: start 17, 14 tokens: no boundary.
  const Problem pb(small({70, 0, 33, 16, 5, 14}), rng_);
  CheckpointSetup c;
  c.starts = {5, 100, 16, 0, 11, 17};
  c.slots = {{3, -1, 7}, {0, 1, 2}, {9, 4, 5}, {6, 8, 10}, {11, -1, -1}, {-1, -1, -1}};
  int written = 0;
  run_and_check(pb, c, &written);
  EXPECT_EQ(written, 2 + 2 + 1 + 1);
}

TEST_P(Checkpoints, Int32StartsAndWideInterval) {
  const Problem pb(small({100, 47}), rng_);
  CheckpointSetup c;
  c.interval = 48;
  c.starts = {40, 1};  // boundaries 48, 96, 144 (after 8, 56 tokens); 48 (after 47: the last token)
  c.starts_i32 = true;
  c.slots = {{0, 2, 4}, {1, 3, 5}};
  int written = 0;
  run_and_check(pb, c, &written);
  EXPECT_EQ(written, 3);
}

TEST_P(Checkpoints, FixedBatchWithInitialStateAndRowStride) {
  Config cfg = small({});
  cfg.batch = 3;
  cfg.seqlen = 40;
  const Problem pb(cfg, rng_);
  CheckpointSetup c;
  c.interval = 32;
  c.starts = {0, 30, 64};  // boundaries after 32 | 2, 34 | 32 tokens
  c.slots = {{1, 2}, {3, 4}, {5, 0}};
  c.row_stride = 5;
  int written = 0;
  run_and_check(pb, c, &written);
  EXPECT_EQ(written, 1 + 2 + 1);
}

TEST_P(Checkpoints, NoStartsMeansZero) {
  Config cfg = small({});
  cfg.batch = 2;
  cfg.seqlen = 33;
  cfg.state_dtype = DType::kNone;  // no states at all: checkpoints still work
  const Problem pb(cfg, rng_);
  CheckpointSetup c;
  c.slots = {{0, 1, 2}, {3, -1, 5}};  // boundaries after 16 and 32 tokens
  int written = 0;
  run_and_check(pb, c, &written);
  EXPECT_EQ(written, 3);
}

// The checkpoint pool is the state pool (in place, through state_indices).
TEST_P(Checkpoints, InTheStatePool) {
  const Problem pb(small({40, 20}), rng_);
  const int64_t per_slot = pb.HV * pb.V * pb.K, P = 8;
  StateBuffer pool = patterned_pool(dtype(), P, per_slot);
  // Slots 2 and 6 hold the sequences' states (random), the others are free.
  std::mt19937_64 gen(seed_);
  std::normal_distribution<float> normal;
  for (int64_t s : {2, 6})
    for (int64_t i = 0; i < per_slot; ++i) {
      if (dtype() == DType::kF32)
        pool.f32[size_t(s * per_slot + i)] = normal(gen);
      else
        pool.bf16[size_t(s * per_slot + i)] = float_to_bf16(normal(gen));
    }
  const StateBuffer before = pool;
  const std::vector<int32_t> state_slots = {6, 2};
  CheckpointSetup c;
  c.dtype = dtype();
  c.pool_slots = P;
  c.starts = {8, 0};  // boundaries after 8, 24, 40 | 16 tokens
  c.slots = {{0, 3, 5}, {7, 1, 4}};
  const CheckpointArrays arrays(c, pb.N);
  Result r = poisoned_result(pb);
  FwdParams p = params_for(pb, backend(), r);
  p.initial_state = p.final_state = pool.data();
  p.state_dtype = dtype();
  p.state_indices = state_slots.data();
  p.pool_size = P;
  arrays.apply(c, p, pool);
  const Status s = fwd(p);
  ASSERT_TRUE(s.ok()) << s.message;

  // The oracle on the gathered initial states.
  Problem gathered = pb;
  gathered.initial_state = StateBuffer(dtype(), size_t(pb.state_count()));
  for (int64_t n = 0; n < pb.N; ++n)
    for (int64_t i = 0; i < per_slot; ++i) {
      const size_t from = size_t(state_slots[size_t(n)] * per_slot + i), to = size_t(n * per_slot + i);
      if (dtype() == DType::kF32)
        gathered.initial_state.f32[to] = before.f32[from];
      else
        gathered.initial_state.bf16[to] = before.bf16[from];
    }
  const NaiveResult ref = naive_forward(gathered, true);
  auto slot_error = [&](int64_t slot, const double* want) {
    std::vector<double> got(static_cast<size_t>(per_slot)), w(want, want + per_slot);
    for (int64_t i = 0; i < per_slot; ++i) got[size_t(i)] = pool.at(size_t(slot * per_slot + i));
    return rel_error(got, w);
  };
  const std::vector<std::pair<int64_t, int64_t>> expected = {{0, 8}, {3, 24}, {5, 40}, {7, 40 + 16}};
  for (auto [slot, token] : expected)
    EXPECT_LE(slot_error(slot, ref.token_states.data() + (token - 1) * per_slot), tolerance()) << "slot " << slot;
  EXPECT_LE(slot_error(6, ref.state.data()), kStateTolerance * (dtype() == DType::kF32 ? 1 : 2));
  EXPECT_LE(slot_error(2, ref.state.data() + per_slot), kStateTolerance * (dtype() == DType::kF32 ? 1 : 2));
  const size_t bytes = size_t(per_slot) * (dtype() == DType::kF32 ? 4 : 2);
  for (int64_t slot : {1, 4})
    EXPECT_EQ(std::memcmp(static_cast<const char*>(pool.data()) + slot * bytes,
                          static_cast<const char*>(before.data()) + slot * bytes, bytes),
              0)
        << "slot " << slot << " (no boundary reached) was written";
}

// A prefill resumed from a checkpoint equals the uninterrupted prefill.
TEST_P(Checkpoints, ResumeFromACheckpoint) {
  Config cfg = small({});
  cfg.seqlen = 77;
  cfg.state_dtype = DType::kNone;
  const Problem full(cfg, rng_);
  const int64_t per_slot = full.HV * full.V * full.K, start = 3, I = 32;
  // Boundaries after 29 and 61 tokens (absolute 32, 64).
  StateBuffer pool = patterned_pool(dtype(), 2, per_slot);
  CheckpointSetup c;
  c.dtype = dtype();
  c.interval = I;
  c.pool_slots = 2;
  c.starts = {start};
  c.slots = {{0, 1}};
  const CheckpointArrays arrays(c, 1);
  Result r = poisoned_result(full);
  FwdParams p = params_for(full, backend(), r);
  arrays.apply(c, p, pool);
  ASSERT_TRUE(fwd(p).ok());

  for (int64_t slot : {0, 1}) {
    SCOPED_TRACE("resuming from slot " + std::to_string(slot));
    const int64_t done = (slot + 1) * I - start;  // tokens covered by the checkpoint
    Config rest_cfg = cfg;
    rest_cfg.seqlen = full.T - done;
    Problem rest(rest_cfg, rng_);
    auto tail = [&](const std::vector<uint16_t>& x, int64_t per_token) {
      return std::vector<uint16_t>(x.begin() + done * per_token, x.end());
    };
    rest.q = tail(full.q, full.cfg.heads * full.K);
    rest.k = tail(full.k, full.cfg.heads * full.K);
    rest.v = tail(full.v, full.HV * full.V);
    rest.g = tail(full.g, full.HV * full.K);
    rest.beta = tail(full.beta, full.HV);
    rest.A_log = full.A_log;
    rest.dt_bias = full.dt_bias;
    Result r2 = poisoned_result(rest);
    FwdParams p2 = params_for(rest, backend(), r2);
    p2.initial_state = static_cast<const char*>(pool.data()) + slot * per_slot * (dtype() == DType::kF32 ? 4 : 2);
    p2.state_dtype = dtype();
    ASSERT_TRUE(fwd(p2).ok());
    std::vector<double> got = r2.out_double(), want(r.out.size() - size_t(done * full.HV * full.V));
    for (size_t i = 0; i < want.size(); ++i) want[i] = bf16_to_float(r.out[size_t(done * full.HV * full.V) + i]);
    EXPECT_LE(rel_error(got, want), dtype() == DType::kF32 ? kOutTolerance : 6e-3);
  }
}

// Threads and batch composition do not change a checkpoint (bit for bit).
TEST_P(Checkpoints, BatchInvariant) {
  const Problem pb(small({50, 37}), rng_);
  const int64_t per_slot = pb.HV * pb.V * pb.K;
  CheckpointSetup c;
  c.dtype = dtype();
  c.pool_slots = 4;
  c.starts = {7, 2};
  c.slots = {{0, 1}, {2, 3}};
  StateBuffer both = patterned_pool(dtype(), 4, per_slot);
  Result r = poisoned_result(pb);
  FwdParams p = params_for(pb, backend(), r, 2);
  const CheckpointArrays arrays(c, pb.N);
  arrays.apply(c, p, both);
  ASSERT_TRUE(fwd(p).ok());
  const Problem second = pb.only_sequence(1);
  CheckpointSetup c1 = c;
  c1.starts = {2};
  c1.slots = {{2, 3}};
  StateBuffer alone = patterned_pool(dtype(), 4, per_slot);
  Result r1 = poisoned_result(second);
  FwdParams p1 = params_for(second, backend(), r1, 1);
  const CheckpointArrays arrays1(c1, 1);
  arrays1.apply(c1, p1, alone);
  ASSERT_TRUE(fwd(p1).ok());
  // Slots 2 and 3 are sequence 1's checkpoints in both calls.
  const size_t bytes = size_t(per_slot) * (dtype() == DType::kF32 ? 4 : 2);
  EXPECT_EQ(std::memcmp(static_cast<const char*>(alone.data()) + 2 * bytes,
                        static_cast<const char*>(both.data()) + 2 * bytes, 2 * bytes),
            0);
}

INSTANTIATE_TEST_SUITE_P(Backends, Checkpoints,
                         ::testing::Combine(::testing::Values(Backend::kCpu, Backend::kCpuReference),
                                            ::testing::Values(DType::kF32, DType::kBF16)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) == Backend::kCpu ? "Cpu" : "Reference") +
                                  (std::get<1>(info.param) == DType::kF32 ? "Fp32" : "Bf16");
                         });

// ---- rejections -------------------------------------------------------------------------------------

struct CheckpointCall {
  Problem pb;
  Result r;
  StateBuffer pool;    // the checkpoint pool (slots 0..5)
  StateBuffer states;  // a state pool of 4 slots
  std::vector<int32_t> state_slots{1, 3};
  std::vector<int32_t> indices{0, 1, 2, 3};  // [2, 2]
  std::vector<int64_t> starts{3, 16};
  FwdParams p;

  CheckpointCall(std::mt19937_64& rng, Backend backend)
      : pb(small({40, 20}), rng),
        r(poisoned_result(pb)),
        pool(patterned_pool(DType::kF32, 6, pb.HV * pb.V * pb.K)),
        states(patterned_pool(DType::kF32, 4, pb.HV * pb.V * pb.K)) {
    p = params_for(pb, backend, r);
    p.initial_state = p.final_state = states.data();
    p.state_indices = state_slots.data();
    p.pool_size = 4;
    p.checkpoint_interval = 16;
    p.checkpoint_state = pool.data();
    p.checkpoint_state_dtype = DType::kF32;
    p.checkpoint_pool_size = 6;
    p.checkpoint_indices = indices.data();
    p.checkpoint_columns = 2;
    p.checkpoint_start = starts.data();
    p.checkpoint_start_dtype = DType::kI64;
  }
};

struct BadCheckpoint {
  std::string name;
  StatusCode code;
  std::string argument;
  std::function<void(CheckpointCall&)> corrupt;
};

std::ostream& operator<<(std::ostream& os, const BadCheckpoint& c) { return os << c.name; }

std::vector<BadCheckpoint> bad_checkpoints() {
  const StatusCode kInvalid = StatusCode::kInvalidArgument, kType = StatusCode::kTypeMismatch;
  return {
      {"NegativeInterval", kInvalid, "checkpoint_interval", [](CheckpointCall& c) { c.p.checkpoint_interval = -16; }},
      {"IntervalNotMultipleOf16", kInvalid, "checkpoint_interval",
       [](CheckpointCall& c) { c.p.checkpoint_interval = 24; }},
      {"StateWithoutInterval", kInvalid, "checkpoint_state", [](CheckpointCall& c) { c.p.checkpoint_interval = 0; }},
      {"IndicesWithoutInterval", kInvalid, "checkpoint_indices",
       [](CheckpointCall& c) {
         c.p.checkpoint_interval = 0;
         c.p.checkpoint_state = nullptr;
       }},
      {"StartWithoutInterval", kInvalid, "checkpoint_start",
       [](CheckpointCall& c) {
         c.p.checkpoint_interval = 0;
         c.p.checkpoint_state = nullptr;
         c.p.checkpoint_indices = nullptr;
       }},
      {"NullState", kInvalid, "checkpoint_state", [](CheckpointCall& c) { c.p.checkpoint_state = nullptr; }},
      {"NullIndices", kInvalid, "checkpoint_indices", [](CheckpointCall& c) { c.p.checkpoint_indices = nullptr; }},
      {"StateDtype", kType, "checkpoint_state", [](CheckpointCall& c) { c.p.checkpoint_state_dtype = DType::kI32; }},
      {"StartDtype", kType, "checkpoint_start", [](CheckpointCall& c) { c.p.checkpoint_start_dtype = DType::kBF16; }},
      {"NegativePoolSize", kInvalid, "checkpoint_pool_size", [](CheckpointCall& c) { c.p.checkpoint_pool_size = -1; }},
      {"NegativeColumns", kInvalid, "checkpoint_indices", [](CheckpointCall& c) { c.p.checkpoint_columns = -1; }},
      {"RowStrideBelowColumns", kInvalid, "checkpoint_indices",
       [](CheckpointCall& c) { c.p.checkpoint_indices_stride = 1; }},
      {"MisalignedState", kInvalid, "checkpoint_state",
       [](CheckpointCall& c) { c.p.checkpoint_state = static_cast<char*>(c.pool.data()) + 2; }},
      {"MisalignedIndices", kInvalid, "checkpoint_indices",
       [](CheckpointCall& c) {
         c.p.checkpoint_indices = reinterpret_cast<const int32_t*>(reinterpret_cast<const char*>(c.indices.data()) + 2);
       }},
      {"MisalignedStart", kInvalid, "checkpoint_start",
       [](CheckpointCall& c) { c.p.checkpoint_start = reinterpret_cast<const char*>(c.starts.data()) + 4; }},
      {"SlotTooLarge", kInvalid, "checkpoint_indices", [](CheckpointCall& c) { c.indices[3] = 6; }},
      {"SlotBelowMinusOne", kInvalid, "checkpoint_indices", [](CheckpointCall& c) { c.indices[1] = -2; }},
      {"SlotTooLargeEvenIfNotReached", kInvalid, "checkpoint_indices",
       [](CheckpointCall& c) {
         c.starts[1] = 17;  // sequence 1 reaches one boundary: column 1 is never written, still checked
         c.indices[3] = 100;
       }},
      {"DuplicateSlots", kInvalid, "checkpoint_indices", [](CheckpointCall& c) { c.indices[2] = 1; }},
      {"DuplicateSlotsInARow", kInvalid, "checkpoint_indices", [](CheckpointCall& c) { c.indices[1] = 0; }},
      {"NegativeStart", kInvalid, "checkpoint_start", [](CheckpointCall& c) { c.starts[0] = -1; }},
      {"HugeStart", kInvalid, "checkpoint_start", [](CheckpointCall& c) { c.starts[1] = int64_t(1) << 62; }},
      {"StateOverlapsQ", kInvalid, "checkpoint_state",
       [](CheckpointCall& c) {
         c.p.checkpoint_state = const_cast<uint16_t*>(c.pb.q.data());
         c.p.checkpoint_state_dtype = DType::kBF16;
         c.p.checkpoint_pool_size = 1;
       }},
      {"StateOverlapsStatePool", kInvalid, "final_state",
       [](CheckpointCall& c) {
         c.p.checkpoint_state = static_cast<float*>(c.states.data()) + 4;  // not the pool itself: a shifted view
         c.p.checkpoint_pool_size = 1;
       }},
      {"StateOverlapsOut", kInvalid, "out",
       [](CheckpointCall& c) {
         c.p.checkpoint_state = c.r.out.data();
         c.p.checkpoint_state_dtype = DType::kBF16;
         c.p.checkpoint_pool_size = 1;
       }},
      {"StateOverlapsIndices", kInvalid, "checkpoint_state",
       [](CheckpointCall& c) {
         c.p.checkpoint_indices = static_cast<const int32_t*>(c.pool.data());
         c.pool.f32[0] = 0.0f;  // valid slot values (0 as int32 bits), so only the overlap is wrong
         c.pool.f32[1] = 0.0f;
         c.pool.f32[2] = 0.0f;
         c.pool.f32[3] = 0.0f;
         c.p.checkpoint_indices_stride = 0;
       }},
      {"SameAsStatePoolOtherDtype", kType, "checkpoint_state",
       [](CheckpointCall& c) {
         c.p.checkpoint_state = c.states.data();
         c.p.checkpoint_state_dtype = DType::kBF16;
         c.p.checkpoint_pool_size = 4;
       }},
      {"SameAsStatePoolOtherSize", kInvalid, "checkpoint_state",
       [](CheckpointCall& c) {
         c.p.checkpoint_state = c.states.data();
         c.p.checkpoint_pool_size = 3;
       }},
      {"CheckpointIntoAnotherSequencesState", kInvalid, "checkpoint_indices",
       [](CheckpointCall& c) {
         c.p.checkpoint_state = c.states.data();
         c.p.checkpoint_pool_size = 4;
         c.indices = {0, 3, 2, -1};  // slot 3 is sequence 1's state, written by sequence 0
       }},
      {"CheckpointIntoOwnState", kInvalid, "checkpoint_indices",
       [](CheckpointCall& c) {
         c.p.checkpoint_state = c.states.data();
         c.p.checkpoint_pool_size = 4;
         c.indices = {1, 0, 2, -1};  // slot 1 is sequence 0's state
       }},
  };
}

class CheckpointRejections : public SeededTest,
                             public ::testing::WithParamInterface<std::tuple<BadCheckpoint, Backend>> {};

TEST_P(CheckpointRejections, NamesTheArgumentAndWritesNothing) {
  const auto& [bad, backend] = GetParam();
  CheckpointCall c(rng_, backend);
  ASSERT_TRUE(fwd(c.p).ok()) << "the base call must be valid";
  CheckpointCall fresh(rng_, backend);
  bad.corrupt(fresh);
  const std::vector<uint16_t> out_before = fresh.r.out;
  const StateBuffer pool_before = fresh.pool, states_before = fresh.states;
  const Status s = fwd(fresh.p);
  EXPECT_EQ(s.code, bad.code) << s.message;
  EXPECT_EQ(s.message.rfind(bad.argument + ":", 0), 0u)
      << "message should name '" << bad.argument << "': " << s.message;
  EXPECT_TRUE(fresh.r.out == out_before) << "out was modified by a rejected call";
  EXPECT_TRUE(fresh.pool == pool_before) << "the checkpoint pool was modified by a rejected call";
  EXPECT_TRUE(fresh.states == states_before) << "the state pool was modified by a rejected call";
}

INSTANTIATE_TEST_SUITE_P(Cases, CheckpointRejections,
                         ::testing::Combine(::testing::ValuesIn(bad_checkpoints()),
                                            ::testing::Values(Backend::kCpu, Backend::kCpuReference)),
                         [](const auto& info) {
                           return std::get<0>(info.param).name +
                                  (std::get<1>(info.param) == Backend::kCpu ? "_Cpu" : "_Reference");
                         });

// Checkpoints into free slots of the state pool, padding sequences (no checkpoint written) and a
// checkpoint slot shared with a padding sequence's row are fine.
TEST(CheckpointPool, FreeSlotsOfTheStatePoolAreAccepted) {
  std::mt19937_64 rng(fresh_seed());
  CheckpointCall c(rng, Backend::kCpu);
  c.p.checkpoint_state = c.states.data();
  c.p.checkpoint_pool_size = 4;
  c.indices = {0, 2, 0, 2};  // sequence 1 is padding: its row names the same slots, never written
  c.state_slots = {1, -1};
  const Status s = fwd(c.p);
  EXPECT_TRUE(s.ok()) << s.message;
}

// The CUDA backend writes checkpoints too (its results are checked on a GPU by
// tests/gpu/test_cuda_checkpoints.cu); the arguments are validated before anything is launched, as
// on the host backends (no GPU needed: the interval is checked first).
TEST(CheckpointPool, CudaBackendValidatesArguments) {
  std::mt19937_64 rng(fresh_seed());
  CheckpointCall c(rng, Backend::kCuda);
  c.p.head_dim_k = c.p.head_dim_v = 128;  // what the CUDA backend runs (nothing is read: the call fails first)
  c.p.checkpoint_interval = 24;
  const Status s = fwd(c.p);
  EXPECT_EQ(s.code, StatusCode::kInvalidArgument) << s.message;
  EXPECT_EQ(s.message.rfind("checkpoint_interval:", 0), 0u) << s.message;
}

}  // namespace
}  // namespace flash_kda::test
