// The context-parallel pieces of the C++ API (flash_kda.h: transition, compose) on the CPU
// backends: a sequence split into two shards and put back together from the second shard's
// zero-start result and transition must equal the forward over the whole sequence; every
// rejection before anything is written.
#include <cmath>
#include <vector>

#include "test_util.h"

namespace flash_kda::test {
namespace {

// Tokens [t0, t1) of every batch row of a fixed-batch problem, from the given initial state.
Problem token_range(const Problem& pb, int64_t t0, int64_t t1) {
  Problem s = pb;
  s.cfg.seqlen = s.T = t1 - t0;
  auto slice = [&](const std::vector<uint16_t>& x, int64_t per_token) {
    std::vector<uint16_t> y;
    for (int64_t b = 0; b < pb.cfg.batch; ++b) {
      const auto first = x.begin() + (b * pb.T + t0) * per_token;
      y.insert(y.end(), first, first + (t1 - t0) * per_token);
    }
    return y;
  };
  s.q = slice(pb.q, pb.cfg.heads * pb.K);
  s.k = slice(pb.k, pb.cfg.heads * pb.K);
  s.v = slice(pb.v, pb.HV * pb.V);
  s.g = slice(pb.g, pb.HV * pb.K);
  s.beta = slice(pb.beta, pb.HV);
  return s;
}

// The final state of `pb` as fp32 values (its initial state, or zeros with zero_start).
std::vector<float> final_state(const Problem& pb, Backend backend, bool zero_start = false) {
  std::vector<uint16_t> out(size_t(pb.out_count()));
  std::vector<float> fin(size_t(pb.state_count()), poison_f32());
  FwdParams p = pb.params(backend, out.data(), fin.data());
  if (zero_start) p.initial_state = nullptr;
  const Status s = fwd(p);
  EXPECT_TRUE(s.ok()) << s.message;
  return fin;
}

TransitionParams transition_params(const Problem& pb, Backend backend, float* transition) {
  TransitionParams t;
  static_cast<ProblemParams&>(t) = pb.params(backend, nullptr, nullptr);
  t.v = nullptr;
  t.transition = transition;
  return t;
}

ComposeParams compose_params(const Problem& pb, Backend backend, const float* in, const float* P, const float* R,
                             float* out) {
  ComposeParams cp;
  cp.num_seqs = pb.N;
  cp.heads_v = pb.HV;
  cp.head_dim_k = pb.K;
  cp.head_dim_v = pb.V;
  cp.state_in = in;
  cp.transition = P;
  cp.shard_state = R;
  cp.state_out = out;
  cp.backend = backend;
  return cp;
}

double max_rel(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    num = std::max(num, std::abs(double(got[i]) - want[i]));
    den = std::max(den, std::abs(double(want[i])));
  }
  return num / std::max(den, 1e-30);
}

class ContextParallel : public SeededTest, public ::testing::WithParamInterface<Backend> {};

// Shard A = tokens [0, t), shard B = [t, T): compose(S_A, P_B, R_B) must be the whole forward's
// final state (both from the same initial state). GVA (HV = 2H) and V != K included.
TEST_P(ContextParallel, ShardsComposeIntoTheWholeForward) {
  Config c;
  c.batch = 2;
  c.seqlen = 70;
  c.heads = 2;
  c.heads_v = 4;
  c.head_dim_k = 32;
  c.head_dim_v = 16;
  c.g_offset = -7.0f;  // weak decay: the first shard's state still matters at the end
  const Problem pb(c, rng_);
  const Backend backend = GetParam();
  const int64_t t = 29;
  const Problem a = token_range(pb, 0, t), b = token_range(pb, t, pb.T);
  const std::vector<float> whole = final_state(pb, Backend::kCpuReference);
  const std::vector<float> s_a = final_state(a, backend);
  const std::vector<float> r_b = final_state(b, backend, /*zero_start=*/true);
  std::vector<float> p_b(size_t(pb.N * pb.HV * pb.K * pb.K), poison_f32());
  const Status st = transition(transition_params(b, backend, p_b.data()));
  ASSERT_TRUE(st.ok()) << st.message;
  std::vector<float> composed(whole.size(), poison_f32());
  ComposeParams cp = compose_params(pb, backend, s_a.data(), p_b.data(), r_b.data(), composed.data());
  ASSERT_TRUE(compose(cp).ok());
  // fp32 pieces (the chunked path) or float64 ones rounded to fp32 (the reference).
  const double tol = backend == Backend::kCpuReference ? 1e-6 : kStateTolerance;
  EXPECT_LT(max_rel(composed, whole), tol);
  EXPECT_GT(max_rel(r_b, whole), 100 * tol);  // the first shard's part is not negligible
  // In place on state_in, and on shard_state: the same values.
  std::vector<float> in_place = s_a;
  cp.state_in = in_place.data();
  cp.state_out = in_place.data();
  ASSERT_TRUE(compose(cp).ok());
  EXPECT_EQ(in_place, composed);
  std::vector<float> on_r = r_b;
  cp.state_in = s_a.data();
  cp.shard_state = on_r.data();
  cp.state_out = on_r.data();
  ASSERT_TRUE(compose(cp).ok());
  EXPECT_EQ(on_r, composed);
  // Without state_in the composition is the shard's own result.
  cp.state_in = nullptr;
  cp.shard_state = r_b.data();
  cp.state_out = composed.data();
  ASSERT_TRUE(compose(cp).ok());
  EXPECT_EQ(composed, r_b);
}

// Packed sequences (one empty): each sequence's transition; the empty one's is exactly I, and
// every other composes with its zero-start result into the forward from a random state.
TEST_P(ContextParallel, PackedSequencesAndAnEmptyOne) {
  Config c;
  c.seq_lens = {41, 0, 18};
  c.heads = 3;
  c.head_dim_k = 16;
  c.head_dim_v = 16;
  c.cu_seqlens_dtype = DType::kI32;
  c.g_offset = -7.0f;  // weak decay: the initial state still matters at the end
  const Problem pb(c, rng_);
  const Backend backend = GetParam();
  std::vector<float> P(size_t(pb.N * pb.HV * pb.K * pb.K), poison_f32());
  const Status st = transition(transition_params(pb, backend, P.data()));
  ASSERT_TRUE(st.ok()) << st.message;
  const int64_t per = pb.HV * pb.K * pb.K;
  for (int64_t h = 0; h < pb.HV; ++h)
    for (int64_t i = 0; i < pb.K; ++i)
      for (int64_t j = 0; j < pb.K; ++j) EXPECT_EQ(P[size_t(per + (h * pb.K + i) * pb.K + j)], i == j ? 1.f : 0.f);
  const std::vector<float> whole = final_state(pb, Backend::kCpuReference);
  const std::vector<float> zero_start = final_state(pb, backend, /*zero_start=*/true);
  std::vector<float> composed(whole.size(), poison_f32());
  const ComposeParams cp =
      compose_params(pb, backend, pb.initial_state.f32.data(), P.data(), zero_start.data(), composed.data());
  ASSERT_TRUE(compose(cp).ok());
  EXPECT_LT(max_rel(composed, whole), backend == Backend::kCpuReference ? 1e-6 : kStateTolerance);
}

// Every rejection names its argument, and nothing is written.
TEST_P(ContextParallel, RejectsBeforeWriting) {
  Config c;
  c.seqlen = 20;
  c.head_dim_k = 16;
  c.head_dim_v = 16;
  const Problem pb(c, rng_);
  const Backend backend = GetParam();
  std::vector<float> P(size_t(pb.N * pb.HV * pb.K * pb.K), poison_f32());
  auto untouched = [&] {
    for (float x : P)
      if (!std::isnan(x)) return false;
    return true;
  };
  auto expect_error = [&](const TransitionParams& t, const char* name) {
    const Status s = transition(t);
    EXPECT_FALSE(s.ok());
    EXPECT_EQ(s.message.rfind(name, 0), 0u) << s.message;
    EXPECT_TRUE(untouched());
  };
  TransitionParams t = transition_params(pb, backend, P.data());
  t.transition = nullptr;
  expect_error(t, "transition");
  t = transition_params(pb, backend, P.data());
  t.v = pb.v.data();
  expect_error(t, "v:");
  t = transition_params(pb, backend, P.data());
  std::vector<uint16_t> out(size_t(pb.out_count()));
  t.out = out.data();
  expect_error(t, "out:");
  t = transition_params(pb, backend, P.data());
  t.lower_bound = -6.f;
  expect_error(t, "lower_bound");
  t = transition_params(pb, backend, P.data());
  t.heads = 0;
  expect_error(t, "q");
  // `transition` overlapping an input (here q's bytes) is named as `transition`.
  std::vector<uint16_t> q = pb.q;
  q.resize(std::max(q.size(), P.size() * 2 + 64));
  t = transition_params(pb, backend, P.data());
  t.q = q.data();
  t.transition = reinterpret_cast<float*>(q.data());
  const Status s = transition(t);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.message.rfind("transition", 0), 0u) << s.message;

  std::vector<float> a(size_t(pb.state_count()), 1.f), r(a), o(a.size() + 1, poison_f32());
  const ComposeParams cp = compose_params(pb, backend, a.data(), P.data(), r.data(), o.data());
  auto expect_compose_error = [&](const ComposeParams& x, const char* name) {
    const Status e = compose(x);
    EXPECT_FALSE(e.ok());
    EXPECT_EQ(e.message.rfind(name, 0), 0u) << e.message;
    for (float y : o) EXPECT_TRUE(std::isnan(y));
  };
  ComposeParams x = cp;
  x.transition = nullptr;
  expect_compose_error(x, "transition");
  x = cp;
  x.shard_state = nullptr;
  expect_compose_error(x, "shard_state");
  x = cp;
  x.state_out = nullptr;
  expect_compose_error(x, "state_out");
  x = cp;
  x.num_seqs = -1;
  expect_compose_error(x, "num_seqs");
  x = cp;
  x.heads_v = 0;
  expect_compose_error(x, "heads_v");
  x = cp;
  x.head_dim_k = 300;
  expect_compose_error(x, "head_dim_k");
  // A partial overlap of state_out with state_in (one element off) is refused; the same tensor is not.
  std::vector<float> shifted(a.size() + 1, poison_f32());
  x = cp;
  x.state_in = shifted.data();
  x.state_out = shifted.data() + 1;
  EXPECT_FALSE(compose(x).ok());
  x = cp;
  x.state_out = const_cast<float*>(P.data());
  EXPECT_FALSE(compose(x).ok());
}

INSTANTIATE_TEST_SUITE_P(CpuBackends, ContextParallel, ::testing::Values(Backend::kCpu, Backend::kCpuReference),
                         [](const auto& info) { return info.param == Backend::kCpu ? "cpu" : "reference"; });

// A CUDA call without a device fails before writing (with a GPU the CUDA path is checked by
// tests/gpu/test_cuda_context_parallel.cu, not here: these buffers are host memory).
TEST(ContextParallelCuda, FailsCleanlyWithoutADevice) {
  if (cuda_available()) GTEST_SKIP() << "a GPU is present";
  std::mt19937_64 rng(fresh_seed());
  Config c;
  c.seqlen = 20;
  const Problem pb(c, rng);
  std::vector<float> P(size_t(pb.N * pb.HV * pb.K * pb.K), poison_f32());
  TransitionParams t = transition_params(pb, Backend::kCuda, P.data());
  std::vector<unsigned char> ws(transition_workspace_size(t) + 1);
  t.workspace = ws.data();
  t.workspace_bytes = ws.size();
  EXPECT_FALSE(transition(t).ok());
  for (float x : P) EXPECT_TRUE(std::isnan(x));
}

}  // namespace
}  // namespace flash_kda::test
