// Decode (docs/serving.md) on the CUDA backend against the float64 CPU reference: K = V = 128 and
// 64, T = 1..8, fp32 and bf16 pools, padding, speculative index rows with accepted counts, every gate
// form and extreme softplus gates (tests/gpu/decode_cases.cuh). Padding rows of out and every pool
// slot the call does not write are checked byte for byte.
#include "decode_cases.cuh"

namespace flash_kda::gpu_test {
namespace {

TEST(CudaDecode, AgainstFloat64Reference) {
  std::printf("== decode vs float64 CPU reference (CUDA backend)\n");
  for (const DecodeCase& dc : decode_cases()) {
    const DecodeSetup d = make_decode_setup(dc);
    std::vector<uint16_t> out_ref, out_gpu;
    HostPool pool_ref, pool_gpu;
    run_decode_backend(dc, d, Backend::kCpuReference, out_ref, pool_ref);
    run_decode_backend(dc, d, Backend::kCuda, out_gpu, pool_gpu);
    // out: active sequences' rows against the reference; padding rows still poisoned; the slots the
    // call does not write byte for byte.
    const PoolComparison r = compare_pool_run(
        d.h, [&](int64_t n) { return bool(d.active[n]); }, out_gpu, out_ref, d.pool, pool_gpu, pool_ref,
        [&](int64_t s) { return d.written.count(s) > 0; });
    const double tol_state = dc.state == DType::kF32 ? kTolDecodeStateF32 : kTolDecodeStateBF16;
    report_pool_run("decode", dc.name, r, kTolDecodeOut, tol_state);
  }
}

}  // namespace
}  // namespace flash_kda::gpu_test
