// A plain fp32 per-token recurrence on the GPU, written straight from the contract's equations
// (every gate form of docs/spec.md, "Gate forms").
// It stands in for the float64 reference on cases too large for the CPU; tests/gpu/test_cuda_forward.cu
// first shows that it agrees with the float64 reference on small cases.
#pragma once

#include <cuda_bf16.h>

#include "flash_kda/flash_kda.h"

namespace flash_kda::gpu_test {

struct RecurrenceArgs {
  const __nv_bfloat16 *q, *k, *v, *g, *beta;
  const float *A_log, *dt_bias;  // A_log nullptr: rate 1 (the sigmoid gate only)
  const float* initial_state;    // fp32 or nullptr
  float* final_state;            // fp32 [N, HV, D, D]
  float* out;                    // fp32 [total tokens, HV, D] (token index as in the inputs)
  const int64_t* starts;         // [N] first token (flat index over B*T)
  const int64_t* lens;           // [N]
  int H, HV;
  float scale, lower_bound;
  bool softplus_gate = false;     // a = -exp(A_log) softplus(g + dt_bias) instead of the sigmoid gate
  bool allow_neg_eigval = false;  // beta = 2 sigmoid(logit)
};

// log(1 + e^x) for every finite x: max(x, 0) + log1p(e^-|x|) (no cutoff, unlike the kernels'; +Inf
// stays +Inf).
__device__ inline float reference_softplus(float x) { return fmaxf(x, 0.f) + log1pf(expf(-fabsf(x))); }

// One block of D threads per (sequence, value head); thread v owns state row v in shared memory.
// D = K = V: 128 or 64.
template <int D>
__global__ void recurrence_kernel(RecurrenceArgs a) {
  constexpr int kWarps = D / 32;
  __shared__ float S[D][D + 1];
  __shared__ float k_hat[D], q_hat[D], alpha[D], red[2][kWarps];
  const int n = blockIdx.x / a.HV, hv = blockIdx.x % a.HV, hq = hv / (a.HV / a.H);
  const int v = threadIdx.x, lane = v & 31, warp = v >> 5;
  for (int c = 0; c < D; ++c)
    S[v][c] = a.initial_state ? a.initial_state[((int64_t(n) * a.HV + hv) * D + v) * D + c] : 0.f;
  const float exp_a = a.A_log ? expf(a.A_log[hv]) : 1.f;
  for (int64_t i = 0; i < a.lens[n]; ++i) {
    const int64_t tok = a.starts[n] + i;
    const float qc = __bfloat162float(a.q[(tok * a.H + hq) * D + v]);
    const float kc = __bfloat162float(a.k[(tok * a.H + hq) * D + v]);
    float sq = qc * qc, sk = kc * kc;
    for (int o = 16; o > 0; o >>= 1) {
      sq += __shfl_xor_sync(0xffffffffu, sq, o);
      sk += __shfl_xor_sync(0xffffffffu, sk, o);
    }
    if (lane == 0) red[0][warp] = sq, red[1][warp] = sk;
    // docs/spec.md, "Gate forms", as written (no flush: a factor of e^-200 underflows to 0 by itself).
    const float x = __bfloat162float(a.g[(tok * a.HV + hv) * D + v]) + a.dt_bias[hv * D + v];
    alpha[v] = a.softplus_gate ? expf(-exp_a * reference_softplus(x)) : expf(a.lower_bound / (1.f + expf(-exp_a * x)));
    __syncthreads();
    float sum_q = 0.f, sum_k = 0.f;
    for (int w = 0; w < kWarps; ++w) sum_q += red[0][w], sum_k += red[1][w];
    const float nq = sqrtf(sum_q + 1e-6f);
    const float nk = sqrtf(sum_k + 1e-6f);
    q_hat[v] = qc / nq;
    k_hat[v] = kc / nk;
    __syncthreads();
    const float beta = (a.allow_neg_eigval ? 2.f : 1.f) / (1.f + expf(-__bfloat162float(a.beta[tok * a.HV + hv])));
    float pred = 0.f;
    for (int c = 0; c < D; ++c) {
      S[v][c] *= alpha[c];
      pred += S[v][c] * k_hat[c];
    }
    const float delta = beta * (__bfloat162float(a.v[(tok * a.HV + hv) * D + v]) - pred);
    float o = 0.f;
    for (int c = 0; c < D; ++c) {
      S[v][c] += delta * k_hat[c];
      o += S[v][c] * q_hat[c];
    }
    a.out[(tok * a.HV + hv) * D + v] = a.scale * o;
    __syncthreads();
  }
  for (int c = 0; c < D; ++c) a.final_state[((int64_t(n) * a.HV + hv) * D + v) * D + c] = S[v][c];
}

// The kernel for head dimension `dim` (128 or 64), one block per (sequence, value head).
inline void launch_recurrence(const RecurrenceArgs& a, int dim, unsigned blocks) {
  if (dim == 64) {
    recurrence_kernel<64><<<blocks, 64>>>(a);
  } else {
    recurrence_kernel<128><<<blocks, 128>>>(a);
  }
}

}  // namespace flash_kda::gpu_test
