/**
 * @file l2norm.cuh
 * @brief In-kernel q/k L2 norm: rstd = 1 / sqrt(sum x^2 + 1e-6), y = bf16(x * rstd), rstd kept
 *        in fp32 for the backward (docs/algorithm.md 1.2).
 */
#pragma once

#include "common/numeric.cuh"
#include "prep/geometry.hpp"

namespace gdn {

template <class Cfg>
struct L2Norm {
  static constexpr int D = Cfg::K;
  static_assert(D % 128 == 0, "L2Norm: the head dim must be a multiple of 128 (4 bf16 per lane)");
  static constexpr int kPerLane = D / 32;

  __device__ static void run(const L2NormParams& p) {
    // A warp normalizes kRowsPerWarp rows and issues all their loads before the first reduction:
    // one row per warp left a single 8-byte load in flight per lane, about a tenth of the DRAM rate.
    constexpr int R = L2NormGeometry::kRowsPerWarp;
    const long long row0 = static_cast<long long>(blockIdx.x) * L2NormGeometry::kRowsPerBlock + (threadIdx.x / 32) * R;
    if (row0 >= p.rows) return;
    const int lane = threadIdx.x % 32;
    uint2 raw[R][kPerLane / 4];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int i = 0; i < kPerLane; i += 4)
        // 4 consecutive bf16 = 8 bytes per lane per step; a warp reads 256 contiguous bytes.
        raw[r][i / 4] = row0 + r < p.rows ? *reinterpret_cast<const uint2*>(p.x + (row0 + r) * D + i * 32 + lane * 4)
                                          : make_uint2(0u, 0u);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float v[kPerLane];
      float ss = 0.f;
#pragma unroll
      for (int i = 0; i < kPerLane; i += 4) {
        v[i + 0] = bf2f(static_cast<bf16_t>(raw[r][i / 4].x & 0xffff));
        v[i + 1] = bf2f(static_cast<bf16_t>(raw[r][i / 4].x >> 16));
        v[i + 2] = bf2f(static_cast<bf16_t>(raw[r][i / 4].y & 0xffff));
        v[i + 3] = bf2f(static_cast<bf16_t>(raw[r][i / 4].y >> 16));
        ss += v[i] * v[i] + v[i + 1] * v[i + 1] + v[i + 2] * v[i + 2] + v[i + 3] * v[i + 3];
      }
      ss = warp_sum(ss);
      const long long row = row0 + r;
      if (row >= p.rows) continue;
      const float rstd = 1.f / sqrtf(ss + 1e-6f);
      if (p.y != nullptr) {
        bf16_t* y = p.y + row * D;
#pragma unroll
        for (int i = 0; i < kPerLane; i += 4) {
          uint2 out;
          out.x = static_cast<u32>(f2bf(v[i] * rstd)) | (static_cast<u32>(f2bf(v[i + 1] * rstd)) << 16);
          out.y = static_cast<u32>(f2bf(v[i + 2] * rstd)) | (static_cast<u32>(f2bf(v[i + 3] * rstd)) << 16);
          *reinterpret_cast<uint2*>(y + i * 32 + lane * 4) = out;
        }
      }
      if (lane == 0 && p.rstd != nullptr) p.rstd[row] = rstd;
    }
  }
};

}  // namespace gdn
