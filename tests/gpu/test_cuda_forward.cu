// The CUDA forward under every plan of FLASH_KDA_GPU_PLANS (tests/gpu/harness.cuh): the edge cases
// of docs/spec.md and the gate forms of docs/spec.md ("Gate forms") against the float64 CPU reference,
// on poisoned outputs, at K = V = 128 and again at 64 ("D=64 ..."); the fp32 GPU recurrence against
// float64 on small cases; and BENCH cases (python/flash_kda/bench/cases.json, and fixed96_d64,
// fixed16_d64) against the fp32 GPU recurrence, inputs generated on the device. Each comparison prints
// its measured errors. Checkpoints, prefill on pools, decode and context parallelism have tests of
// their own (test_cuda_checkpoints.cu, test_cuda_prefill_pool.cu, test_cuda_decode.cu,
// test_cuda_context_parallel.cu).
#include "harness.cuh"

namespace flash_kda::gpu_test {
namespace {

std::vector<Case> edge_cases() {
  std::vector<Case> cs;
  auto add = [&](Case c) { cs.push_back(c); };
  Case c;
  // clang-format off
  add(fixed_case("fixed B=2 T=100 H=4 fp32", 2, 100));
  add(varlen_case("spec varlen 300/17/700/1 fp32", {300, 17, 700, 1}));
  c = varlen_case("varlen + empty, int32, bf16 state", {129, 0, 64, 5}); c.i32 = true; c.state = DType::kBF16; add(c);
  c = fixed_case("T=1 B=3 H=2 no state", 3, 1); c.H = 2; c.state = DType::kNone; add(c);
  c = varlen_case("final only (no initial)", {50, 33}); c.initial = false; add(c);
  c = varlen_case("in-place fp32 state varlen", {200, 31, 1, 90}); c.in_place = true; add(c);
  c = varlen_case("in-place bf16 state", {77, 16}); c.in_place = true; c.state = DType::kBF16; add(c);
  c = fixed_case("strong decay g+8", 2, 150); c.g_shift = 8.f; add(c);
  c = fixed_case("weak decay g-7 T=2000 H=2", 1, 2000); c.H = 2; c.g_shift = -7.f; add(c);
  c = fixed_case("large |v| x100", 1, 300); c.v_scale = 100.f; add(c);
  // States past fp16's range: the prepared plans' fp16 products detect it and recompute in tf32.
  c = fixed_case("huge |v| x3e4 (fp16 range)", 1, 700); c.v_scale = 3e4f; add(c);
  c = fixed_case("small |v| x1e-3", 1, 700); c.v_scale = 1e-3f; add(c);
  c = fixed_case("zero key row", 1, 64); c.zero_key = true; add(c);
  c = fixed_case("GVA HV=2H", 2, 70); c.H = 2; c.HV = 4; add(c);
  c = fixed_case("packed qkv strides", 2, 90); c.packed_qkv = true; add(c);
  c = fixed_case("lower_bound=-1", 1, 100); c.lower_bound = -1.f; add(c);
  // clang-format on
  {
    c = varlen_case("many short (64 seqs 1..40)", {});
    c.H = 2;
    std::uniform_int_distribution<int> len(1, 40);
    for (int i = 0; i < 64; ++i) c.lens.push_back(len(rng()));
    add(c);
  }
  // clang-format off
  // Work-unit shapes: (sequence, head) pairs decide how many CTAs share one state (8, 4, 2, 1).
  add(fixed_case("20 pairs (2 consumer warps)", 5, 48));
  add(fixed_case("40 pairs (4 consumer warps)", 10, 40));
  add(fixed_case("100 pairs (8 consumer warps)", 25, 37));
  // Shapes the split plans cut into segments (forced small segments reach many chain steps).
  c = varlen_case("long varlen 1500/40/0/700 in-place", {1500, 40, 0, 700}); c.H = 2; c.in_place = true; add(c);
  c = fixed_case("long fixed B=2 T=1100 bf16 state", 2, 1100); c.H = 2; c.state = DType::kBF16; add(c);
  c = fixed_case("long GVA HV=2H T=900 no initial", 1, 900); c.H = 2; c.HV = 4; c.initial = false; add(c);
  c = varlen_case("long strided int32 800/33", {800, 33}); c.packed_qkv = true; c.i32 = true; add(c);
  c = varlen_case("bf16 initial, fp32 final state", {400, 77}); c.state = DType::kBF16; c.final_f32 = true; add(c);
  c = varlen_case("stress collinear keys weak decay", {700, 90}); c.H = 2; c.g_shift = -7.f; c.collinear = true; add(c);
  // The gate forms the CUDA forward computes (docs/spec.md, "Gate forms"): the sigmoid gate at rate 1
  // (A_log absent) and beta = 2 sigmoid(logit), on the shapes every plan takes.
  c = varlen_case("A_log=None varlen 300/17/700/1", {300, 17, 700, 1}); c.no_A_log = true; add(c);
  c = fixed_case("A_log=None GVA HV=2H bf16 state", 2, 70); c.H = 2; c.HV = 4; c.state = DType::kBF16; c.no_A_log = true; add(c);
  c = fixed_case("A_log=None lower_bound=-1 g=3e38/1e4", 2, 90); c.lower_bound = -1.f; c.no_A_log = true; c.extreme = Extreme::kInfinite; add(c);
  c = fixed_case("neg eigval fixed B=2 T=100", 2, 100); c.neg_eigval = true; add(c);
  c = varlen_case("neg eigval varlen+empty int32 bf16", {129, 0, 64, 5}); c.i32 = true; c.state = DType::kBF16; c.neg_eigval = true; add(c);
  // beta up to 2 doubles U at most: still within the fp16 check's reach (docs/kernel.md).
  c = fixed_case("neg eigval huge |v| x3e4 (fp16 range)", 1, 700); c.v_scale = 3e4f; c.neg_eigval = true; add(c);
  c = fixed_case("neg eigval weak decay g-7 T=2000 H=2", 1, 2000); c.H = 2; c.g_shift = -7.f; c.neg_eigval = true; add(c);
  c = varlen_case("neg eigval+A_log=None long 1500/40/0/700", {1500, 40, 0, 700}); c.H = 2; c.in_place = true; c.no_A_log = true; c.neg_eigval = true; add(c);
  c = fixed_case("neg eigval+A_log=None 100 pairs", 25, 37); c.no_A_log = true; c.neg_eigval = true; add(c);
  c = fixed_case("neg eigval GVA T=900 no initial", 1, 900); c.H = 2; c.HV = 4; c.initial = false; c.neg_eigval = true; add(c);
  // beta logits + 6: beta ~ 2, each transition nearly a reflection in nearly the same direction.
  c = varlen_case("stress neg eigval collinear keys", {700, 90}); c.H = 2; c.g_shift = -7.f; c.collinear = true; c.neg_eigval = true; add(c);
  // clang-format on
  // Every case again at K = V = 64 (fixed and packed batches, empty and 1-token sequences, both state
  // dtypes and none, in-place states, GVA, strides, the fp16 range checks, the gate forms, long
  // sequences for the split plans).
  return with_d64(cs);
}

// The softplus gate: the CUDA forward (every plan) and the fp32 GPU recurrence (the oracle of the
// large cases) against float64.
std::vector<Case> softplus_cases() {
  std::vector<Case> cs;
  auto add = [&](Case c) {
    c.gate = GateForm::kSoftplus;
    cs.push_back(c);
  };
  Case c;
  // clang-format off
  c = varlen_case("softplus varlen 300/17/0/70 GVA", {300, 17, 0, 70}); c.H = 2; c.HV = 4; add(c);
  c = fixed_case("softplus+neg eigval fixed B=2 T=100", 2, 100); c.neg_eigval = true; add(c);
  c = fixed_case("softplus e^-200 in one token", 2, 64); c.extreme = Extreme::kOneToken200; add(c);
  c = varlen_case("softplus e^-1e4 over a chunk", {64, 16, 5}); c.extreme = Extreme::kChunk1e4; add(c);
  c = fixed_case("softplus no decay g=-1e4", 1, 300); c.extreme = Extreme::kNoDecay; add(c);
  c = fixed_case("softplus g=3e38/1e4 (infinite)", 2, 40); c.extreme = Extreme::kInfinite; add(c);
  c = fixed_case("softplus A_log=80, g=-100 half", 1, 50); c.extreme = Extreme::kHugeRate; add(c);
  // 80 pairs: the fused kernel's 8-consumer-warp shape; a bf16 state.
  c = varlen_case("softplus 80 pairs bf16", {45, 3}); c.H = 40; c.state = DType::kBF16; add(c);
  // Long enough for the split plans' segments; weak decay (g - 7: softplus ~ 1e-3) keeps a long memory.
  c = fixed_case("softplus fixed B=1 T=1500 H=2", 1, 1500); c.H = 2; add(c);
  c = varlen_case("softplus weak (g - 7) varlen 700/90", {700, 90}); c.H = 2; c.g_shift = -7.f; add(c);
  // clang-format on
  return with_d64(cs);  // every case again at K = V = 64
}

// Every edge case under every plan against the float64 reference; the fp32 GPU recurrence against
// float64 on some of them (it is the oracle of the large cases).
TEST(CudaForward, EdgeCases) {
  std::printf("== edge cases vs float64 CPU reference (CUDA backend)\n");
  for (const Case& c : edge_cases()) {
    const Host h = make_inputs(c);
    const Result ref = run_backend(c, h, Backend::kCpuReference, nullptr);
    const size_t outputs = size_t(h.B * h.T * h.HV) * h.dim;
    const double tol_out = c.collinear ? kTolStress : outputs < kFewOutputs ? kTolOutFew : kTolOut;
    const double tol_state = c.collinear                               ? kTolStress
                             : (c.state == DType::kF32 || c.final_f32) ? kTolStateF32
                                                                       : kTolStateBF16;
    for (const PlanChoice& plan : g_plans) {
      g_plan = plan;
      bool written = false;
      const Result got = run_backend(c, h, Backend::kCuda, &written);
      report(("cuda/" + plan.name).c_str(), c.name, rel(got.out, ref.out),
             c.state == DType::kNone ? 0 : rel(got.state, ref.state), written, tol_out, tol_state);
    }
    g_plan = PlanChoice{"auto"};
    const std::string base = base_name(c.name);
    if (base.rfind("spec", 0) == 0 || base.rfind("weak", 0) == 0 || (!default_form(c) && !c.collinear)) {
      const Result rec = run_gpu_recurrence(c, h);
      report("gpu-f32", c.name, rel(rec.out, ref.out), rel(rec.state, ref.state), true, kTolOut, tol_state);
    }
  }
}

// The softplus gate on the CUDA forward under every plan, on poisoned outputs, within the tolerances
// of the float64 reference like every other case (every element written and finite; a refusal is a
// failure); and the fp32 GPU recurrence against float64 on the same cases, since it is the oracle of
// the large ones.
TEST(CudaForward, SoftplusGate) {
  std::printf("== softplus gate: the CUDA forward and the fp32 GPU recurrence vs float64 CPU reference\n");
  for (const Case& c : softplus_cases()) {
    const Host h = make_inputs(c);
    const Result ref = run_backend(c, h, Backend::kCpuReference, nullptr);
    const Result rec = run_gpu_recurrence(c, h);
    bool finite = true;
    for (float x : rec.out) finite &= std::isfinite(x);
    for (float x : rec.state) finite &= std::isfinite(x);
    const double tol_state = c.state == DType::kF32 ? kTolStateF32 : kTolStateBF16;
    report("gpu-f32", c.name, rel(rec.out, ref.out), rel(rec.state, ref.state), finite, kTolOut, tol_state);
    for (const PlanChoice& plan : g_plans) {
      g_plan = plan;
      Status st;
      bool written = false;
      const Result got = run_backend(c, h, Backend::kCuda, &written, &st);
      const std::string what = "cuda/" + plan.name;
      if (!st.ok()) {
        report_call_failed(what, c.name, "fwd", st);
        continue;
      }
      const double tol_out = got.out.size() < kFewOutputs ? kTolOutFew : kTolOut;
      report(what.c_str(), c.name, rel(got.out, ref.out), rel(got.state, ref.state), written, tol_out, tol_state);
    }
    g_plan = PlanChoice{"auto"};
  }
}

// One BENCH case (inputs generated on the device) under every plan against the fp32 GPU recurrence,
// in the gate form asked for (A_log absent: rate 1; allow_neg_eigval; the softplus gate). False if a
// call failed.
bool check_bench_case(const BenchCase& b, bool no_A_log, bool neg_eigval, bool softplus) {
  const std::string name = std::string(b.id) + (no_A_log ? " A_log=None" : "") + (neg_eigval ? " neg eigval" : "") +
                           (softplus ? " softplus" : "");
  DeviceCase d = make_device_case(b.lens, b.batch, b.seqlen, b.H, b.dim);
  const int64_t D = d.dim;
  // Recurrence reference.
  std::vector<int64_t> starts(d.N), lens(d.N);
  for (int64_t n = 0; n < d.N; ++n) {
    starts[n] = d.cu.empty() ? n * d.T : d.cu[n];
    lens[n] = d.cu.empty() ? d.T : d.cu[n + 1] - d.cu[n];
  }
  RecurrenceArgs ra{};
  ra.q = d.q, ra.k = d.k, ra.v = d.v, ra.g = d.g, ra.beta = d.beta, ra.dt_bias = d.dt_bias;
  ra.A_log = no_A_log ? nullptr : d.A_log;
  ra.initial_state = d.s0;
  ra.final_state = dev_alloc<float>(d.N * d.H * D * D);
  ra.out = dev_alloc<float>(d.tok * d.H * D);
  ra.starts = upload(starts);
  ra.lens = upload(lens);
  ra.H = ra.HV = int(d.H);
  ra.scale = 1.f / std::sqrt(float(D));
  ra.lower_bound = -5.f;
  ra.allow_neg_eigval = neg_eigval;
  ra.softplus_gate = softplus;
  launch_recurrence(ra, int(D), unsigned(d.N * d.H));
  CUDA_OK(cudaGetLastError());
  // Ours, on poisoned outputs, under every plan asked for.
  double* acc = dev_alloc<double>(4);
  int* bad = dev_alloc<int>(2);
  bool ran = true;
  for (const PlanChoice& plan : g_plans) {
    g_plan = plan;
    CUDA_OK(cudaMemset(d.out, 0xff, d.tok * d.H * D * 2));
    CUDA_OK(cudaMemset(d.s1, 0xff, d.N * d.H * D * D * 4));
    FwdParams p = device_params(d);
    if (no_A_log) p.A_log = nullptr;
    p.allow_neg_eigval = neg_eigval;
    if (softplus) p.gate = GateForm::kSoftplus;
    Status st = run_fwd(p, nullptr);
    if (!st.ok()) {
      std::printf("  fwd failed: %s\n", st.message.c_str());
      ADD_FAILURE() << "cuda/" << plan.name << " " << name << ": fwd failed: " << st.message;
      ran = false;
      break;
    }
    CUDA_OK(cudaMemset(acc, 0, 4 * sizeof(double)));
    CUDA_OK(cudaMemset(bad, 0, 2 * sizeof(int)));
    sq_err_kernel<<<1024, 256>>>(d.out, ra.out, d.tok * d.H * D, acc);
    count_nonfinite_bf16<<<1024, 256>>>(d.out, d.tok * d.H * D, bad);
    sq_err_f32_kernel<<<1024, 256>>>(d.s1, ra.final_state, d.N * d.H * D * D, acc + 2, bad + 1);
    CUDA_OK(cudaDeviceSynchronize());
    const std::vector<double> e = download(acc, 4);
    const std::vector<int> nb = download(bad, 2);
    report(("cuda/" + plan.name).c_str(), name, std::sqrt(e[0] / e[1]), std::sqrt(e[2] / e[3]),
           nb[0] == 0 && nb[1] == 0, kTolOut, kTolStateF32);
  }
  g_plan = PlanChoice{"auto"};
  for (void* p : {static_cast<void*>(ra.final_state), static_cast<void*>(ra.out),
                  static_cast<void*>(const_cast<int64_t*>(ra.starts)),
                  static_cast<void*>(const_cast<int64_t*>(ra.lens)), static_cast<void*>(acc), static_cast<void*>(bad)})
    cudaFree(p);
  free_device_case(d);
  return ran;
}

// BENCH cases under every plan against the fp32 GPU recurrence, some in every gate form.
TEST(CudaForward, BenchCasesAgainstRecurrence) {
  std::printf("== BENCH cases vs the fp32 GPU recurrence (inputs generated on the device)\n");
  const char* const checked[] = {"fixed96", "varlen6_64", "b16x2048_32", "fixed16",     "h8_8k",
                                 "h4_64k",  "mix20k",     "mix20kx31",   "fixed96_d64", "fixed16_d64"};
  // The gate forms on some of them: (case, A_log absent, allow_neg_eigval, the softplus gate).
  struct FormRun {
    const char* id;
    bool no_A_log, neg_eigval, softplus;
  };
  const FormRun forms[] = {
      {"varlen6_64", true, false, false}, {"h4_64k", false, true, false},     {"mix20k", true, true, false},
      {"fixed96", false, false, true},    {"fixed16", false, false, true},    {"h8_8k", false, false, true},
      {"h4_64k", false, true, true},      {"mix20kx31", false, false, true},  {"fixed96_d64", true, true, false},
      {"fixed16_d64", false, true, true}, {"fixed16_d64", true, false, false}};
  for (const BenchCase& b : bench_cases()) {
    if (std::find_if(std::begin(checked), std::end(checked),
                     [&](const char* c) { return std::strcmp(c, b.id) == 0; }) == std::end(checked))
      continue;
    // A failed call ends the test (the failure is recorded).
    if (!check_bench_case(b, false, false, false)) return;
    for (const FormRun& f : forms)
      if (std::strcmp(f.id, b.id) == 0 && !check_bench_case(b, f.no_A_log, f.neg_eigval, f.softplus)) return;
  }
}

}  // namespace
}  // namespace flash_kda::gpu_test
