// Host-side bfloat16 conversions (round to nearest even, NaN preserved), shared by the CPU backend,
// the tests and the tools. Device code uses cuda_bf16.h instead.
#pragma once

#include <cstdint>
#include <cstring>

namespace flash_kda {

inline float bf16_to_float(uint16_t h) {
  const uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline uint16_t float_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40u);  // quiet NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return uint16_t(bits >> 16);
}

}  // namespace flash_kda
