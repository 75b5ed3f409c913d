// The gate forms of docs/spec.md ("Gate forms") on every CPU backend: the sigmoid gate without
// A_log, the unbounded softplus gate, beta = 2 sigmoid(logit) (allow_neg_eigval), alone and
// combined; forward (fixed and varlen batches, GVA with distinct per-head A_log / dt_bias, both
// state dtypes), decode and pool prefill, checkpoints; extreme gates (a decay of e^-200 in one
// token, e^-1e4 over a chunk, an infinite one, and none at all); and every new rejection. Every
// result is measured against the naive float64 oracle of test_util.h, which shares no code with src/.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "test_util.h"

namespace flash_kda::test {
namespace {

constexpr Backend kBackends[] = {Backend::kCpu, Backend::kCpuReference};

const char* backend_name(Backend b) { return b == Backend::kCpu ? "kCpu" : "kCpuReference"; }

struct Form {
  const char* name;
  GateForm gate;
  bool has_A_log;
  bool allow_neg_eigval;
};

constexpr Form kForms[] = {
    {"SigmoidNoALog", GateForm::kSigmoid, false, false},
    {"Softplus", GateForm::kSoftplus, true, false},
    {"NegEigval", GateForm::kSigmoid, true, true},
    {"SoftplusNegEigval", GateForm::kSoftplus, true, true},
    {"SigmoidNoALogNegEigval", GateForm::kSigmoid, false, true},
};

Config with_form(Config c, const Form& f) {
  c.gate = f.gate;
  c.has_A_log = f.has_A_log;
  c.allow_neg_eigval = f.allow_neg_eigval;
  return c;
}

// out and final_state of `r` against the naive oracle: complete, finite, within docs/spec.md.
void expect_matches_naive(const Result& r, const NaiveResult& exact, const char* what) {
  SCOPED_TRACE(what);
  ASSERT_TRUE(r.status.ok()) << r.status.message;
  const std::vector<double> out = r.out_double();
  EXPECT_TRUE(all_finite(out)) << "out has an unwritten or non-finite element";
  EXPECT_LE(rel_error(out, exact.out), kOutTolerance) << "out";
  if (!r.final_state.empty()) {
    const std::vector<double> state = r.final_state.to_double();
    EXPECT_TRUE(all_finite(state)) << "final_state has an unwritten or non-finite element";
    EXPECT_LE(rel_error(state, exact.state), kStateTolerance) << "final_state";
  }
}

// The fp32 CPU paths stay far inside the spec (as in test_cpu_backend.cpp): against the reference
// backend (rounded like them) out within 1e-3 and an fp32 state within 1e-4.
void expect_close_to_reference(const Result& fast, const Result& ref) {
  EXPECT_LE(rel_error(fast.out_double(), ref.out_double()), 1e-3) << "out vs kCpuReference";
  if (!ref.final_state.empty() && ref.final_state.dtype == DType::kF32) {
    EXPECT_LE(rel_error(fast.final_state.to_double(), ref.final_state.to_double()), 1e-4)
        << "final_state vs kCpuReference";
  }
}

struct Shape {
  const char* name;
  std::function<void(Config&)> edit;
};

const std::vector<Shape>& shapes() {
  static const std::vector<Shape> s = {
      {"FixedBatch",
       [](Config& c) {
         c.batch = 2;
         c.seqlen = 45;  // a partial last chunk
       }},
      {"VarlenGva",
       [](Config& c) {
         c.heads = 2;
         c.heads_v = 4;  // distinct A_log / dt_bias per value head (drawn per head)
         c.seq_lens = {70, 0, 17, 1};
       }},
      {"StateBf16",
       [](Config& c) {
         c.state_dtype = DType::kBF16;
         c.seq_lens = {33, 18};
       }},
      {"OddDims",
       [](Config& c) {
         c.head_dim_k = 40;
         c.head_dim_v = 24;
         c.seqlen = 50;
       }},
      {"StrongDecay",
       [](Config& c) {
         c.seqlen = 80;
         c.g_offset = 6.0f;  // softplus: a of about -6 exp(A_log) per token, chunks decay by e^-100 and more
       }},
      {"NoState", [](Config& c) { c.state_dtype = DType::kNone; }},
  };
  return s;
}

class GateForms : public SeededTest, public ::testing::WithParamInterface<std::tuple<int, int>> {
 protected:
  const Form& form() const { return kForms[std::get<0>(GetParam())]; }
  const Shape& shape() const { return shapes()[size_t(std::get<1>(GetParam()))]; }
};

TEST_P(GateForms, ForwardAgainstNaiveOnEveryBackend) {
  Config cfg;
  shape().edit(cfg);
  const Problem pb(with_form(cfg, form()), rng_);
  const NaiveResult exact = naive_forward(pb);
  const Result ref = run(pb, Backend::kCpuReference);
  expect_matches_naive(ref, exact, "kCpuReference");
  const Result fast = run(pb, Backend::kCpu);
  expect_matches_naive(fast, exact, "kCpu");
  if (ref.status.ok() && fast.status.ok()) expect_close_to_reference(fast, ref);
}

INSTANTIATE_TEST_SUITE_P(FormsAndShapes, GateForms,
                         ::testing::Combine(::testing::Range(0, int(std::size(kForms))),
                                            ::testing::Range(0, int(shapes().size()))),
                         [](const ::testing::TestParamInfo<std::tuple<int, int>>& info) {
                           return std::string(kForms[std::get<0>(info.param)].name) + "_" +
                                  shapes()[size_t(std::get<1>(info.param))].name;
                         });

// The form must change the result: the same inputs under the default gate differ from the oracle
// of the requested form (so the tests above could fail if a backend ignored the new fields).
class GateFormMatters : public SeededTest, public ::testing::WithParamInterface<int> {};

TEST_P(GateFormMatters, DefaultFormGivesAnotherResult) {
  Config cfg;
  cfg.seqlen = 40;
  const Problem pb(with_form(cfg, kForms[GetParam()]), rng_);
  Problem plain = pb;
  plain.cfg.gate = GateForm::kSigmoid;
  plain.cfg.has_A_log = true;
  plain.cfg.allow_neg_eigval = false;
  // Without A_log the form is a rate of 1: the plain problem's rates are kept at least e away from it
  // (a drawn A_log near 0 would make both forms nearly agree).
  if (!pb.cfg.has_A_log)
    for (float& x : plain.A_log) x = x >= 0.f ? 1.f + x : -1.f + x;
  const NaiveResult exact = naive_forward(pb);
  for (Backend b : kBackends) {
    const Result r = run(plain, b);
    ASSERT_TRUE(r.status.ok()) << r.status.message;
    EXPECT_GT(rel_error(r.out_double(), exact.out), 10 * kOutTolerance) << backend_name(b);
  }
}

INSTANTIATE_TEST_SUITE_P(Forms, GateFormMatters, ::testing::Range(0, int(std::size(kForms))),
                         [](const ::testing::TestParamInfo<int>& info) { return kForms[info.param].name; });

// ---- extreme gates under the softplus form -------------------------------------------------------

class ExtremeGates : public SeededTest {
 protected:
  // A softplus-gate problem of one sequence of T tokens, fp32 states, A_log = 0 (rate 1) on head 0.
  Problem make(int64_t T, int64_t heads = 2) {
    Config c;
    c.seqlen = T;
    c.heads = heads;
    c.gate = GateForm::kSoftplus;
    Problem pb(c, rng_);
    pb.A_log[0] = 0.0f;
    return pb;
  }
  void set_g(Problem& pb, int64_t t, int64_t hv, int64_t c, float value) {
    pb.g[size_t((t * pb.HV + hv) * pb.K + c)] = float_to_bf16(value);
  }
  void check(const Problem& pb) {
    const NaiveResult exact = naive_forward(pb);
    for (Backend b : kBackends) {
      SCOPED_TRACE(backend_name(b));
      expect_matches_naive(run(pb, b), exact, backend_name(b));
    }
  }
};

// One token decays every channel of head 0 by about e^-200: its state before that token is gone.
TEST_F(ExtremeGates, OneTokenDecaysByEMinus200) {
  Problem pb = make(40);
  for (int64_t c = 0; c < pb.K; ++c) set_g(pb, 21, 0, c, 200.0f);
  check(pb);
}

// Every token of a chunk decays by about e^-640 (e^-1e4 over the chunk), on half of the channels;
// the other half barely decays. Chunk boundaries of the fast path are at multiples of 16.
TEST_F(ExtremeGates, ChunkDecaysByEMinus1e4) {
  Problem pb = make(64);
  for (int64_t t = 16; t < 32; ++t)
    for (int64_t c = 0; c < pb.K; c += 2) set_g(pb, t, 0, c, 640.0f);
  check(pb);
}

// The whole sequence decays by e^-1e4 in one token inside a chunk, and by an infinite amount
// (exp(A_log) softplus(g) overflows fp32: g = 3e38) in another one.
TEST_F(ExtremeGates, SingleTokenEMinus1e4AndInfiniteDecay) {
  Problem pb = make(50);
  for (int64_t c = 0; c < pb.K; ++c) {
    set_g(pb, 5, 0, c, 1.0e4f);
    set_g(pb, 37, 1, c, 3.0e38f);
  }
  check(pb);
}

// g very negative: softplus(g + dt_bias) underflows, a = 0 and the state is not decayed at all.
TEST_F(ExtremeGates, NoDecayAtAll) {
  Problem pb = make(48);
  for (int64_t t = 0; t < pb.T; ++t)
    for (int64_t hv = 0; hv < pb.HV; ++hv)
      for (int64_t c = 0; c < pb.K; ++c) set_g(pb, t, hv, c, -1.0e4f);
  check(pb);
}

// A rate of e^80 (A_log = 80, inside the contract's A_log < 88) on nearly vanishing softplus values
// (g = -90 and -100: rate · softplus = e^-10 and e^-20 a token): the decays are tiny but not zero,
// and a softplus that fp32's e^x cut off at e^-87 would decay by e^-7 a token instead.
TEST_F(ExtremeGates, HugeRateOnVanishingSoftplus) {
  Problem pb = make(40);
  pb.A_log[0] = 80.0f;
  for (int64_t t = 0; t < pb.T; ++t)
    for (int64_t c = 0; c < pb.K; ++c) set_g(pb, t, 0, c, c % 2 ? -90.0f : -100.0f);
  check(pb);
}

// Random mixtures: each (token, channel) is, at random, an e^-200 decay, no decay, or a normal gate.
TEST_F(ExtremeGates, RandomMixture) {
  Problem pb = make(100, 1);
  std::uniform_int_distribution<int> pick(0, 9);
  for (int64_t t = 0; t < pb.T; ++t)
    for (int64_t c = 0; c < pb.K; ++c) {
      const int r = pick(rng_);
      if (r == 0) set_g(pb, t, 0, c, 200.0f);
      if (r == 1) set_g(pb, t, 0, c, -200.0f);
    }
  check(pb);
}

// ---- decode (the per-token recurrence) and pools -------------------------------------------------

class GateFormsPool : public SeededTest, public ::testing::WithParamInterface<int> {
 protected:
  const Form& form() const { return kForms[GetParam()]; }
};

// Decode of up to 8 tokens per sequence on a pool (slots in reverse order, one padding sequence)
// against the naive oracle from each sequence's initial state; padding writes nothing.
TEST_P(GateFormsPool, DecodeAgainstNaive) {
  Config cfg;
  cfg.heads = 2;
  cfg.heads_v = 4;
  cfg.seq_lens = {8, 3, 1, 5};
  Problem pb(with_form(cfg, form()), rng_);
  // Extreme gates inside the decode window: an e^-200 decay and no decay.
  for (int64_t c = 0; c < pb.K; ++c) {
    pb.g[size_t((2 * pb.HV + 1) * pb.K + c)] = float_to_bf16(200.0f);
    pb.g[size_t((9 * pb.HV + 3) * pb.K + c)] = float_to_bf16(-200.0f);
  }
  const NaiveResult exact = naive_forward(pb);
  const int64_t per = pb.HV * pb.V * pb.K, P = 6;
  const std::vector<int32_t> slots = {5, 2, -1, 0};  // sequence 2 is padding
  for (Backend b : kBackends) {
    SCOPED_TRACE(backend_name(b));
    StateBuffer pool(DType::kF32, size_t(P * per));
    for (int64_t n = 0; n < pb.N; ++n)
      if (slots[size_t(n)] >= 0)
        std::copy_n(pb.initial_state.f32.begin() + n * per, per, pool.f32.begin() + slots[size_t(n)] * per);
    const StateBuffer before = pool;
    std::vector<uint16_t> out(size_t(pb.out_count()), kPoisonBf16);
    const Status s = decode(decode_params(pb, b, out.data(), pool, P, slots.data()));
    ASSERT_TRUE(s.ok()) << s.message;
    std::vector<double> got_out, want_out, got_state, want_state;
    for (int64_t n = 0; n < pb.N; ++n) {
      const int64_t rows = (pb.end(n) - pb.begin(n)) * pb.HV * pb.V, first = pb.begin(n) * pb.HV * pb.V;
      if (slots[size_t(n)] < 0) {
        for (int64_t i = 0; i < rows; ++i) EXPECT_EQ(out[size_t(first + i)], kPoisonBf16) << "padding out written";
        continue;
      }
      for (int64_t i = 0; i < rows; ++i) {
        got_out.push_back(bf16_to_float(out[size_t(first + i)]));
        want_out.push_back(exact.out[size_t(first + i)]);
      }
      for (int64_t i = 0; i < per; ++i) {
        got_state.push_back(pool.f32[size_t(slots[size_t(n)] * per + i)]);
        want_state.push_back(exact.state[size_t(n * per + i)]);
      }
    }
    EXPECT_TRUE(all_finite(got_out) && all_finite(got_state));
    EXPECT_LE(rel_error(got_out, want_out), kOutTolerance);
    EXPECT_LE(rel_error(got_state, want_state), kStateTolerance);
    for (int64_t s2 : {1, 3, 4})  // unused slots: untouched (NaN poison compared as bytes)
      EXPECT_EQ(std::memcmp(pool.f32.data() + s2 * per, before.f32.data() + s2 * per, size_t(per) * 4), 0)
          << "slot " << s2;
  }
}

// A pool prefill (state_indices) with checkpoints every 16 tokens, against the naive states after
// the boundary tokens, on a sequence whose gate decays by e^-200 right before a boundary.
TEST_P(GateFormsPool, PoolPrefillWithCheckpoints) {
  Config cfg;
  cfg.heads = 1;
  cfg.heads_v = 2;
  cfg.seq_lens = {40, 23};
  Problem pb(with_form(cfg, form()), rng_);
  for (int64_t c = 0; c < pb.K; c += 3) pb.g[size_t((15 * pb.HV + 0) * pb.K + c)] = float_to_bf16(200.0f);
  const NaiveResult exact = naive_forward(pb, /*keep_token_states=*/true);
  const int64_t per = pb.HV * pb.V * pb.K, P = 4, P2 = 5;
  const std::vector<int32_t> slots = {3, 1};
  const std::vector<int32_t> ckpt = {4, 0, 2, -1};  // [N=2, M=2]: sequence 0 writes 2, sequence 1 one
  for (Backend b : kBackends) {
    SCOPED_TRACE(backend_name(b));
    StateBuffer pool(DType::kF32, size_t(P * per)), ckpt_pool(DType::kF32, size_t(P2 * per));
    for (int64_t n = 0; n < pb.N; ++n)
      std::copy_n(pb.initial_state.f32.begin() + n * per, per, pool.f32.begin() + slots[size_t(n)] * per);
    Result r = poisoned_result(pb);
    FwdParams p = pb.params(b, r.out.data(), pool.data());
    p.initial_state = pool.data();
    p.state_indices = slots.data();
    p.pool_size = P;
    p.checkpoint_interval = 16;
    p.checkpoint_state = ckpt_pool.data();
    p.checkpoint_state_dtype = DType::kF32;
    p.checkpoint_pool_size = P2;
    p.checkpoint_indices = ckpt.data();
    p.checkpoint_columns = 2;
    const Status s = fwd(p);
    ASSERT_TRUE(s.ok()) << s.message;
    EXPECT_LE(rel_error(r.out_double(), exact.out), kOutTolerance);
    struct Want {
      int32_t slot;
      int64_t token;  // packed index of the token after which the state is due
    };
    const Want wants[] = {{4, 15}, {0, 31}, {2, 40 + 15}};
    for (const Want& w : wants) {
      std::vector<double> got(ckpt_pool.f32.begin() + w.slot * per, ckpt_pool.f32.begin() + (w.slot + 1) * per);
      std::vector<double> want(exact.token_states.begin() + w.token * per,
                               exact.token_states.begin() + (w.token + 1) * per);
      EXPECT_TRUE(all_finite(got)) << "checkpoint slot " << w.slot;
      EXPECT_LE(rel_error(got, want), 1e-3) << "checkpoint slot " << w.slot;
    }
    for (int64_t n = 0; n < pb.N; ++n) {
      std::vector<double> got(pool.f32.begin() + slots[size_t(n)] * per,
                              pool.f32.begin() + (slots[size_t(n)] + 1) * per);
      std::vector<double> want(exact.state.begin() + n * per, exact.state.begin() + (n + 1) * per);
      EXPECT_LE(rel_error(got, want), kStateTolerance) << "final state of sequence " << n;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Forms, GateFormsPool, ::testing::Range(0, int(std::size(kForms))),
                         [](const ::testing::TestParamInfo<int>& info) { return kForms[info.param].name; });

// ---- rejections ----------------------------------------------------------------------------------

// Runs `p` and expects `code` with a message starting with `name`, and nothing written.
void expect_rejected(const Problem& pb, const std::function<void(FwdParams&)>& edit, StatusCode code,
                     const std::string& name) {
  Result r = poisoned_result(pb);
  const Result untouched = r;
  FwdParams p = params_for(pb, Backend::kCpu, r);
  edit(p);
  const Status s = fwd(p);
  EXPECT_EQ(int(s.code), int(code)) << s.message;
  EXPECT_EQ(s.message.rfind(name + ":", 0), 0u) << s.message;
  EXPECT_TRUE(r.out == untouched.out) << "out written by a rejected call";
  EXPECT_TRUE(r.final_state == untouched.final_state) << "final_state written by a rejected call";
}

class GateFormErrors : public SeededTest {};

TEST_F(GateFormErrors, SoftplusNeedsALog) {
  const Problem pb(Config{}, rng_);
  for (Backend b : kBackends)
    expect_rejected(
        pb,
        [&](FwdParams& p) {
          p.backend = b;
          p.gate = GateForm::kSoftplus;
          p.A_log = nullptr;
        },
        StatusCode::kInvalidArgument, "A_log");
}

TEST_F(GateFormErrors, UnknownGateForm) {
  const Problem pb(Config{}, rng_);
  expect_rejected(pb, [](FwdParams& p) { p.gate = static_cast<GateForm>(7); }, StatusCode::kInvalidArgument, "gate");
}

TEST_F(GateFormErrors, LowerBoundStillCheckedForTheSigmoidGateOnly) {
  const Problem pb(Config{}, rng_);
  expect_rejected(
      pb,
      [](FwdParams& p) {
        p.A_log = nullptr;
        p.lower_bound = -6.0f;
      },
      StatusCode::kInvalidArgument, "lower_bound");
  // The softplus gate ignores lower_bound, whatever its value.
  Result r = poisoned_result(pb);
  FwdParams p = params_for(pb, Backend::kCpu, r);
  p.gate = GateForm::kSoftplus;
  p.lower_bound = std::nanf("");
  EXPECT_TRUE(fwd(p).ok());
}

TEST_F(GateFormErrors, DecodeSoftplusNeedsALog) {
  Config cfg;
  cfg.seqlen = 2;
  const Problem pb(cfg, rng_);
  StateBuffer pool(DType::kF32, size_t(pb.state_count()));
  const StateBuffer before = pool;
  std::vector<uint16_t> out(size_t(pb.out_count()), kPoisonBf16);
  const std::vector<int32_t> slots = {0};
  DecodeParams d = decode_params(pb, Backend::kCpu, out.data(), pool, 1, slots.data());
  d.gate = GateForm::kSoftplus;
  d.A_log = nullptr;
  const Status s = decode(d);
  EXPECT_EQ(int(s.code), int(StatusCode::kInvalidArgument));
  EXPECT_EQ(s.message.rfind("A_log:", 0), 0u) << s.message;
  EXPECT_TRUE(pool == before);
  for (uint16_t x : out) EXPECT_EQ(x, kPoisonBf16);
}

// Every form is the CUDA backend's (docs/spec.md, "Gate forms"): the forward and the decode take a
// null A_log, the softplus gate and allow_neg_eigval. src/api lets them through: on a machine
// without a usable GPU the call reaches the backend and gets its "backend:" error, not one naming
// the form. (On an sm_90 GPU tests/gpu/test_cuda_forward.cu runs the forms against the float64 reference; these
// host buffers are not handed to a GPU, so the calls are skipped there.)
TEST_F(GateFormErrors, CudaTakesEveryForm) {
  const Problem pb(Config{}, rng_);
  struct Edit {
    std::function<void(ProblemParams&)> edit;
    const char* name;
  };
  const Edit edits[] = {
      {[](ProblemParams& p) { p.A_log = nullptr; }, "A_log=null"},
      {[](ProblemParams& p) { p.allow_neg_eigval = true; }, "allow_neg_eigval"},
      {[](ProblemParams& p) { p.A_log = nullptr, p.allow_neg_eigval = true; }, "both"},
      {[](ProblemParams& p) { p.gate = GateForm::kSoftplus; }, "softplus"},
      {[](ProblemParams& p) { p.gate = GateForm::kSoftplus, p.allow_neg_eigval = true; }, "softplus+neg"},
  };
  const bool gpu = cuda_available();
  for (const Edit& e : edits) {
    SCOPED_TRACE(e.name);
    if (gpu) continue;
    Result r = poisoned_result(pb);
    FwdParams p = params_for(pb, Backend::kCuda, r);
    e.edit(p);
    const Status s = fwd(p);
    EXPECT_FALSE(s.ok());
    EXPECT_EQ(s.message.rfind("backend:", 0), 0u) << s.message;
    StateBuffer pool(DType::kF32, size_t(pb.state_count()));
    std::vector<uint16_t> out(size_t(pb.out_count()), kPoisonBf16);
    Config dc;
    dc.seqlen = 1;
    const Problem dpb(dc, rng_);
    const std::vector<int32_t> slots = {0};
    DecodeParams d = decode_params(dpb, Backend::kCuda, out.data(), pool, 1, slots.data());
    e.edit(d);
    const Status ds = decode(d);
    EXPECT_FALSE(ds.ok());
    EXPECT_EQ(ds.message.rfind("backend:", 0), 0u) << ds.message;
  }
}

}  // namespace
}  // namespace flash_kda::test
