// Shared helpers of the C++ tests: random problems (fresh every run, seed printed on failure), a
// naive float64 oracle independent of src/cpu, poisoning, error measures and FwdParams building.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/bf16.h"
#include "flash_kda/flash_kda.h"

namespace flash_kda::test {

// docs/spec.md tolerances (the "must" column).
constexpr double kOutTolerance = 4e-3;
constexpr double kStateTolerance = 3e-3;

// Poison patterns: NaN in each dtype, so an element the kernel forgets to write is caught.
constexpr uint16_t kPoisonBf16 = 0x7fc1;
constexpr uint32_t kPoisonF32 = 0x7fc00001u;

inline float poison_f32() {
  float f;
  std::memcpy(&f, &kPoisonF32, sizeof f);
  return f;
}

// Seed of the test's generator: fresh from std::random_device every run, or FLASH_KDA_TEST_SEED to
// replay a failure.
inline uint64_t fresh_seed() {
  if (const char* env = std::getenv("FLASH_KDA_TEST_SEED")) return std::strtoull(env, nullptr, 0);
  std::random_device device;
  return (uint64_t(device()) << 32) ^ device();
}

// Base fixture: a seeded generator whose seed appears in every failure message of the test.
class SeededTest : public ::testing::Test {
 protected:
  SeededTest() : seed_(fresh_seed()), rng_(seed_), trace_(__FILE__, __LINE__, seed_message()) {}

  std::string seed_message() const {
    return "random seed " + std::to_string(seed_) + " (replay: FLASH_KDA_TEST_SEED=" + std::to_string(seed_) + ")";
  }

  uint64_t seed_;
  std::mt19937_64 rng_;
  ::testing::ScopedTrace trace_;
};

// A state tensor [N, HV, V, K] in either dtype.
struct StateBuffer {
  DType dtype = DType::kNone;
  std::vector<float> f32;
  std::vector<uint16_t> bf16;

  StateBuffer() = default;
  StateBuffer(DType d, size_t count) : dtype(d) {
    if (d == DType::kF32) f32.assign(count, poison_f32());
    if (d == DType::kBF16) bf16.assign(count, kPoisonBf16);
  }
  bool empty() const { return f32.empty() && bf16.empty(); }
  size_t size() const { return dtype == DType::kF32 ? f32.size() : bf16.size(); }
  void* data() { return dtype == DType::kF32 ? static_cast<void*>(f32.data()) : bf16.data(); }
  const void* data() const { return dtype == DType::kF32 ? static_cast<const void*>(f32.data()) : bf16.data(); }
  size_t bytes() const { return f32.size() * sizeof(float) + bf16.size() * sizeof(uint16_t); }
  double at(size_t i) const { return dtype == DType::kF32 ? f32[i] : bf16_to_float(bf16[i]); }
  std::vector<double> to_double() const {
    std::vector<double> x(size());
    for (size_t i = 0; i < x.size(); ++i) x[i] = at(i);
    return x;
  }
  bool operator==(const StateBuffer& o) const {
    return dtype == o.dtype && bytes() == o.bytes() && std::memcmp(data(), o.data(), bytes()) == 0;
  }
};

// What a problem looks like; every field has a default so a test names only what it changes.
struct Config {
  int64_t batch = 1;
  int64_t seqlen = 40;
  int64_t heads = 2;
  int64_t heads_v = 0;  // 0: HV = H
  int64_t head_dim_k = 128;
  int64_t head_dim_v = 128;
  std::vector<int64_t> seq_lens;  // non-empty: packed varlen batch (batch 1, seqlen = the sum)
  DType cu_seqlens_dtype = DType::kI64;
  DType state_dtype = DType::kF32;  // kNone: no state at all
  bool has_initial = true;
  bool has_final = true;
  float lower_bound = -5.0f;
  GateForm gate = GateForm::kSigmoid;  // kSoftplus: the unbounded gate (lower_bound unused)
  bool has_A_log = true;               // false: A_log null (the sigmoid gate at rate 1)
  bool allow_neg_eigval = false;       // beta = 2 sigmoid(logit)
  float g_offset = 0.0f;  // added to every gate logit (large positive: strong decay)
  float v_factor = 1.0f;  // multiplies every value (large |v|)
};

// Random inputs of one call, contiguous, owned by the object.
struct Problem {
  Config cfg;
  int64_t N = 0, HV = 0, K = 0, V = 0, T = 0;
  float scale = 0.0f;  // K^-0.5
  std::vector<uint16_t> q, k, v, g, beta;
  std::vector<float> A_log, dt_bias;
  std::vector<int64_t> cu64;
  std::vector<int32_t> cu32;
  StateBuffer initial_state;

  Problem(const Config& c, std::mt19937_64& rng) : cfg(c) {
    if (!cfg.seq_lens.empty()) {
      cfg.batch = 1;
      cfg.seqlen = 0;
      for (int64_t len : cfg.seq_lens) cfg.seqlen += len;
    }
    N = cfg.seq_lens.empty() ? cfg.batch : int64_t(cfg.seq_lens.size());
    HV = cfg.heads_v > 0 ? cfg.heads_v : cfg.heads;
    K = cfg.head_dim_k;
    V = cfg.head_dim_v;
    T = cfg.seqlen;
    scale = float(1.0 / std::sqrt(double(K)));
    const int64_t tokens = cfg.batch * T;
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
    // Never zeros: a zero is redrawn (tests that want zeros write them explicitly).
    auto bf16_vector = [&](int64_t count, float factor, float offset) {
      std::vector<uint16_t> x(static_cast<size_t>(count));
      for (uint16_t& e : x) {
        do e = float_to_bf16(normal(rng) * factor + offset);
        while ((e & 0x7fffu) == 0);
      }
      return x;
    };
    auto uniform_vector = [&](int64_t count) {
      std::vector<float> x(static_cast<size_t>(count));
      for (float& e : x) {
        do e = uniform(rng);
        while (e == 0.0f);
      }
      return x;
    };
    q = bf16_vector(tokens * cfg.heads * K, 1.0f, 0.0f);
    k = bf16_vector(tokens * cfg.heads * K, 1.0f, 0.0f);
    v = bf16_vector(tokens * HV * V, cfg.v_factor, 0.0f);
    g = bf16_vector(tokens * HV * K, 1.0f, cfg.g_offset);
    beta = bf16_vector(tokens * HV, 1.0f, 0.0f);
    A_log = uniform_vector(HV);
    dt_bias = uniform_vector(HV * K);
    if (!cfg.seq_lens.empty()) {
      cu64 = {0};
      for (int64_t len : cfg.seq_lens) cu64.push_back(cu64.back() + len);
      cu32.assign(cu64.begin(), cu64.end());
    }
    if (cfg.state_dtype != DType::kNone && cfg.has_initial) {
      initial_state = StateBuffer(cfg.state_dtype, size_t(state_count()));
      for (size_t i = 0; i < initial_state.size(); ++i) {
        const float x = normal(rng);
        if (cfg.state_dtype == DType::kF32) {
          initial_state.f32[i] = x;
        } else {
          initial_state.bf16[i] = float_to_bf16(x);
        }
      }
    }
  }

  int64_t state_count() const { return N * HV * V * K; }
  int64_t out_count() const { return cfg.batch * T * HV * V; }
  // Token range [begin, end) and batch row of sequence n.
  int64_t row(int64_t n) const { return cfg.seq_lens.empty() ? n : 0; }
  int64_t begin(int64_t n) const { return cfg.seq_lens.empty() ? 0 : cu64[size_t(n)]; }
  int64_t end(int64_t n) const { return cfg.seq_lens.empty() ? T : cu64[size_t(n) + 1]; }

  // Contiguous parameters for this problem, writing to `out` and `final_state` (may be null).
  FwdParams params(Backend backend, void* out, void* final_state) const {
    FwdParams p;
    p.batch = cfg.batch;
    p.seqlen = T;
    p.heads = cfg.heads;
    p.heads_v = cfg.heads_v;
    p.head_dim_k = K;
    p.head_dim_v = V;
    p.q = q.data();
    p.k = k.data();
    p.v = v.data();
    p.g = g.data();
    p.beta = beta.data();
    p.A_log = cfg.has_A_log ? A_log.data() : nullptr;
    p.dt_bias = dt_bias.data();
    p.scale = scale;
    p.lower_bound = cfg.lower_bound;
    p.gate = cfg.gate;
    p.allow_neg_eigval = cfg.allow_neg_eigval;
    p.out = out;
    p.initial_state = initial_state.empty() ? nullptr : initial_state.data();
    p.final_state = final_state;
    p.state_dtype = cfg.state_dtype;
    if (!cfg.seq_lens.empty()) {
      p.cu_seqlens_dtype = cfg.cu_seqlens_dtype;
      p.cu_seqlens = cfg.cu_seqlens_dtype == DType::kI32 ? static_cast<const void*>(cu32.data()) : cu64.data();
      p.num_seqs = N;
    }
    p.backend = backend;
    return p;
  }

  // The same problem with only sequence n, as a one-sequence batch (varlen stays varlen).
  Problem only_sequence(int64_t n) const {
    Problem s = *this;
    const int64_t b = begin(n), e = end(n), r = row(n);
    if (!cfg.seq_lens.empty()) s.cfg.seq_lens = {e - b};
    s.cfg.batch = 1;
    s.cfg.seqlen = e - b;
    s.N = 1;
    s.T = e - b;
    auto slice = [&](const std::vector<uint16_t>& x, int64_t per_token) {
      const auto first = x.begin() + (r * T + b) * per_token;
      return std::vector<uint16_t>(first, first + (e - b) * per_token);
    };
    s.q = slice(q, cfg.heads * K);
    s.k = slice(k, cfg.heads * K);
    s.v = slice(v, HV * V);
    s.g = slice(g, HV * K);
    s.beta = slice(beta, HV);
    s.cu64 = {0, e - b};
    s.cu32 = {0, int32_t(e - b)};
    if (!initial_state.empty()) {
      const size_t per_seq = size_t(HV * V * K);
      s.initial_state.f32.clear();
      s.initial_state.bf16.clear();
      if (cfg.state_dtype == DType::kF32)
        s.initial_state.f32.assign(initial_state.f32.begin() + n * per_seq,
                                   initial_state.f32.begin() + (n + 1) * per_seq);
      else
        s.initial_state.bf16.assign(initial_state.bf16.begin() + n * per_seq,
                                    initial_state.bf16.begin() + (n + 1) * per_seq);
    }
    return s;
  }
};

// Outputs of one call; both start poisoned.
struct Result {
  Status status;
  std::vector<uint16_t> out;
  StateBuffer final_state;

  std::vector<double> out_double() const {
    std::vector<double> x(out.size());
    for (size_t i = 0; i < x.size(); ++i) x[i] = bf16_to_float(out[i]);
    return x;
  }
};

inline Result poisoned_result(const Problem& pb) {
  Result r;
  r.out.assign(size_t(pb.out_count()), kPoisonBf16);
  if (pb.cfg.state_dtype != DType::kNone && pb.cfg.has_final)
    r.final_state = StateBuffer(pb.cfg.state_dtype, size_t(pb.state_count()));
  return r;
}

inline FwdParams params_for(const Problem& pb, Backend backend, Result& r, int threads = 0) {
  FwdParams p = pb.params(backend, r.out.data(), r.final_state.empty() ? nullptr : r.final_state.data());
  p.cpu_threads = threads;
  return p;
}

// Runs the problem on a backend into freshly poisoned outputs.
inline Result run(const Problem& pb, Backend backend, int threads = 0) {
  Result r = poisoned_result(pb);
  r.status = fwd(params_for(pb, backend, r, threads));
  return r;
}

inline bool all_finite(const std::vector<double>& x) {
  for (double e : x)
    if (!std::isfinite(e)) return false;
  return true;
}

// ||x − ref||₂ / ||ref||₂ (the plain norm of x − ref when ref is zero).
inline double rel_error(const std::vector<double>& x, const std::vector<double>& ref) {
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    diff += (x[i] - ref[i]) * (x[i] - ref[i]);
    norm += ref[i] * ref[i];
  }
  return norm > 0.0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

// The recurrence of docs/spec.md in float64, coded from the equations over the problem's contiguous
// arrays without any code of src/cpu: an independent check of the reference backend's indexing.
struct NaiveResult {
  std::vector<double> out;           // [B, T, HV, V]
  std::vector<double> state;         // [N, HV, V, K], the state after each sequence
  std::vector<double> token_states;  // [B, T, HV, V, K], the state after each token (if asked for)
};

inline NaiveResult naive_forward(const Problem& pb, bool keep_token_states = false) {
  const int64_t H = pb.cfg.heads, HV = pb.HV, K = pb.K, V = pb.V;
  NaiveResult res;
  res.out.assign(size_t(pb.out_count()), 0.0);
  res.state.assign(size_t(pb.state_count()), 0.0);
  if (keep_token_states) res.token_states.assign(size_t(pb.cfg.batch * pb.T * HV * V * K), 0.0);
  auto sigmoid = [](double z) { return 1.0 / (1.0 + std::exp(-z)); };
  for (int64_t n = 0; n < pb.N; ++n) {
    for (int64_t hv = 0; hv < HV; ++hv) {
      const int64_t h = hv / (HV / H);
      double* S = res.state.data() + (n * HV + hv) * V * K;  // S[r * K + c]
      if (!pb.initial_state.empty())
        for (int64_t i = 0; i < V * K; ++i) S[i] = pb.initial_state.at(size_t((n * HV + hv) * V * K + i));
      for (int64_t t = pb.begin(n); t < pb.end(n); ++t) {
        const int64_t token = pb.row(n) * pb.T + t;
        auto q = [&](int64_t c) { return double(bf16_to_float(pb.q[size_t((token * H + h) * K + c)])); };
        auto k = [&](int64_t c) { return double(bf16_to_float(pb.k[size_t((token * H + h) * K + c)])); };
        auto v = [&](int64_t r) { return double(bf16_to_float(pb.v[size_t((token * HV + hv) * V + r)])); };
        auto g = [&](int64_t c) { return double(bf16_to_float(pb.g[size_t((token * HV + hv) * K + c)])); };
        double q_norm = 0.0, k_norm = 0.0;
        for (int64_t c = 0; c < K; ++c) {
          q_norm += q(c) * q(c);
          k_norm += k(c) * k(c);
        }
        q_norm = std::sqrt(q_norm + 1e-6);
        k_norm = std::sqrt(k_norm + 1e-6);
        std::vector<double> q_hat, k_hat, alpha, S_k(static_cast<size_t>(V), 0.0);
        for (int64_t c = 0; c < K; ++c) {
          q_hat.push_back(q(c) / q_norm);
          k_hat.push_back(k(c) / k_norm);
          // docs/spec.md, "Gate forms": no A_log is a rate of 1; the softplus gate has no floor.
          const double rate = pb.cfg.has_A_log ? std::exp(double(pb.A_log[size_t(hv)])) : 1.0;
          const double x = g(c) + pb.dt_bias[size_t(hv * K + c)];
          if (pb.cfg.gate == GateForm::kSoftplus) {
            const double softplus = x > 30.0 ? x + std::exp(-x) : std::log(1.0 + std::exp(x));
            alpha.push_back(std::exp(-rate * softplus));
          } else {
            alpha.push_back(std::exp(pb.cfg.lower_bound * sigmoid(rate * x)));
          }
        }
        const double beta = (pb.cfg.allow_neg_eigval ? 2.0 : 1.0) *
                            sigmoid(double(bf16_to_float(pb.beta[size_t(token * HV + hv)])));
        for (int64_t r = 0; r < V; ++r)
          for (int64_t c = 0; c < K; ++c) S[r * K + c] *= alpha[size_t(c)];
        for (int64_t r = 0; r < V; ++r)
          for (int64_t c = 0; c < K; ++c) S_k[size_t(r)] += S[r * K + c] * k_hat[size_t(c)];
        for (int64_t r = 0; r < V; ++r)
          for (int64_t c = 0; c < K; ++c) S[r * K + c] += beta * (v(r) - S_k[size_t(r)]) * k_hat[size_t(c)];
        for (int64_t r = 0; r < V; ++r) {
          double o = 0.0;
          for (int64_t c = 0; c < K; ++c) o += S[r * K + c] * q_hat[size_t(c)];
          res.out[size_t((token * HV + hv) * V + r)] = double(pb.scale) * o;
        }
        if (keep_token_states) std::copy(S, S + V * K, res.token_states.begin() + (token * HV + hv) * V * K);
      }
    }
  }
  return res;
}

// Decode parameters for the problem's inputs (contiguous, strides filled), the pool and its indices.
inline DecodeParams decode_params(const Problem& pb, Backend backend, void* out, StateBuffer& pool, int64_t P,
                           const int32_t* indices, int64_t slots_per_seq = 1, const int32_t* accepted = nullptr) {
  DecodeParams d;
  d.batch = pb.cfg.batch;
  d.seqlen = pb.T;
  d.heads = pb.cfg.heads;
  d.heads_v = pb.cfg.heads_v;
  d.head_dim_k = pb.K;
  d.head_dim_v = pb.V;
  d.q = pb.q.data();
  d.k = pb.k.data();
  d.v = pb.v.data();
  d.g = pb.g.data();
  d.beta = pb.beta.data();
  d.A_log = pb.cfg.has_A_log ? pb.A_log.data() : nullptr;
  d.dt_bias = pb.dt_bias.data();
  d.scale = pb.scale;
  d.lower_bound = pb.cfg.lower_bound;
  d.gate = pb.cfg.gate;
  d.allow_neg_eigval = pb.cfg.allow_neg_eigval;
  d.out = out;
  d.state = pool.data();
  d.state_dtype = pool.dtype;
  d.pool_size = P;
  d.state_indices = indices;
  d.slots_per_seq = slots_per_seq;
  d.num_accepted_tokens = accepted;
  if (!pb.cfg.seq_lens.empty()) {
    d.cu_seqlens_dtype = pb.cfg.cu_seqlens_dtype;
    d.cu_seqlens = pb.cfg.cu_seqlens_dtype == DType::kI32 ? static_cast<const void*>(pb.cu32.data()) : pb.cu64.data();
    d.num_seqs = pb.N;
  }
  d.backend = backend;
  fill_contiguous_strides(d);
  return d;
}


}  // namespace flash_kda::test
