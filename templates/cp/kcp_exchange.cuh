/**
 * @file kcp_exchange.cuh
 * @brief One rank of a context-parallel run (docs/design_kcp.md 3.1): the summary it contributes
 *        to the all-gather, and the gathered summaries of the ranks its boundary documents span,
 *        copied into the segment slots where the merge chains through them.
 *
 * A record is [HV, K, V + K] fp32, one segment slot of seg_hm (S_ext | M, forward) or seg_dzm
 * (dZ_ext | A = M^T, backward). A rank holds one piece of each of its documents; only its first
 * document can have pieces on earlier ranks and only its last on later ones (common/segments.cuh:
 * the local pieces [lo, hi], count in all). Piece s of a document lies on rank r - lo + s.
 *  - forward send: the last document's (S_ext, M) if it continues on the next rank, else zeros;
 *  - forward receive: the first document's pieces 0 .. lo - 1 from ranks r - lo .. r - 1;
 *  - backward send: the first document's (dZ_ext, A) if it started on an earlier rank, else zeros;
 *  - backward receive: the last document's pieces hi + 1 .. count - 1 from ranks r + 1 ...
 * Plain copies: the merge does the arithmetic, in the proxy's order.
 */
#pragma once

#include "common/segments.cuh"
#include "cp/geometry.hpp"
#include "params.cuh"

namespace gdn {

template <class Cfg>
struct KcpExchange {
  static constexpr long long kRecord = (long long)Cfg::HV * Cfg::K * (Cfg::V + Cfg::K);  ///< floats
  static_assert(kRecord % 4 == 0, "records are copied as float4");

  /// dst = src (records of kRecord floats), or zeros when src is null; the whole grid strides.
  __device__ static void copy(float* dst, const float* src, long long records) {
    const long long n4 = records * kRecord / 4;
    float4* d = reinterpret_cast<float4*>(dst);
    const float4* s = reinterpret_cast<const float4*>(src);
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4; i += (long long)gridDim.x * blockDim.x)
      d[i] = s ? s[i] : make_float4(0.f, 0.f, 0.f, 0.f);
  }

  __device__ static void run(const KcpExchangeParams& p) {
    const bool last_doc = p.mode == kKcpForwardSend || p.mode == kKcpBackwardReceive;
    const DocSegments<Cfg> ds(p.doc_chunk_offset, p.chunks, last_doc ? p.N - 1 : 0);
    switch (p.mode) {
      case kKcpForwardSend:
        copy(p.send, ds.hi < ds.count - 1 ? p.slots + (ds.slot0 + ds.hi) * kRecord : nullptr, 1);
        break;
      case kKcpForwardReceive:
        if (ds.lo > 0) copy(p.slots + ds.slot0 * kRecord, p.gathered + (long long)(p.rank - ds.lo) * kRecord, ds.lo);
        break;
      case kKcpBackwardSend: copy(p.send, ds.lo > 0 ? p.slots + (ds.slot0 + ds.lo) * kRecord : nullptr, 1); break;
      case kKcpBackwardReceive:
        if (ds.hi < ds.count - 1)
          copy(p.slots + (ds.slot0 + ds.hi + 1) * kRecord, p.gathered + (long long)(p.rank + 1) * kRecord,
               ds.count - 1 - ds.hi);
        break;
    }
  }
};

}  // namespace gdn
