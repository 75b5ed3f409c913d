// The small set of cases meant to run under compute-sanitizer (memcheck, racecheck, synccheck,
// initcheck): the forward with pools and checkpoints, and decode, at K = V = 128 and 64, seconds on a
// GPU (minutes under racecheck). The forward runs under every plan of FLASH_KDA_GPU_PLANS, by default
// auto,fused,split:3 here (split:3 cuts even these short cases into segments):
//   compute-sanitizer --tool racecheck --error-exitcode 3 build/tests/gpu/test_cuda_sanitize
//   FLASH_KDA_GPU_PLANS=auto,split32:4 compute-sanitizer --tool memcheck build/tests/gpu/test_cuda_sanitize
// (scripts/gpu_check.sh runs memcheck and racecheck). Decode has no plans: --gtest_filter=CudaSanitize.Forward
// leaves it out.
#define FLASH_KDA_GPU_DEFAULT_PLANS "auto,fused,split:3"

#include "checkpoint_cases.cuh"
#include "decode_cases.cuh"
#include "pool_cases.cuh"

namespace flash_kda::gpu_test {
namespace {

// Small varlen forward cases (in place, a bf16 state, the 8-consumer-warp shape, a split whose pass 1
// runs whole-head CTAs), a prefill on a pool and checkpoints on a long sequence, at K = V = 128 and
// 64, under every plan of FLASH_KDA_GPU_PLANS: every output written.
TEST(CudaSanitize, Forward) {
  bool all_written = true;
  for (const PlanChoice& plan : g_plans) {
    g_plan = plan;
    // K = V = 128, then 64 (24 pairs: 4 CTAs a pair, of 2 consumer warps at D = 128, 1 at 64; 80
    // pairs: 1 CTA of 8 consumer warps at D = 128, 4 at 64).
    for (int dim : {128, 64}) {
      const std::string prefix = dim == 64 ? "D=64 " : "";
      Case c;
      c.name = prefix + "sanitize varlen";
      c.lens = {37, 0, 70, 1, 16, 300};
      c.in_place = true;
      c.dim = dim;
      const Host h = make_inputs(c);
      bool written = false;
      run_backend(c, h, Backend::kCuda, &written);
      c.lens = {45, 3};
      c.H = 40;  // 80 pairs: the 8-consumer-warp shape (D = 64: 4 consumer warps)
      c.in_place = false;
      c.state = DType::kBF16;
      const Host h2 = make_inputs(c);
      bool written2 = false;
      run_backend(c, h2, Backend::kCuda, &written2);
      // A split whose pass 1 runs whole-head CTAs of 8 consumer warps (24 heads, 600 tokens: 3
      // segments, 72 pass-1 CTAs of 128 rows at D = 128), which the short cases above do not reach.
      c.lens = {600};
      c.H = 24;
      c.state = DType::kF32;
      const Host h3 = make_inputs(c);
      bool written3 = false;
      run_backend(c, h3, Backend::kCuda, &written3);
      all_written = all_written && written3;
      // An unsplit walk whose 96 parts leave SMs idle but do not fit twice: four 2-warp CTAs a part,
      // three an SM, each with a 4-stage ring (D = 128 on 132 SMs; docs/kernel.md, "Plans").
      c.H = 96;
      const Host h4 = make_inputs(c);
      bool written4 = false;
      run_backend(c, h4, Backend::kCuda, &written4);
      all_written = all_written && written4;
      // pool indexing, padding, out-of-range slot
      for (const PoolCase& pc : pool_cases())
        if (pc.name == prefix + "varlen 300/0/17/90/5 fp32") run_prefill_pool_case(pc);
      // Checkpoints on a sequence long enough (2,000 tokens) that the recurrence kernel's ring of
      // stages wraps many times in the instantiation with checkpoints (its piecewise walk).
      for (const CkptCase& k : ckpt_cases()) {
        if (k.base.name != prefix + "ckpt I=1024 start 1000") continue;
        const Host hk = make_inputs(k.base);
        const CkptSetup sk = make_ckpt_setup(k, hk);
        const CkptResult got = run_ckpt(k, hk, sk, Backend::kCuda);
        all_written = all_written && got.status.ok();
      }
      all_written = all_written && written && written2;
    }
  }
  g_plan = PlanChoice{"auto"};
  std::printf("sanitize forward run done, written %s\n", all_written ? "yes" : "NO");
  EXPECT_TRUE(all_written) << "an output left unwritten (poisoned) or a failed call; seed " << seed_value();
}

// Decode: speculative with padding (fp32, 1 row a thread), 4 rows a thread on a bf16 pool (one pass,
// two with one token a step, many waves of CTAs with padding and speculative slots), and the gate forms'
// branches (the softplus gate, no A_log), several tokens a step on 4 rows a thread (fp32: the token
// walk; bf16 at 640 pairs and more: the matrix step) with padding and packed batches; K = V = 64
// likewise (1 and 4 rows a thread).
TEST(CudaSanitize, Decode) {
  for (const char* name : {"spec S=3 padding", "320 pairs bf16 spec", "528 pairs bf16 padding (two passes)",
                           "640 pairs bf16 padding (two passes)", "640 pairs bf16 spec (one pass)",
                           "softplus spec S=3 padding bf16",
                           "softplus e^-1e4 varlen 1/0/8/3 bf16", "A_log=None spec S=4 T=2 stride 6 bf16",
                           "D=64 spec S=3 padding", "D=64 1080 pairs bf16 spec", "D=64 softplus spec S=3 padding bf16",
                           "D=64 A_log=None spec S=4 T=2 stride 6 bf16", "320 pairs T=4 padding",
                           "640 pairs bf16 T=8 sigmoid floor padding", "bf16 varlen 720 x 0..8 (matrix step)",
                           "D=64 1080 pairs T=4 padding"}) {
    for (const DecodeCase& dc : decode_cases()) {
      if (dc.name != name) continue;
      const DecodeSetup d = make_decode_setup(dc);
      std::vector<uint16_t> out;
      HostPool pool;
      run_decode_backend(dc, d, Backend::kCuda, out, pool);
    }
  }
  std::printf("sanitize decode run done\n");
}

}  // namespace
}  // namespace flash_kda::gpu_test
