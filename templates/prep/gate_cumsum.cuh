/**
 * @file gate_cumsum.cuh
 * @brief Stage F0: chunk-local inclusive cumsum of g, restarting at every chunk start, in fp32
 *        and in log2 units (times 1/ln 2) so later programs use exp2.
 */
#pragma once

#include "common/numeric.cuh"
#include "prep/geometry.hpp"

namespace gdn {

template <class Cfg>
struct GateCumsum {
  static_assert(Cfg::CHUNK == 64, "GateCumsum: one warp scans a 64-token chunk, two tokens per lane");

  __device__ static void run(const GateCumsumParams& p) {
    const ChunkInfo c = p.chunks[blockIdx.x];
    const int j = blockIdx.y * GateCumsumGeometry::kHeadsPerBlock + threadIdx.x / 32;
    if (c.len == 0 || j >= Cfg::HV) return;
    const int lane = threadIdx.x % 32;
    const int i0 = 2 * lane, i1 = 2 * lane + 1;
    const float a = i0 < c.len ? p.g[static_cast<long long>(c.start + i0) * Cfg::HV + j] : 0.f;
    const float b = i1 < c.len ? p.g[static_cast<long long>(c.start + i1) * Cfg::HV + j] : 0.f;
    const float pair = a + b;
    float incl = pair;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const float up = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += up;
    }
    const float before = incl - pair;
    if (i0 < c.len) p.gc[static_cast<long long>(c.start + i0) * Cfg::HV + j] = (before + a) * kRcpLn2;
    if (i1 < c.len) p.gc[static_cast<long long>(c.start + i1) * Cfg::HV + j] = (before + a + b) * kRcpLn2;
  }
};

}  // namespace gdn
