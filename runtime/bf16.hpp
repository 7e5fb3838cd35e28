/**
 * @file bf16.hpp
 * @brief Host-side bfloat16 conversions (round to nearest even, NaN kept), matching the
 *        device's cvt.rn.bf16.f32, for uploading inputs and reading results.
 */
#pragma once

#include <cstdint>
#include <cstring>

namespace gdn {

inline uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN stays a (quiet) NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float from_bf16(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace gdn
