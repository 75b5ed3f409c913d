// Decode and state pools on the CPU backends (docs/serving.md): decode against the forward over the
// same tokens; a pool prefill followed by decode steps against one prefill; padding sequences and
// unused slots untouched byte for byte; speculative indices against the naive float64 oracle;
// has_initial_state; and every rejection of the new arguments (code, message, nothing written).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "test_util.h"

namespace flash_kda::test {
namespace {

constexpr Backend kBackends[] = {Backend::kCpu, Backend::kCpuReference};

const char* backend_name(Backend b) { return b == Backend::kCpu ? "kCpu" : "kCpuReference"; }

// As test_cpu_backend.cpp: the fp32 CPU paths land far inside docs/spec.md's tolerances and are held to
// these tighter bounds too.
constexpr double kCpuOutBound = 1e-3;
constexpr double kCpuStateBound = 1e-4;
// A bf16 state: fp32 and float64 results a few 1e-6 apart round to different bf16 neighbours
// (2^-8 apart) for ~0.1 % of the elements, which alone gives ~1.4e-4.
constexpr double kCpuBf16StateBound = 5e-4;

int64_t slot_elems(const Problem& pb) { return pb.HV * pb.V * pb.K; }

// A pool of P slots of the problem's state dtype, every element poisoned (NaN).
StateBuffer poisoned_pool(const Problem& pb, int64_t P) {
  return StateBuffer(pb.cfg.state_dtype, size_t(P * slot_elems(pb)));
}

void copy_slot(const StateBuffer& src, int64_t from, StateBuffer& dst, int64_t to, int64_t per_slot) {
  if (src.dtype == DType::kF32)
    std::copy_n(src.f32.begin() + from * per_slot, per_slot, dst.f32.begin() + to * per_slot);
  else
    std::copy_n(src.bf16.begin() + from * per_slot, per_slot, dst.bf16.begin() + to * per_slot);
}

std::vector<double> slot_values(const StateBuffer& pool, int64_t slot, int64_t per_slot) {
  std::vector<double> x(static_cast<size_t>(per_slot));
  for (int64_t i = 0; i < per_slot; ++i) x[size_t(i)] = pool.at(size_t(slot * per_slot + i));
  return x;
}

bool slot_bytes_equal(const StateBuffer& a, const StateBuffer& b, int64_t slot, int64_t per_slot) {
  const size_t elem = a.dtype == DType::kF32 ? 4 : 2;
  const auto* pa = static_cast<const char*>(a.data()) + slot * per_slot * int64_t(elem);
  const auto* pb = static_cast<const char*>(b.data()) + slot * per_slot * int64_t(elem);
  return std::memcmp(pa, pb, size_t(per_slot) * elem) == 0;
}

// Every slot outside `written` holds the same bytes as before the call.
void expect_untouched_except(const StateBuffer& after, const StateBuffer& before, const std::set<int64_t>& written,
                             int64_t P, int64_t per_slot) {
  for (int64_t s = 0; s < P; ++s)
    if (!written.count(s)) {
      EXPECT_TRUE(slot_bytes_equal(after, before, s, per_slot)) << "slot " << s << " was modified";
    }
}

// `count` distinct random slots of [0, P).
std::vector<int32_t> distinct_slots(int64_t count, int64_t P, std::mt19937_64& rng) {
  std::vector<int32_t> all(static_cast<size_t>(P));
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(size_t(count));
  return all;
}

std::vector<double> bf16_to_double(const std::vector<uint16_t>& x) {
  std::vector<double> r(x.size());
  for (size_t i = 0; i < x.size(); ++i) r[i] = bf16_to_float(x[i]);
  return r;
}

// `got` against `ref` within docs/spec.md's tolerance and, when `ref` has been rounded to the same dtype
// (a result of the reference backend), within the CPU bound as well: against unrounded float64 the
// bf16 rounding of out alone is ~1.1e-3.
void expect_close(const std::vector<double>& got, const std::vector<double>& ref, bool is_state, const char* what,
                  bool ref_rounded = true, DType state_dtype = DType::kF32) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  EXPECT_TRUE(all_finite(got)) << what << " has an unwritten or non-finite element";
  const double rel = rel_error(got, ref);
  EXPECT_LE(rel, is_state ? kStateTolerance : kOutTolerance) << what;
  if (ref_rounded) {
    const double state_bound = state_dtype == DType::kBF16 ? kCpuBf16StateBound : kCpuStateBound;
    EXPECT_LE(rel, is_state ? state_bound : kCpuOutBound) << what;
  }
}

// Rows [first, first + count) of x (rows of `width` elements).
template <typename T>
std::vector<T> rows(const std::vector<T>& x, int64_t first, int64_t count, int64_t width) {
  return std::vector<T>(x.begin() + first * width, x.begin() + (first + count) * width);
}

class Decode : public SeededTest {};

// ---- decode over T tokens equals the forward over the same tokens ------------------------------

void check_decode_equals_forward(const Config& cfg, std::mt19937_64& rng) {
  const Problem pb(cfg, rng);
  const int64_t per = slot_elems(pb), P = 2 * pb.N + 3;
  const std::vector<int32_t> slots = distinct_slots(pb.N, P, rng);
  StateBuffer pool0 = poisoned_pool(pb, P);
  for (int64_t n = 0; n < pb.N; ++n) copy_slot(pb.initial_state, n, pool0, slots[size_t(n)], per);
  const Result ref = run(pb, Backend::kCpuReference);
  ASSERT_TRUE(ref.status.ok()) << ref.status.message;

  for (Backend backend : kBackends) {
    SCOPED_TRACE(backend_name(backend));
    StateBuffer pool = pool0;
    std::vector<uint16_t> out(size_t(pb.out_count()), kPoisonBf16);
    const Status s = decode(decode_params(pb, backend, out.data(), pool, P, slots.data()));
    ASSERT_TRUE(s.ok()) << s.message;
    std::vector<double> states;
    for (int64_t n = 0; n < pb.N; ++n) {
      const std::vector<double> x = slot_values(pool, slots[size_t(n)], per);
      states.insert(states.end(), x.begin(), x.end());
    }
    if (backend == Backend::kCpuReference) {
      // The same float64 recurrence behind both entry points: identical bits.
      EXPECT_TRUE(out == ref.out) << "decode and fwd differ on the reference backend";
      EXPECT_TRUE(states == ref.final_state.to_double()) << "pool slots differ from fwd's final_state";
    }
    expect_close(bf16_to_double(out), ref.out_double(), false, "out");
    expect_close(states, ref.final_state.to_double(), true, "pool slots", true, pb.cfg.state_dtype);
    expect_untouched_except(pool, pool0, std::set<int64_t>(slots.begin(), slots.end()), P, per);
  }
}

TEST_F(Decode, EqualsForwardOverTheSameTokens) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (int64_t T : {1, 4, 8}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " T=" + std::to_string(T));
      Config cfg;
      cfg.batch = 3;
      cfg.seqlen = T;
      cfg.state_dtype = dtype;
      check_decode_equals_forward(cfg, rng_);
    }
  }
}

TEST_F(Decode, EqualsForwardVarlenGvaAndSmallHeads) {
  Config varlen;
  varlen.seq_lens = {3, 0, 8, 1};
  varlen.cu_seqlens_dtype = DType::kI32;
  Config gva;
  gva.batch = 2;
  gva.seqlen = 5;
  gva.heads = 2;
  gva.heads_v = 4;
  Config small;
  small.batch = 2;
  small.seqlen = 6;
  small.head_dim_k = 40;
  small.head_dim_v = 24;
  small.state_dtype = DType::kBF16;
  for (const Config& cfg : {varlen, gva, small}) check_decode_equals_forward(cfg, rng_);
}

// ---- prefill into a pool, then decode steps = one prefill over all tokens ----------------------

TEST_F(Decode, PrefillThenDecodeEqualsOnePrefill) {
  constexpr int64_t kPrefill = 29;
  const std::vector<int64_t> steps = {3, 8, 1, 5};
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    Config cfg;
    cfg.batch = 3;
    cfg.seqlen = kPrefill;
    for (int64_t t : steps) cfg.seqlen += t;
    cfg.heads = 2;
    cfg.state_dtype = dtype;
    const Problem full(cfg, rng_);
    const Result ref = run(full, Backend::kCpuReference);
    ASSERT_TRUE(ref.status.ok()) << ref.status.message;
    const int64_t per = slot_elems(full), P = 7, H = cfg.heads, HV = full.HV, K = full.K, V = full.V;
    const std::vector<int32_t> slots = distinct_slots(full.N, P, rng_);

    for (Backend backend : kBackends) {
      SCOPED_TRACE(std::string(backend_name(backend)) + " " + dtype_name(dtype));
      StateBuffer pool = poisoned_pool(full, P);
      for (int64_t n = 0; n < full.N; ++n) copy_slot(full.initial_state, n, pool, slots[size_t(n)], per);
      const StateBuffer pool0 = pool;
      std::vector<uint16_t> out(size_t(full.out_count()), kPoisonBf16);

      // The prefill reads tokens [0, kPrefill) of each row in place (strided views of the full arrays).
      FwdParams p = full.params(backend, out.data(), pool.data());
      fill_contiguous_strides(p);
      p.seqlen = kPrefill;
      p.initial_state = pool.data();
      p.state_indices = slots.data();
      p.pool_size = P;
      Status s = fwd(p);
      ASSERT_TRUE(s.ok()) << s.message;

      int64_t offset = kPrefill;
      for (int64_t T : steps) {
        DecodeParams d = decode_params(full, backend, out.data(), pool, P, slots.data());
        d.seqlen = T;
        d.q = full.q.data() + offset * H * K;
        d.k = full.k.data() + offset * H * K;
        d.v = full.v.data() + offset * HV * V;
        d.g = full.g.data() + offset * HV * K;
        d.beta = full.beta.data() + offset * HV;
        d.out = out.data() + offset * HV * V;
        s = decode(d);
        ASSERT_TRUE(s.ok()) << s.message;
        offset += T;
      }
      std::vector<double> states;
      for (int64_t n = 0; n < full.N; ++n) {
        const std::vector<double> x = slot_values(pool, slots[size_t(n)], per);
        states.insert(states.end(), x.begin(), x.end());
      }
      // The state is rounded to the pool's dtype between calls, so this is a tolerance, not bits.
      const bool bf16 = dtype == DType::kBF16;
      const std::vector<double> out_d = bf16_to_double(out);
      EXPECT_TRUE(all_finite(out_d)) << "out has an unwritten element";
      EXPECT_LE(rel_error(out_d, ref.out_double()), bf16 ? kOutTolerance : kCpuOutBound) << "out";
      EXPECT_LE(rel_error(states, ref.final_state.to_double()), bf16 ? kStateTolerance : kCpuStateBound)
          << "pool slots";
      expect_untouched_except(pool, pool0, std::set<int64_t>(slots.begin(), slots.end()), P, per);
    }
  }
}

// ---- padding sequences and unused slots are untouched -------------------------------------------

TEST_F(Decode, PaddingSequencesWriteNothing) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (bool prefill : {false, true}) {
      Config cfg;
      cfg.batch = 4;
      cfg.seqlen = prefill ? 20 : 3;
      cfg.state_dtype = dtype;
      const Problem pb(cfg, rng_);
      const int64_t per = slot_elems(pb), P = 9, row = pb.T * pb.HV * pb.V;
      const std::vector<int32_t> indices = {6, -1, 2, -3};
      StateBuffer pool0 = poisoned_pool(pb, P);
      copy_slot(pb.initial_state, 0, pool0, 6, per);
      copy_slot(pb.initial_state, 2, pool0, 2, per);
      for (Backend backend : kBackends) {
        SCOPED_TRACE(std::string(backend_name(backend)) + " " + dtype_name(dtype) + (prefill ? " fwd" : " decode"));
        StateBuffer pool = pool0;
        std::vector<uint16_t> out(size_t(pb.out_count()), kPoisonBf16);
        Status s;
        if (prefill) {
          FwdParams p = pb.params(backend, out.data(), pool.data());
          p.initial_state = pool.data();
          p.state_indices = indices.data();
          p.pool_size = P;
          s = fwd(p);
        } else {
          s = decode(decode_params(pb, backend, out.data(), pool, P, indices.data()));
        }
        ASSERT_TRUE(s.ok()) << s.message;
        for (int64_t n : {1, 3})
          EXPECT_TRUE(std::all_of(out.begin() + n * row, out.begin() + (n + 1) * row,
                                  [](uint16_t x) { return x == kPoisonBf16; }))
              << "out rows of padding sequence " << n << " were written";
        for (int64_t n : {0, 2}) EXPECT_TRUE(all_finite(bf16_to_double(rows(out, n, 1, row)))) << "sequence " << n;
        EXPECT_TRUE(all_finite(slot_values(pool, 6, per)) && all_finite(slot_values(pool, 2, per)));
        expect_untouched_except(pool, pool0, {6, 2}, P, per);
      }
    }
  }
}

// T = 0, or a batch of padding sequences only: nothing at all is written.
TEST_F(Decode, NoTokensAndAllPadding) {
  Config cfg;
  cfg.batch = 2;
  cfg.seqlen = 0;
  const Problem pb(cfg, rng_);
  const int64_t per = slot_elems(pb), P = 3;
  const std::vector<int32_t> indices = {0, 2};
  StateBuffer pool0 = poisoned_pool(pb, P);
  copy_slot(pb.initial_state, 0, pool0, 0, per);
  for (Backend backend : kBackends) {
    StateBuffer pool = pool0;
    DecodeParams d = decode_params(pb, backend, nullptr, pool, P, indices.data());
    d.q = d.k = d.v = d.g = d.beta = nullptr;
    const Status s = decode(d);
    ASSERT_TRUE(s.ok()) << s.message;
    EXPECT_TRUE(pool == pool0);
  }
  Config two;
  two.batch = 2;
  two.seqlen = 2;
  const Problem pb2(two, rng_);
  const std::vector<int32_t> padding = {-1, -1};
  const StateBuffer pool1 = poisoned_pool(pb2, 1);
  for (Backend backend : kBackends) {
    StateBuffer pool = pool1;
    std::vector<uint16_t> out(size_t(pb2.out_count()), kPoisonBf16);
    const Status s = decode(decode_params(pb2, backend, out.data(), pool, 1, padding.data()));
    ASSERT_TRUE(s.ok()) << s.message;
    EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](uint16_t x) { return x == kPoisonBf16; }));
    EXPECT_TRUE(slot_bytes_equal(pool, pool1, 0, slot_elems(pb2)));
  }
}

// ---- speculative decoding against the naive float64 oracle --------------------------------------

// Within half a unit in the last place of the stored dtype of the naive value (both are float64
// computations; the reference backend rounds once).
// (The two float64 computations differ by their own rounding, ~1e-16 of the largest terms: an entry
// that ends near zero by cancellation (seen: 3.8e-12 in a state of entries ~1, FLASH_KDA_TEST_SEED=
// 2406767580904556910) may differ between them by more than its half ulp. 1e-12 of the largest |exact|
// absorbs that and nothing a wrong rounding of the other entries would show.)
int64_t not_rounded_from(const std::vector<double>& got, const std::vector<double>& exact, double half_ulp) {
  double largest = 0.0;
  for (double e : exact) largest = std::max(largest, std::abs(e));
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (!(std::abs(got[i] - exact[i]) <= half_ulp * std::abs(exact[i]) * (1.0 + 1e-6) + 1e-12 * largest + 1e-30)) ++bad;
  return bad;
}

struct SpecCase {
  int64_t T, S, stride;
};

TEST_F(Decode, SpeculativeIndicesAgainstNaiveFloat64) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (const SpecCase& sc : {SpecCase{4, 4, 4}, SpecCase{2, 4, 6}, SpecCase{1, 3, 3}, SpecCase{8, 8, 8}}) {
      Config cfg;
      cfg.batch = 5;
      cfg.seqlen = sc.T;
      cfg.state_dtype = dtype;
      const Problem pb(cfg, rng_);
      const int64_t N = pb.N, S = sc.S, T = sc.T, per = slot_elems(pb), P = N * S + 5;
      const std::vector<int32_t> slots = distinct_slots(N * S, P, rng_);
      // indices [N, stride]: the columns past S are never read (a value no pool has).
      std::vector<int32_t> indices(size_t(N * sc.stride), 1 << 30);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t c = 0; c < S; ++c) indices[size_t(n * sc.stride + c)] = slots[size_t(n * S + c)];
      std::uniform_int_distribution<int32_t> pick(1, int32_t(S));
      std::vector<int32_t> accepted(static_cast<size_t>(N));
      for (int32_t& a : accepted) a = pick(rng_);
      accepted[0] = 1;
      if (T > 1) indices[size_t(0 * sc.stride + T - 1)] = -1;  // sequence 0 skips its last write
      accepted[3] = 0;                                         // padding by num_accepted_tokens
      indices[size_t(4 * sc.stride + accepted[4] - 1)] = -1;   // padding by a negative read slot
      StateBuffer pool0 = poisoned_pool(pb, P);
      for (int64_t n : {0, 1, 2})
        copy_slot(pb.initial_state, n, pool0, indices[size_t(n * sc.stride + accepted[size_t(n)] - 1)], per);
      const NaiveResult exact = naive_forward(pb, true);
      const int64_t out_row = T * pb.HV * pb.V;

      for (Backend backend : kBackends) {
        SCOPED_TRACE(std::string(backend_name(backend)) + " " + dtype_name(dtype) + " T=" + std::to_string(T) +
                     " S=" + std::to_string(S) + " stride=" + std::to_string(sc.stride));
        StateBuffer pool = pool0;
        std::vector<uint16_t> out(size_t(pb.out_count()), kPoisonBf16);
        DecodeParams d = decode_params(pb, backend, out.data(), pool, P, indices.data(), S, accepted.data());
        d.state_indices_stride = sc.stride;
        const Status s = decode(d);
        ASSERT_TRUE(s.ok()) << s.message;
        std::set<int64_t> written;
        for (int64_t n : {0, 1, 2}) {
          SCOPED_TRACE("sequence " + std::to_string(n));
          const std::vector<double> got_out = bf16_to_double(rows(out, n, 1, out_row));
          const std::vector<double> exact_out = rows(exact.out, n, 1, out_row);
          for (int64_t t = 0; t < T; ++t) {
            const int32_t slot = indices[size_t(n * sc.stride + t)];
            if (slot < 0) continue;
            written.insert(slot);
            const std::vector<double> got = slot_values(pool, slot, per);
            const std::vector<double> want = rows(exact.token_states, n * T + t, 1, per);
            if (backend == Backend::kCpuReference) {
              const double half_ulp = dtype == DType::kF32 ? std::ldexp(1.0, -24) : std::ldexp(1.0, -8);
              EXPECT_EQ(not_rounded_from(got, want, half_ulp), 0) << "state after token " << t;
            }
            EXPECT_LE(rel_error(got, want), dtype == DType::kF32 ? kCpuStateBound : kStateTolerance)
                << "state after token " << t;
          }
          if (backend == Backend::kCpuReference) {
            EXPECT_EQ(not_rounded_from(got_out, exact_out, std::ldexp(1.0, -8)), 0) << "out";
          }
          expect_close(got_out, exact_out, false, "out", false);
        }
        for (int64_t n : {3, 4})
          EXPECT_TRUE(std::all_of(out.begin() + n * out_row, out.begin() + (n + 1) * out_row,
                                  [](uint16_t x) { return x == kPoisonBf16; }))
              << "out rows of padding sequence " << n << " were written";
        expect_untouched_except(pool, pool0, written, P, per);
      }
    }
  }
}

// Without num_accepted_tokens the state is read from column 0 (vLLM's convention), and a varlen batch
// may give the sequences different numbers of tokens.
TEST_F(Decode, SpeculativeVarlenReadsColumnZero) {
  Config cfg;
  cfg.seq_lens = {3, 1, 0, 4};
  const Problem pb(cfg, rng_);
  const int64_t N = pb.N, S = 4, per = slot_elems(pb), P = N * S;
  const std::vector<int32_t> indices = distinct_slots(N * S, P, rng_);
  StateBuffer pool0 = poisoned_pool(pb, P);
  for (int64_t n = 0; n < N; ++n) copy_slot(pb.initial_state, n, pool0, indices[size_t(n * S)], per);
  const NaiveResult exact = naive_forward(pb, true);
  for (Backend backend : kBackends) {
    SCOPED_TRACE(backend_name(backend));
    StateBuffer pool = pool0;
    std::vector<uint16_t> out(size_t(pb.out_count()), kPoisonBf16);
    const Status s = decode(decode_params(pb, backend, out.data(), pool, P, indices.data(), S));
    ASSERT_TRUE(s.ok()) << s.message;
    expect_close(bf16_to_double(out), exact.out, false, "out", false);
    std::set<int64_t> written;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t t = 0; t < pb.end(n) - pb.begin(n); ++t) {
        const int64_t slot = indices[size_t(n * S + t)];
        written.insert(slot);
        expect_close(slot_values(pool, slot, per), rows(exact.token_states, pb.begin(n) + t, 1, per), true,
                     "state after a token");
      }
    expect_untouched_except(pool, pool0, written, P, per);
  }
}

// ---- has_initial_state ----------------------------------------------------------------------------

TEST_F(Decode, HasInitialStateStartsFromZeros) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    Config cfg;
    cfg.seq_lens = {17, 0, 5, 30};
    cfg.state_dtype = dtype;
    const Problem pb(cfg, rng_);
    const std::vector<uint8_t> flags = {1, 0, 1, 0};
    // What the flags mean: the initial state of flagged-off sequences is zero.
    Problem zeroed = pb;
    const int64_t per = slot_elems(pb), P = 7;
    for (int64_t n = 0; n < pb.N; ++n)
      if (!flags[size_t(n)]) {
        if (dtype == DType::kF32)
          std::fill_n(zeroed.initial_state.f32.begin() + n * per, per, 0.0f);
        else
          std::fill_n(zeroed.initial_state.bf16.begin() + n * per, per, uint16_t(0));
      }
    const Result ref = run(zeroed, Backend::kCpuReference);
    const std::vector<int32_t> slots = distinct_slots(pb.N, P, rng_);
    StateBuffer pool0 = poisoned_pool(pb, P);
    for (int64_t n = 0; n < pb.N; ++n) copy_slot(pb.initial_state, n, pool0, slots[size_t(n)], per);

    for (Backend backend : kBackends) {
      SCOPED_TRACE(std::string(backend_name(backend)) + " " + dtype_name(dtype));
      // On a pool.
      StateBuffer pool = pool0;
      std::vector<uint16_t> out(size_t(pb.out_count()), kPoisonBf16);
      FwdParams p = pb.params(backend, out.data(), pool.data());
      p.initial_state = pool.data();
      p.state_indices = slots.data();
      p.pool_size = P;
      p.has_initial_state = flags.data();
      Status s = fwd(p);
      ASSERT_TRUE(s.ok()) << s.message;
      std::vector<double> states;
      for (int64_t n = 0; n < pb.N; ++n) {
        const std::vector<double> x = slot_values(pool, slots[size_t(n)], per);
        states.insert(states.end(), x.begin(), x.end());
      }
      expect_close(bf16_to_double(out), ref.out_double(), false, "out (pool)");
      expect_close(states, ref.final_state.to_double(), true, "pool slots", true, dtype);
      // The empty flagged-off sequence ends with a zero state.
      for (double x : slot_values(pool, slots[1], per)) ASSERT_EQ(x, 0.0);
      expect_untouched_except(pool, pool0, std::set<int64_t>(slots.begin(), slots.end()), P, per);

      // Without a pool: the flags select between initial_state[n] and zeros.
      Result r = poisoned_result(pb);
      FwdParams q = params_for(pb, backend, r);
      q.has_initial_state = flags.data();
      s = fwd(q);
      ASSERT_TRUE(s.ok()) << s.message;
      expect_close(r.out_double(), ref.out_double(), false, "out (no pool)");
      expect_close(r.final_state.to_double(), ref.final_state.to_double(), true, "final_state (no pool)", true, dtype);
    }
  }
}

// A sequence's results do not depend on what else is in the batch, and neither on the thread count.
TEST_F(Decode, BatchAndThreadInvariance) {
  Config cfg;
  cfg.batch = 5;
  cfg.seqlen = 4;
  cfg.heads = 3;
  const Problem pb(cfg, rng_);
  const int64_t per = slot_elems(pb), P = 5, row = pb.T * pb.HV * pb.V;
  const std::vector<int32_t> slots = distinct_slots(pb.N, P, rng_);
  StateBuffer pool0 = poisoned_pool(pb, P);
  for (int64_t n = 0; n < pb.N; ++n) copy_slot(pb.initial_state, n, pool0, slots[size_t(n)], per);
  for (Backend backend : kBackends) {
    SCOPED_TRACE(backend_name(backend));
    StateBuffer all = pool0;
    std::vector<uint16_t> out_all(size_t(pb.out_count()), kPoisonBf16);
    DecodeParams d = decode_params(pb, backend, out_all.data(), all, P, slots.data());
    d.cpu_threads = 3;
    ASSERT_TRUE(decode(d).ok());
    for (int64_t n = 0; n < pb.N; ++n) {
      // Sequence n alone (the others as padding), on one thread.
      std::vector<int32_t> only(size_t(pb.N), -1);
      only[size_t(n)] = slots[size_t(n)];
      StateBuffer alone = pool0;
      std::vector<uint16_t> out(size_t(pb.out_count()), kPoisonBf16);
      DecodeParams e = decode_params(pb, backend, out.data(), alone, P, only.data());
      e.cpu_threads = 1;
      ASSERT_TRUE(decode(e).ok());
      EXPECT_TRUE(rows(out, n, 1, row) == rows(out_all, n, 1, row)) << "out of sequence " << n;
      EXPECT_TRUE(slot_bytes_equal(alone, all, slots[size_t(n)], per)) << "slot of sequence " << n;
    }
  }
}

// ---- rejections ------------------------------------------------------------------------------------

// A valid speculative decode problem (3 sequences, T = 2, S = 3) and a valid pool prefill, both with
// recognisable bytes in every buffer they could write.
struct Fixture {
  Problem pb;
  int64_t P = 12;
  std::vector<int32_t> indices;   // [3, 3]
  std::vector<int32_t> accepted;  // [3]
  std::vector<int32_t> prefill_slots;
  std::vector<uint8_t> flags;
  StateBuffer pool;
  std::vector<uint16_t> out;

  static Config config() {
    Config cfg;
    cfg.batch = 3;
    cfg.seqlen = 2;
    cfg.heads = 2;
    cfg.head_dim_k = 32;
    cfg.head_dim_v = 16;
    return cfg;
  }

  explicit Fixture(std::mt19937_64& rng) : pb(config(), rng) {
    indices = distinct_slots(9, P, rng);
    accepted = {1, 3, 2};
    prefill_slots = {4, 9, 1};
    flags = {1, 0, 1};
    pool = StateBuffer(DType::kF32, size_t(P * slot_elems(pb)));
    std::normal_distribution<float> normal;
    for (float& x : pool.f32) x = normal(rng);
    out.resize(size_t(pb.out_count()));
    for (size_t i = 0; i < out.size(); ++i) out[i] = uint16_t(0x3f00 + i % 97);
  }

  DecodeParams decode_params(Backend backend) {
    return test::decode_params(pb, backend, out.data(), pool, P, indices.data(), 3, accepted.data());
  }

  FwdParams prefill_params(Backend backend) {
    FwdParams p = pb.params(backend, out.data(), pool.data());
    p.initial_state = pool.data();
    p.state_indices = prefill_slots.data();
    p.pool_size = P;
    p.has_initial_state = flags.data();
    return p;
  }
};

template <typename Params>
struct BadCase {
  std::string name;
  StatusCode code;
  std::string argument;  // the message must start with "<argument>:"
  std::function<void(Params&)> corrupt;
};

template <typename Params>
std::ostream& operator<<(std::ostream& os, const BadCase<Params>& c) {
  return os << c.name;
}

// An int32 array owned by the case, so the pointer stays valid.
std::shared_ptr<std::vector<int32_t>> owned(std::vector<int32_t> x) {
  return std::make_shared<std::vector<int32_t>>(std::move(x));
}

std::vector<BadCase<DecodeParams>> bad_decode_cases() {
  using C = StatusCode;
  const C kInvalid = C::kInvalidArgument, kType = C::kTypeMismatch;
  using P = DecodeParams;
  // A new token count with the strides of contiguous tensors of that count (validation rejects the
  // call before any input is read, so the arrays need not be that large).
  auto tokens = [](int64_t T) {
    return [T](P& p) {
      p.seqlen = T;
      p.q_strides = p.k_strides = p.v_strides = p.g_strides = p.out_strides = p.beta_strides = ActStrides{};
    };
  };
  auto varlen = [](std::vector<int32_t> cu) {
    auto c = owned(std::move(cu));
    return [c](P& p) {
      p.batch = 1;
      p.seqlen = c->back();
      p.cu_seqlens = c->data();
      p.cu_seqlens_dtype = DType::kI32;
      p.num_seqs = int64_t(c->size()) - 1;
    };
  };
  return {
      {"UnknownBackend", kInvalid, "backend", [](P& p) { p.backend = Backend(7); }},
      {"NullQ", kInvalid, "q", [](P& p) { p.q = nullptr; }},
      {"ZeroHeads", kInvalid, "q", [](P& p) { p.heads = 0; }},
      {"LowerBound", kInvalid, "lower_bound", [](P& p) { p.lower_bound = -6.0f; }},
      {"TooManyTokens", kInvalid, "q", tokens(9)},
      {"VarlenSequenceTooLong", kInvalid, "cu_seqlens", varlen({0, 9, 10, 10})},
      {"VarlenBadEnd", kInvalid, "cu_seqlens",
       [set = varlen({0, 1, 2, 3})](P& p) {
         set(p);
         p.seqlen = 6;
       }},
      {"VarlenMoreTokensThanSlots", kInvalid, "state_indices", varlen({0, 1, 5, 6})},
      {"StateNull", kInvalid, "state", [](P& p) { p.state = nullptr; }},
      {"StateDtypeNone", kType, "state", [](P& p) { p.state_dtype = DType::kNone; }},
      {"StateDtypeInt", kType, "state", [](P& p) { p.state_dtype = DType::kI32; }},
      {"StateMisaligned", kInvalid, "state", [](P& p) { p.state = static_cast<char*>(p.state) + 2; }},
      {"PoolSizeNegative", kInvalid, "pool_size", [](P& p) { p.pool_size = -1; }},
      {"IndicesNull", kInvalid, "state_indices", [](P& p) { p.state_indices = nullptr; }},
      {"IndicesMisaligned", kInvalid, "state_indices",
       [](P& p) {
         p.state_indices = reinterpret_cast<const int32_t*>(reinterpret_cast<const char*>(p.state_indices) + 2);
       }},
      {"SlotsPerSeqZero", kInvalid, "state_indices", [](P& p) { p.slots_per_seq = 0; }},
      {"SlotsPerSeqNine", kInvalid, "state_indices", [](P& p) { p.slots_per_seq = 9; }},
      {"IndicesStrideTooSmall", kInvalid, "state_indices", [](P& p) { p.state_indices_stride = 2; }},
      {"FewerSlotsThanTokens", kInvalid, "state_indices",
       [tokens](P& p) {
         tokens(3)(p);
         p.slots_per_seq = 2;
       }},
      {"AcceptedWithoutSpeculation", kInvalid, "num_accepted_tokens", [](P& p) { p.slots_per_seq = 1; }},
      {"AcceptedMisaligned", kInvalid, "num_accepted_tokens",
       [](P& p) {
         p.num_accepted_tokens =
             reinterpret_cast<const int32_t*>(reinterpret_cast<const char*>(p.num_accepted_tokens) + 1);
       }},
      {"AcceptedAboveSlots", kInvalid, "num_accepted_tokens",
       [a = owned({1, 4, 2})](P& p) { p.num_accepted_tokens = a->data(); }},
      {"SlotOutsidePool", kInvalid, "state_indices",
       [i = owned({0, 1, 2, 3, 12, 5, 6, 7, 8})](P& p) { p.state_indices = i->data(); }},
      {"PoolEmpty", kInvalid, "state_indices", [](P& p) { p.pool_size = 0; }},
      {"SlotSharedBySequences", kInvalid, "state_indices",
       [i = owned({0, 1, 2, 0, 4, 5, 6, 7, 8})](P& p) { p.state_indices = i->data(); }},
      {"IndicesInsideOut", kInvalid, "out",
       [](P& p) { p.state_indices = static_cast<const int32_t*>(static_cast<const void*>(p.out)); }},
      {"PoolIsQ", kInvalid, "state", [](P& p) { p.state = const_cast<void*>(p.q); }},
      {"ReadSlotWrittenByAnother", kInvalid, "state_indices",
       // Sequence 2 reads column 1 (accepted 2), which sequence 0 writes after its second token.
       [i = owned({0, 1, 2, 3, 4, 5, 6, 1, 8})](P& p) { p.state_indices = i->data(); }},
  };
}

std::vector<BadCase<FwdParams>> bad_prefill_cases() {
  const StatusCode kInvalid = StatusCode::kInvalidArgument;
  using P = FwdParams;
  return {
      {"IndicesWithoutState", kInvalid, "state_indices",
       [](P& p) {
         p.initial_state = nullptr;
         p.final_state = nullptr;
         p.has_initial_state = nullptr;
       }},
      {"PoolSizeNegative", kInvalid, "pool_size", [](P& p) { p.pool_size = -2; }},
      {"IndicesMisaligned", kInvalid, "state_indices",
       [](P& p) {
         p.state_indices = reinterpret_cast<const int32_t*>(reinterpret_cast<const char*>(p.state_indices) + 1);
       }},
      {"SlotOutsidePool", kInvalid, "state_indices", [i = owned({4, 12, 1})](P& p) { p.state_indices = i->data(); }},
      {"SlotShared", kInvalid, "state_indices", [i = owned({4, 9, 4})](P& p) { p.state_indices = i->data(); }},
      {"HasInitialWithoutInitialState", kInvalid, "has_initial_state", [](P& p) { p.initial_state = nullptr; }},
      {"PoolHoldsIndices", kInvalid, "final_state",
       [](P& p) { p.state_indices = static_cast<const int32_t*>(static_cast<const void*>(p.final_state)); }},
      {"PoolsPartlyOverlap", kInvalid, "final_state",
       // Two pools of 12 slots, 11 slots apart: they overlap although their first slots differ.
       [](P& p) { p.final_state = static_cast<float*>(p.final_state) + 1 * 2 * 16 * 32; }},
  };
}

template <typename Params>
void expect_rejected(const BadCase<Params>& bad, Backend backend, std::mt19937_64& rng) {
  SCOPED_TRACE(backend_name(backend));
  Fixture f(rng);
  Params p;
  if constexpr (std::is_same_v<Params, DecodeParams>) {
    p = f.decode_params(backend);
  } else {
    p = f.prefill_params(backend);
  }
  // The base call is valid; it is run on copies so the watched buffers keep their bytes.
  {
    Fixture copy = f;
    Params ok;
    if constexpr (std::is_same_v<Params, DecodeParams>) {
      ok = copy.decode_params(backend);
      ASSERT_TRUE(decode(ok).ok()) << "the base problem must be valid";
    } else {
      ok = copy.prefill_params(backend);
      const Status s = fwd(ok);
      ASSERT_TRUE(s.ok()) << "the base problem must be valid: " << s.message;
    }
  }
  const StateBuffer pool_before = f.pool;
  const std::vector<uint16_t> out_before = f.out;
  bad.corrupt(p);
  Status s;
  if constexpr (std::is_same_v<Params, DecodeParams>) {
    s = decode(p);
  } else {
    s = fwd(p);
  }
  EXPECT_EQ(s.code, bad.code) << s.message;
  EXPECT_EQ(s.message.rfind(bad.argument + ":", 0), 0u)
      << "message should name '" << bad.argument << "': " << s.message;
  EXPECT_TRUE(f.pool == pool_before) << "the pool was modified by a rejected call";
  EXPECT_TRUE(f.out == out_before) << "out was modified by a rejected call";
}

class RejectsDecode : public SeededTest, public ::testing::WithParamInterface<BadCase<DecodeParams>> {};

TEST_P(RejectsDecode, BeforeWritingAnything) {
  for (Backend backend : kBackends) expect_rejected(GetParam(), backend, rng_);
}

INSTANTIATE_TEST_SUITE_P(Validation, RejectsDecode, ::testing::ValuesIn(bad_decode_cases()),
                         [](const auto& info) { return info.param.name; });

class RejectsPoolPrefill : public SeededTest, public ::testing::WithParamInterface<BadCase<FwdParams>> {};

TEST_P(RejectsPoolPrefill, BeforeWritingAnything) {
  for (Backend backend : kBackends) expect_rejected(GetParam(), backend, rng_);
}

INSTANTIATE_TEST_SUITE_P(Validation, RejectsPoolPrefill, ::testing::ValuesIn(bad_prefill_cases()),
                         [](const auto& info) { return info.param.name; });

// Columns a sequence does not use are not checked, and padding sequences' slots may repeat.
TEST_F(Decode, UnusedIndicesAreNotChecked) {
  Fixture f(rng_);
  // T = 2 uses columns 0, 1 and the read column; sequence 0 reads column 0, so its column 2 is unused.
  f.indices[2] = 1 << 30;
  f.accepted[2] = 0;  // sequence 2 is padding: its slots may be anything
  f.indices[6] = f.indices[0];
  f.indices[7] = -5;
  f.indices[8] = 1 << 29;
  for (Backend backend : kBackends) {
    Fixture g = f;
    const Status s = decode(g.decode_params(backend));
    EXPECT_TRUE(s.ok()) << backend_name(backend) << ": " << s.message;
  }
}

// The CUDA backend cannot read device memory on the host: validate() leaves slot contents to the
// kernel (which treats out-of-range slots as padding) and asks for 16-byte aligned pools and K = V =
// 128 or 64.
TEST_F(Decode, CudaValidationIsHostSideOnly) {
  Config cfg = Fixture::config();
  cfg.head_dim_k = cfg.head_dim_v = 128;
  Fixture f(rng_);
  Problem pb(cfg, rng_);
  std::vector<uint16_t> out(size_t(pb.out_count()));
  std::vector<int32_t> shared = {0, 1, 2, 0, 1, 2, 99, 99, 99};
  StateBuffer pool(DType::kF32, size_t(f.P * slot_elems(pb)));
  DecodeParams d = decode_params(pb, Backend::kCuda, out.data(), pool, f.P, shared.data(), 3, f.accepted.data());
  Status s = validate(d);
  EXPECT_TRUE(s.ok()) << s.message;
  DecodeParams bad = d;
  bad.state = static_cast<char*>(bad.state) + 8;
  s = validate(bad);
  EXPECT_EQ(s.code, StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message.rfind("state:", 0), 0u) << s.message;
  bad = d;
  bad.head_dim_k = 64;
  s = validate(bad);
  EXPECT_EQ(s.code, StatusCode::kUnsupported);
  EXPECT_EQ(s.message.rfind("q:", 0), 0u) << s.message;
}

// The CUDA decode runs K = V = 128 and K = V = 64 (as the CUDA forward: test_validation.cpp,
// CudaForwardHeadDimensions): validate() accepts both on every decode path (fp32 and bf16 pools, padding
// slots, speculative rows with num_accepted_tokens, cu_seqlens) and rejects every other head
// dimension, K != V included, as kUnsupported naming q. Nothing is read from the (host) buffers.
TEST_F(Decode, CudaHeadDimensions) {
  for (int64_t dim : {128, 64})
    for (DType state : {DType::kF32, DType::kBF16}) {
      SCOPED_TRACE("K = V = " + std::to_string(dim) + ", " + dtype_name(state) + " pool");
      Config cfg = Fixture::config();
      cfg.head_dim_k = cfg.head_dim_v = dim;
      cfg.seqlen = 4;
      cfg.state_dtype = state;
      const Problem pb(cfg, rng_);
      std::vector<uint16_t> out(size_t(pb.out_count()));
      const int64_t P = 16;
      StateBuffer pool(state, size_t(P * slot_elems(pb)));
      // One slot per sequence, or speculative rows [3, 4]; sequence 1 is padding either way.
      const std::vector<int32_t> slots = {3, -1, 7};
      const std::vector<int32_t> rows = {0, 1, 2, 3, 4, 5, 6, 8, 9, 10, 11, 12};
      const std::vector<int32_t> accepted = {4, 0, 2};
      const DecodeParams plain = decode_params(pb, Backend::kCuda, out.data(), pool, P, slots.data());
      Status s = validate(plain);
      EXPECT_TRUE(s.ok()) << s.message;
      const DecodeParams spec = decode_params(pb, Backend::kCuda, out.data(), pool, P, rows.data(), 4, accepted.data());
      s = validate(spec);
      EXPECT_TRUE(s.ok()) << s.message;
      Config varlen_cfg = cfg;
      varlen_cfg.seq_lens = {1, 0, 8};
      const Problem varlen(varlen_cfg, rng_);
      std::vector<uint16_t> varlen_out(size_t(varlen.out_count()));
      s = validate(decode_params(varlen, Backend::kCuda, varlen_out.data(), pool, P, slots.data()));
      EXPECT_TRUE(s.ok()) << s.message;
      for (auto [k, v] : {std::pair<int64_t, int64_t>{dim, dim / 2}, {dim / 2, dim}, {32, 32}, {96, 96}, {256, 256}}) {
        DecodeParams bad = plain;
        bad.head_dim_k = k;
        bad.head_dim_v = v;
        bad.q_strides = bad.k_strides = bad.v_strides = bad.g_strides = bad.out_strides = ActStrides{};
        fill_contiguous_strides(bad);
        s = validate(bad);
        EXPECT_EQ(s.code, StatusCode::kUnsupported) << "K=" << k << " V=" << v << ": " << s.message;
        EXPECT_EQ(s.message.rfind("q: the CUDA decode supports K = V = 128 or K = V = 64", 0), 0u) << s.message;
      }
    }
}

}  // namespace
}  // namespace flash_kda::test
