// bfloat16 on the host, for filling and reading flash-kda's bf16 buffers from C++.
//
// flash-kda's activations (q, k, v, g, beta, out) and bf16 states are bfloat16: the upper 16 bits
// of an IEEE-754 float (sign, 8 exponent bits, 7 mantissa bits). The API takes them as untyped
// pointers (`const void*`), so any 2-byte storage with that bit pattern works: uint16_t here,
// __nv_bfloat16 in CUDA code, torch.bfloat16 / ml_dtypes.bfloat16 in Python. These helpers convert
// between float and that bit pattern; no CUDA header is needed.
//
//   std::vector<float> qf = ...;                                    // [B, T, H, K], row-major
//   std::vector<uint16_t> q = flash_kda::bf16::from_float(qf);      // round to nearest even
//   p.q = q.data();
//   ...
//   std::vector<float> o = flash_kda::bf16::to_float(out);          // exact
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace flash_kda {
namespace bf16 {

// float -> bf16 bits, rounding to nearest, ties to even (as CUDA's __float2bfloat16 and PyTorch
// do). Infinities stay infinities, a NaN stays a (quiet) NaN, and values beyond bf16's largest
// finite value round to infinity.
inline uint16_t from_float(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  const uint32_t round = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + round) >> 16);
}

// bf16 bits -> float (exact: every bf16 value is a float).
inline float to_float(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Element-wise over n values.
inline void from_float(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = from_float(src[i]);
}
inline void to_float(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = to_float(src[i]);
}

inline std::vector<uint16_t> from_float(const std::vector<float>& src) {
  std::vector<uint16_t> dst(src.size());
  from_float(src.data(), dst.data(), src.size());
  return dst;
}
inline std::vector<float> to_float(const std::vector<uint16_t>& src) {
  std::vector<float> dst(src.size());
  to_float(src.data(), dst.data(), src.size());
  return dst;
}

}  // namespace bf16
}  // namespace flash_kda
