/**
 * @file l2norm.cuh
 * @brief In-kernel q/k L2 norm: rstd = 1 / sqrt(sum x^2 + 1e-6), y = bf16(x * rstd), rstd kept
 *        in fp32 for the backward (docs/algorithm.md 1.2).
 */
#pragma once

#include "common/grid.cuh"
#include "common/numeric.cuh"
#include "common/segments.cuh"
#include "prep/geometry.hpp"

namespace gdn {

template <class Cfg>
struct L2Norm {
  static constexpr int D = Cfg::K;
  static_assert(D % 128 == 0, "L2Norm: the head dim must be a multiple of 128 (4 bf16 per lane)");
  static constexpr int kPerLane = D / 32;

  /// A row's rstd from this lane's raw bf16 (every lane of the warp calls it), its values in v.
  /// L2Norm and L2NormMarked share it and store_row: kn has one set of bits whichever wrote it.
  __device__ __forceinline__ static float row_rstd(const uint2 (&raw)[kPerLane / 4], float (&v)[kPerLane]) {
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < kPerLane; i += 4) {
      v[i + 0] = bf2f(static_cast<bf16_t>(raw[i / 4].x & 0xffff));
      v[i + 1] = bf2f(static_cast<bf16_t>(raw[i / 4].x >> 16));
      v[i + 2] = bf2f(static_cast<bf16_t>(raw[i / 4].y & 0xffff));
      v[i + 3] = bf2f(static_cast<bf16_t>(raw[i / 4].y >> 16));
      ss += v[i] * v[i] + v[i + 1] * v[i + 1] + v[i + 2] * v[i + 2] + v[i + 3] * v[i + 3];
    }
    ss = warp_sum(ss);
    return 1.f / sqrtf(ss + 1e-6f);
  }
  __device__ __forceinline__ static void store_row(bf16_t* y, const float (&v)[kPerLane], float rstd, int lane) {
#pragma unroll
    for (int i = 0; i < kPerLane; i += 4) {
      uint2 out;
      out.x = f2bf_pair(v[i] * rstd, v[i + 1] * rstd);
      out.y = f2bf_pair(v[i + 2] * rstd, v[i + 3] * rstd);
      *reinterpret_cast<uint2*>(y + i * 32 + lane * 4) = out;
    }
  }

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
      const float rstd = row_rstd(raw[r], v);
      const long long row = row0 + r;
      if (row >= p.rows) continue;
      if (p.y != nullptr) store_row(p.y + row * D, v, rstd, lane);
      if (lane == 0 && p.rstd != nullptr) p.rstd[row] = rstd;
    }
  }
};

/// l2norm_k_marked (sm_90a, the fused forward's verified carry under light saves): kn for the
/// chunks of the chains the verify walks marked, which only their prescan and chunk_prep_fwd_marked
/// read (the fused walks fold the norm); the full l2norm k idles there. A block per (chunk, value
/// head) of a chunk_heads grid: the group's first value head writes the q/k head's rows, a warp a
/// row at a time, when any value head of the group is marked.
template <class Cfg>
struct L2NormMarked {
  static constexpr int D = Cfg::K, G = Cfg::G;
  using Row = L2Norm<Cfg>;

  __device__ static void run(const L2NormMarkedParams& p) {
    const ChunkBlock at = chunk_block(p.chunks);
    if (at.len == 0 || at.head % G != 0) return;
    const int doc = p.chunks[at.chunk].doc;
    const DocSegments<Cfg> ds(p.doc_chunk_offset, p.chunks, doc);
    bool marked = false;
    for (int g = 0; g < G; ++g) marked = marked || marked_chain(ds, p.seg_fail, doc, at.head + g);
    if (!marked) return;
    const int hq = at.head / G, lane = threadIdx.x % 32;
    for (int t = threadIdx.x / 32; t < at.len; t += blockDim.x / 32) {
      const long long row = (static_cast<long long>(at.start) + t) * Cfg::H + hq;
      uint2 raw[Row::kPerLane / 4];
#pragma unroll
      for (int i = 0; i < Row::kPerLane; i += 4)
        raw[i / 4] = *reinterpret_cast<const uint2*>(p.x + row * D + i * 32 + lane * 4);
      float v[Row::kPerLane];
      const float rstd = Row::row_rstd(raw, v);
      Row::store_row(p.y + row * D, v, rstd, lane);
    }
  }
};

}  // namespace gdn
