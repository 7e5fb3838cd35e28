/**
 * @file segments.cuh
 * @brief Intra-card segments of one document: how many, where each starts, and its storage slot
 *        in seg_hm / seg_h0 (and the backward's seg_dzm / seg_dz).
 *
 * Cfg::SEGMENTS is the most per document (the grid has that many z entries per document; those
 * past a document's count return at once). Pinned (Cfg::SEG_MIN_CHUNKS == 0): every document has
 * SEGMENTS, at slots n * SEGMENTS + seg. "auto" (SEG_MIN_CHUNKS > 0): a document of nc chunks has
 * min(SEGMENTS, max(1, nc / SEG_MIN_CHUNKS)), a function of its own length (batch invariance), at
 * slots first / SEG_MIN_CHUNKS + seg, first = its first chunk. Only split documents (two or more
 * segments) use slots: a document of one segment walks from h0 (or dht) and the merges skip it, as
 * with SEGMENTS == 1. The split documents' slots are distinct (c <= nc / MIN segments end before
 * floor((first + nc) / MIN), at most the next one's base) and below NT / MIN, the buffers' size
 * (compiler/ir.cpp). The arithmetic is common/segments.hpp, which the host tests check.
 *
 * cp.ranks R > 1 (the single-GPU proxy of context parallelism, docs/design_kcp.md 2): the segments
 * are the pieces between the rank boundaries r T / R inside the document, each chunked from its
 * own first token by chunk_table, which numbers them in ChunkInfo::piece. SEGMENTS is R (a document
 * spans at most R ranks), the slots are pinned (n * R + piece), and a piece's first chunk is found
 * by a binary search over the document's chunks (pieces are non-decreasing along them).
 *
 * One rank of a context-parallel run (chunk_table's rank_local) holds one piece of each of its
 * documents: the local pieces [lo, hi] of a document are those it has chunks of; the others are
 * remote (their segments have no block to walk: the prescans and walks skip them, the merges chain
 * through their gathered summaries). In the proxy every piece is local.
 */
#pragma once

#include "common/pipeline.cuh"
#include "common/segments.hpp"
#include "params.cuh"

namespace gdn {

/// Cfg::SAVED_MAPS where the program has it (walk_prescan, walk_bwd_prescan, walk_merge_bwd),
/// else false: the forward's
/// per-segment maps (S_ext | M) are saved, the forward prescan computes every segment's transition M, and the backward
/// takes A = M^T from them instead of walking it (compiler/ir.cpp).
template <class Cfg, class = int>
struct SavedMaps {
  static constexpr bool value = false;
};
template <class Cfg>
struct SavedMaps<Cfg, decltype((void)Cfg::SAVED_MAPS, 0)> {
  static constexpr bool value = Cfg::SAVED_MAPS;
};

/// Cfg::VERIFIED_CARRY where the program has it (the forward's state_walk, walk_prescan,
/// walk_merge, walk_speculate, walk_verify and the backward's state_walk_bwd, walk_bwd_prescan,
/// walk_merge_bwd, walk_bwd_speculate, walk_bwd_verify), else false: cp.carry "verified"
/// (docs/algorithm.md 4.7). A document's segments are walked at once, from zero except the one
/// with the true entry (the first forward, the last backward), each then re-walked from its
/// neighbour's end until its state equals the walk from zero bit for bit; the prescan, the merge
/// and the full walk then run only for the chains that did not verify.
template <class Cfg, class = int>
struct VerifiedCarry {
  static constexpr bool value = false;
};
template <class Cfg>
struct VerifiedCarry<Cfg, decltype((void)Cfg::VERIFIED_CARRY, 0)> {
  static constexpr bool value = Cfg::VERIFIED_CARRY;
};

/// Which walk of the verified carry a fused walk program runs (FusedWalkSpeculate,
/// FusedWalkVerify): Cfg::CARRY_WALK where the program's Cfg has it, else the plain walk.
enum class CarryWalk { walk, speculate, verify };
template <class Cfg, CarryWalk kMode>
struct WithCarryWalk : Cfg {
  static constexpr CarryWalk CARRY_WALK = kMode;
};
template <class Cfg, class = int>
struct CarryWalkOf {
  static constexpr CarryWalk value = CarryWalk::walk;
};
template <class Cfg>
struct CarryWalkOf<Cfg, decltype((void)Cfg::CARRY_WALK, 0)> {
  static constexpr CarryWalk value = Cfg::CARRY_WALK;
};

template <class Cfg>
struct DocSegments {
  int first;        ///< the document's first chunk
  int chunks;       ///< its chunk count
  int count;        ///< its segments
  int lo, hi;       ///< its local segments (cp.ranks > 1: the pieces this run has chunks of)
  long long slot0;  ///< the slot of its segment 0

  const ChunkInfo* table;  ///< the chunk table (cp.ranks > 1: the pieces' numbers)

  __device__ __forceinline__ DocSegments(const int* doc_chunk_offset, const ChunkInfo* chunk_table, int n)
      : table(chunk_table) {
    first = doc_chunk_offset[n];
    chunks = doc_chunk_offset[n + 1] - first;
    if (Cfg::RANKS > 1) {
      constexpr int mask = (1 << kPieceBits) - 1;
      const int tag_first = chunks > 0 ? table[first].piece : 1 << kPieceBits;
      const int tag_last = chunks > 0 ? table[first + chunks - 1].piece : 1 << kPieceBits;
      count = tag_last >> kPieceBits;
      lo = tag_first & mask;
      hi = tag_last & mask;
      slot0 = (long long)n * Cfg::SEGMENTS;
    } else {
      count = seg::count(chunks, Cfg::SEGMENTS, Cfg::SEG_MIN_CHUNKS);
      lo = 0;
      hi = count - 1;
      slot0 = seg::slot0(n, first, Cfg::SEGMENTS, Cfg::SEG_MIN_CHUNKS);
    }
  }
  /// The document has two or more segments: its walks enter and leave through the slots.
  __device__ __forceinline__ bool split() const { return count > 1; }
  /// Segment s has a block to walk here (it exists and its chunks are this run's).
  __device__ __forceinline__ bool local(int s) const { return s >= lo && s <= hi && s < count; }
  /// The first chunk of segment s (s = count gives the end).
  __device__ __forceinline__ int begin(int s) const {
    if (Cfg::RANKS > 1) {
      if (s <= lo) return first;
      if (s > hi) return first + chunks;
      int a = first, b = first + chunks - 1;  // the first chunk of piece >= s lies in (a, b]
      while (b - a > 1) {
        const int mid = a + (b - a) / 2;
        if ((table[mid].piece & ((1 << kPieceBits) - 1)) >= s)
          b = mid;
        else
          a = mid;
      }
      return b;
    }
    return seg::begin(first, chunks, count, s);
  }
};

/// Cfg::MARKED_CHAINS where the program has it (dv_local_marked, chunk_prep_marked,
/// chunk_prep_fwd_marked), else false: the program runs for the chunks of the chains the verified
/// carry marked only (marked_chain).
template <class Cfg, class = int>
struct MarkedChains {
  static constexpr bool value = false;
};
template <class Cfg>
struct MarkedChains<Cfg, decltype((void)Cfg::MARKED_CHAINS, 0)> {
  static constexpr bool value = Cfg::MARKED_CHAINS;
};

/// Whether document n's chain on value head j was marked by the verified carry's walks (its mark
/// nonzero, in seg_fail or the forward's fwd_fail): only a split document's chains have a mark,
/// the others verify by construction (their one segment walked from the true entry).
template <class Cfg>
__device__ __forceinline__ bool marked_chain(const DocSegments<Cfg>& ds, const int* seg_fail, int n, int j) {
  return ds.split() && seg_fail[(long long)n * Cfg::HV + j] != 0;
}

/// The verified carry's gate test: whether the gates decay every window that its verification
/// re-walks by 2^kCarryDecayLog2 or more (the forward's: the first kCarryCheckpoints chunks of each
/// segment but the first; the reverse walk's: the last ones of each segment but the last). A chain
/// that fails it cannot be expected to verify (slow-decay heads, g = 0, empty segments) and goes
/// to the merge without the speculative walks. Every thread of the block calls it; every block of
/// the chain gets the same answer (the same sums in the same order).
template <class Cfg, bool kReverse>
__device__ bool chain_decays(const DocSegments<Cfg>& ds, const ChunkInfo* chunks, const float* gc, int j) {
  bool ok = true;
  for (int s = (kReverse ? 0 : 1) + (int)threadIdx.x; s < ds.count - (kReverse ? 1 : 0); s += (int)blockDim.x) {
    const int b = ds.begin(s), e = ds.begin(s + 1);
    const int lo = kReverse ? max(b, e - kCarryCheckpoints) : b, hi = kReverse ? e : min(e, b + kCarryCheckpoints);
    float log2_decay = 0.f;  // gc is the chunk-local cumsum in log2 units: a chunk's last entry is its decay
    for (int c = lo; c < hi; ++c) {
      const ChunkInfo ci = chunks[c];
      log2_decay += gc[((long long)ci.start + ci.len - 1) * Cfg::HV + j];
    }
    ok = ok && hi > lo && log2_decay <= (float)kCarryDecayLog2;
  }
  return __syncthreads_and(ok);
}

/// The backward's mark of a chain before either of its walks (0: speculate on it). A chain the
/// forward marked (forward_mark, from the saved region) was walked by the forward's prescan, which
/// saved its maps: the backward merges it with them (kChainSavedMaps, the merge carry's programs
/// and bits) instead of speculating on it. Else a chain that fails the reverse gate test walks its
/// own transitions (kChainOwnMaps). Every block of the chain gets the same answer.
template <class Cfg>
__device__ int reverse_chain_mark(const DocSegments<Cfg>& ds, const ChunkInfo* chunks, const float* gc, int j,
                                  int forward_mark) {
  if (forward_mark != 0) return kChainSavedMaps;
  return chain_decays<Cfg, true>(ds, chunks, gc, j) ? 0 : kChainOwnMaps;
}

/// The document and segment of this block of a segmented walk grid (x: slabs, y: HV * R, z: N;
/// seg::grid_position), segment-major: position segment * N + i, document doc_order[i]. R, the
/// call's segment rows (at most SEGMENTS), is as many segments as the call's longest possible
/// document can take (the host's segment_rows()), so no segment a document takes is left out and
/// a call of short documents launches fewer blocks that only return. Under "auto" a short
/// document leaves its later segments idle; in this order the blocks with work come first in
/// launch order and spread over the SMs (document-major, every R-th z has work, and those blocks
/// land on SMs that are already walking while others hold only blocks that returned at once).
/// doc_order (chunk_table) puts the longest documents first: blocks start in launch order, and a
/// long document started last would walk alone after the others (seg::doc_order_key).
using GridSegment = seg::GridIndex;

template <int SEGMENTS, int HV>
__device__ __forceinline__ GridSegment grid_segment(const int* doc_order) {
  GridSegment at = seg::block_position(static_cast<int>(blockIdx.y), static_cast<int>(blockIdx.z),
                                       static_cast<int>(gridDim.y), static_cast<int>(gridDim.z), HV, SEGMENTS);
  at.n = doc_order[at.n];
  return at;
}
/// The value head of this block of a walk grid (segmented or not).
template <class Cfg>
__device__ __forceinline__ int walk_head() {
  return seg::grid_head(static_cast<int>(blockIdx.y), Cfg::HV, Cfg::SEGMENTS);
}

/// What one block of a segmented walk grid walks: chunks [begin, end) of document n, the segment's
/// slot, and whether it is the document's last segment (the one that writes ht). With
/// SEGMENTS == 1 the block walks its whole document (z = n).
template <class Cfg>
struct SegmentWalk {
  int n;           ///< the document
  int seg;         ///< its segment
  bool active;     ///< false past the document's segments ("auto") or on a remote piece: nothing to do
  bool last;       ///< the document's last segment
  bool split;      ///< the document has two or more segments (its entry comes from its slot)
  int begin, end;  ///< chunks (when active)
  long long slot;  ///< the segment's slot in seg_h0 (SEGMENTS > 1, split)

  __device__ __forceinline__ SegmentWalk(const int* doc_chunk_offset, const ChunkInfo* chunk_table,
                                         const int* doc_order) {
    const GridSegment at = grid_segment<Cfg::SEGMENTS, Cfg::HV>(doc_order);
    n = at.n;
    seg = at.seg;
    const DocSegments<Cfg> ds(doc_chunk_offset, chunk_table, n);
    active = ds.local(seg);
    last = seg == ds.count - 1;
    split = ds.split();
    begin = active ? ds.begin(seg) : 0;
    end = active ? ds.begin(seg + 1) : 0;
    slot = ds.slot0 + seg;
  }
};

/// The verified carry on a fused walk (docs/design_fused_fwd_sm90.md 3.11.1), by the program's
/// CarryWalkOf<Cfg>:
///  - walk: the plain walk; under VERIFIED_CARRY with marks (the forward's merge path) only the
///    chains marked in them, every chain with null marks (the backward's re-run);
///  - speculate: every segment at once, a split document's first from h0 and the others from 0,
///    with o and the tapes, the state after each of a later segment's first kCarryCheckpoints
///    chunks (seg_ckpt) and each segment's end as the next one's entry (seg_h0);
///  - verify: each later segment of a split document from that entry over exactly
///    min(kCarryCheckpoints, its chunks) chunks (a warp-specialized ring cannot stop early),
///    rewriting o and the tapes there; a chain none of whose chunks met its checkpoint is marked.
/// A chain whose gates decay too slowly to verify is marked before any walk (chain_decays).
template <class Cfg>
struct FusedCarry {
  static constexpr CarryWalk kMode = CarryWalkOf<Cfg>::value;
  static constexpr bool kSpeculate = kMode == CarryWalk::speculate, kVerify = kMode == CarryWalk::verify;
  static_assert(kMode == CarryWalk::walk || (VerifiedCarry<Cfg>::value && Cfg::SEGMENTS > 1 && Cfg::RANKS == 1),
                "FusedCarry: the speculate and verify walks need VERIFIED_CARRY, segments and one rank");

  /// Whether this block walks. Every thread of the block calls it, before any barrier of the
  /// body (the gate test is a block-wide vote); a verify block's range shrinks to its window.
  __device__ static bool prepare(SegmentWalk<Cfg>& range, const int* doc_chunk_offset, const ChunkInfo* chunks,
                                 const float* gc, int* marks, int j) {
    if (!range.active) return false;
    int* const fail = marks != nullptr ? marks + (long long)range.n * Cfg::HV + j : nullptr;
    if constexpr (kMode == CarryWalk::walk) {
      return !(VerifiedCarry<Cfg>::value && fail != nullptr && (!range.split || *fail == 0));
    } else {
      if (kVerify && (!range.split || range.seg == 0)) return false;
      if (range.split) {
        const DocSegments<Cfg> ds(doc_chunk_offset, chunks, range.n);
        if (!chain_decays<Cfg, false>(ds, chunks, gc, j)) {
          if (kSpeculate && range.seg == 0 && blockIdx.x == 0 && threadIdx.x == 0) *fail = 1;
          return false;
        }
      }
      if (kVerify) range.end = min(range.end, range.begin + kCarryCheckpoints);
      return true;
    }
  }
  /// speculate: a split document's later segment starts from zero.
  __device__ static bool from_zero(const SegmentWalk<Cfg>& range) { return kSpeculate && range.split && range.seg > 0; }
  /// The checkpoints of the segment (value head j): kCarryCheckpoints states of [K, V] floats.
  __device__ static long long checkpoint_base(const SegmentWalk<Cfg>& range, int j) {
    return (range.slot * Cfg::HV + j) * kCarryCheckpoints * Cfg::K * Cfg::V;
  }
  /// The segment's entry slot in seg_h0 (s = 0) and the next segment's (s = 1).
  __device__ static long long entry_base(const SegmentWalk<Cfg>& range, int j, int s) {
    return ((range.slot + s) * Cfg::HV + j) * Cfg::K * Cfg::V;
  }
};

/// The verified carry on the reverse walk's sm_90a body (state_walk_bwd_sm90.cuh), by the program's
/// CarryWalkOf<Cfg>; the portable body's early-stopping loop (state_walk_bwd.cuh) has the same
/// contract:
///  - walk: the plain walk; under VERIFIED_CARRY with marks only the marked chains of split
///    documents;
///  - speculate: every segment at once, a split document's last from dht and the others from 0,
///    with the tapes, the gradient after each of a from-zero segment's first kCarryCheckpoints
///    chunks walked (seg_ckpt) and each later segment's start gradient as its predecessor's end
///    (seg_dz); the last segment's block clears the chain's mark, or sets it for a chain the
///    forward marked or whose gates decay too slowly (reverse_chain_mark), which no walk takes;
///  - verify: each earlier segment of a split document from that end over exactly
///    min(kCarryCheckpoints, its chunks) chunks (a warp-specialized ring cannot stop early),
///    rewriting the tapes there; a chain whose window ends off its checkpoint is marked.
template <class Cfg>
struct ReverseCarry {
  static constexpr CarryWalk kMode = CarryWalkOf<Cfg>::value;
  static constexpr bool kSpeculate = kMode == CarryWalk::speculate, kVerify = kMode == CarryWalk::verify;
  static_assert(kMode == CarryWalk::walk || (VerifiedCarry<Cfg>::value && Cfg::SEGMENTS > 1 && Cfg::RANKS == 1),
                "ReverseCarry: the speculate and verify walks need VERIFIED_CARRY, segments and one rank");

  /// The chain's mark in seg_fail.
  __device__ static int* mark(const StateWalkBwdParams& p, const SegmentWalk<Cfg>& range, int j) {
    return p.seg_fail + (long long)range.n * Cfg::HV + j;
  }
  /// Whether this block walks. Every thread of the block calls it, before any barrier of the body
  /// (the gate test is a block-wide vote); a verify block's range shrinks to its window, the
  /// segment's last chunks.
  __device__ static bool prepare(SegmentWalk<Cfg>& range, const StateWalkBwdParams& p, int j) {
    if constexpr (kMode == CarryWalk::walk) {
      return !(VerifiedCarry<Cfg>::value && p.seg_fail != nullptr && (!range.split || *mark(p, range, j) == 0));
    } else {
      if (kVerify && (!range.split || range.last)) return false;
      if (range.split) {
        const DocSegments<Cfg> ds(p.doc_chunk_offset, p.chunks, range.n);
        const int chain = reverse_chain_mark<Cfg>(ds, p.chunks, p.gc, j, p.fwd_fail[(long long)range.n * Cfg::HV + j]);
        const bool writer = kSpeculate && range.last && blockIdx.x == 0 && threadIdx.x == 0;
        if (writer) *mark(p, range, j) = chain;  // 0: the chain starts out verified
        if (chain != 0) return false;
      }
      if (kVerify) range.begin = max(range.begin, range.end - kCarryCheckpoints);
      return true;
    }
  }
  /// speculate: a split document's earlier segments start from zero.
  __device__ static bool from_zero(const SegmentWalk<Cfg>& range) { return kSpeculate && range.split && !range.last; }
  /// The walk starts from dht (or zero without it): an unsplit document, and speculate's last segment.
  __device__ static bool from_dht(const SegmentWalk<Cfg>& range) { return !range.split || (kSpeculate && range.last); }
  /// The checkpoints of the segment (value head j): kCarryCheckpoints gradients of [K, V] floats.
  __device__ static long long checkpoint_base(const SegmentWalk<Cfg>& range, int j) {
    return (range.slot * Cfg::HV + j) * kCarryCheckpoints * Cfg::K * Cfg::V;
  }

#if GDN_HAS_WGMMA
  // The walk's carry steps, shared by the reverse walk's sm_90a bodies (the split one per slab
  // warpgroup, the fused one in its gradient's owner). for_state(base, f) visits the thread's
  // elements of a [K, V] gradient, f(element, offset from base).

  /// Loads the gradient at the segment's end into the thread's elements: the segment's slot (the
  /// merge, or the speculative walk of the next segment), else dht. False where the walk starts
  /// from zero (a speculative walk's earlier segments, or no dht): the caller zeroes them.
  template <class ForState>
  __device__ __forceinline__ static bool load_end(const StateWalkBwdParams& p, const SegmentWalk<Cfg>& range, int j,
                                                  ForState&& for_state) {
    if constexpr (Cfg::SEGMENTS == 1) {  // the document's end: dht
      if (!(Cfg::HAS_HT && p.dht != nullptr)) return false;
      for_state(((long long)range.n * Cfg::HV + j) * Cfg::K * Cfg::V, [&](float& x, long long at) { x = p.dht[at]; });
      return true;
    } else {
      const bool from_slot = range.split && !from_dht(range);
      const float* const src = from_zero(range) ? nullptr : from_slot ? p.seg_dz : Cfg::HAS_HT ? p.dht : nullptr;
      if (src == nullptr) return false;
      const long long row = from_slot ? range.slot : range.n;
      for_state((row * Cfg::HV + j) * Cfg::K * Cfg::V, [&](float& x, long long at) { x = src[at]; });
      return true;
    }
  }
  /// speculate: the gradient after the u-th chunk walked, for the segment's first chunks.
  template <class ForState>
  __device__ __forceinline__ static void checkpoint(const StateWalkBwdParams& p, const SegmentWalk<Cfg>& range, int j,
                                                    int u, ForState&& for_state) {
    if constexpr (kSpeculate) {
      if (from_zero(range) && u < kCarryCheckpoints)
        for_state(checkpoint_base(range, j) + (long long)u * Cfg::K * Cfg::V,
                  [&](float& x, long long at) { p.seg_ckpt[at] = x; });
    }
  }
  /// The walk's end, by every thread of the warpgroups that hold the gradient (`threads` of them
  /// on named barrier `barrier`; ctid the thread's index there) after its last chunk (nc walked).
  /// verify: the window's last gradient against the speculative walk's (the columns evolve
  /// independently and every step is the same arithmetic, so one comparison at the window's end
  /// decides it; an empty window never verifies) marks the chain where they differ. speculate:
  /// a split document's later segments store their start gradient as the previous segment's end.
  /// Returns whether the walk goes on to write dh0 (a document's dh0 is its first segment's).
  template <class ForState>
  __device__ __forceinline__ static bool finish(const StateWalkBwdParams& p, const SegmentWalk<Cfg>& range, int j,
                                                int nc, int barrier, int threads, int ctid, ForState&& for_state) {
    if constexpr (kVerify) {
      bool same = nc > 0;
      if (nc > 0)
        for_state(checkpoint_base(range, j) + (long long)(nc - 1) * Cfg::K * Cfg::V, [&](float& x, long long at) {
          same = same && __float_as_uint(p.seg_ckpt[at]) == __float_as_uint(x);
        });
      if (!pipe::named_all(barrier, threads, same) && ctid == 0) atomicExch(mark(p, range, j), kChainOwnMaps);
      return false;
    }
    if constexpr (kSpeculate) {
      if (range.split && range.seg > 0) {
        float* const dst = const_cast<float*>(p.seg_dz);
        for_state(((range.slot - 1) * Cfg::HV + j) * Cfg::K * Cfg::V, [&](float& x, long long at) { dst[at] = x; });
        return false;
      }
    }
    return range.seg == 0;
  }
#endif  // GDN_HAS_WGMMA
};

}  // namespace gdn
