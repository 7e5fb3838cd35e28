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
    // The chunk's [64 x kHeadsPerBlock] gates pass through shared memory so that global reads and
    // writes are whole 32-byte row pieces (a warp per head read one float per 192-byte row).
    constexpr int NH = GateCumsumGeometry::kHeadsPerBlock, C = Cfg::CHUNK, kPitch = NH + 1;
    __shared__ float tile[C * kPitch];
    const ChunkInfo c = p.chunks[blockIdx.x];
    if (c.len == 0) return;
    const int j0 = blockIdx.y * NH;
    for (int i = threadIdx.x; i < C * NH; i += GateCumsumGeometry::kThreads) {
      const int t = i / NH, h = i % NH;
      tile[t * kPitch + h] =
          t < c.len && j0 + h < Cfg::HV ? p.g[static_cast<long long>(c.start + t) * Cfg::HV + j0 + h] : 0.f;
    }
    __syncthreads();
    const int h = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int i0 = 2 * lane, i1 = 2 * lane + 1;
    const float a = tile[i0 * kPitch + h], b = tile[i1 * kPitch + h];
    const float pair = a + b;
    float incl = pair;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const float up = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += up;
    }
    const float before = incl - pair;
    tile[i0 * kPitch + h] = (before + a) * kRcpLn2;
    tile[i1 * kPitch + h] = (before + a + b) * kRcpLn2;
    __syncthreads();
    for (int i = threadIdx.x; i < C * NH; i += GateCumsumGeometry::kThreads) {
      const int t = i / NH, hh = i % NH;
      if (t < c.len && j0 + hh < Cfg::HV)
        p.gc[static_cast<long long>(c.start + t) * Cfg::HV + j0 + hh] = tile[t * kPitch + hh];
    }
  }
};

}  // namespace gdn
