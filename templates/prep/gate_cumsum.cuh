/**
 * @file gate_cumsum.cuh
 * @brief Stage F0: chunk-local inclusive cumsum of g, restarting at every chunk start, in fp32
 *        and in log2 units (times 1/ln 2) so later programs use exp2.
 *
 * It also checks g: the programs clamp every gate difference at 0 (exp2 of at most 0), which is
 * exact for log decays (g <= 0) and silently wrong for a positive g (a raw logit passed where its
 * logsigmoid belongs), and a NaN or infinite g poisons whole chunks. The lowest t x HV + head of
 * such a gate goes to the status block by atomicMin (the same report whatever the blocks' order);
 * the host reads it when the caller asks (Layer::check_device_status).
 */
#pragma once

#include "common/numeric.cuh"
#include "prep/geometry.hpp"

namespace gdn {

template <class Cfg>
struct GateCumsum {
  static_assert(Cfg::CHUNK == 64, "GateCumsum: one warp scans a 64-token chunk, two tokens per lane");

  /// The block's lowest bad key, then the batch's by one global atomicMin (kStatusNoKey from
  /// chunk_table is larger than every key). Every reporting block writes the same code.
  __device__ static void report_bad_gate(const GateCumsumParams& p, long long key) {
    __shared__ long long block_key;
    if (threadIdx.x == 0) block_key = kStatusNoKey;
    __syncthreads();
    if (key != kStatusNoKey) atomicMin(&block_key, key);
    __syncthreads();
    if (threadIdx.x == 0) {
      atomicMin(&p.status->value, block_key);
      atomicExch(&p.status->code, static_cast<int>(kGateNotLogDecay));
    }
  }

  __device__ static void run(const GateCumsumParams& p) {
    // The chunk's [64 x kHeadsPerBlock] gates pass through shared memory so that global reads and
    // writes are whole 32-byte row pieces (a warp per head read one float per 192-byte row).
    constexpr int NH = GateCumsumGeometry::kHeadsPerBlock, C = Cfg::CHUNK, kPitch = NH + 1;
    __shared__ float tile[C * kPitch];
    const ChunkInfo c = p.chunks[blockIdx.x];
    if (c.len == 0) return;
    const int j0 = blockIdx.y * NH;
    long long bad_key = kStatusNoKey;  // this thread's first gate that is not a finite log decay
    for (int i = threadIdx.x; i < C * NH; i += GateCumsumGeometry::kThreads) {
      const int t = i / NH, h = i % NH;
      const long long at = static_cast<long long>(c.start + t) * Cfg::HV + j0 + h;
      const bool inside = t < c.len && j0 + h < Cfg::HV;
      const float x = inside ? p.g[at] : 0.f;
      // !(x <= 0) holds for NaN as well; -inf passes it and fails the second test (-FLT_MAX).
      if ((!(x <= 0.f) || x < -3.40282347e38f) && at < bad_key) bad_key = at;
      tile[t * kPitch + h] = x;
    }
    if (__syncthreads_or(bad_key != kStatusNoKey)) report_bad_gate(p, bad_key);
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
