/**
 * @file segments.cuh
 * @brief Intra-card segments of one document: how many, where each starts, and its storage slot
 *        in seg_hm / seg_h0 (and the backward's seg_dzm / seg_dz).
 *
 * Cfg::SEGMENTS is the most per document (the grid has that many z entries per document; those
 * past a document's count return at once). Pinned (Cfg::SEG_MIN_CHUNKS == 0): every document has
 * SEGMENTS, at slots n * SEGMENTS + seg. "auto" (SEG_MIN_CHUNKS > 0): a document of nc chunks has
 * min(SEGMENTS, max(1, nc / SEG_MIN_CHUNKS)), a function of its own length (batch invariance), at
 * slots n + first / SEG_MIN_CHUNKS + seg, first = its first chunk. Those are distinct: the next
 * document's base is at least n + 1 + first / MIN + nc / MIN, past this one's last slot; and the
 * largest is below N + NT / MIN, the buffers' size (compiler/ir.cpp). The arithmetic is
 * common/segments.hpp, which the host tests check.
 */
#pragma once

#include "common/segments.hpp"

namespace gdn {

template <class Cfg>
struct DocSegments {
  int first;        ///< the document's first chunk
  int chunks;       ///< its chunk count
  int count;        ///< its segments
  long long slot0;  ///< the slot of its segment 0

  __device__ __forceinline__ DocSegments(const int* doc_chunk_offset, int n) {
    first = doc_chunk_offset[n];
    chunks = doc_chunk_offset[n + 1] - first;
    count = seg::count(chunks, Cfg::SEGMENTS, Cfg::SEG_MIN_CHUNKS);
    slot0 = seg::slot0(n, first, Cfg::SEGMENTS, Cfg::SEG_MIN_CHUNKS);
  }
  /// The first chunk of segment s (s = count gives the end).
  __device__ __forceinline__ int begin(int s) const { return seg::begin(first, chunks, count, s); }
};

/// What one block of a segmented walk grid (z = n * SEGMENTS + segment) walks: chunks [begin, end)
/// of document n, the segment's slot, and whether it is the document's last segment (the one that
/// writes ht). With SEGMENTS == 1 the block walks its whole document (z = n).
template <class Cfg>
struct SegmentWalk {
  int n;           ///< the document
  bool active;     ///< false past the document's segments ("auto"): nothing to do
  bool last;       ///< the document's last segment
  int begin, end;  ///< chunks (when active)
  long long slot;  ///< the segment's slot in seg_h0 (SEGMENTS > 1)

  __device__ __forceinline__ explicit SegmentWalk(const int* doc_chunk_offset) {
    constexpr int SEG = Cfg::SEGMENTS;
    const int z = blockIdx.z, seg = SEG > 1 ? z % SEG : 0;
    n = SEG > 1 ? z / SEG : z;
    const DocSegments<Cfg> ds(doc_chunk_offset, n);
    active = seg < ds.count;
    last = seg == ds.count - 1;
    begin = active ? ds.begin(seg) : 0;
    end = active ? ds.begin(seg + 1) : 0;
    slot = ds.slot0 + seg;
  }
};

}  // namespace gdn
