/**
 * @file segments.hpp
 * @brief The arithmetic of intra-card segments as plain C++17, shared by the host tests
 *        (tests/test_cp_partition.cpp checks the slots' invariants) and the kernels
 *        (common/segments.cuh): how many segments a document takes, where each starts, and the
 *        storage slot of its first.
 *
 * `most` is Cfg::SEGMENTS, `min_chunks` Cfg::SEG_MIN_CHUNKS (0: pinned, every document `most`).
 */
#pragma once

namespace gdn {
namespace seg {

/// Segments of a document of `chunks` chunks.
constexpr int count(int chunks, int most, int min_chunks) {
  if (min_chunks <= 0) return most;
  const int by_length = chunks / min_chunks;
  return by_length < 1 ? 1 : (by_length > most ? most : by_length);
}

/// Storage slot of segment 0 of document n, whose first chunk is `first`; only documents of two
/// or more segments use slots (one segment reads h0 or dht itself). Pinned: n * most. "auto":
/// first / min_chunks. A split document of c segments has c <= chunks / m, so its slots end
/// before floor((first + chunks) / m), at most the next split document's first slot (its first
/// chunk is at least first + chunks), and every slot is below NT / min_chunks.
constexpr long long slot0(int n, int first, int most, int min_chunks) {
  return min_chunks <= 0 ? (long long)n * most : (long long)first / min_chunks;
}

/// The document and segment of position `l` of a segmented walk grid's `docs` x `most` (document,
/// segment) pairs, segment-major (l = segment * docs + document): every document's first segment
/// comes first in launch order.
struct GridIndex {
  int n;    ///< the document
  int seg;  ///< its segment
};
constexpr GridIndex grid_index(int l, int docs, int most) {
  return most == 1 ? GridIndex{l, 0} : GridIndex{l % docs, l / docs};
}
/// A segmented walk grid is (slabs, HV x most, docs): y = d * HV + head, z = the row of `most`
/// positions, l = z * most + d, which keeps the launch order (slab, head, then l) and lets a call
/// take as many documents as the z axis (65535) whatever `most` is. The host checks HV x most.
constexpr int grid_position(int y, int z, int heads_v, int most) { return most == 1 ? z : z * most + y / heads_v; }
constexpr int grid_head(int y, int heads_v, int most) { return most == 1 ? y : y % heads_v; }
/// The (document row, segment) of block (y, z) of a call's segmented walk grid whose y holds
/// grid_y = heads_v x R rows, R the call's segment rows (at most `most`; the host's segment_rows()).
constexpr GridIndex block_position(int y, int z, int grid_y, int docs, int heads_v, int most) {
  const int rows = most == 1 ? 1 : grid_y / heads_v;
  return grid_index(grid_position(y, z, heads_v, rows), docs, rows);
}
/// The walks take documents longest first (chunk_table writes the order; each document's result
/// does not depend on it): a short document launched first no longer leaves a long one to run
/// alone at the end. The key is the chunk count to a quarter octave (its leading bit and the two
/// after it), larger for longer documents, 0 for an empty one; equal keys keep the batch's order.
/// In a list-scheduling model of the walks, quarter octaves gave the makespan of an exact
/// longest-first order on M and G (docs/PERF.md), and they make the order a counting sort over
/// kDocOrderKeys keys.
constexpr int kDocOrderKeys = 128;
constexpr int doc_order_key(int chunks) {
  if (chunks <= 0) return 0;
  int e = 0;
  while ((chunks >> e) > 1) ++e;  // the leading bit: 0 .. 30
  const int frac = e >= 2 ? (chunks >> (e - 2)) & 3 : (chunks << (2 - e)) & 3;
  return 1 + 4 * e + frac;  // 1 .. 124
}
static_assert(doc_order_key(0x7fffffff) < kDocOrderKeys, "doc_order_key: the largest count's key fits");

/// First chunk of segment s of `segments` (s = segments gives the document's end): first +
/// floor(chunks s / segments), as q s + floor(r s / segments) with chunks = q segments + r, in
/// 32-bit divisions. A 64-bit product divided by a count known only at run time ("auto") is a
/// called routine on the GPU: the fused walks that computed it spilled their state (208 bytes, the
/// speculative walk 50 % slower at heads 16 / 32).
constexpr int begin(int first, int chunks, int segments, int s) {
  const int q = chunks / segments, r = chunks % segments;
  return first + q * s + r * s / segments;
}

/// cp.ranks > 1, the packed tokens cut into parts of per_rank: the first part boundary after token
/// a. A piece of a document that starts at a ends at the smaller of this and the document's end
/// (chunk_table; tests/test_cp_partition.cpp holds the pieces to cp_fragments' cut list). Token
/// positions are below 2^31, so the unsigned sum cannot wrap.
constexpr unsigned next_rank_boundary(unsigned a, unsigned per_rank) { return a - a % per_rank + per_rank; }

}  // namespace seg
}  // namespace gdn
