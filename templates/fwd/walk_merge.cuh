/**
 * @file walk_merge.cuh
 * @brief Intra-card segments: the state entering every segment of a document, chained in fp32
 *        from the prescan's per-segment (S_ext, M) (ALGORITHM.md 4.3 step 4, 4.6 step 2).
 *
 * One block per (32 state columns, value head, document). S = h0 (or 0); for each segment i:
 * seg_h0[i] = S, then S = M_i S + S_ext_i. The sum over k runs in a fixed order (deterministic).
 * The work is SEGMENTS - 1 products of 128 x 128 by 128 x 32 per block: small next to the walks.
 */
#pragma once

#include "common/numeric.cuh"
#include "fwd/geometry.hpp"
#include "params.cuh"

namespace gdn {

template <class Cfg>
struct WalkMerge {
  static_assert(Cfg::K == Cfg::V, "WalkMerge reads M as K columns after V columns of S_ext: K must equal V");
  static constexpr int K = Cfg::K, V = Cfg::V, HV = Cfg::HV, SEG = Cfg::SEGMENTS;
  static constexpr int kThreads = WalkMergeGeometry::kThreads, BC = WalkMergeGeometry::kColumns;
  static_assert(kThreads == 2 * K && BC == 32, "WalkMerge: two threads per state row, 16 columns each");
  static_assert(V % BC == 0, "the column blocks must tile V");

  __device__ static void run(const WalkMergeParams& p) {
    __shared__ float sS[K][BC];
    const int c0 = blockIdx.x * BC, j = blockIdx.y, n = blockIdx.z;
    const int r = threadIdx.x >> 1, half = (threadIdx.x & 1) * 16;
    const bool has_h0 = Cfg::HAS_H0 && p.h0 != nullptr;
    float x[16];
#pragma unroll
    for (int e = 0; e < 16; ++e)
      x[e] = has_h0 ? p.h0[((long long)n * HV + j) * K * V + (long long)r * V + c0 + half + e] : 0.f;
    for (int seg = 0; seg < SEG; ++seg) {
      const long long z = (long long)n * SEG + seg;
      float* out = p.seg_h0 + (z * HV + j) * K * V + (long long)r * V + c0 + half;
#pragma unroll
      for (int e = 0; e < 16; ++e) out[e] = x[e];
      if (seg == SEG - 1) break;
#pragma unroll
      for (int e = 0; e < 16; ++e) sS[r][half + e] = x[e];
      __syncthreads();
      const float* row = p.seg_hm + (z * HV + j) * K * (V + K) + (long long)r * (V + K);
#pragma unroll
      for (int e = 0; e < 16; ++e) x[e] = row[c0 + half + e];  // S_ext
      for (int k = 0; k < K; ++k) {
        const float m = row[V + k];
#pragma unroll
        for (int e = 0; e < 16; ++e) x[e] = fmaf(m, sS[k][half + e], x[e]);
      }
      __syncthreads();  // every thread is done reading sS before the next segment overwrites it
    }
  }
};

}  // namespace gdn
