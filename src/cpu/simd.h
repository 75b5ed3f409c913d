// Fixed-width float vectors for the chunked CPU path, as GCC/Clang vector extensions. W is the width
// the calling function is compiled for (4: SSE2 / NEON, 8: AVX2), so every vector is one register.
// Plain loops did not get there: GCC kept the register-blocked accumulators of the products in memory,
// and the same algorithm on plain loops took 900 ms where this takes 370 (T=8192, H=8, one thread).
//
// Every function is always_inline so that it is compiled as part of its caller, with the caller's
// target ISA (see the kernel selection in chunked.cpp).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#define FLASH_KDA_INLINE inline __attribute__((always_inline))

// GCC and Clang note, at every use, that 32-byte vector arguments change the calling convention without AVX.
// Code on Simd<8> is always inlined into a function compiled for AVX2, so no call with that convention
// exists; the note is silenced for the rest of the including file.
#if defined(__clang__)
#if __has_warning("-Wpsabi")
#pragma clang diagnostic ignored "-Wpsabi"
#endif
#elif defined(__GNUC__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

namespace flash_kda::cpu {

// The vector types live outside Simd: inside a class template, GCC 12 treats a member typedef with a
// dependent vector_size as its scalar type while parsing the members that use it.
template <int W>
struct VecTypes {
  typedef float Vec __attribute__((vector_size(W * sizeof(float))));
  typedef int32_t IVec __attribute__((vector_size(W * sizeof(int32_t))));
};

template <int W>
struct Simd {
  using Vec = typename VecTypes<W>::Vec;
  using IVec = typename VecTypes<W>::IVec;

  static FLASH_KDA_INLINE Vec load(const float* p) {
    Vec v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }

  static FLASH_KDA_INLINE void store(float* p, Vec v) { std::memcpy(p, &v, sizeof v); }

  static FLASH_KDA_INLINE Vec splat(float x) { return Vec{} + x; }

  static FLASH_KDA_INLINE float sum(Vec v) {
    float s = 0.0f;
    for (int i = 0; i < W; ++i) s += v[i];
    return s;
  }

  // exp(x), within 2 ulp for x in [-87, 88] and clamped to that range, so the result of a number is
  // always a finite normal number (no Inf to meet a zero later). NaN stays NaN, as in the float64
  // reference: each clamp is written so that its comparison is false for NaN and keeps x (the
  // other way round, NaN became exp(88)). Cody-Waite reduction x = n ln2 + r with |r| <= ln2/2,
  // the Cephes expf polynomial, then 2^n through the exponent bits (n in [-126, 127]).
  static FLASH_KDA_INLINE Vec exp(Vec x) {
    x = x > 88.0f ? splat(88.0f) : x;
    x = x < -87.0f ? splat(-87.0f) : x;
    // Round to nearest by adding and removing 1.5 · 2^23 (exact: |x · log2 e| < 2^22).
    const Vec n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    const Vec r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
    Vec p = splat(1.9875691500e-4f);
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const Vec y = p * (r * r) + r + 1.0f;
    const IVec bits = (__builtin_convertvector(n, IVec) + 127) << 23;
    Vec two_n;
    std::memcpy(&two_n, &bits, sizeof two_n);
    return y * two_n;
  }

  // log(1 + e^x) (the softplus gate), within a few ulp for every x; NaN stays NaN and +Inf stays
  // +Inf. Written as max(x, 0) + log1p(y) with y = e^-|x| in (0, 1]: log(u) of u = 1 + y in [1, 2]
  // comes from the reduction u = 2^e m with m in [sqrt(1/2), sqrt(2)] (e = 0 or 1, exact) and the
  // Cephes logf polynomial in m - 1; log1p(y) = log(u) · y / (u - 1) then corrects the rounding of
  // 1 + y (and is y where u rounds to 1). For x < -87 the result is e^-87 instead of e^x (exp's
  // clamp): a difference below 2e-38, which a large rate would magnify; rate_softplus below.
  static FLASH_KDA_INLINE Vec softplus(Vec x) {
    const Vec abs_x = x < 0.0f ? -x : x;
    const Vec y = exp(-abs_x);
    const Vec u = 1.0f + y;
    const Vec high = u > 1.41421356f ? splat(1.0f) : splat(0.0f);  // the exponent e
    const Vec z = (high > 0.0f ? u * 0.5f : u) - 1.0f;
    Vec p = splat(7.0376836292e-2f);
    p = p * z - 1.1514610310e-1f;
    p = p * z + 1.1676998740e-1f;
    p = p * z - 1.2420140846e-1f;
    p = p * z + 1.4249322787e-1f;
    p = p * z - 1.6668057665e-1f;
    p = p * z + 2.0000714765e-1f;
    p = p * z - 2.4999993993e-1f;
    p = p * z + 3.3333331174e-1f;
    const Vec z2 = z * z;
    const Vec log_u = ((p * z * z2 - 0.5f * z2) + z) + high * 0.693147181f;
    const Vec d = u - 1.0f;
    const Vec log1p_y = d == 0.0f ? y : log_u * (y / (d == 0.0f ? splat(1.0f) : d));
    return (x > 0.0f ? x : splat(0.0f)) + log1p_y;
  }

  // exp(log_rate) · softplus(x), the softplus gate's decay rate (rate = exp(log_rate)). Where e^x
  // is far below 1 the product is formed as exp(log_rate + x): softplus(x) = e^x to within e^x / 2
  // relative for x < -20, and the rate may be as large as e^88, so the product of the rate and an
  // e^x that exp's clamp (or fp32) cut off at e^-87 would be e^(log_rate - 87) instead of
  // e^(log_rate + x) (A_log = 80, g = -100: a decay of e^-7 a token instead of e^-3e-9). NaN stays
  // NaN (the comparison is false and the direct form keeps it).
  static FLASH_KDA_INLINE Vec rate_softplus(Vec x, float log_rate, float rate) {
    const Vec direct = rate * softplus(x);
    const Vec small = exp(x + log_rate);
    return x < -20.0f ? small : direct;
  }
};

// Whether the 8-wide AVX2 + FMA kernels should run: the CPU has them and FLASH_KDA_CPU_ISA is not
// "portable" (which forces the 4-wide baseline kernels; that is how the tests cover them on AVX2
// machines). Callers decide once per process, so every call takes the same arithmetic path.
inline bool use_avx2_kernels() {
  const char* isa = std::getenv("FLASH_KDA_CPU_ISA");
  if (isa && std::string(isa) == "portable") return false;
#if defined(__x86_64__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

}  // namespace flash_kda::cpu
