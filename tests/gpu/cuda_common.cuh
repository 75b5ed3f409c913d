// What the GPU tests of tests/gpu and the C++ benchmark bench/cpp/kda_bench.cu share: CUDA error
// checks, the seeded generator, host <-> device copies, the forward plan under test and its
// workspace, inputs generated on the device for the large cases, and the benchmark's prefill cases
// (python/flash_kda/bench/cases.json through the generated bench_cases.h, and K = V = 64 cases of
// their own). No GoogleTest here: bench/cpp/kda_bench.cu includes it too.
//
// Each including executable is one translation unit of these headers: everything is in an unnamed
// namespace.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench_cases.h"  // generated: FLASH_KDA_BENCH_CASES (see bench_cases() below)
#include "common/bf16.h"
#include "flash_kda/flash_kda.h"

// A CUDA call that fails ends the process (exit 2): after most errors the context is unusable.
#define CUDA_OK(x)                                                                            \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(2);                                                                           \
    }                                                                                         \
  } while (0)

namespace flash_kda::gpu_test {
namespace {

constexpr int kDefaultDim = 128;  // K = V of a case unless it says otherwise (Case::dim, DecodeCase::dim: 128 or 64)

// The seed of every random input of the process: fresh each run and printed first, or
// FLASH_KDA_TEST_SEED=N (as in the C++ tests of tests/cpp) to replay a run's inputs: the same
// executable with the same gtest filter and plans (FLASH_KDA_GPU_PLANS) draws them in the same order.
uint64_t& seed_value() {
  static uint64_t seed = [] {
    const char* fixed = std::getenv("FLASH_KDA_TEST_SEED");
    const uint64_t s = fixed != nullptr ? std::strtoull(fixed, nullptr, 0) : std::random_device{}();
    std::printf("seed %llu (replay: FLASH_KDA_TEST_SEED=%llu)\n", static_cast<unsigned long long>(s),
                static_cast<unsigned long long>(s));
    return s;
  }();
  return seed;
}

std::mt19937_64& rng() {
  static std::mt19937_64 r(seed_value());
  return r;
}

// True where a CUDA device is present (the GPU tests skip elsewhere, the benchmark exits 77).
bool cuda_device_present() {
  int devices = 0;
  return cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0;
}

template <typename T>
T* upload(const std::vector<T>& x) {
  T* d = nullptr;
  CUDA_OK(cudaMalloc(&d, std::max<size_t>(x.size(), 1) * sizeof(T)));
  if (!x.empty()) CUDA_OK(cudaMemcpy(d, x.data(), x.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

template <typename T>
std::vector<T> download(const T* d, size_t n) {
  std::vector<T> x(n);
  if (n) CUDA_OK(cudaMemcpy(x.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return x;
}

// ---- the forward plan under test and its workspace ------------------------------------------------

// A forward plan by name (docs/kernel.md, "Plans"): auto, fused, prepared, split or split:L (L chunks
// a segment); prepared and split with 16 or 32 appended force the walk's step (FwdParams::walk_tokens),
// e.g. prepared32, split32:4.
struct PlanChoice {
  std::string name;
  FwdPlan plan = FwdPlan::kAuto;
  int64_t segment_chunks = 0;
  int walk_tokens = 0;  // a name ending in 16 or 32 (before any :L) forces FwdParams::walk_tokens
};
PlanChoice g_plan;                                       // applied by run_fwd to every CUDA forward
std::vector<PlanChoice> g_plans = {PlanChoice{"auto"}};  // the tests and the benchmark loop over these

PlanChoice parse_plan(const std::string& s) {
  PlanChoice c{s};
  std::string kind = s.substr(0, s.find(':'));
  for (const int w : {16, 32}) {
    const std::string suffix = std::to_string(w);
    if (kind.size() > suffix.size() && kind.compare(kind.size() - suffix.size(), suffix.size(), suffix) == 0) {
      c.walk_tokens = w;
      kind.resize(kind.size() - suffix.size());
    }
  }
  if (kind == "auto")
    c.plan = FwdPlan::kAuto;
  else if (kind == "fused")
    c.plan = FwdPlan::kFused;
  else if (kind == "prepared")
    c.plan = FwdPlan::kPrepared;
  else if (kind == "split")
    c.plan = FwdPlan::kSplit;
  else {
    std::fprintf(stderr,
                 "unknown plan '%s' (auto, fused, prepared, split, split:L; prepared and split with 16 or 32 "
                 "appended force the walk's step, e.g. split16:4)\n",
                 s.c_str());
    std::exit(2);
  }
  if (s.find(':') != std::string::npos) c.segment_chunks = std::atoll(s.c_str() + s.find(':') + 1);
  return c;
}

// A comma-separated list of plan names ("auto,fused,split:4").
std::vector<PlanChoice> parse_plan_list(const std::string& list) {
  std::vector<PlanChoice> plans;
  for (size_t pos = 0; pos <= list.size();) {
    const size_t end = std::min(list.find(',', pos), list.size());
    plans.push_back(parse_plan(list.substr(pos, end - pos)));
    pos = end + 1;
  }
  return plans;
}

// fwd with the plan under test; CUDA calls get a workspace (one buffer, grown on demand; the first
// call of a size allocates, so timed loops warm up first).
Status run_fwd(FwdParams p, cudaStream_t stream = nullptr) {
  if (p.backend != Backend::kCuda) return fwd(p, stream);
  p.plan = g_plan.plan;
  p.segment_chunks = g_plan.segment_chunks;
  // A forced 32-token step where it cannot run (K = V = 64, softplus, a checkpoint interval that is
  // not a multiple of 32) falls back to the backend's choice: the cases of a check run mix them.
  p.walk_tokens = g_plan.walk_tokens;
  if (p.walk_tokens == 32 && (p.head_dim_k == 64 || p.gate == GateForm::kSoftplus || p.checkpoint_interval % 32 != 0))
    p.walk_tokens = 0;
  static void* ws = nullptr;
  static size_t ws_bytes = 0;
  const size_t need = workspace_size(p);
  if (need > ws_bytes) {
    if (ws) CUDA_OK(cudaFree(ws));
    CUDA_OK(cudaMalloc(&ws, need));
    ws_bytes = need;
  }
  p.workspace = ws;
  p.workspace_bytes = ws_bytes;
  static const bool graph = [] {
    const char* e = std::getenv("FLASH_KDA_GPU_GRAPH");
    return e != nullptr && std::string(e) == "1";
  }();
  if (!graph || stream != nullptr) return fwd(p, stream);
  // Captured on a stream of its own, then replayed once: a refusal is returned before anything is
  // captured (validation writes nothing), so its status is the call's. The inputs were uploaded by
  // cudaMemcpy from pageable memory, which may return before its DMA lands; work on the legacy
  // default stream is ordered after it, work on a non-blocking stream is not: synchronise first.
  CUDA_OK(cudaDeviceSynchronize());
  cudaStream_t s = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  const Status st = fwd(p, s);
  cudaGraph_t g = nullptr;
  CUDA_OK(cudaStreamEndCapture(s, &g));
  if (st.ok()) {
    cudaGraphExec_t exec = nullptr;
    CUDA_OK(cudaGraphInstantiate(&exec, g, 0));
    CUDA_OK(cudaGraphLaunch(exec, s));
    CUDA_OK(cudaStreamSynchronize(s));
    CUDA_OK(cudaGraphExecDestroy(exec));
  }
  CUDA_OK(cudaGraphDestroy(g));
  CUDA_OK(cudaStreamDestroy(s));
  return st;
}

// ---- device-side inputs for the large cases (host generation of ~10^9 normals would dominate) ----

__device__ uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Standard normal (Box-Muller on a counter-based hash) * mul + add, stored as bf16.
__global__ void fill_normal_kernel(__nv_bfloat16* x, int64_t n, uint64_t seed, float mul, float add) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t h = splitmix64(seed ^ splitmix64(uint64_t(i)));
    const float u1 = (float((h >> 40) & 0xffffff) + 1.f) * (1.f / 16777217.f);
    const float u2 = float((h >> 8) & 0xffffff) * (1.f / 16777216.f);
    x[i] = __float2bfloat16_rn(sqrtf(-2.f * logf(u1)) * cospif(2.f * u2) * mul + add);
  }
}

struct DeviceCase {  // a large case generated and kept on the device (contiguous, fp32 states)
  int64_t B, T, N, H, tok;
  int64_t dim;  // K = V
  std::vector<int64_t> cu;
  __nv_bfloat16 *q, *k, *v, *g, *beta, *out;
  float *A_log, *dt_bias, *s0, *s1;
  int64_t* d_cu = nullptr;
};

template <typename T>
T* dev_alloc(size_t n) {
  T* p = nullptr;
  CUDA_OK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
  return p;
}

DeviceCase make_device_case(const std::vector<int64_t>& lens, int64_t batch, int64_t seqlen, int H, int D) {
  DeviceCase d{};
  d.H = H;
  d.dim = D;
  if (!lens.empty()) {
    d.B = 1;
    d.cu.push_back(0);
    for (int64_t l : lens) d.cu.push_back(d.cu.back() + l);
    d.T = d.cu.back();
    d.N = int64_t(lens.size());
    d.d_cu = upload(d.cu);
  } else {
    d.B = batch, d.T = seqlen, d.N = batch;
  }
  d.tok = d.B * d.T;
  const uint64_t seed = rng()();
  auto normal = [&](int64_t n, uint64_t salt, float mul, float add) {
    auto* p = dev_alloc<__nv_bfloat16>(n);
    fill_normal_kernel<<<1024, 256>>>(p, n, seed + salt, mul, add);
    CUDA_OK(cudaGetLastError());
    return p;
  };
  d.q = normal(d.tok * H * D, 1, 1.f, 0.f);
  d.k = normal(d.tok * H * D, 2, 1.f, 0.f);
  d.v = normal(d.tok * H * D, 3, 1.f, 0.f);
  d.g = normal(d.tok * H * D, 4, 1.f, 0.f);
  d.beta = normal(d.tok * H, 5, 1.f, 0.f);
  d.out = dev_alloc<__nv_bfloat16>(d.tok * H * D);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  std::normal_distribution<float> nd;
  std::vector<float> A_log(H), dt(H * D), s0(d.N * H * D * D);
  for (auto& e : A_log) e = u(rng());
  for (auto& e : dt) e = u(rng());
  for (auto& e : s0) e = nd(rng());
  d.A_log = upload(A_log);
  d.dt_bias = upload(dt);
  d.s0 = upload(s0);
  d.s1 = dev_alloc<float>(s0.size());
  CUDA_OK(cudaDeviceSynchronize());
  return d;
}

void free_device_case(DeviceCase& d) {
  for (void* p :
       {static_cast<void*>(d.q), static_cast<void*>(d.k), static_cast<void*>(d.v), static_cast<void*>(d.g),
        static_cast<void*>(d.beta), static_cast<void*>(d.out), static_cast<void*>(d.A_log),
        static_cast<void*>(d.dt_bias), static_cast<void*>(d.s0), static_cast<void*>(d.s1), static_cast<void*>(d.d_cu)})
    if (p) cudaFree(p);
}

FwdParams device_params(const DeviceCase& d) {
  FwdParams p;
  p.batch = d.B, p.seqlen = d.T, p.heads = d.H;
  p.head_dim_k = p.head_dim_v = d.dim;
  p.scale = 1.f / std::sqrt(float(d.dim));
  p.lower_bound = -5.f;
  p.state_dtype = DType::kF32;
  p.q = d.q, p.k = d.k, p.v = d.v, p.g = d.g, p.beta = d.beta, p.out = d.out;
  p.A_log = d.A_log, p.dt_bias = d.dt_bias, p.initial_state = d.s0, p.final_state = d.s1;
  if (d.d_cu) {
    p.cu_seqlens = d.d_cu;
    p.cu_seqlens_dtype = DType::kI64;
    p.num_seqs = d.N;
  }
  p.backend = Backend::kCuda;
  return p;
}

// The benchmark's cases, written once for the C++ benchmark and the Python suite: python/flash_kda/
// bench/cases.json, turned into bench_cases.h at configure time (cmake/BenchCases.cmake).
// bench/cpp/kda_bench.cu times them, tests/gpu/test_cuda_forward.cu runs a subset against the fp32
// GPU recurrence.

struct BenchCase {
  const char* id;
  const char* group;  // "prefill", "serving" (python/flash_kda/bench/cases.py) or "tool_only"
  std::vector<int64_t> lens;
  int64_t batch, seqlen;
  int H;
  bool softplus = false;  // the softplus gate (Kimi-Linear-48B; docs/spec.md, "Gate forms")
  int dim = kDefaultDim;  // K = V (cases.json's are 128)
};

// cases.json's cases, then K = V = 64 cases of the C++ benchmark and tests alone (like cases.json's
// tool_only group; the Python suite and cases.json stay K = V = 128): fixed96's and fixed16's
// shapes, the largest and the smallest head count of the prefill table (both run the split plan
// under auto; kda_bench --plans fused times the fused kernel with 4 and 1 consumer warps), and
// fixed16's with the softplus gate.
const std::vector<BenchCase>& bench_cases() {
  static const std::vector<BenchCase> cases = [] {
    std::vector<BenchCase> c = {FLASH_KDA_BENCH_CASES};
    c.push_back({"fixed96_d64", "tool_only", {}, 1, 8192, 96, false, 64});
    c.push_back({"fixed16_d64", "tool_only", {}, 1, 8192, 16, false, 64});
    c.push_back({"fixed16_d64_sp", "tool_only", {}, 1, 8192, 16, true, 64});
    return c;
  }();
  return cases;
}

}  // namespace
}  // namespace flash_kda::gpu_test
