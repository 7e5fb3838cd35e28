/**
 * @file dv_local.cuh
 * @brief Stage B2 (dV'_local = P^T dO with P = scale * tril0(Qc Kc^T .* Dec) in bf16), plus the
 *        small tile helpers every backward program uses (async tile loads, accumulator pair
 *        walks, deterministic row/column reductions of an Acc).
 *
 * The helpers live here because dv_local.cuh is the first backward stage and every other
 * backward header includes it; nothing in them is specific to B2.
 */
#pragma once

#include "common/async_copy.cuh"
#include "common/mma.cuh"
#include "bwd/geometry.hpp"
#include "common/segments.cuh"

namespace gdn {
namespace bwd {

__device__ __forceinline__ u32 smem_addr(const void* p) {
  u32 a;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  return a;
}

/// 16-byte async copy; invalid rows are zero-filled (src-size 0) so partial chunks need no
/// separate clearing pass and the masked rows enter every product as exact zeros.
__device__ __forceinline__ void cp_async16(u32 dst_smem, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst_smem), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  cp_async16(smem_addr(dst), src, valid);
}
/// 4-byte async copy (one fp32 scalar), zero-filled when invalid.
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(valid ? 4 : 0)
               : "memory");
}
/// One 16-byte global store, written as such: the compiler split a plain uint4 store of
/// computed values into four 4-byte stores (seen in the SASS of state_walk_bwd).
__device__ __forceinline__ void st_global_v4(void* p, uint4 v) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}
using gdn::cp_async_commit;
using gdn::cp_async_wait;

/// Starts the copy of a ROWS x COLS bf16 tile (global row stride gstride elements) into shared
/// memory with row pitch spitch; rows >= valid_rows become zeros.
template <int ROWS, int COLS, int THREADS>
__device__ __forceinline__ void load_tile_async(bf16_t* dst, int spitch, const bf16_t* src, long long gstride,
                                                int valid_rows) {
  static_assert(COLS % 8 == 0, "load_tile_async: rows must be whole 16-byte pieces");
  constexpr int kPieces = COLS / 8;
  if constexpr (THREADS % kPieces == 0) {
    // Each thread keeps one column piece and walks every kRowStep-th row: the addresses advance
    // by constants instead of being rebuilt from a piece index (the same copies either way).
    constexpr int kRowStep = THREADS / kPieces;
    const int r0 = static_cast<int>(threadIdx.x / kPieces), c = static_cast<int>(threadIdx.x % kPieces) * 8;
#pragma unroll
    for (int r = r0; r < ROWS; r += kRowStep) {
      const bool ok = r < valid_rows;
      // A masked row still needs a legal address; row 0 of the tile always exists.
      cp_async16(dst + r * spitch + c, src + (ok ? r * gstride : 0) + c, ok);
    }
  } else {
    for (int i = threadIdx.x; i < ROWS * kPieces; i += THREADS) {
      const int r = i / kPieces, c = (i % kPieces) * 8;
      const bool ok = r < valid_rows;
      cp_async16(dst + r * spitch + c, src + (ok ? r * gstride : 0) + c, ok);
    }
  }
}

/// Walks an Acc two adjacent columns at a time: f(row, col, v[col], v[col + 1]) (common/mma.cuh).
template <class AccT, class F>
__device__ __forceinline__ void for_pairs(AccT& a, F f) {
  acc_for_pairs(a, f);
}

/// Row sums of f(row, col, value) over an Acc, phase 1: one partial per (row, column tile) into
/// part[row * kTilesN + tile]. Every slot is written exactly once, so the later fixed-order sum
/// is deterministic without atomics. The caller syncs, then calls row_partials_sum.
template <class AccT, class F>
__device__ __forceinline__ void row_partials(AccT& a, F f, float* part) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int gr = lane / 4, tq = (lane % 4) * 2;
#pragma unroll
  for (int s = 0; s < AccT::kSlots; ++s) {
    const int tr = AccT::tile_row(warp, s), tc = AccT::tile_col(warp, s);
    const int r0 = tr * 16, c0 = tc * 8;
    float lo = f(r0 + gr, c0 + tq, a.c[s][0]) + f(r0 + gr, c0 + tq + 1, a.c[s][1]);
    float hi = f(r0 + gr + 8, c0 + tq, a.c[s][2]) + f(r0 + gr + 8, c0 + tq + 1, a.c[s][3]);
    lo += __shfl_xor_sync(0xffffffffu, lo, 1);
    hi += __shfl_xor_sync(0xffffffffu, hi, 1);
    lo += __shfl_xor_sync(0xffffffffu, lo, 2);
    hi += __shfl_xor_sync(0xffffffffu, hi, 2);
    if (tq == 0) {
      part[(r0 + gr) * AccT::kTilesN + tc] = lo;
      part[(r0 + gr + 8) * AccT::kTilesN + tc] = hi;
    }
  }
}

/// Column sums, phase 1: one partial per (column, row tile) into part[col * kTilesM + tile].
template <class AccT, class F>
__device__ __forceinline__ void col_partials(AccT& a, F f, float* part) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int gr = lane / 4, tq = (lane % 4) * 2;
#pragma unroll
  for (int s = 0; s < AccT::kSlots; ++s) {
    const int tr = AccT::tile_row(warp, s), tc = AccT::tile_col(warp, s);
    const int r0 = tr * 16, c0 = tc * 8;
    float x0 = f(r0 + gr, c0 + tq, a.c[s][0]) + f(r0 + gr + 8, c0 + tq, a.c[s][2]);
    float x1 = f(r0 + gr, c0 + tq + 1, a.c[s][1]) + f(r0 + gr + 8, c0 + tq + 1, a.c[s][3]);
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) {
      x0 += __shfl_xor_sync(0xffffffffu, x0, o);
      x1 += __shfl_xor_sync(0xffffffffu, x1, o);
    }
    if (gr == 0) {
      part[(c0 + tq) * AccT::kTilesM + tr] = x0;
      part[(c0 + tq + 1) * AccT::kTilesM + tr] = x1;
    }
  }
}

/// Phase 2: the fixed-order sum of the NPARTS partials of `row` (either kind).
template <int NPARTS>
__device__ __forceinline__ float partials_sum(const float* part, int row) {
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < NPARTS; ++i) s += part[row * NPARTS + i];
  return s;
}

using gdn::split_bf16;

__device__ __forceinline__ void store_bf16x2(bf16_t* p, float a, float b) {
  *reinterpret_cast<u32*>(p) = f2bf_pair(a, b);
}

/// ldmatrix fragment loads: the mma operands of row-major (MatRef, unit column stride, rows
/// 16-byte aligned) shared tiles and their transposes, one instruction per fragment instead of
/// eight scalar 16-bit loads; Acc::mma stays the fallback for computed accessors.
__device__ __forceinline__ void ldsm_x4(u32 (&r)[4], const bf16_t* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x4_t(u32 (&r)[4], const bf16_t* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x2(u32 (&r)[2], const bf16_t* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x2_t(u32 (&r)[2], const bf16_t* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_addr(p)));
}
/// A tile rows r0..r0+15, depth k0..k0+15.
__device__ __forceinline__ void lda(u32 (&a)[4], const MatRef& A, int r0, int k0, int lane) {
  ldsm_x4(a, A.p + (r0 + lane % 16) * A.rs + k0 + (lane / 16) * 8);
}
__device__ __forceinline__ void lda(u32 (&a)[4], const Transposed<MatRef>& A, int r0, int k0, int lane) {
  const int i = lane / 8;
  ldsm_x4_t(a, A.a.p + (k0 + (i >> 1) * 8 + lane % 8) * A.a.rs + r0 + (i & 1) * 8);
}
/// B tile depth k0..k0+15, columns c0..c0+7.
__device__ __forceinline__ void ldb(u32 (&b)[2], const MatRef& B, int k0, int c0, int lane) {
  ldsm_x2_t(b, B.p + (k0 + lane % 16) * B.rs + c0);
}
__device__ __forceinline__ void ldb(u32 (&b)[2], const Transposed<MatRef>& B, int k0, int c0, int lane) {
  ldsm_x2(b, B.a.p + (c0 + lane % 8) * B.a.rs + k0 + ((lane / 8) % 2) * 8);
}

/// acc += A[M x kd] * B[kd x N] with ldmatrix operands; same element mapping and the same
/// per-element k order as Acc::mma. Each k step loads the warp's kWM A and kWN B fragments once.
template <class AccT, class A, class B>
__device__ __forceinline__ void mma(AccT& acc, const A& a, const B& b, int kd) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  constexpr int WM = AccT::kWM, WN = AccT::kWN;
  for (int k0 = 0; k0 < kd; k0 += 16) {
    u32 af[WM][4], bf[WN][2];
#pragma unroll
    for (int i = 0; i < WM; ++i) lda(af[i], a, AccT::tile_row(warp, i * WN) * 16, k0, lane);
#pragma unroll
    for (int jn = 0; jn < WN; ++jn) ldb(bf[jn], b, k0, AccT::tile_col(warp, jn) * 8, lane);
#pragma unroll
    for (int s = 0; s < AccT::kSlots; ++s) mma_16816(acc.c[s], af[s / WN], bf[s % WN]);
  }
}

}  // namespace bwd

/// B2 per (chunk, value head): dv_local = bf16(P)^T dO_c.
template <class Cfg>
struct DvLocal {
  static constexpr int K = Cfg::K, V = Cfg::V, C = Cfg::CHUNK;
  static constexpr int kThreads = DvLocalGeometry::kThreads, kWarps = kThreads / 32;
  static constexpr int PK = bwd_pitch(K), PV = bwd_pitch(V), PC = bwd_pitch(C);
  static_assert(C == 64, "DvLocal: only chunk size 64 is supported");
  static_assert(K % 16 == 0 && V % 16 == 0, "DvLocal: K and V must be multiples of 16 (mma depth)");
  static_assert(Cfg::HV == Cfg::H * Cfg::G, "DvLocal: HV must equal H * G");

  __device__ static void run(const DvLocalParams& p) {
    // Chunks fastest (blockIdx order), not value heads fastest as in the forward's chunk_heads
    // programs: measured faster on the H200 (docs/PERF.md).
    const ChunkInfo ci = p.chunks[blockIdx.x];
    const int j = blockIdx.y;
    if constexpr (MarkedChains<Cfg>::value) {
#if GDN_HAS_WGMMA
      // dv_local_marked: after the verified carry's reverse walks, for the backward prescan of the
      // chains they marked (the sm_90a walk computes its own).
      if (ci.len == 0 || !marked_chain(DocSegments<Cfg>(p.doc_chunk_offset, p.chunks, ci.doc), p.seg_fail, ci.doc, j))
        return;
#else
      return;  // the portable walk reads every chain's: dv_local ran in full before it
#endif
    } else {
#if GDN_HAS_WGMMA
      // The reverse walk's sm_90a body computes dv_local itself (bwd/state_walk_bwd_sm90.cuh) and
      // nothing else reads it (or dv_local_marked makes what the prescan reads): the program does
      // nothing on this target.
      if (Cfg::WALK_FUSES_DV) return;
#endif
    }
    if (ci.len == 0) return;
    const int h = j / Cfg::G, m = ci.len;
    extern __shared__ __align__(16) unsigned char smem[];
    bf16_t* sQ = reinterpret_cast<bf16_t*>(smem);
    bf16_t* sK = sQ + C * PK;
    bf16_t* sO = sK + C * PK;
    bf16_t* sP = sO + C * PV;
    float* sg = reinterpret_cast<float*>(sP + C * PC);

    const long long t0 = ci.start;
    bwd::load_tile_async<C, K, kThreads>(sQ, PK, p.q + (t0 * Cfg::H + h) * K, (long long)Cfg::H * K, m);
    bwd::load_tile_async<C, K, kThreads>(sK, PK, p.k + (t0 * Cfg::H + h) * K, (long long)Cfg::H * K, m);
    bwd::load_tile_async<C, V, kThreads>(sO, PV, p.d_o + (t0 * Cfg::HV + j) * V, (long long)Cfg::HV * V, m);
    bwd::cp_async_commit();
    for (int i = threadIdx.x; i < C; i += kThreads) sg[i] = i < m ? p.gc[(t0 + i) * Cfg::HV + j] : 0.f;
    bwd::cp_async_wait<0>();
    __syncthreads();

    Acc<C, C, kWarps> s;
    s.zero();
    bwd::mma(s, MatRef{sQ, PK, 1}, transposed(MatRef{sK, PK, 1}), K);
    const float scale = p.scale;
    bwd::for_pairs(s, [&](int r, int c, float& a, float& b) {
      const bool ok0 = r >= c && r < m, ok1 = r >= c + 1 && r < m;
      const float v0 = select_f32(ok0, scale * a * gate_exp2(sg[r] - sg[c], true), 0.f);
      const float v1 = select_f32(ok1, scale * b * gate_exp2(sg[r] - sg[c + 1], true), 0.f);
      bwd::store_bf16x2(sP + r * PC + c, v0, v1);
    });
    __syncthreads();

    Acc<C, V, kWarps> o;
    o.zero();
    bwd::mma(o, transposed(MatRef{sP, PC, 1}), MatRef{sO, PV, 1}, C);
    bf16_t* out = p.dv_local + (t0 * Cfg::HV + j) * V;
    bwd::for_pairs(o, [&](int r, int c, float& a, float& b) {
      if (r < m) bwd::store_bf16x2(out + (long long)r * Cfg::HV * V + c, a, b);
    });
  }
};

}  // namespace gdn
