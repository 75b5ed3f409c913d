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
    // out: active sequences' rows against the reference; padding rows still poisoned.
    const Host& h = d.h;
    std::vector<float> got, ref;
    bool written = true;
    for (int64_t n = 0; n < h.N; ++n) {
      const int64_t b = h.cu.empty() ? n * h.T : h.cu[n], e = h.cu.empty() ? (n + 1) * h.T : h.cu[n + 1];
      for (int64_t i = b * h.HV * h.dim; i < e * h.HV * h.dim; ++i) {
        if (!d.active[n]) {
          written &= out_gpu[i] == 0xffff;  // untouched
          continue;
        }
        got.push_back(bf16_to_float(out_gpu[i]));
        ref.push_back(bf16_to_float(out_ref[i]));
        written &= std::isfinite(got.back());
      }
    }
    std::vector<float> s_got, s_ref;
    for (int64_t s = 0; s < d.pool.P; ++s) {
      if (!d.written.count(s)) {
        written &= pool_gpu.slot_equal(d.pool, s);  // byte for byte
        continue;
      }
      for (int64_t i = s * d.pool.per_slot; i < (s + 1) * d.pool.per_slot; ++i) {
        s_got.push_back(pool_gpu.at(i));
        s_ref.push_back(pool_ref.at(i));
        written &= std::isfinite(s_got.back());
      }
    }
    const double tol_state = dc.state == DType::kF32 ? kTolDecodeStateF32 : kTolDecodeStateBF16;
    report("decode", dc.name, got.empty() ? 0 : rel(got, ref), s_got.empty() ? 0 : rel(s_got, s_ref), written,
           kTolDecodeOut, tol_state);
  }
}

}  // namespace
}  // namespace flash_kda::gpu_test
