// The fast CPU path (Backend::kCpu): the chunked form of the KDA recurrence in fp32, one
// (sequence, value head) per thread. Within a chunk of C tokens starting from state S0:
//
//   G_t  = a_1 + ... + a_t (per channel),  E_t = exp(G_t)
//   Kt_t = k_hat_t ⊙ E_t,  Qt_t = scale q_hat_t ⊙ E_t,  Kdec_s = k_hat_s ⊙ E_L / E_s
//   A[t,s] = Σ_c k_hat_t k_hat_s exp(G_t − G_s)  (s < t),   M[t,s] = the same with scale q_hat_t (s <= t)
//   U = (I + diag(β) A)^{-1} diag(β) (V − Kt S0ᵀ)      (forward substitution)
//   O = Qt S0ᵀ + M U,   S_next = S0 Diag(E_L) + Uᵀ Kdec
//
// which equals the per-token recurrence in exact arithmetic (L = tokens in the chunk).
//
// The softplus gate (GateForm::kSoftplus) has no floor, so the factors exp(±G) above can overflow; its
// chunks take prepare_unbounded() instead, which forms every decay factor as a product of per-token
// factors in [0, 1] (see there). The sigmoid gate keeps the path above unchanged.
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "head_task.h"
#include "isa_dispatch.h"
#include "simd.h"

namespace flash_kda::cpu {

namespace {

// Tokens per chunk. Every decay factor below is exp(x) with |x| <= |lower_bound| · C <= 80, inside the
// fp32 normal range [exp(-87.3), exp(88.7)]: no factor overflows or flushes to zero, so no Inf · 0.
constexpr int64_t kChunk = 16;
static_assert(5 * kChunk < 87, "decay factors of a chunk must stay in the fp32 normal range");

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

struct ChunkedScratch {
  std::vector<float> state;        // S, Vp × Kp
  std::vector<float> dt_bias;      // Kp
  std::vector<float> gate;         // raw gate of one token, Kp
  std::vector<float> gate_sum;     // G of the current token, Kp
  std::vector<float> k_hat;        // C × Kp
  std::vector<float> q_hat;        // C × Kp, times scale
  std::vector<float> decay;        // E = exp(G), C × Kp
  std::vector<float> kq_start_t;   // [Kt; Qt] transposed, Kp × 2C (decay from the chunk start)
  std::vector<float> kq_mid;       // [Kt; Qt] referenced to the middle token, 2C × Kp
  std::vector<float> k_bar_mid_t;  // k_hat_s ⊙ E_m / E_s transposed, Kp × C
  std::vector<float> k_dec;        // Kdec, C × Kp
  std::vector<float> intra;        // [A; M] before masking, 2C × C
  std::vector<float> inter;        // [Kt; Qt] · S0ᵀ, 2C × Vp
  std::vector<float> u;            // U, C × Vp
  std::vector<float> o;            // one output row, Vp
  std::vector<float> alpha;        // softplus gate: exp(a) of each token, C × Kp
  std::vector<float> run_product;  // softplus gate: a running product of alphas, Kp
  float beta[kChunk];
};

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// Reads n bf16 values into x[0, n) and zeros x[n, padded).
FLASH_KDA_INLINE void load_row(const uint16_t* src, int64_t n, int64_t padded, float* x) {
  for (int64_t c = 0; c < n; ++c) x[c] = bf16_to_float(src[c]);
  for (int64_t c = n; c < padded; ++c) x[c] = 0.0f;
}

// One (sequence, head) on W-wide vectors. Inside the scratch buffers K is padded to a multiple of
// kBlock and V to a multiple of W, with zeros, so every inner loop runs on whole vectors: zero keys
// keep the padding columns of the state at zero, zero values its padding rows.
template <int W>
class HeadRunner {
  using S = Simd<W>;
  using Vec = typename S::Vec;
  static constexpr int64_t kBlock = 4 * W;
  // Rows of S per pass of the products, so that a pass holds 8 accumulator registers at any width.
  static constexpr int64_t kRows = W / 4;

  // x *= scale / sqrt(sum x^2 + 1e-6) over a padded row (the eps inside the root, as docs/spec.md).
  static FLASH_KDA_INLINE void l2_normalise(float* x, int64_t padded, float scale) {
    Vec sum_sq{};
    for (int64_t c = 0; c < padded; c += W) {
      const Vec v = S::load(x + c);
      sum_sq += v * v;
    }
    const float factor = scale / std::sqrt(S::sum(sum_sq) + 1e-6f);
    for (int64_t c = 0; c < padded; ++c) x[c] *= factor;
  }

 public:
  FLASH_KDA_INLINE HeadRunner(const HostRun& run, const HeadTask& task, ChunkedScratch& s)
      : run_(run),
        p_(run.p),
        task_(task),
        s_(s),
        K_(p_.head_dim_k),
        V_(p_.head_dim_v),
        Kp_(round_up(K_, kBlock)),
        Vp_(round_up(V_, W)) {
    s_.state.assign(size_t(Vp_ * Kp_), 0.0f);
    for (auto* buf : {&s_.dt_bias, &s_.gate, &s_.gate_sum}) buf->resize(size_t(Kp_));
    for (auto* buf : {&s_.k_hat, &s_.q_hat, &s_.decay, &s_.k_dec}) buf->resize(size_t(kChunk * Kp_));
    s_.kq_start_t.resize(size_t(Kp_ * 2 * kChunk));
    s_.kq_mid.resize(size_t(2 * kChunk * Kp_));
    s_.k_bar_mid_t.resize(size_t(Kp_ * kChunk));
    s_.intra.resize(size_t(2 * kChunk * kChunk));
    s_.inter.resize(size_t(Vp_ * 2 * kChunk));
    s_.u.resize(size_t(kChunk * Vp_));
    s_.o.resize(size_t(Vp_));
    std::copy(task.dt_bias, task.dt_bias + K_, s_.dt_bias.begin());
    std::fill(s_.dt_bias.begin() + K_, s_.dt_bias.end(), 0.0f);
    if (softplus_) {
      s_.alpha.resize(size_t(kChunk * Kp_));
      s_.run_product.resize(size_t(Kp_));
    }
  }

  FLASH_KDA_INLINE void run() {
    // The whole initial state is read before anything is written: final_state may alias it.
    load_state(run_, task_.initial_state, s_.state.data(), Kp_);
    // Checkpoints: a chunk never crosses a checkpoint boundary. Boundaries are multiples of 16 in
    // absolute position but the sequence's start need not be, so the chunk that would contain the
    // first boundary is cut short there (a partial chunk, as the last one may be); from then on the
    // chunks are aligned with absolute multiples of 16 and every later boundary (a multiple of the
    // interval, itself a multiple of 16) falls on a chunk end. The state after the chunk is the
    // checkpoint. Without checkpoints the chunks are those of the sequence's own chunking.
    int64_t next_checkpoint = 0;
    for (int64_t t0 = 0, L = 0; t0 < task_.length; t0 += L) {
      L = std::min(kChunk, task_.length - t0);
      const bool due = next_checkpoint < task_.checkpoints.count;
      if (due) L = std::min(L, task_.checkpoint_end(next_checkpoint) - t0);
      if (softplus_) {
        prepare_unbounded(t0, L);  // also forms intra
        inter_products();
      } else {
        prepare(t0, L);
        products();
      }
      solve_and_output(t0, L);
      update_state(L);
      if (due && t0 + L == task_.checkpoint_end(next_checkpoint))
        store_checkpoint(run_, task_, next_checkpoint++, s_.state.data(), Kp_);
    }
    store_state(run_, s_.state.data(), Kp_, task_.final_state);
  }

 private:
  // Asks for the input rows of token t ahead of use. A head's rows of consecutive tokens lie H·K·2
  // bytes apart, a stride the hardware prefetchers follow poorly: fetching one chunk ahead took the
  // T=8192, H=8 case from 370 to 305 ms on one thread and from 320 to 152 ms on two.
  FLASH_KDA_INLINE void prefetch_token(int64_t t) const {
    constexpr int64_t kLine = 32;  // bf16 values per 64-byte cache line
    for (int64_t c = 0; c < K_; c += kLine) {
      __builtin_prefetch(task_.q + t * task_.q_stride + c);
      __builtin_prefetch(task_.k + t * task_.k_stride + c);
      __builtin_prefetch(task_.g + t * task_.g_stride + c);
    }
    for (int64_t c = 0; c < V_; c += kLine) __builtin_prefetch(task_.v + t * task_.v_stride + c);
  }

  // Row i of a chunk past the sequence's end: k = q = 0, beta = 0, no decay.
  FLASH_KDA_INLINE void pad_token(int64_t i) {
    std::fill(s_.k_hat.data() + i * Kp_, s_.k_hat.data() + (i + 1) * Kp_, 0.0f);
    std::fill(s_.q_hat.data() + i * Kp_, s_.q_hat.data() + (i + 1) * Kp_, 0.0f);
    std::fill(s_.decay.data() + i * Kp_, s_.decay.data() + (i + 1) * Kp_, 1.0f);
    s_.beta[i] = 0.0f;
  }

  // Token t into row i of the chunk: k and q L2-normalised (q with the scale), beta, and the raw
  // gate row into `gate`.
  FLASH_KDA_INLINE void load_token(int64_t i, int64_t t, float* gate) {
    float* k_row = s_.k_hat.data() + i * Kp_;
    float* q_row = s_.q_hat.data() + i * Kp_;
    if (t + kChunk < task_.length) prefetch_token(t + kChunk);
    load_row(task_.k + t * task_.k_stride, K_, Kp_, k_row);
    l2_normalise(k_row, Kp_, 1.0f);
    load_row(task_.q + t * task_.q_stride, K_, Kp_, q_row);
    l2_normalise(q_row, Kp_, p_.scale);
    s_.beta[i] = beta_scale_ * sigmoid(bf16_to_float(task_.beta[t * task_.beta_stride]));
    load_row(task_.g + t * task_.g_stride, K_, Kp_, gate);
  }

  // Normalised keys and queries, cumulative gates and every decayed operand of the chunk. Rows L..C-1
  // (a partial last chunk) get zero keys and queries and unit decay so the fixed-width products below
  // stay finite; they are never read back.
  FLASH_KDA_INLINE void prepare(int64_t t0, int64_t L) {
    const float gate_rate = std::exp(task_.A_log);
    const float lower_bound = p_.lower_bound;
    float* gate = s_.gate.data();
    float* gate_sum = s_.gate_sum.data();
    std::fill(gate_sum, gate_sum + Kp_, 0.0f);
    for (int64_t i = 0; i < kChunk; ++i) {
      float* e_row = s_.decay.data() + i * Kp_;
      if (i >= L) {
        pad_token(i);
        continue;
      }
      load_token(i, t0 + i, gate);
      for (int64_t c = 0; c < Kp_; c += W) {
        // a = lower_bound · sigmoid(exp(A_log) (g + dt_bias)); G += a; E = exp(G)
        const Vec z = (S::load(gate + c) + S::load(s_.dt_bias.data() + c)) * gate_rate;
        const Vec g_sum = S::load(gate_sum + c) + lower_bound / (1.0f + S::exp(-z));
        S::store(gate_sum + c, g_sum);
        S::store(e_row + c, S::exp(g_sum));
      }
    }

    // The intra-chunk products use decays referenced to the middle token m, so both factors of
    // exp(G_t − G_s) = exp(G_t − G_m) · exp(G_m − G_s) stay within exp(±40), away from denormals.
    const float* e_mid = s_.decay.data() + (L - 1) / 2 * Kp_;
    const float* e_last = s_.decay.data() + (L - 1) * Kp_;
    float* kq_start_t = s_.kq_start_t.data();
    float* k_bar_mid_t = s_.k_bar_mid_t.data();
    for (int64_t i = 0; i < kChunk; ++i) {
      const float* k_row = s_.k_hat.data() + i * Kp_;
      const float* q_row = s_.q_hat.data() + i * Kp_;
      const float* e_row = s_.decay.data() + i * Kp_;
      float* k_mid = s_.kq_mid.data() + i * Kp_;
      float* q_mid = s_.kq_mid.data() + (kChunk + i) * Kp_;
      float* k_dec = s_.k_dec.data() + i * Kp_;
      for (int64_t c = 0; c < Kp_; c += W) {
        const Vec k = S::load(k_row + c), q = S::load(q_row + c);
        const Vec e = S::load(e_row + c), em = S::load(e_mid + c);
        const Vec inv_e = 1.0f / e, to_mid = e / em;
        S::store(k_mid + c, k * to_mid);
        S::store(q_mid + c, q * to_mid);
        S::store(k_dec + c, k * (S::load(e_last + c) * inv_e));
        const Vec k_bar_mid = k * (em * inv_e), k_start = k * e, q_start = q * e;
        for (int j = 0; j < W; ++j) {
          k_bar_mid_t[(c + j) * kChunk + i] = k_bar_mid[j];
          kq_start_t[(c + j) * 2 * kChunk + i] = k_start[j];
          kq_start_t[(c + j) * 2 * kChunk + kChunk + i] = q_start[j];
        }
      }
    }
  }

  // The chunk's operands under the softplus gate, a = -exp(A_log) softplus(g + dt_bias) without a
  // floor: one token may decay a channel by e^-200 and a chunk by e^-1e4, where prepare()'s factors
  // exp(G_t), 1/exp(G_s) and exp(G_t - G_m) overflow to Inf and meet zeros (Inf · 0 = NaN). Here no
  // factor is a ratio or an exponential of a difference: with alpha_j = exp(a_j) in [0, 1] per token,
  //   E_t = Π_{j<=t} alpha_j,   Kdec_s = k_s ⊙ Π_{s<j<L} alpha_j,
  //   A[t,s] = Σ_c k_t k_s Π_{s<j<=t} alpha_j,   M[t,s] = the same with scale q_hat_t (s <= t),
  // each product formed as a running product. A product of numbers in [0, 1] cannot overflow and has
  // a relative error of at most one ulp per factor (no cancellation, unlike G_t - G_s of a large
  // cumulative sum), so the chunk stays within the spec's tolerances whatever the decay. Factors
  // below 1e-30 are flushed to 0: what they would add is below 1e-30 of the term they scale (fp32
  // resolves 6e-8), and no denormal is ever multiplied. A and M are formed pair by pair (C(C+1)/2
  // pairs of Kp-long products, about the cost of prepare()'s mid-referenced product); rows L..C-1
  // are set up as in prepare().
  FLASH_KDA_INLINE void prepare_unbounded(int64_t t0, int64_t L) {
    const float gate_rate = std::exp(task_.A_log);
    const Vec tiny = S::splat(1e-30f), zero{}, one = S::splat(1.0f);
    auto flush = [&](Vec x) { return x < tiny ? zero : x; };
    float* gate = s_.gate.data();
    for (int64_t i = 0; i < kChunk; ++i) {
      float* e_row = s_.decay.data() + i * Kp_;
      float* a_row = s_.alpha.data() + i * Kp_;
      if (i >= L) {
        pad_token(i);
        std::fill(a_row, a_row + Kp_, 1.0f);
        continue;
      }
      load_token(i, t0 + i, gate);
      const float* e_prev = i > 0 ? s_.decay.data() + (i - 1) * Kp_ : nullptr;
      for (int64_t c = 0; c < Kp_; c += W) {
        const Vec x = S::load(gate + c) + S::load(s_.dt_bias.data() + c);
        const Vec alpha = flush(S::exp(-S::rate_softplus(x, task_.A_log, gate_rate)));
        S::store(a_row + c, alpha);
        S::store(e_row + c, e_prev ? flush(S::load(e_prev + c) * alpha) : alpha);
      }
    }

    // Kdec_s = k_s ⊙ Π_{s<j<L} alpha_j (backwards from the last token) and the transposed start
    // operands [Kt; Qt] = [k_hat; q_hat] ⊙ E, as in prepare().
    float* tail = s_.run_product.data();
    std::fill(tail, tail + Kp_, 1.0f);
    float* kq_start_t = s_.kq_start_t.data();
    for (int64_t i = kChunk; i-- > 0;) {
      const float* k_row = s_.k_hat.data() + i * Kp_;
      const float* q_row = s_.q_hat.data() + i * Kp_;
      const float* e_row = s_.decay.data() + i * Kp_;
      float* k_dec = s_.k_dec.data() + i * Kp_;
      for (int64_t c = 0; c < Kp_; c += W) {
        const Vec k = S::load(k_row + c), e = S::load(e_row + c);
        if (i < L) {
          S::store(k_dec + c, k * S::load(tail + c));
          if (i > 0) S::store(tail + c, flush(S::load(tail + c) * S::load(s_.alpha.data() + i * Kp_ + c)));
        } else {
          S::store(k_dec + c, zero);
        }
        const Vec k_start = k * e, q_start = S::load(q_row + c) * e;
        for (int j = 0; j < W; ++j) {
          kq_start_t[(c + j) * 2 * kChunk + i] = k_start[j];
          kq_start_t[(c + j) * 2 * kChunk + kChunk + i] = q_start[j];
        }
      }
    }

    // A[t,s] (s < t) and M[t,s] (s <= t): for each s, the running product P = Π_{s<j<=t} alpha_j.
    float* product = s_.run_product.data();
    for (int64_t s = 0; s < L; ++s) {
      const float* k_s = s_.k_hat.data() + s * Kp_;
      for (int64_t c = 0; c < Kp_; c += W) S::store(product + c, one);
      for (int64_t t = s; t < L; ++t) {
        const float* k_t = s_.k_hat.data() + t * Kp_;
        const float* q_t = s_.q_hat.data() + t * Kp_;
        const float* a_t = s_.alpha.data() + t * Kp_;
        Vec acc_a{}, acc_m{};
        for (int64_t c = 0; c < Kp_; c += W) {
          Vec f = S::load(product + c);
          if (t > s) {
            f = flush(f * S::load(a_t + c));
            S::store(product + c, f);
          }
          const Vec kf = S::load(k_s + c) * f;
          acc_a += S::load(k_t + c) * kf;
          acc_m += S::load(q_t + c) * kf;
        }
        if (t > s) s_.intra[size_t(t * kChunk + s)] = S::sum(acc_a);
        s_.intra[size_t((kChunk + t) * kChunk + s)] = S::sum(acc_m);
      }
    }
  }

  // inter and intra (the sigmoid gate's chunk operands).
  FLASH_KDA_INLINE void products() {
    inter_products();
    intra_products();
  }

  // inter = [Kt; Qt] · S0ᵀ (2C × Vp) and intra = [Kt; Qt]_mid · Kbar_midᵀ (2C × C). Each pass holds 8
  // accumulator registers at any width: kRows rows of S share every load of [Kt; Qt], and intra
  // takes W/2 rows at once (with one row its two accumulator chains waited on the FMA latency). The
  // accumulators hold rows of S0 · [Kt; Qt]ᵀ; they are stored transposed so the solve reads inter by rows.
  FLASH_KDA_INLINE void inter_products() {
    constexpr int kVecs = 2 * kChunk / W;  // vectors per row of S0 · [Kt; Qt]ᵀ
    const float* kq_start_t = s_.kq_start_t.data();
    for (int64_t r = 0; r < Vp_; r += kRows) {
      const float* rows = s_.state.data() + r * Kp_;
      Vec acc[kRows][kVecs] = {};
      for (int64_t c = 0; c < Kp_; ++c) {
        const float* x = kq_start_t + c * 2 * kChunk;
        for (int j = 0; j < kVecs; ++j) {
          const Vec xj = S::load(x + j * W);
          for (int i = 0; i < kRows; ++i) acc[i][j] += rows[i * Kp_ + c] * xj;
        }
      }
      for (int i = 0; i < kRows; ++i)
        for (int j = 0; j < kVecs; ++j)
          for (int lane = 0; lane < W; ++lane) s_.inter[size_t((j * W + lane) * Vp_ + r + i)] = acc[i][j][lane];
    }
  }

  FLASH_KDA_INLINE void intra_products() {
    constexpr int kIntraVecs = kChunk / W, kIntraRows = W / 2;
    const float* k_bar_mid_t = s_.k_bar_mid_t.data();
    for (int64_t i0 = 0; i0 < 2 * kChunk; i0 += kIntraRows) {
      const float* x = s_.kq_mid.data() + i0 * Kp_;
      Vec acc[kIntraRows][kIntraVecs] = {};
      for (int64_t c = 0; c < Kp_; ++c)
        for (int j = 0; j < kIntraVecs; ++j) {
          const Vec y = S::load(k_bar_mid_t + c * kChunk + j * W);
          for (int i = 0; i < kIntraRows; ++i) acc[i][j] += x[i * Kp_ + c] * y;
        }
      for (int i = 0; i < kIntraRows; ++i)
        for (int j = 0; j < kIntraVecs; ++j) S::store(s_.intra.data() + (i0 + i) * kChunk + j * W, acc[i][j]);
    }
  }

  // U by forward substitution, U_t = β_t (v_t − Kt_t S0ᵀ − Σ_{s<t} A[t,s] U_s), then
  // O_t = Qt_t S0ᵀ + Σ_{s<=t} M[t,s] U_s. The causal masks are the loop bounds (selection), so the
  // unused upper entries of intra never meet a multiplication.
  FLASH_KDA_INLINE void solve_and_output(int64_t t0, int64_t L) {
    const float* inter = s_.inter.data();
    const float* intra = s_.intra.data();
    float* u = s_.u.data();
    float* o = s_.o.data();
    for (int64_t t = 0; t < L; ++t) {
      const uint16_t* v = task_.v + (t0 + t) * task_.v_stride;
      float* u_t = u + t * Vp_;
      for (int64_t r = 0; r < Vp_; ++r) u_t[r] = -inter[t * Vp_ + r];
      for (int64_t r = 0; r < V_; ++r) u_t[r] += bf16_to_float(v[r]);
      for (int64_t s = 0; s < t; ++s) {
        const float a = intra[t * kChunk + s];
        const float* u_s = u + s * Vp_;
        for (int64_t r = 0; r < Vp_; ++r) u_t[r] -= a * u_s[r];
      }
      const float beta = s_.beta[t];
      for (int64_t r = 0; r < Vp_; ++r) u_t[r] *= beta;
    }
    for (int64_t t = 0; t < L; ++t) {
      for (int64_t r = 0; r < Vp_; ++r) o[r] = inter[(kChunk + t) * Vp_ + r];
      for (int64_t s = 0; s <= t; ++s) {
        const float m = intra[(kChunk + t) * kChunk + s];
        const float* u_s = u + s * Vp_;
        for (int64_t r = 0; r < Vp_; ++r) o[r] += m * u_s[r];
      }
      uint16_t* out = task_.out + (t0 + t) * task_.out_stride;
      for (int64_t r = 0; r < V_; ++r) out[r] = float_to_bf16(o[r]);
    }
  }

  // S = S0 · Diag(E_L) + Uᵀ · Kdec, on blocks of two rows × kBlock columns held in registers.
  FLASH_KDA_INLINE void update_state(int64_t L) {
    constexpr int kVecs = kBlock / W;
    const float* e_last = s_.decay.data() + (L - 1) * Kp_;
    const float* u = s_.u.data();
    for (int64_t r = 0; r < Vp_; r += 2) {
      float* row0 = s_.state.data() + r * Kp_;
      float* row1 = row0 + Kp_;
      for (int64_t c0 = 0; c0 < Kp_; c0 += kBlock) {
        Vec acc0[kVecs], acc1[kVecs];
        for (int j = 0; j < kVecs; ++j) {
          const Vec e = S::load(e_last + c0 + j * W);
          acc0[j] = S::load(row0 + c0 + j * W) * e;
          acc1[j] = S::load(row1 + c0 + j * W) * e;
        }
        for (int64_t s = 0; s < L; ++s) {
          const float u0 = u[s * Vp_ + r], u1 = u[s * Vp_ + r + 1];
          const float* k_dec = s_.k_dec.data() + s * Kp_ + c0;
          for (int j = 0; j < kVecs; ++j) {
            const Vec k = S::load(k_dec + j * W);
            acc0[j] += u0 * k;
            acc1[j] += u1 * k;
          }
        }
        for (int j = 0; j < kVecs; ++j) {
          S::store(row0 + c0 + j * W, acc0[j]);
          S::store(row1 + c0 + j * W, acc1[j]);
        }
      }
    }
  }

  const HostRun& run_;
  const ProblemParams& p_;
  const HeadTask& task_;
  ChunkedScratch& s_;
  const int64_t K_, V_, Kp_, Vp_;
  const bool softplus_ = p_.gate == GateForm::kSoftplus;
  const float beta_scale_ = p_.allow_neg_eigval ? 2.0f : 1.0f;  // beta = 2 sigmoid(logit): exact doubling
};

}  // namespace

Status chunked_fwd(const HostRun& run) { return IsaDispatch<HeadRunner, ChunkedScratch>::run(run); }

}  // namespace flash_kda::cpu
