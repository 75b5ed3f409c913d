// Decode's fast CPU path (Backend::kCpu of `decode`): the per-token recurrence of docs/spec.md in fp32, one
// (sequence, value head) per thread. A decode call brings at most kMaxDecodeTokens tokens per
// sequence, too few for the chunked form to pay off, and speculative decoding needs the state after
// every token anyway. Per token, with q_tilde = scale · q_hat and S_a = S · Diag(alpha):
//
//   delta = beta (v − S_a k_hat),   out = S_a q_tilde + delta (k_hat · q_tilde),   S = S_a + delta k_hatᵀ
//
// so one pass over each row of S forms both dot products and a second adds the rank-one update
// (the same factorisation as the CUDA decode kernel).
#include <cmath>
#include <vector>

#include "head_task.h"
#include "isa_dispatch.h"
#include "simd.h"

namespace flash_kda::cpu {

namespace {

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

struct RecurrentScratch {
  std::vector<float> state;    // S, V × Kp (columns past K stay zero)
  std::vector<float> k_hat;    // Kp
  std::vector<float> q_tilde;  // Kp, times scale
  std::vector<float> alpha;    // Kp
  std::vector<float> dt_bias;  // Kp
};

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

template <int W>
class DecodeRunner {
  using S = Simd<W>;
  using Vec = typename S::Vec;

 public:
  FLASH_KDA_INLINE DecodeRunner(const HostRun& run, const HeadTask& task, RecurrentScratch& s)
      : run_(run), p_(run.p), task_(task), s_(s), K_(p_.head_dim_k), V_(p_.head_dim_v), Kp_(round_up(K_, W)) {
    s_.state.assign(size_t(V_ * Kp_), 0.0f);
    for (auto* buf : {&s_.k_hat, &s_.q_tilde, &s_.alpha, &s_.dt_bias}) buf->assign(size_t(Kp_), 0.0f);
    std::copy(task.dt_bias, task.dt_bias + K_, s_.dt_bias.begin());
  }

  FLASH_KDA_INLINE void run() {
    // The whole state is read before anything is written: the pool is updated in place.
    load_state(run_, task_.initial_state, s_.state.data(), Kp_);
    for (int64_t t = 0; t < task_.length; ++t) {
      step(t);
      if (task_.per_token_states && t < kMaxDecodeTokens) store_state(run_, s_.state.data(), Kp_, task_.state_after[t]);
    }
    store_state(run_, s_.state.data(), Kp_, task_.final_state);
  }

 private:
  // x[0, K) = src * factor / sqrt(sum src^2 + 1e-6) (the eps inside the root, as docs/spec.md).
  FLASH_KDA_INLINE void normalised(const uint16_t* src, float factor, float* x) const {
    float sum_sq = 0.0f;
    for (int64_t c = 0; c < K_; ++c) {
      x[c] = bf16_to_float(src[c]);
      sum_sq += x[c] * x[c];
    }
    const float f = factor / std::sqrt(sum_sq + 1e-6f);
    for (int64_t c = 0; c < K_; ++c) x[c] *= f;
  }

  FLASH_KDA_INLINE void step(int64_t t) {
    float* k_hat = s_.k_hat.data();
    float* q_tilde = s_.q_tilde.data();
    float* alpha = s_.alpha.data();
    normalised(task_.k + t * task_.k_stride, 1.0f, k_hat);
    normalised(task_.q + t * task_.q_stride, p_.scale, q_tilde);
    const uint16_t* g = task_.g + t * task_.g_stride;
    for (int64_t c = 0; c < K_; ++c) alpha[c] = bf16_to_float(g[c]);
    const float gate_rate = std::exp(task_.A_log);
    if (p_.gate == GateForm::kSoftplus) {
      for (int64_t c = 0; c < Kp_; c += W) {
        // alpha = exp(-exp(A_log) softplus(g + dt_bias)): no floor. A factor below 1e-30 is taken as
        // 0 (a token may decay a channel to exactly 0; what it would keep is below fp32's resolution),
        // so no denormal is multiplied; no number gives 0 · Inf or NaN.
        const Vec x = S::load(alpha + c) + S::load(s_.dt_bias.data() + c);
        const Vec a = S::exp(-S::rate_softplus(x, task_.A_log, gate_rate));
        S::store(alpha + c, a < 1e-30f ? Vec{} : a);
      }
    } else {
      for (int64_t c = 0; c < Kp_; c += W) {
        // alpha = exp(lower_bound · sigmoid(exp(A_log) (g + dt_bias))); the padding columns meet zero keys.
        const Vec z = (S::load(alpha + c) + S::load(s_.dt_bias.data() + c)) * gate_rate;
        S::store(alpha + c, S::exp(p_.lower_bound / (1.0f + S::exp(-z))));
      }
    }
    // allow_neg_eigval: beta = 2 sigmoid(logit) (an exact doubling).
    const float beta = (p_.allow_neg_eigval ? 2.0f : 1.0f) * sigmoid(bf16_to_float(task_.beta[t * task_.beta_stride]));
    Vec kq_acc{};
    for (int64_t c = 0; c < Kp_; c += W) kq_acc += S::load(k_hat + c) * S::load(q_tilde + c);
    const float kq = S::sum(kq_acc);

    const uint16_t* v = task_.v + t * task_.v_stride;
    uint16_t* out = task_.out + t * task_.out_stride;
    for (int64_t r = 0; r < V_; ++r) {
      float* row = s_.state.data() + r * Kp_;
      Vec row_k{}, row_q{};
      for (int64_t c = 0; c < Kp_; c += W) {
        const Vec s = S::load(row + c) * S::load(alpha + c);
        row_k += s * S::load(k_hat + c);
        row_q += s * S::load(q_tilde + c);
        S::store(row + c, s);
      }
      const float delta = beta * (bf16_to_float(v[r]) - S::sum(row_k));
      out[r] = float_to_bf16(S::sum(row_q) + delta * kq);
      for (int64_t c = 0; c < Kp_; c += W) S::store(row + c, S::load(row + c) + delta * S::load(k_hat + c));
    }
  }

  const HostRun& run_;
  const ProblemParams& p_;
  const HeadTask& task_;
  RecurrentScratch& s_;
  const int64_t K_, V_, Kp_;
};

}  // namespace

Status recurrent_fwd(const HostRun& run) { return IsaDispatch<DecodeRunner, RecurrentScratch>::run(run); }

}  // namespace flash_kda::cpu
