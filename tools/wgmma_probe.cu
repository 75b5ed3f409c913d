// wgmma_probe: checks, on one warpgroup of an sm_90a GPU, the operand layouts a wgmma consumer of
// the forward kernel would rely on (docs/perf_log.md, next steps): tf32 `wgmma.mma_async` with A
// from registers in the mma.sync m16n8k8 fragment layout and B from shared memory in the
// no-swizzle K-major core-matrix layout, addressed by a matrix descriptor.
//
// D[64 x 32] = A[64 x 16] * B[16 x 32] in two k8 steps (B stored as 32 rows of 16 k values). Each
// hypothesis (A fragment order x meaning of the descriptor's two byte offsets) runs once; the tool
// prints the max relative error of each against a double-precision product of the same
// tf32-rounded operands and exits 0 when exactly the expected hypothesis matches.
//
// Usage: wgmma_probe            (seconds; no arguments)
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

namespace {

constexpr int M = 64, N = 32, K = 16;

__device__ __forceinline__ uint32_t tf32_bits(float x) { return __float_as_uint(x) + 0x1000u; }

// Descriptor of a no-swizzle operand: start address, "leading" and "stride" byte offsets (each
// encoded >> 4 in 14 bits), base offset 0, layout type 0.
__device__ __forceinline__ uint64_t make_desc(const void* smem, uint32_t lead_bytes, uint32_t stride_bytes) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  return uint64_t((addr >> 4) & 0x3FFF) | (uint64_t((lead_bytes >> 4) & 0x3FFF) << 16) |
         (uint64_t((stride_bytes >> 4) & 0x3FFF) << 32);
}

__device__ __forceinline__ void wgmma_m64n32k8(float (&d)[16], const uint32_t (&a)[4], uint64_t desc, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k8.f32.tf32.tf32 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "{%16, %17, %18, %19}, %20, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(acc));
}

// a_order 0: a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4)   (as mma.sync m16n8k8)
// a_order 1: a0 (g, t), a1 (g, t+4), a2 (g+8, t), a3 (g+8, t+4)
// k_lead 1: the descriptor's leading offset steps along K (128 B), the stride offset along N
// k_lead 0: the other way round.
__global__ void probe(const float* A, const float* B, float* D, int a_order, int k_lead) {
  // B as core matrices of 8 rows (n) x 4 k values (16 B): core (n / 8, k / 4) at
  // (n / 8) * kStrideN + (k / 4) * kStepK bytes, row n % 8 at 16 B steps inside.
  constexpr uint32_t kStepK = 128, kStrideN = (K / 4) * 128;
  __shared__ __align__(128) float bs[N * K];
  const int tid = threadIdx.x;
  for (int i = tid; i < N * K; i += blockDim.x) {
    const int n = i / K, k = i % K;
    const uint32_t byte = (n / 8) * kStrideN + (k / 4) * kStepK + (n % 8) * 16 + (k % 4) * 4;
    bs[byte / 4] = __uint_as_float(tf32_bits(B[n * K + k]) & 0xFFFFE000u);
  }
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();

  const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int r0 = 16 * warp + g, r1 = r0 + 8;
  // The A fragments of both k steps are in registers before the first wgmma: registers an
  // in-flight wgmma reads must not change until wgmma.wait_group.
  uint32_t a[K / 8][4];
#pragma unroll
  for (int s = 0; s < K / 8; ++s) {
    const int c0 = 8 * s + t, c1 = c0 + 4;
    if (a_order == 0) {
      a[s][0] = tf32_bits(A[r0 * K + c0]), a[s][1] = tf32_bits(A[r1 * K + c0]);
      a[s][2] = tf32_bits(A[r0 * K + c1]), a[s][3] = tf32_bits(A[r1 * K + c1]);
    } else {
      a[s][0] = tf32_bits(A[r0 * K + c0]), a[s][1] = tf32_bits(A[r0 * K + c1]);
      a[s][2] = tf32_bits(A[r1 * K + c0]), a[s][3] = tf32_bits(A[r1 * K + c1]);
    }
  }
  float d[16] = {};
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
  for (int s = 0; s < K / 8; ++s) {
    const void* start = reinterpret_cast<const char*>(bs) + s * 2 * kStepK;  // two core matrices of K a step
    const uint64_t desc = k_lead ? make_desc(start, kStepK, kStrideN) : make_desc(start, kStrideN, kStepK);
    wgmma_m64n32k8(d, a[s], desc, s);
  }
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  // Accumulator layout (as mma.sync): d[4j] (g, 8j+2t), d[4j+1] (g, 8j+2t+1), d[4j+2] (g+8, 8j+2t), ...
#pragma unroll
  for (int j = 0; j < N / 8; ++j) {
    const int c = 8 * j + 2 * t;
    D[r0 * N + c] = d[4 * j], D[r0 * N + c + 1] = d[4 * j + 1];
    D[r1 * N + c] = d[4 * j + 2], D[r1 * N + c + 1] = d[4 * j + 3];
  }
}

float tf32_host(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u = (u + 0x1000u) & 0xFFFFE000u;
  float r;
  std::memcpy(&r, &u, 4);
  return r;
}

}  // namespace

int main() {
  int dev = 0, major = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  if (major != 9) {
    std::printf("wgmma_probe needs an sm_90 GPU\n");
    return 2;
  }
  std::mt19937 rng(1234);
  std::normal_distribution<float> nd;
  std::vector<float> A(M * K), B(N * K), ref(M * N);
  for (auto& x : A) x = nd(rng);
  for (auto& x : B) x = nd(rng);
  double ref_norm = 0;
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      double s = 0;
      for (int k = 0; k < K; ++k) s += double(tf32_host(A[m * K + k])) * tf32_host(B[n * K + k]);
      ref[m * N + n] = float(s);
      ref_norm = std::max(ref_norm, std::fabs(s));
    }
  float *dA, *dB, *dD;
  cudaMalloc(&dA, A.size() * 4);
  cudaMalloc(&dB, B.size() * 4);
  cudaMalloc(&dD, ref.size() * 4);
  cudaMemcpy(dA, A.data(), A.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(dB, B.data(), B.size() * 4, cudaMemcpyHostToDevice);
  int matches = 0;
  bool expected_ok = false;
  for (int a_order = 0; a_order < 2; ++a_order)
    for (int k_lead = 1; k_lead >= 0; --k_lead) {
      cudaMemset(dD, 0xff, ref.size() * 4);
      probe<<<1, 128>>>(dA, dB, dD, a_order, k_lead);
      const cudaError_t e = cudaDeviceSynchronize();
      std::vector<float> D(ref.size());
      cudaMemcpy(D.data(), dD, D.size() * 4, cudaMemcpyDeviceToHost);
      double err = 0;
      for (size_t i = 0; i < D.size(); ++i) err = std::max(err, double(std::fabs(D[i] - ref[i])));
      err /= ref_norm;
      const bool ok = e == cudaSuccess && err < 1e-5;
      matches += ok;
      if (a_order == 0 && k_lead == 1) expected_ok = ok;
      std::printf("A order %d (%s), leading offset along %s: %s, max error %.2e relative to max |D| %s\n", a_order,
                  a_order == 0 ? "mma.sync m16n8k8" : "row pairs", k_lead ? "K" : "N",
                  e == cudaSuccess ? "ran" : cudaGetErrorString(e), err, ok ? "MATCH" : "");
      if (e != cudaSuccess) return 3;
    }
  std::printf("%s\n", expected_ok && matches == 1 ? "wgmma_probe: the expected layouts hold"
                                                  : "wgmma_probe: UNEXPECTED (see the lines above)");
  return expected_ok && matches == 1 ? 0 : 1;
}
