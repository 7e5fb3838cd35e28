/**
 * @file walk_merge.cuh
 * @brief Intra-card segments: the state entering every segment of a document, chained in fp32
 *        from the prescan's per-segment (S_ext, M) (docs/algorithm.md 4.3 and 4.6: the merge).
 *
 * One block per (8 state columns, value head, document). S = h0 (or 0); for each segment i:
 * seg_h0[i] = S, then S = M_i S + S_ext_i. The sum over k runs in a fixed order (deterministic).
 * The work is a chain of SEGMENTS - 1 products of 128 x 128 by 128 x 8 per block: its time is the
 * chain's latency, so the columns are spread thin over many blocks (16 per value head) and each
 * link waits for one round trip of its loads.
 * On one rank of a context-parallel run the chain of a boundary document runs through the remote
 * pieces' gathered summaries in the same order and the same fp32 operations as the proxy's chain,
 * so the local piece starts from the proxy's bits (docs/design_kcp.md 3.1).
 *
 * WalkMergeBwd is the backward's: Z = dht (or 0); for each segment i from the last: seg_dz[i] = Z,
 * then Z = A_i Z + dZ_ext_i, A_i = M_i^T (docs/algorithm.md 4.4, 4.6): on one rank read from the
 * forward's saved maps (M_i's column r is A_i's row r; SavedMaps), on a rank of a context-parallel
 * run from the backward prescan's records.
 */
#pragma once

#include "common/numeric.cuh"
#include "common/segments.cuh"
#include "fwd/geometry.hpp"
#include "params.cuh"

namespace gdn {

template <class Cfg, bool kReverse = false>
struct WalkMerge {
  static_assert(Cfg::K == Cfg::V, "WalkMerge reads M as K columns after V columns of S_ext: K must equal V");
  static constexpr int K = Cfg::K, V = Cfg::V, HV = Cfg::HV, SEG = Cfg::SEGMENTS;
  static constexpr int kThreads = WalkMergeGeometry::kThreads, BC = WalkMergeGeometry::kColumns, kCols = BC / 2;
  static_assert(kThreads == 2 * K && kCols == 4, "WalkMerge: two threads per state row, 4 columns each");
  static_assert(V % BC == 0, "the column blocks must tile V");

  __device__ static void run(const WalkMergeParams& p) {
    __shared__ __align__(16) float sS[K][BC];
    const int c0 = blockIdx.x * BC, j = blockIdx.y, n = blockIdx.z;
    const int r = threadIdx.x >> 1, half = (threadIdx.x & 1) * kCols;
    const DocSegments<Cfg> ds(p.doc_chunk_offset, p.chunks, n);
    if (!ds.split()) return;  // one segment: its walk reads h0 (dht) itself and has no slot
    // A verified chain keeps its speculative walk's entries. The backward takes A from the saved
    // maps where the layer saves them; under the verified carry only for a chain whose forward
    // prescan walked it (kChainSavedMaps).
    bool saved_maps = kReverse && SavedMaps<Cfg>::value;
    if constexpr (VerifiedCarry<Cfg>::value) {
      const int mark = p.seg_fail != nullptr ? p.seg_fail[(long long)n * HV + j] : kChainOwnMaps;
      if (mark == 0) return;
      saved_maps = saved_maps && mark == kChainSavedMaps;
    }
    const bool has_h0 = (kReverse ? Cfg::HAS_HT : Cfg::HAS_H0) && p.h0 != nullptr;  // dht in the backward
    float x[kCols];
#pragma unroll
    for (int e = 0; e < kCols; ++e)
      x[e] = has_h0 ? p.h0[((long long)n * HV + j) * K * V + (long long)r * V + c0 + half + e] : 0.f;
    // Forward: segments 0 .. hi (a rank stops at its local piece: what follows is the later
    // ranks'); backward: count - 1 down to lo. Remote segments chain through the gathered
    // summaries that kcp_exchange copied into their slots.
    int seg = kReverse ? ds.count - 1 : 0;
    const int last = kReverse ? ds.lo : ds.hi;
    // The state entering the first document's local piece, kept by the forward for a recompute.
    const bool entry = !kReverse && Cfg::RANKS > 1 && ds.lo > 0;
    float* const entry_at = p.kcp_entry + (long long)j * K * V + (long long)r * V + c0 + half;
    if (entry && p.kcp_entry_mode == kKcpEntryRead) {
#pragma unroll
      for (int e = 0; e < kCols; ++e) x[e] = entry_at[e];
      seg = ds.lo;
    }
    for (;; seg += kReverse ? -1 : 1) {
      const long long z = ds.slot0 + seg;
      float* out = p.seg_h0 + (z * HV + j) * K * V + (long long)r * V + c0 + half;
#pragma unroll
      for (int e = 0; e < kCols; ++e) out[e] = x[e];
      if (entry && seg == ds.lo && p.kcp_entry_mode == kKcpEntryWrite)
#pragma unroll
        for (int e = 0; e < kCols; ++e) entry_at[e] = x[e];
      if (seg == last) break;
      // The link's whole row r of M (A) and its S_ext columns are loaded before the barrier: they
      // do not depend on the chain, so a link waits for one round trip of loads, not one per
      // k-block. A's row r on one rank is column r of the forward's saved M (consecutive rows r
      // of a warp read consecutive floats); else row r of the record, four floats a load.
      const float* const rec = p.seg_hm + (z * HV + j) * K * (V + K) + (long long)r * (V + K);
      float a[K];
      if (saved_maps) {
        const float* col = p.fwd_maps + (z * HV + j) * K * (V + K) + V + r;
#pragma unroll
        for (int k = 0; k < K; ++k) a[k] = col[(long long)k * (V + K)];
      } else {
        const float4* row = reinterpret_cast<const float4*>(rec + V);
#pragma unroll
        for (int q = 0; q < K / 4; ++q) {
          const float4 t = row[q];
          a[4 * q] = t.x, a[4 * q + 1] = t.y, a[4 * q + 2] = t.z, a[4 * q + 3] = t.w;
        }
      }
#pragma unroll
      for (int e = 0; e < kCols; ++e) sS[r][half + e] = x[e];
      {
        const float4 t = *reinterpret_cast<const float4*>(rec + c0 + half);  // S_ext
        x[0] = t.x, x[1] = t.y, x[2] = t.z, x[3] = t.w;
      }
      __syncthreads();
      // The sum over k in a fixed order (deterministic; the same order at every column width).
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const float4 s4 = *reinterpret_cast<const float4*>(&sS[k][half]);
        x[0] = fmaf(a[k], s4.x, x[0]);
        x[1] = fmaf(a[k], s4.y, x[1]);
        x[2] = fmaf(a[k], s4.z, x[2]);
        x[3] = fmaf(a[k], s4.w, x[3]);
      }
      __syncthreads();  // every thread is done reading sS before the next segment overwrites it
    }
  }
};

/// The backward's merge over the same parameter block (seg_hm = seg_dzm, h0 = dht, seg_h0 = seg_dz).
template <class Cfg>
struct WalkMergeBwd {
  __device__ static void run(const WalkMergeParams& p) { WalkMerge<Cfg, true>::run(p); }
};

}  // namespace gdn
