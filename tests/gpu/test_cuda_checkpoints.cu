// Prefix-cache checkpoints on the CUDA forward (docs/spec.md, "Prefix-cache checkpoints") against the
// float64 CPU reference: out, final states and every written checkpoint slot; the slots no boundary
// names must stay byte for byte as they were (poisoned). Every case at K = V = 128 and 64, under
// every plan of FLASH_KDA_GPU_PLANS plus forced splits of their own (tests/gpu/checkpoint_cases.cuh).
#include "checkpoint_cases.cuh"

namespace flash_kda::gpu_test {
namespace {

// Every checkpoint case under every plan of FLASH_KDA_GPU_PLANS and its own: out and final state as
// usual, each written slot against the float64 reference's, every other checkpoint-pool byte untouched.
TEST(CudaCheckpoints, EveryCase) {
  std::printf("== prefix-cache checkpoints vs float64 CPU reference (pool poisoned; unwritten slots byte for byte)\n");
  for (const CkptCase& k : ckpt_cases()) {
    const Host h = make_inputs(k.base);
    const CkptSetup s = make_ckpt_setup(k, h);
    const CkptResult ref = run_ckpt(k, h, s, Backend::kCpuReference);
    if (!ref.status.ok()) {
      std::printf("  reference failed on %s: %s\n", k.base.name.c_str(), ref.status.message.c_str());
      ADD_FAILURE() << k.base.name << ": the reference failed: " << ref.status.message;
      continue;
    }
    const size_t slot_bytes = size_t(s.per_slot) * dtype_bytes(k.pool);
    const double tol_ckpt = k.pool == DType::kF32 ? 1e-3 : kTolStateBF16;
    const bool f32_states = (k.state_pool ? k.pool : k.base.state) == DType::kF32;
    const double tol_out = ref.out.size() < kFewOutputs ? kTolOutFew : kTolOut;
    std::vector<PlanChoice> plans = g_plans;
    for (const std::string& e : k.extra_plans) plans.push_back(parse_plan(e));
    for (const PlanChoice& plan : plans) {
      g_plan = plan;
      const CkptResult got = run_ckpt(k, h, s, Backend::kCuda);
      const std::string what = "cuda/" + plan.name;
      if (!got.status.ok()) {
        report_call_failed(what, k.base.name, "fwd", got.status);
        continue;
      }
      double worst = 0;
      int64_t written = 0, touched = 0;
      bool finite = true;
      for (int64_t slot = 0; slot < s.P2; ++slot) {
        const uint8_t* a = got.pool.data() + slot * slot_bytes;
        const uint8_t* b = ref.pool.data() + slot * slot_bytes;
        const bool is_state = k.state_pool && slot < h.N;  // compared as final states below
        if (is_state) continue;
        if (!s.written[slot]) {
          touched += std::memcmp(a, s.pool0.data() + slot * slot_bytes, slot_bytes) != 0;
          continue;
        }
        ++written;
        std::vector<float> x(size_t(s.per_slot)), y(size_t(s.per_slot));
        for (int64_t e = 0; e < s.per_slot; ++e) {
          if (k.pool == DType::kF32) {
            std::memcpy(&x[e], a + 4 * e, 4), std::memcpy(&y[e], b + 4 * e, 4);
          } else {
            uint16_t u, v;
            std::memcpy(&u, a + 2 * e, 2), std::memcpy(&v, b + 2 * e, 2);
            x[e] = bf16_to_float(u), y[e] = bf16_to_float(v);
          }
          finite &= std::isfinite(x[e]);
        }
        worst = std::max(worst, rel(x, y));
      }
      // The reference must not have touched them either (a check of the check).
      for (int64_t slot = 0; slot < s.P2; ++slot)
        if (!s.written[slot] && !(k.state_pool && slot < h.N))
          touched +=
              std::memcmp(ref.pool.data() + slot * slot_bytes, s.pool0.data() + slot * slot_bytes, slot_bytes) != 0;
      const double e_out = rel(got.out, ref.out), e_state = rel(got.state, ref.state);
      bool out_written = true;
      for (float x : got.out) out_written &= std::isfinite(x);
      for (float x : got.state) out_written &= std::isfinite(x);
      const bool ok = out_written && finite && touched == 0 && e_out <= tol_out &&
                      e_state <= (f32_states ? kTolStateF32 : kTolStateBF16) && worst <= tol_ckpt;
      std::printf("  %-7s %-34s out %.2e  state %.2e  ckpt %.2e (%lld slots)  untouched %s  %s\n", what.c_str(),
                  k.base.name.c_str(), e_out, e_state, worst, static_cast<long long>(written), touched ? "NO" : "yes",
                  ok ? "ok" : "FAIL");
      if (!ok)
        ADD_FAILURE() << what << " " << k.base.name << ": out " << e_out << ", state " << e_state << ", ckpt " << worst
                      << " (tolerance " << tol_ckpt << "), untouched " << (touched ? "NO" : "yes") << "; seed "
                      << seed_value();
    }
    g_plan = PlanChoice{"auto"};
  }
}

// Context parallelism (flash_kda.h: transition, compose; docs/distributed.md): the CUDA transition of
// each case against the float64 CPU one (poisoned first; weak decay, so that P is far from 0), and

}  // namespace
}  // namespace flash_kda::gpu_test
