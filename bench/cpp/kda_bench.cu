// The C++ benchmark of the CUDA backend, with no Python needed (runs from the build folder):
//
//   kda_bench prefill [--reps N] [--json FILE] [--ckpt I] [--neg-eigval] [--graph] [--plans a,b,...] [case ...]
//        the benchmark's prefill cases (python/flash_kda/bench/cases.json, every group, through the
//        generated bench_cases.h; then the K = V = 64 cases fixed96_d64, fixed16_d64, fixed16_d64_sp
//        of tests/gpu/cuda_common.cuh): median time of the forward, the copy floor (a device copy of
//        the same bytes) timed alternately in the same run; each case under every plan of --plans
//        (default auto; names as in the GPU tests: auto, fused, prepared, split, split:L,
//        prepared16/32, split16/32[:L]); --ckpt I: with prefix-cache checkpoints every I tokens (the
//        cost of them); --neg-eigval: with allow_neg_eigval (beta = 2 sigmoid; -T solved in two terms,
//        docs/kernel.md "Numerical choices"); --graph: each call replayed from a CUDA graph (the host's
//        part of the call out of the time); the host's time a call (eager: the whole call; graph:
//        the graph launch) is the last column, host_us_median in the JSON
//   kda_bench decode [--reps N] [--json FILE] [case ...]
//        the benchmark's decode256_32 and B = 1..256, T = 1, 4, fp32/bf16 pools, H = 32, then
//        K = V = 64 rows (decode256_32_d64, ...): per-call median over rotated pools and inputs, each
//        side captured in one CUDA graph, copy floor in the same run
//
// --reps N: timed repetitions (default 50, after a warm-up); --json FILE: every row as JSON too;
// cases by name (default all). FLASH_KDA_TEST_SEED=N replays the inputs of a run (each prints its
// seed first). Exits 77 where no CUDA device is present, 2 on a bad command line.
// (The GPU correctness tests are in tests/gpu; the Python benchmark is python -m flash_kda.bench.)
#include <chrono>
#include <functional>
#include <numeric>

#include "cuda_common.cuh"

namespace flash_kda::gpu_test {
namespace {

float median(std::vector<float> x) {
  std::sort(x.begin(), x.end());
  return x[x.size() / 2];
}

// --ckpt I (prefill): every case also writes prefix-cache checkpoints every I tokens (starts 0, an
// fp32 pool of one slot a boundary), to compare with the same run without.
int64_t g_bench_ckpt = 0;
// --neg-eigval (prefill): every case with allow_neg_eigval.
bool g_bench_neg_eigval = false;
// --graph (prefill): each call replayed from a CUDA graph (the host's part of a call out of the time,
// as python -m flash_kda.bench times it); without it, eager calls (the host's part included).
bool g_bench_graph = false;

int run_bench(int reps, const char* json_path, const std::vector<std::string>& only) {
  const std::vector<BenchCase>& cases = bench_cases();
  FILE* js = json_path ? std::fopen(json_path, "w") : nullptr;
  if (js) std::fprintf(js, "[\n");
  std::printf("%-12s %-10s %10s %10s %8s %9s\n", "case", "plan", "ours ms", "floor ms", "ratio", "host us");
  cudaStream_t stream = nullptr;
  if (g_bench_graph) CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  bool first = true;
  cudaEvent_t e0, e1;
  CUDA_OK(cudaEventCreate(&e0));
  CUDA_OK(cudaEventCreate(&e1));
  for (const BenchCase& bc : cases) {
    if (!only.empty() && std::find(only.begin(), only.end(), bc.id) == only.end()) continue;
    DeviceCase d = make_device_case(bc.lens, bc.batch, bc.seqlen, bc.H, bc.dim);
    const int64_t D = d.dim;
    FwdParams p = device_params(d);
    if (bc.softplus) p.gate = GateForm::kSoftplus;
    p.allow_neg_eigval = g_bench_neg_eigval;
    const int64_t tok = d.tok;
    void* ck_pool = nullptr;
    int32_t* ck_idx = nullptr;
    if (g_bench_ckpt > 0) {
      int64_t M = 0;
      for (int64_t n = 0; n < d.N; ++n) M = std::max(M, (d.cu.empty() ? d.T : d.cu[n + 1] - d.cu[n]) / g_bench_ckpt);
      M = std::max<int64_t>(M, 1);
      std::vector<int32_t> idx(size_t(d.N * M));
      std::iota(idx.begin(), idx.end(), 0);
      ck_idx = upload(idx);
      ck_pool = dev_alloc<float>(size_t(d.N * M) * d.H * D * D);
      p.checkpoint_interval = g_bench_ckpt;
      p.checkpoint_state = ck_pool;
      p.checkpoint_state_dtype = DType::kF32;
      p.checkpoint_pool_size = d.N * M;
      p.checkpoint_indices = ck_idx;
      p.checkpoint_columns = M;
    }
    // The benchmark's byte count (docs/perf_log.md): q, k, v, g, beta, out once each, fp32 initial and final state.
    const double bytes = double(tok) * d.H * (4.0 * 2 * D + 2 + 2 * D) + 2.0 * d.N * d.H * D * D * 4;
    void *src = nullptr, *dst = nullptr;
    const size_t copy_bytes = size_t(bytes / 2);
    CUDA_OK(cudaMalloc(&src, copy_bytes));
    CUDA_OK(cudaMalloc(&dst, copy_bytes));
    CUDA_OK(cudaMemset(src, 1, copy_bytes));
    for (const PlanChoice& plan : g_plans) {
      g_plan = plan;
      // --graph: the call captured once (after one eager call) and replayed; eager calls run on the
      // legacy default stream, as before.
      cudaGraphExec_t exec = nullptr;
      if (g_bench_graph) {
        CUDA_OK(cudaDeviceSynchronize());  // (the inputs' uploads, on the legacy stream)
        Status st = run_fwd(p, stream);
        if (st.ok()) {
          CUDA_OK(cudaStreamSynchronize(stream));
          cudaGraph_t graph;
          CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
          st = run_fwd(p, stream);
          CUDA_OK(cudaStreamEndCapture(stream, &graph));
          CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
          CUDA_OK(cudaGraphDestroy(graph));
        }
        if (!st.ok()) {
          std::printf("fwd failed: %s\n", st.message.c_str());
          return 1;
        }
      }
      cudaStream_t s = g_bench_graph ? stream : nullptr;
      std::vector<float> t_ours, t_copy, t_host;
      for (int r = 0; r < reps + 5; ++r) {
        // Interleave the kernel and the copy so that both see the same clocks and thermal state.
        CUDA_OK(cudaEventRecord(e0, s));
        const auto h0 = std::chrono::steady_clock::now();
        Status st = Status::Ok();
        if (exec)
          CUDA_OK(cudaGraphLaunch(exec, s));
        else
          st = run_fwd(p, s);
        const auto h1 = std::chrono::steady_clock::now();
        CUDA_OK(cudaEventRecord(e1, s));
        if (!st.ok()) {
          std::printf("fwd failed: %s\n", st.message.c_str());
          return 1;
        }
        CUDA_OK(cudaEventSynchronize(e1));
        float ms;
        CUDA_OK(cudaEventElapsedTime(&ms, e0, e1));
        if (r >= 5) t_ours.push_back(ms);
        if (r >= 5) t_host.push_back(std::chrono::duration<float, std::micro>(h1 - h0).count());
        CUDA_OK(cudaEventRecord(e0, s));
        CUDA_OK(cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice, s));
        CUDA_OK(cudaEventRecord(e1, s));
        CUDA_OK(cudaEventSynchronize(e1));
        CUDA_OK(cudaEventElapsedTime(&ms, e0, e1));
        if (r >= 5) t_copy.push_back(ms);
      }
      if (exec) CUDA_OK(cudaGraphExecDestroy(exec));
      const float mo = median(t_ours), mc = median(t_copy), mh = median(t_host);
      std::sort(t_ours.begin(), t_ours.end());
      std::printf("%-12s %-10s %10.3f %10.3f %8.2f %9.1f%s%s%s\n", bc.id, plan.name.c_str(), mo, mc, mo / mc, mh,
                  g_bench_ckpt > 0 ? "  (checkpoints)" : "", g_bench_neg_eigval ? "  (neg eigval)" : "",
                  g_bench_graph ? "  (graph)" : "");
      std::fflush(stdout);
      if (js) {
        std::fprintf(
            js,
            "%s  {\"case\": \"%s\", \"plan\": \"%s\", \"checkpoint_interval\": %lld, \"allow_neg_eigval\": %s, "
            "\"H\": %d, \"D\": %d, \"tokens\": %lld, "
            "\"bytes\": %.0f, "
            "\"ours_ms_median\": %.5f, \"ours_ms_p10\": %.5f, \"ours_ms_p90\": %.5f, \"copy_ms_median\": %.5f, "
            "\"floor_ratio\": %.4f, \"host_us_median\": %.2f, \"graph\": %s, \"reps\": %d}",
            first ? "" : ",\n", bc.id, plan.name.c_str(), static_cast<long long>(g_bench_ckpt),
            g_bench_neg_eigval ? "true" : "false", bc.H, bc.dim, static_cast<long long>(tok), bytes, mo,
            t_ours[t_ours.size() / 10], t_ours[t_ours.size() * 9 / 10], mc, mo / mc, mh,
            g_bench_graph ? "true" : "false", reps);
        first = false;
      }
    }
    g_plan = PlanChoice{"auto"};
    cudaFree(src);
    cudaFree(dst);
    if (ck_pool) cudaFree(ck_pool);
    if (ck_idx) cudaFree(ck_idx);
    free_device_case(d);
  }
  if (js) {
    std::fprintf(js, "\n]\n");
    std::fclose(js);
  }
  return 0;
}

// ---- decode: the benchmark's decode case and a grid around it -----------------------------------------

__global__ void fill_normal_f32_kernel(float* x, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t h = splitmix64(seed ^ splitmix64(uint64_t(i)));
    const float u1 = (float((h >> 40) & 0xffffff) + 1.f) * (1.f / 16777217.f);
    const float u2 = float((h >> 8) & 0xffffff) * (1.f / 16777216.f);
    x[i] = sqrtf(-2.f * logf(u1)) * cospif(2.f * u2);
  }
}

struct DecodeBenchCase {
  std::string id;
  int64_t B;
  int T;
  DType state;
  int S;        // slots per sequence (> 1: speculative, one state written per token)
  int D = 128;  // K = V
};

// Each case runs `sets` calls (one per pool region and input set) captured in one CUDA graph, so the
// launch overhead stays out of the figure and the capture itself checks that decode is graph-safe;
// the copy floor is timed the same way, alternating with the kernel in the same run.
int run_bench_decode(int reps, const char* json_path, const std::vector<std::string>& only) {
  constexpr int H = 32;
  std::vector<DecodeBenchCase> cases = {{"decode256_32", 256, 1, DType::kF32, 1}};
  for (DType st : {DType::kF32, DType::kBF16})
    for (int64_t B : {1, 8, 64, 256})
      for (int T : {1, 4})
        cases.push_back({"b" + std::to_string(B) + "_t" + std::to_string(T) + "_" + dtype_name(st), B, T, st, 1});
  cases.push_back({"spec_b64_t4_fp32", 64, 4, DType::kF32, 4});
  cases.push_back({"spec_b256_t4_bf16", 256, 4, DType::kBF16, 4});
  // K = V = 64: decode256_32's shape (a quarter of its bytes), the same 512 MB of fp32 state as
  // decode256_32 (B = 1024), T = 4 and bf16 pools, and a speculative step.
  cases.push_back({"decode256_32_d64", 256, 1, DType::kF32, 1, 64});
  cases.push_back({"b1024_t1_fp32_d64", 1024, 1, DType::kF32, 1, 64});
  cases.push_back({"b256_t4_fp32_d64", 256, 4, DType::kF32, 1, 64});
  cases.push_back({"b256_t1_bf16_d64", 256, 1, DType::kBF16, 1, 64});
  cases.push_back({"b256_t4_bf16_d64", 256, 4, DType::kBF16, 1, 64});
  cases.push_back({"spec_b256_t4_d64", 256, 4, DType::kBF16, 4, 64});

  FILE* js = json_path ? std::fopen(json_path, "w") : nullptr;
  if (js) std::fprintf(js, "[\n");
  std::printf("%-18s %5s %6s %10s %10s %8s %9s\n", "case", "sets", "MB", "ours ms", "floor ms", "ratio", "GB/s");
  bool first = true;
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CUDA_OK(cudaEventCreate(&e0));
  CUDA_OK(cudaEventCreate(&e1));
  for (const DecodeBenchCase& bc : cases) {
    if (!only.empty() && std::find(only.begin(), only.end(), bc.id) == only.end()) continue;
    const int64_t B = bc.B, T = bc.T, S = bc.S, D = bc.D;  // (D: the case's K = V)
    const int64_t elem = bc.state == DType::kF32 ? 4 : 2;
    const int64_t slot_bytes = H * D * D * elem;
    const int64_t state_writes = S == 1 ? 1 : T;
    // The benchmark's byte count (docs/perf_log.md): q, k, v, g, beta, out once each; the state read once and written
    // once (speculative: once per token).
    const double input_bytes = double(B) * T * H * (4.0 * D * 2 + 2) + double(B) * T * H * D * 2;
    const double bytes = input_bytes + double(B) * slot_bytes * (1 + state_writes);
    // Enough sets that the footprint of one round is far beyond the 50 MB L2.
    const double footprint = input_bytes + double(B) * S * slot_bytes;
    const int sets = int(std::min<double>(64, std::max<double>(2, std::ceil(512e6 / footprint))));
    const int64_t P = B * S * sets;
    const int64_t act = B * T * H * D;  // elements of q (= k, v, g, out) per set
    const uint64_t seed = rng()();
    void* pool = nullptr;
    CUDA_OK(cudaMalloc(&pool, size_t(P * slot_bytes)));
    if (bc.state == DType::kF32) {
      fill_normal_f32_kernel<<<2048, 256>>>(static_cast<float*>(pool), P * H * D * D, seed);
    } else {
      fill_normal_kernel<<<2048, 256>>>(static_cast<__nv_bfloat16*>(pool), P * H * D * D, seed, 1.f, 0.f);
    }
    auto normal = [&](int64_t n, uint64_t salt) {
      auto* p = dev_alloc<__nv_bfloat16>(n);
      fill_normal_kernel<<<1024, 256>>>(p, n, seed + salt, 1.f, 0.f);
      return p;
    };
    __nv_bfloat16 *q = normal(act * sets, 1), *k = normal(act * sets, 2), *v = normal(act * sets, 3),
                  *g = normal(act * sets, 4), *beta = normal(B * T * H * sets, 5);
    __nv_bfloat16* out = dev_alloc<__nv_bfloat16>(act * sets);
    CUDA_OK(cudaGetLastError());
    std::uniform_real_distribution<float> u(0.f, 1.f);
    std::vector<float> A_log(H), dt(H * D);
    for (auto& e : A_log) e = u(rng());
    for (auto& e : dt) e = u(rng());
    float *dA = upload(A_log), *ddt = upload(dt);
    // Set i owns slots [i·B·S, (i+1)·B·S), in a random order as a pool allocator would hand them out.
    std::vector<int32_t> indices(P);
    std::iota(indices.begin(), indices.end(), 0);
    for (int i = 0; i < sets; ++i) std::shuffle(indices.begin() + i * B * S, indices.begin() + (i + 1) * B * S, rng());
    std::vector<int32_t> accepted(B);
    std::uniform_int_distribution<int> pick(1, int(S));
    for (auto& a : accepted) a = pick(rng());
    int32_t *didx = upload(indices), *dacc = upload(accepted);
    const size_t copy_bytes = size_t(bytes / 2);  // a copy reads and writes: bytes moved = 2 × copied
    char *src = dev_alloc<char>(copy_bytes * sets), *dst = dev_alloc<char>(copy_bytes * sets);
    CUDA_OK(cudaMemset(src, 1, copy_bytes * sets));
    CUDA_OK(cudaDeviceSynchronize());

    auto params = [&](int i) {
      DecodeParams p;
      p.batch = B, p.seqlen = T, p.heads = H;
      p.head_dim_k = p.head_dim_v = D;
      p.q = q + i * act, p.k = k + i * act, p.v = v + i * act, p.g = g + i * act, p.beta = beta + i * B * T * H;
      p.out = out + i * act;
      p.A_log = dA, p.dt_bias = ddt;
      p.scale = 1.f / std::sqrt(float(D));
      p.lower_bound = -5.f;
      p.state = pool, p.state_dtype = bc.state, p.pool_size = P;
      p.state_indices = didx + i * B * S;
      p.slots_per_seq = S;
      p.num_accepted_tokens = S > 1 ? dacc : nullptr;
      p.backend = Backend::kCuda;
      return p;
    };
    // Warm-up outside capture (also caches the device attributes), then one graph per side.
    for (int i = 0; i < sets; ++i) {
      const Status st = decode(params(i), stream);
      if (!st.ok()) {
        std::printf("decode failed: %s\n", st.message.c_str());
        return 1;
      }
    }
    CUDA_OK(cudaStreamSynchronize(stream));
    auto capture = [&](const std::function<void(int)>& call) {
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
      for (int i = 0; i < sets; ++i) call(i);
      CUDA_OK(cudaStreamEndCapture(stream, &graph));
      CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
      CUDA_OK(cudaGraphDestroy(graph));
      return exec;
    };
    cudaGraphExec_t ours = capture([&](int i) {
      const Status st = decode(params(i), stream);
      if (!st.ok()) {
        std::printf("decode failed in capture: %s\n", st.message.c_str());
        std::exit(1);
      }
    });
    cudaGraphExec_t copy = capture([&](int i) {
      CUDA_OK(
          cudaMemcpyAsync(dst + i * copy_bytes, src + i * copy_bytes, copy_bytes, cudaMemcpyDeviceToDevice, stream));
    });
    std::vector<float> t_ours, t_copy;
    for (int r = 0; r < reps + 3; ++r) {
      for (auto [exec, times] : {std::pair<cudaGraphExec_t, std::vector<float>*>{ours, &t_ours}, {copy, &t_copy}}) {
        CUDA_OK(cudaEventRecord(e0, stream));
        CUDA_OK(cudaGraphLaunch(exec, stream));
        CUDA_OK(cudaEventRecord(e1, stream));
        CUDA_OK(cudaEventSynchronize(e1));
        float ms;
        CUDA_OK(cudaEventElapsedTime(&ms, e0, e1));
        if (r >= 3) times->push_back(ms / sets);
      }
    }
    const float mo = median(t_ours), mc = median(t_copy);
    std::sort(t_ours.begin(), t_ours.end());
    std::printf("%-18s %5d %6.1f %10.4f %10.4f %8.2f %9.0f%s\n", bc.id.c_str(), sets, bytes / 1e6, mo, mc, mo / mc,
                bytes / (mo * 1e6), bc.id.rfind("decode256_32", 0) == 0 ? "   (goal <= 1.2)" : "");
    std::fflush(stdout);
    if (js) {
      std::fprintf(js,
                   "%s  {\"case\": \"%s\", \"B\": %lld, \"T\": %d, \"H\": %d, \"D\": %d, \"state\": \"%s\", "
                   "\"slots_per_seq\": %d, "
                   "\"bytes\": %.0f, \"sets\": %d, \"ours_ms_median\": %.5f, \"ours_ms_p10\": %.5f, "
                   "\"ours_ms_p90\": %.5f, \"copy_ms_median\": %.5f, \"floor_ratio\": %.4f, \"reps\": %d}",
                   first ? "" : ",\n", bc.id.c_str(), static_cast<long long>(B), bc.T, H, bc.D, dtype_name(bc.state),
                   bc.S, bytes, sets, mo, t_ours[t_ours.size() / 10], t_ours[t_ours.size() * 9 / 10], mc, mo / mc,
                   reps);
      first = false;
    }
    CUDA_OK(cudaGraphExecDestroy(ours));
    CUDA_OK(cudaGraphExecDestroy(copy));
    for (void* p :
         {pool, static_cast<void*>(q), static_cast<void*>(k), static_cast<void*>(v), static_cast<void*>(g),
          static_cast<void*>(beta), static_cast<void*>(out), static_cast<void*>(dA), static_cast<void*>(ddt),
          static_cast<void*>(didx), static_cast<void*>(dacc), static_cast<void*>(src), static_cast<void*>(dst)})
      cudaFree(p);
  }
  if (js) {
    std::fprintf(js, "\n]\n");
    std::fclose(js);
  }
  CUDA_OK(cudaStreamDestroy(stream));
  return 0;
}

}  // namespace
}  // namespace flash_kda::gpu_test

int main(int argc, char** argv) {
  using namespace flash_kda::gpu_test;
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode != "prefill" && mode != "decode") {
    std::fprintf(
        stderr,
        "usage: %s prefill [--reps N] [--json FILE] [--ckpt I] [--neg-eigval] [--graph] [--plans a,b,...] [case ...]\n"
        "       %s decode [--reps N] [--json FILE] [case ...]\n",
        argv[0], argv[0]);
    return 2;
  }
  int reps = 50;
  const char* json = nullptr;
  std::vector<std::string> only;
  for (int i = 2; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--json") && i + 1 < argc) {
      json = argv[++i];
    } else if (!std::strcmp(argv[i], "--ckpt") && i + 1 < argc) {
      g_bench_ckpt = std::atoll(argv[++i]);
    } else if (!std::strcmp(argv[i], "--neg-eigval")) {
      g_bench_neg_eigval = true;
    } else if (!std::strcmp(argv[i], "--graph")) {
      g_bench_graph = true;
    } else if (!std::strcmp(argv[i], "--plans") && i + 1 < argc) {
      g_plans = parse_plan_list(argv[++i]);
    } else {
      only.push_back(argv[i]);
    }
  }
  if (!cuda_device_present()) {
    std::printf("%s: no CUDA device, nothing timed (exit 77: skipped)\n", argv[0]);
    return 77;
  }
  seed_value();  // printed first
  return mode == "prefill" ? run_bench(reps, json, only) : run_bench_decode(reps, json, only);
}
