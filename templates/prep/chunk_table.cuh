/**
 * @file chunk_table.cuh
 * @brief Builds the chunk table of a packed varlen batch on the device and checks cu_seqlens,
 *        so no call ever needs a device-to-host copy of cu_seqlens (graph-capturable).
 *
 * One block. Documents are cut into ceil(len / CHUNK) chunks from their own first token. With
 * cp.ranks R > 1 (the single-GPU proxy of context parallelism) a document is first cut at every rank
 * boundary r P (P = T / R, which the host checks divides T) strictly inside it, and each piece is
 * chunked from its own first token, as the rank holding it would; ChunkInfo::piece numbers the
 * pieces (common/segments.cuh makes them the walks' segments), with each document's piece count.
 * One rank of a context-parallel run (rank_local) sees only its own tokens: no cuts, every document
 * is one piece, numbered as in the whole batch (its first document's follows pieces_before pieces on
 * earlier ranks, its last document's has pieces_after more on later ranks). Invalid
 * cu_seqlens (first != 0, decreasing, last != T) and a document longer than the caller's bound
 * (max_doc_tokens) are reported in DeviceStatus (the lowest failing index wins, so the report is
 * deterministic) and produce an empty table, so every later program does nothing instead of
 * reading out of bounds. It also writes the order in which the walks take
 * the documents, longest first (write_doc_order).
 */
#pragma once

#include "common/numeric.cuh"
#include "common/segments.hpp"
#include "prep/geometry.hpp"

namespace gdn {

template <class Cfg>
struct ChunkTable {
  static constexpr int kThreads = ChunkTableGeometry::kThreads;

  __device__ static long long cu_at(const ChunkTableParams& p, int i) {
    return p.cu_is_int64 ? static_cast<const long long*>(p.cu_seqlens)[i]
                         : static_cast<long long>(static_cast<const int*>(p.cu_seqlens)[i]);
  }

  /// The end of the piece that starts at token a of a document ending at e (common/segments.hpp);
  /// with one rank there is no boundary inside a document. 32-bit unsigned arithmetic: positions of
  /// a valid table are in [0, T], T < 2^31, and a 64-bit division is a subroutine that spills in
  /// this 1024-thread block.
  __device__ static unsigned piece_end(unsigned a, unsigned e, unsigned per_rank, bool cuts) {
    if (Cfg::RANKS <= 1 || !cuts) return e;
    return min(e, seg::next_rank_boundary(a, per_rank));
  }

  /// The walks' launch order of the documents (seg::doc_order_key, longest first; equal keys in
  /// the batch's order): a stable counting sort, in tiles of kThreads documents whose ranks within
  /// a key come from each warp's peers with the same key. Without a valid table every key is 0 and
  /// the order is the batch's.
  __device__ static void write_doc_order(const ChunkTableParams& p, int used) {
    constexpr int kKeys = seg::kDocOrderKeys, kWarps = kThreads / 32;
    __shared__ int key_count[kKeys];
    __shared__ int key_base[kKeys];
    __shared__ int warp_count[kWarps][kKeys];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    auto key_of = [&](int d) {
      const int end = d + 1 < p.N ? p.doc_chunk_offset[d + 1] : used;
      return seg::doc_order_key(end - p.doc_chunk_offset[d]);
    };
    for (int b = tid; b < kKeys; b += kThreads) key_count[b] = 0;
    __syncthreads();
    for (int d = tid; d < p.N; d += kThreads) atomicAdd(&key_count[key_of(d)], 1);
    __syncthreads();
    if (tid == 0) {
      int sum = 0;
      for (int b = kKeys - 1; b >= 0; --b) {
        key_base[b] = sum;
        sum += key_count[b];
      }
    }
    for (int tile = 0; tile < p.N; tile += kThreads) {
      const int d = tile + tid;
      const int key = d < p.N ? key_of(d) : -1;
      for (int i = tid; i < kWarps * kKeys; i += kThreads) warp_count[i / kKeys][i % kKeys] = 0;
      __syncthreads();
      const unsigned peers = __match_any_sync(0xffffffffu, key);
      const int rank = __popc(peers & ((1u << lane) - 1u));
      if (key >= 0 && rank == 0) warp_count[warp][key] = __popc(peers);
      __syncthreads();
      if (key >= 0) {
        int pos = key_base[key] + rank;
        for (int w = 0; w < warp; ++w) pos += warp_count[w][key];
        p.doc_order[pos] = d;
      }
      __syncthreads();
      for (int b = tid; b < kKeys; b += kThreads) {
        int sum = 0;
        for (int w = 0; w < kWarps; ++w) sum += warp_count[w][b];
        key_base[b] += sum;
      }
      __syncthreads();
    }
  }

  __device__ static void run(const ChunkTableParams& p) {
    const unsigned per_rank = max(1u, static_cast<unsigned>(p.T) / Cfg::RANKS);
    const bool cuts = !p.rank_local;
    __shared__ int first_bad;  // lowest failing index, or INT_MAX
    __shared__ int scan[kThreads];
    __shared__ int total;
    const int tid = threadIdx.x;
    if (tid == 0) first_bad = 0x7fffffff;
    __syncthreads();

    // Index 0 checks cu[0] == 0, index N checks cu[N] == T, 1..N check monotonicity and the
    // caller's bound on document i - 1.
    for (int i = tid; i <= p.N; i += kThreads) {
      bool bad = (i == 0 && cu_at(p, 0) != 0) || (i > 0 && cu_at(p, i) < cu_at(p, i - 1)) ||
                 (i > 0 && p.max_doc_tokens > 0 && cu_at(p, i) - cu_at(p, i - 1) > p.max_doc_tokens) ||
                 (i == p.N && cu_at(p, p.N) != p.T);
      if (bad) atomicMin(&first_bad, i);
    }
    __syncthreads();
    const bool valid = first_bad == 0x7fffffff;

    // Per-thread contiguous run of documents, then an exclusive block scan of the run totals.
    const int per = (p.N + kThreads - 1) / kThreads;
    const int d0 = min(p.N, tid * per), d1 = min(p.N, d0 + per);
    int mine = 0;
    if (valid)
      for (int d = d0; d < d1; ++d) {
        const unsigned e = static_cast<unsigned>(cu_at(p, d + 1));
        for (unsigned a = static_cast<unsigned>(cu_at(p, d)); a < e;) {
          const unsigned b = piece_end(a, e, per_rank, cuts);
          mine += static_cast<int>((b - a + Cfg::CHUNK - 1) / Cfg::CHUNK);
          a = b;
        }
      }
    scan[tid] = mine;
    __syncthreads();
    for (int off = 1; off < kThreads; off <<= 1) {
      int v = tid >= off ? scan[tid - off] : 0;
      __syncthreads();
      scan[tid] += v;
      __syncthreads();
    }
    int offset = scan[tid] - mine;
    if (tid == kThreads - 1) total = scan[tid];
    __syncthreads();
    const bool fits = total <= p.nt_max;

    for (int d = d0; d < d1; ++d) {
      p.doc_chunk_offset[d] = (valid && fits) ? offset : 0;
      if (valid && fits) {
        const unsigned e = static_cast<unsigned>(cu_at(p, d + 1));
        const unsigned a0 = static_cast<unsigned>(cu_at(p, d));
        int piece = 0, pieces = 1;
        if (cuts) {
          for (unsigned a = a0; (a = piece_end(a, e, per_rank, true)) < e;) ++pieces;
        } else {
          piece = d == 0 ? p.pieces_before : 0;
          pieces = piece + 1 + (d == p.N - 1 ? p.pieces_after : 0);
        }
        int idx = 0;
        for (unsigned a = a0; a < e; ++piece) {
          const unsigned b = piece_end(a, e, per_rank, cuts);
          for (unsigned c = a; c < b; c += Cfg::CHUNK, ++idx) {
            ChunkInfo info;
            info.start = static_cast<int>(c);
            info.len = static_cast<int>(min(static_cast<unsigned>(Cfg::CHUNK), b - c));
            info.doc = d;
            info.piece = Cfg::RANKS > 1 ? piece | pieces << kPieceBits : 0;
            p.chunks[offset + idx] = info;
          }
          a = b;
        }
        offset += idx;
      }
    }
    const int used = (valid && fits) ? total : 0;
    for (int c = used + tid; c < p.nt_max; c += kThreads) {
      ChunkInfo empty = {0, 0, 0, 0};
      p.chunks[c] = empty;
    }
    __syncthreads();  // every document's offset is written
    write_doc_order(p, used);
    if (tid == 0) {
      p.doc_chunk_offset[p.N] = used;
      *p.num_chunks = used;
      DeviceStatus st = {kCuOk, 0, kStatusNoKey, 0};
      if (!valid) {
        const int i = first_bad;
        st.index = i;
        if (i == 0 && cu_at(p, 0) != 0) {
          st.code = kCuFirstNotZero;
          st.value = cu_at(p, 0);
          st.expected = 0;
        } else if (i > 0 && cu_at(p, i) < cu_at(p, i - 1)) {
          st.code = kCuDecreasing;
          st.value = cu_at(p, i);
          st.expected = cu_at(p, i - 1);
        } else if (i == p.N && cu_at(p, p.N) != p.T) {
          st.code = kCuLastNotT;
          st.value = cu_at(p, p.N);
          st.expected = p.T;
        } else {
          st.code = kCuLongerThanBound;
          st.value = cu_at(p, i) - cu_at(p, i - 1);
          st.expected = p.max_doc_tokens;
        }
      } else if (!fits) {
        st.code = kCuTooManyChunks;
        st.value = total;
        st.expected = p.nt_max;
      }
      *p.status = st;
    }
  }
};

}  // namespace gdn
