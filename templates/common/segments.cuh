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
 * largest is below N + NT / MIN, the buffers' size (compiler/ir.cpp).
 */
#pragma once

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
    if (Cfg::SEG_MIN_CHUNKS > 0) {
      const int by_length = chunks / Cfg::SEG_MIN_CHUNKS;
      count = by_length < 1 ? 1 : (by_length > Cfg::SEGMENTS ? Cfg::SEGMENTS : by_length);
      slot0 = (long long)n + first / Cfg::SEG_MIN_CHUNKS;
    } else {
      count = Cfg::SEGMENTS;
      slot0 = (long long)n * Cfg::SEGMENTS;
    }
  }
  /// The first chunk of segment seg (seg = count gives the end).
  __device__ __forceinline__ int begin(int seg) const {
    return first + static_cast<int>((long long)chunks * seg / count);
  }
};

}  // namespace gdn
