// The float64 per-token recurrence of docs/spec.md, written as the equations read: the test oracle
// (Backend::kCpuReference) of fwd and decode. Deliberately unoptimised beyond fusing the row passes
// over the state.
#include <cmath>
#include <vector>

#include "head_task.h"

namespace flash_kda::cpu {

namespace {

struct ReferenceScratch {
  std::vector<double> state;  // S, V×K: row r holds state[r, :]
  std::vector<double> q_hat, k_hat, alpha;
};

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// log(1 + e^x) without overflow: x + log1p(e^-x) for x > 0.
double softplus(double x) { return x > 0.0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x)); }

// x / sqrt(sum x^2 + 1e-6): the eps sits inside the root, so an all-zero vector stays zero.
void l2_normalise(const uint16_t* x, int64_t n, double* x_hat) {
  double sum_sq = 0.0;
  for (int64_t c = 0; c < n; ++c) {
    x_hat[c] = bf16_to_float(x[c]);
    sum_sq += x_hat[c] * x_hat[c];
  }
  const double inv_norm = 1.0 / std::sqrt(sum_sq + 1e-6);
  for (int64_t c = 0; c < n; ++c) x_hat[c] *= inv_norm;
}

void run_head(const HostRun& run, const HeadTask& task, ReferenceScratch& scratch) {
  const ProblemParams& p = run.p;
  const int64_t K = p.head_dim_k, V = p.head_dim_v;
  scratch.state.resize(size_t(V * K));
  scratch.q_hat.resize(size_t(K));
  scratch.k_hat.resize(size_t(K));
  scratch.alpha.resize(size_t(K));
  double* state = scratch.state.data();
  double* q_hat = scratch.q_hat.data();
  double* k_hat = scratch.k_hat.data();
  double* alpha = scratch.alpha.data();
  // The whole initial state is read before anything is written: final_state may alias it.
  load_state(run, task.initial_state, state, K);

  const double gate_rate = std::exp(double(task.A_log));
  const double lower_bound = p.lower_bound, scale = p.scale;
  const bool softplus_gate = p.gate == GateForm::kSoftplus;
  const double beta_scale = p.allow_neg_eigval ? 2.0 : 1.0;  // beta = 2 sigmoid(logit) with negative eigenvalues
  int64_t next_checkpoint = 0;  // the next checkpoint (column) due
  for (int64_t t = 0; t < task.length; ++t) {
    l2_normalise(task.q + t * task.q_stride, K, q_hat);
    l2_normalise(task.k + t * task.k_stride, K, k_hat);
    const uint16_t* g = task.g + t * task.g_stride;
    for (int64_t c = 0; c < K; ++c) {
      const double x = double(bf16_to_float(g[c])) + task.dt_bias[c];
      // docs/spec.md, "Gate forms". The softplus gate has no floor: a may be -inf (alpha = 0).
      const double a = softplus_gate ? -gate_rate * softplus(x) : lower_bound * sigmoid(gate_rate * x);
      alpha[c] = std::exp(a);
    }
    const double beta = beta_scale * sigmoid(bf16_to_float(task.beta[t * task.beta_stride]));
    const uint16_t* v = task.v + t * task.v_stride;
    uint16_t* out = task.out + t * task.out_stride;

    // Rows of S evolve independently, so each row takes the three steps in one pass:
    //   S[r,:] *= alpha;  S[r,:] += beta (v[r] - S[r,:]·k_hat) k_hat;  o[r] = scale S[r,:]·q_hat.
    for (int64_t r = 0; r < V; ++r) {
      double* row = state + r * K;
      double row_k = 0.0;
      for (int64_t c = 0; c < K; ++c) {
        row[c] *= alpha[c];
        row_k += row[c] * k_hat[c];
      }
      const double delta = beta * (double(bf16_to_float(v[r])) - row_k);
      double row_q = 0.0;
      for (int64_t c = 0; c < K; ++c) {
        row[c] += delta * k_hat[c];
        row_q += row[c] * q_hat[c];
      }
      out[r] = double_to_bf16(scale * row_q);
    }
    if (task.per_token_states && t < kMaxDecodeTokens) store_state(run, state, K, task.state_after[t]);
    if (next_checkpoint < task.checkpoints.count && t + 1 == task.checkpoint_end(next_checkpoint))
      store_checkpoint(run, task, next_checkpoint++, state, K);
  }
  store_state(run, state, K, task.final_state);
}

}  // namespace

Status reference_fwd(const HostRun& run) {
  return for_each_head<ReferenceScratch>(
      run, [&](const HeadTask& task, ReferenceScratch& scratch) { run_head(run, task, scratch); });
}

}  // namespace flash_kda::cpu
