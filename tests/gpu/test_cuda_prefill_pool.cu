// Prefill on a state pool (FwdParams::state_indices, has_initial_state) against the float64 CPU
// reference, under every plan of FLASH_KDA_GPU_PLANS: padding slots (-1), an out-of-range slot, fresh
// states; padding out rows and every slot no sequence names must stay untouched
// (tests/gpu/pool_cases.cuh, run_prefill_pool_case).
#include "pool_cases.cuh"

namespace flash_kda::gpu_test {
namespace {

TEST(CudaPrefillPool, EveryPlan) {
  std::printf("== prefill on a state pool vs float64 CPU reference (CUDA backend)\n");
  for (const PlanChoice& plan : g_plans) {
    g_plan = plan;
    std::printf("-- plan %s\n", plan.name.c_str());
    for (const PoolCase& pc : pool_cases()) run_prefill_pool_case(pc);
  }
  g_plan = PlanChoice{"auto"};
}

}  // namespace
}  // namespace flash_kda::gpu_test
