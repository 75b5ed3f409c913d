// A complete flash-kda program: one KDA forward over a packed batch of two sequences, with fp32
// states, checked against the float64 reference. It runs on the CUDA backend when this build of
// flash-kda has it and an sm_90 GPU (H100, H200) is present, else on the CPU backend.
//
//   kda_forward [--backend auto|cpu|cuda]        (auto is the default)
//
// Build it against an installed flash-kda (docs/quickstart-cpp.md):
//   cmake -S examples -B build/example -DCMAKE_PREFIX_PATH=<flash-kda prefix> && cmake --build build/example
#include <flash_kda/bf16.h>
#include <flash_kda/flash_kda.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

constexpr int64_t kHeads = 4;  // H = HV
constexpr int64_t kDim = 128;  // K = V = 128 (the CUDA kernels run 128 and 64)
const std::vector<int64_t> kLengths = {300, 77};

// Exits with the call's message when a flash-kda call failed.
void check(const flash_kda::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s failed: %s\n", what, s.message.c_str());
    std::exit(1);
  }
}

// Relative L2 distance ||x - ref|| / ||ref||.
double rel_error(const std::vector<float>& x, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double d = double(x[i]) - ref[i];
    num += d * d;
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num / den);
}

// The host inputs of one problem: bf16 activations (as uint16_t bit patterns, see bf16.h), fp32
// gate parameters and initial state, int64 cu_seqlens.
struct Problem {
  int64_t tokens = 0;  // T: the packed length
  int64_t seqs = 0;    // N
  std::vector<uint16_t> q, k, v, g, beta;
  std::vector<float> A_log, dt_bias, initial_state;
  std::vector<int64_t> cu_seqlens;

  size_t act_size() const { return size_t(tokens * kHeads * kDim); }
  size_t state_size() const { return size_t(seqs * kHeads * kDim * kDim); }
};

Problem make_problem(uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> uniform(0.f, 1.f);
  auto draw = [&](size_t n, auto& dist) {
    std::vector<float> x(n);
    for (float& e : x) e = dist(rng);
    return x;
  };
  Problem pb;
  pb.seqs = int64_t(kLengths.size());
  pb.cu_seqlens = {0};
  for (int64_t len : kLengths) pb.cu_seqlens.push_back(pb.cu_seqlens.back() + len);
  pb.tokens = pb.cu_seqlens.back();
  pb.q = flash_kda::bf16::from_float(draw(pb.act_size(), normal));
  pb.k = flash_kda::bf16::from_float(draw(pb.act_size(), normal));
  pb.v = flash_kda::bf16::from_float(draw(pb.act_size(), normal));
  pb.g = flash_kda::bf16::from_float(draw(pb.act_size(), normal));
  pb.beta = flash_kda::bf16::from_float(draw(size_t(pb.tokens * kHeads), normal));
  pb.A_log = draw(size_t(kHeads), uniform);
  pb.dt_bias = draw(size_t(kHeads * kDim), uniform);
  pb.initial_state = draw(pb.state_size(), normal);
  return pb;
}

// The parameters of a forward over `pb`'s shapes; the caller sets the pointers and the backend.
flash_kda::FwdParams base_params(const Problem& pb) {
  flash_kda::FwdParams p;
  p.batch = 1;  // a packed batch: B = 1, the sequences are cut by cu_seqlens
  p.seqlen = pb.tokens;
  p.heads = kHeads;
  p.head_dim_k = p.head_dim_v = kDim;
  p.scale = 1.0f / std::sqrt(float(kDim));
  p.lower_bound = -5.0f;
  p.state_dtype = flash_kda::DType::kF32;
  p.cu_seqlens_dtype = flash_kda::DType::kI64;
  p.num_seqs = pb.seqs;
  return p;
}

struct Result {
  std::vector<float> out, final_state;
};

// The forward on a CPU backend (kCpu, or kCpuReference: the float64 recurrence).
Result run_host(const Problem& pb, flash_kda::Backend backend) {
  std::vector<uint16_t> out(pb.act_size());
  Result r;
  r.final_state.resize(pb.state_size());
  flash_kda::FwdParams p = base_params(pb);
  p.q = pb.q.data(); p.k = pb.k.data(); p.v = pb.v.data(); p.g = pb.g.data(); p.beta = pb.beta.data();
  p.A_log = pb.A_log.data(); p.dt_bias = pb.dt_bias.data();
  p.initial_state = pb.initial_state.data();
  p.final_state = r.final_state.data();
  p.cu_seqlens = pb.cu_seqlens.data();
  p.out = out.data();
  p.backend = backend;
  std::vector<unsigned char> workspace(flash_kda::workspace_size(p));  // 0 bytes on the CPU today
  p.workspace = workspace.data();
  p.workspace_bytes = workspace.size();
  check(flash_kda::fwd(p), "flash_kda::fwd (CPU)");  // returns when the result is written
  r.out = flash_kda::bf16::to_float(out);
  return r;
}

#ifdef FLASH_KDA_WITH_CUDA  // defined by the flash_kda::flash_kda target of a CUDA build
void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// Device memory holding a copy of a host vector (or n uninitialised bytes).
struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  explicit DeviceBuffer(size_t n) : bytes(n) {
    if (n) cuda_check(cudaMalloc(&ptr, n), "cudaMalloc");
  }
  template <class T>
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size() * sizeof(T)) {
    cuda_check(cudaMemcpy(ptr, host.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy to the GPU");
  }
  template <class T>
  void copy_to(std::vector<T>& host) const {
    cuda_check(cudaMemcpy(host.data(), ptr, host.size() * sizeof(T), cudaMemcpyDeviceToHost),
               "cudaMemcpy from the GPU");
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

// The forward on the CUDA backend: device copies of the inputs, a caller-owned workspace, one
// asynchronous call on a stream.
Result run_cuda(const Problem& pb) {
  DeviceBuffer q(pb.q), k(pb.k), v(pb.v), g(pb.g), beta(pb.beta), A_log(pb.A_log), dt_bias(pb.dt_bias);
  DeviceBuffer state(pb.initial_state);  // updated in place: final_state = initial_state
  DeviceBuffer cu(pb.cu_seqlens);
  DeviceBuffer out(pb.act_size() * sizeof(uint16_t));
  flash_kda::FwdParams p = base_params(pb);
  p.q = q.ptr; p.k = k.ptr; p.v = v.ptr; p.g = g.ptr; p.beta = beta.ptr;
  p.A_log = static_cast<const float*>(A_log.ptr);
  p.dt_bias = static_cast<const float*>(dt_bias.ptr);
  p.initial_state = state.ptr;
  p.final_state = state.ptr;
  p.cu_seqlens = cu.ptr;
  p.out = out.ptr;
  p.backend = flash_kda::Backend::kCuda;
  DeviceBuffer workspace(flash_kda::workspace_size(p));
  p.workspace = workspace.ptr;
  p.workspace_bytes = workspace.bytes;
  cudaStream_t stream;
  cuda_check(cudaStreamCreate(&stream), "cudaStreamCreate");
  check(flash_kda::fwd(p, stream), "flash_kda::fwd (CUDA)");  // no allocation, no synchronisation
  cuda_check(cudaStreamSynchronize(stream), "the forward kernel");
  cudaStreamDestroy(stream);
  std::vector<uint16_t> out_bf16(pb.act_size());
  out.copy_to(out_bf16);
  Result r;
  r.out = flash_kda::bf16::to_float(out_bf16);
  r.final_state.resize(pb.state_size());
  state.copy_to(r.final_state);
  return r;
}
#endif

}  // namespace

int main(int argc, char** argv) {
  std::string backend = "auto";
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--backend") == 0 && i + 1 < argc) {
      backend = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--backend auto|cpu|cuda]\n", argv[0]);
      return 2;
    }
  }
  if (backend == "auto") backend = flash_kda::cuda_available() ? "cuda" : "cpu";
  if (backend != "cpu" && backend != "cuda") {
    std::fprintf(stderr, "unknown backend '%s' (expected auto, cpu or cuda)\n", backend.c_str());
    return 2;
  }

  if (backend == "cuda" && !flash_kda::cuda_available()) {
#ifdef FLASH_KDA_WITH_CUDA
    std::fprintf(stderr, "--backend cuda: no sm_90 GPU is present\n");
#else
    std::fprintf(stderr, "--backend cuda: this flash-kda was built without the CUDA backend\n");
#endif
    return 1;
  }

  const Problem pb = make_problem(2026);
  std::printf("KDA forward: %lld sequences (%lld + %lld tokens), H = %lld, K = V = %lld, fp32 states, on %s\n",
              (long long)pb.seqs, (long long)kLengths[0], (long long)kLengths[1], (long long)kHeads,
              (long long)kDim, backend == "cuda" ? "the CUDA backend" : "the CPU backend");
  Result r;
#ifdef FLASH_KDA_WITH_CUDA
  if (backend == "cuda") r = run_cuda(pb);
#endif
  if (backend == "cpu") r = run_host(pb, flash_kda::Backend::kCpu);

  const Result ref = run_host(pb, flash_kda::Backend::kCpuReference);
  const double out_err = rel_error(r.out, ref.out), state_err = rel_error(r.final_state, ref.final_state);
  // The limits of docs/spec.md: out within 4e-3 of the float64 result, an fp32 final state within 3e-3.
  const bool ok = out_err <= 4e-3 && state_err <= 3e-3;
  std::printf("relative error against float64: out %.2e, final state %.2e (limits 4e-3, 3e-3): %s\n", out_err,
              state_err, ok ? "ok" : "TOO LARGE");
  std::printf("out[0, 0, 0, 0:4] = %.4f %.4f %.4f %.4f\n", r.out[0], r.out[1], r.out[2], r.out[3]);
  return ok ? 0 : 1;
}
