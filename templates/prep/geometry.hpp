/**
 * @file geometry.hpp
 * @brief Launch geometry of the prep programs, shared by the host (IR) and the templates.
 *        Plain C++17: no device code and no includes, so both compilers read it.
 */
#pragma once

namespace gdn {

struct ChunkTableGeometry {
  static constexpr int kThreads = 1024;
  static constexpr int smem_bytes() { return 0; }
};

/// One warp per kRowsPerWarp rows of D elements.
struct L2NormGeometry {
  static constexpr int kThreads = 256;
  static constexpr int kRowsPerWarp = 8;
  static constexpr int kRowsPerBlock = kThreads / 32 * kRowsPerWarp;
  static constexpr long long grid_x(long long rows) { return (rows + kRowsPerBlock - 1) / kRowsPerBlock; }
  static constexpr int smem_bytes() { return 0; }
};

/// A block per (chunk, kHeadsPerBlock value heads), one warp scanning each head.
struct GateCumsumGeometry {
  static constexpr int kHeadsPerBlock = 8;
  static constexpr int kThreads = 32 * kHeadsPerBlock;
  static constexpr int grid_y(int HV) { return (HV + kHeadsPerBlock - 1) / kHeadsPerBlock; }
  static constexpr int smem_bytes() { return 0; }
};

}  // namespace gdn
