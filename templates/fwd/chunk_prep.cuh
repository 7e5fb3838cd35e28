/**
 * @file chunk_prep.cuh
 * @brief Forward stage F3 per (chunk, value head): U = Tm diag(beta) V and W = Tm diag(beta exp2(gc)) K
 *        from chunk_solve's Tm (F2). The forward runs it after chunk_solve, the backward of light
 *        saves again from the saved Tm. Without Cfg::WRITES_U only W (the fused path without
 *        segments: its walks take raw v, and only the reverse walk reads W).
 *
 * Also hosts gdn::fwd, the small ldmatrix / cp.async tile helpers the three forward programs share
 * (they are forward-private today; they belong in templates/common/ once another stage wants them).
 * Fragment conventions are those of mma.sync m16n8k16 (see common/mma.cuh): an accumulator tile
 * c[4] holds (gr, tq..tq+1) and (gr + 8, tq..tq+1) with gr = lane / 4, tq = 2 (lane % 4).
 */
#pragma once

#include "common/async_copy.cuh"
#include "common/grid.cuh"
#include "common/mma.cuh"
#include "common/numeric.cuh"
#include "common/segments.cuh"
#include "fwd/geometry.hpp"
#include "params.cuh"

namespace gdn {
namespace fwd {

__device__ __forceinline__ u32 smem_addr(const void* p) { return static_cast<u32>(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ void ldsm_x4(u32 (&r)[4], const bf16_t* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p))
               : "memory");
}
__device__ __forceinline__ void ldsm_x4_t(u32 (&r)[4], const bf16_t* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p))
               : "memory");
}

/// A fragment (16 x 16 at (r0, k0)) of a row-major bf16 tile with row stride ld.
__device__ __forceinline__ void load_a(u32 (&a)[4], const bf16_t* s, int ld, int r0, int k0) {
  const int lane = threadIdx.x & 31;
  ldsm_x4(a, s + (r0 + (lane & 15)) * ld + k0 + ((lane >> 4) << 3));
}
/// A fragment of A = S^T, where S (row-major, stride ld) holds A's columns as rows: A(m, k) = S[k][m].
__device__ __forceinline__ void load_a_t(u32 (&a)[4], const bf16_t* s, int ld, int m0, int k0) {
  const int lane = threadIdx.x & 31;
  ldsm_x4_t(a, s + (k0 + (lane & 7) + ((lane >> 4) << 3)) * ld + m0 + (((lane >> 3) & 1) << 3));
}
/// B fragments of two adjacent n-tiles (n0, n0 + 8) when B^T is stored row-major: B(k, n) = S[n][k].
__device__ __forceinline__ void load_b_nk(u32 (&b)[4], const bf16_t* s, int ld, int n0, int k0) {
  const int lane = threadIdx.x & 31;
  ldsm_x4(b, s + (n0 + (lane & 7) + ((lane >> 4) << 3)) * ld + k0 + (((lane >> 3) & 1) << 3));
}
/// B fragments of two adjacent n-tiles when B is stored row-major: B(k, n) = S[k][n].
__device__ __forceinline__ void load_b_kn(u32 (&b)[4], const bf16_t* s, int ld, int k0, int n0) {
  const int lane = threadIdx.x & 31;
  ldsm_x4_t(b, s + (k0 + (lane & 15)) * ld + n0 + ((lane >> 4) << 3));
}
/// acc[0] += a * b(n0), acc[1] += a * b(n0 + 8) for the b pair from load_b_*.
__device__ __forceinline__ void mma_pair(float (&c0)[4], float (&c1)[4], const u32 (&a)[4], const u32 (&b)[4]) {
  const u32 b0[2] = {b[0], b[1]};
  const u32 b1[2] = {b[2], b[3]};
  mma_16816(c0, a, b0);
  mma_16816(c1, a, b1);
}

/// 16-byte global -> shared copy; src_valid = false zero-fills (rows past the chunk length).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool src_valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(src_valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool src_valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_valid ? 4 : 0)
               : "memory");
}
using gdn::cp_async_commit;
using gdn::cp_async_wait;

/// Copies `rows` rows of `cols` bf16 (cols % 8 == 0) into a padded shared tile; rows >= valid
/// become zero so later products never read stale (possibly NaN) shared memory.
template <int THREADS>
__device__ __forceinline__ void tile_to_smem_async(bf16_t* dst, int ld, const bf16_t* src, long long src_stride,
                                                   int rows, int cols, int valid, int first = -1) {
  // Unsigned index arithmetic: rows and cols are constants at every call, and unsigned / and %
  // by them become shifts and masks without sign fix-ups.
  const unsigned per_row = static_cast<unsigned>(cols) / 8u;
  if (first < 0) first = threadIdx.x;  // block-wide by default; a part of the block passes its own index
  for (unsigned i = first; i < static_cast<unsigned>(rows) * per_row; i += THREADS) {
    const int r = static_cast<int>(i / per_row), c8 = static_cast<int>(i % per_row) * 8;
    const bool ok = r < valid;
    cp_async16(dst + r * ld + c8, ok ? src + r * src_stride + c8 : src, ok);
  }
}

/// Stores rows < valid of a padded shared bf16 tile to global memory with 16-byte stores.
template <int THREADS>
__device__ __forceinline__ void tile_to_global(bf16_t* dst, long long dst_stride, const bf16_t* src, int ld, int cols,
                                               int valid, int first = -1, int stride = THREADS) {
  const int per_row = cols / 8;
  if (first < 0) first = threadIdx.x;  // block-wide by default; warp-level callers pass (lane, 32)
  for (int i = first; i < valid * per_row; i += stride) {
    const int r = i / per_row, c8 = (i % per_row) * 8;
    *reinterpret_cast<uint4*>(dst + r * dst_stride + c8) = *reinterpret_cast<const uint4*>(src + r * ld + c8);
  }
}

/// Row block rb (16 rows) of the causal scores: P = Q K^T over the column blocks 0..rb (the later
/// ones are not computed). Q and K are padded row-major tiles with row stride LDK.
template <int K, int C, int LDK>
__device__ __forceinline__ void causal_scores(float (&P)[C / 8][4], const bf16_t* sQ, const bf16_t* sK, int rb) {
#pragma unroll
  for (int n = 0; n < C / 8; ++n) P[n][0] = P[n][1] = P[n][2] = P[n][3] = 0.f;
#pragma unroll
  for (int k0 = 0; k0 < K; k0 += 16) {
    u32 a[4];
    load_a(a, sQ, LDK, rb * 16, k0);
#pragma unroll
    for (int np = 0; np < C / 16; ++np) {
      if (np > rb) break;
      u32 b[4];
      load_b_nk(b, sK, LDK, np * 16, k0);
      mma_pair(P[2 * np], P[2 * np + 1], a, b);
    }
  }
}

/// P's gate exp2(gc_i - gc_j) where j <= i < len (0 elsewhere), rounded to the bf16 A fragments of
/// the P V' product: Pa[kk] for k-block kk <= rb (the later ones are not written). g_lo / g_hi are
/// gc of the thread's rows rb * 16 + gr (+8); sg holds the chunk's gc.
template <int C>
__device__ __forceinline__ void gate_scores(u32 (&Pa)[C / 16][4], const float (&P)[C / 8][4], const float* sg,
                                            float g_lo, float g_hi, int rb, int len, int gr, int tq) {
  const int r_lo = rb * 16 + gr, r_hi = r_lo + 8;
#pragma unroll
  for (int kk = 0; kk < C / 16; ++kk) {
    if (kk > rb) break;  // not read: the P V' loop stops there too
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int n = 2 * kk + half, col = n * 8 + tq;
      const float gc0 = sg[col], gc1 = sg[col + 1];
      const float p00 = P[n][0] * gate_exp2(g_lo - gc0, col <= r_lo && r_lo < len);
      const float p01 = P[n][1] * gate_exp2(g_lo - gc1, col + 1 <= r_lo && r_lo < len);
      const float p10 = P[n][2] * gate_exp2(g_hi - gc0, col <= r_hi && r_hi < len);
      const float p11 = P[n][3] * gate_exp2(g_hi - gc1, col + 1 <= r_hi && r_hi < len);
      Pa[kk][2 * half] = f2bf_pair(p00, p01);
      Pa[kk][2 * half + 1] = f2bf_pair(p10, p11);
    }
  }
}

/// No factor: Tm's A fragments as they are.
struct NoColumnFactor {
  static constexpr bool kScales = false;
  __device__ float operator()(int) const { return 1.f; }
};
/// W's factor of chunk row c: beta_c exp2(gc_c), 0 past the chunk's length (shared memory vectors).
struct BetaGateFactor {
  static constexpr bool kScales = true;
  const float *g, *b;
  int len;
  __device__ float operator()(int c) const { return c < len ? b[c] * exp2f(g[c]) : 0.f; }
};

/// acc = Tm X for row block rb (16 rows) and the NC columns from c0 of X: Tm (sT, row stride LDT)
/// is lower triangular, so only its k-blocks 0..rb are read; X is a padded row-major tile [C][..].
/// With a scaling `col_factor`, Tm's column c is multiplied by col_factor(c) and rounded to bf16 in
/// the A fragments (W: the reverse walk's sm_90a body forms it the same way).
template <int C, int NC, int LDT, int LDX, class ColFactor = NoColumnFactor>
__device__ __forceinline__ void lower_tri_product(float (&acc)[NC / 8][4], const bf16_t* sT, const bf16_t* sX, int rb,
                                                  int c0, ColFactor col_factor = {}) {
#pragma unroll
  for (int n = 0; n < NC / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < C / 16; ++kk) {
    if (kk > rb) break;
    u32 a[4];
    load_a(a, sT, LDT, rb * 16, kk * 16);
    if constexpr (ColFactor::kScales) {
      const int tq = (threadIdx.x & 3) * 2;
#pragma unroll
      for (int q = 0; q < 4; ++q) {  // register q: columns kk * 16 + 8 (q / 2) + tq, + 1
        const int c = kk * 16 + ((q >> 1) << 3) + tq;
        a[q] = f2bf_pair(bf2f(static_cast<bf16_t>(a[q] & 0xffffu)) * col_factor(c),
                         bf2f(static_cast<bf16_t>(a[q] >> 16)) * col_factor(c + 1));
      }
    }
#pragma unroll
    for (int np = 0; np < NC / 16; ++np) {
      u32 b[4];
      load_b_kn(b, sX, LDX, kk * 16, c0 + np * 16);
      mma_pair(acc[2 * np], acc[2 * np + 1], a, b);
    }
  }
}

}  // namespace fwd

template <class Cfg>
struct ChunkPrep {
  static_assert(Cfg::K == 128, "ChunkPrep supports K == 128 only (the tiles below are sized for it)");
  static_assert(Cfg::V == 128, "ChunkPrep supports V == 128 only (the tiles below are sized for it)");
  static_assert(Cfg::CHUNK == 64, "ChunkPrep supports CHUNK == 64 only (four 16-row sub-blocks, two warps each)");
  static_assert(Cfg::HV == Cfg::H * Cfg::G, "Cfg::G must equal HV / H");
  static_assert(ChunkPrepGeometry::kThreads == 256,
                "ChunkPrep assumes 8 warps: warp w owns chunk rows 16 (w % 4) .. +15 and half w / 4 of the columns");

  static constexpr int K = Cfg::K, V = Cfg::V, C = Cfg::CHUNK, H = Cfg::H, HV = Cfg::HV, G = Cfg::G;
  static constexpr int kThreads = ChunkPrepGeometry::kThreads;
  static constexpr int LDK = ChunkPrepGeometry::ld_bf(K), LDV = ChunkPrepGeometry::ld_bf(V);
  static constexpr int LDT = ChunkPrepGeometry::ld_bf(C);
  // Offsets as constants: constexpr host functions are not callable from device code under NVRTC.
  static constexpr int kOff_k = ChunkPrepGeometry::off_k(K, V, C);
  static constexpr int kOff_tb = ChunkPrepGeometry::off_tb(K, V, C);
  static constexpr int kOff_v = ChunkPrepGeometry::off_v(K, V, C);
  static constexpr int kOff_g = ChunkPrepGeometry::off_g(K, V, C);
  static constexpr int kOff_beta = ChunkPrepGeometry::off_beta(K, V, C);

  __device__ static void run(const ChunkPrepParams& p) {
    extern __shared__ __align__(16) unsigned char smem[];
    const ChunkBlock at = chunk_block(p.chunks);
    if (at.len == 0) return;
    if constexpr (MarkedChains<Cfg>::value) {
#if GDN_HAS_WGMMA
      // chunk_prep_marked / chunk_prep_fwd_marked: after the verified carry's verify walks, W (and
      // U) for the prescan of the chains they marked, the backward's or the forward's (the sm_90a
      // walks form their own W, the fused walks take raw v).
      const int doc = p.chunks[at.chunk].doc;
      if (!marked_chain(DocSegments<Cfg>(p.doc_chunk_offset, p.chunks, doc), p.seg_fail, doc, at.head)) return;
#else
      return;  // the portable reverse walk reads every chain's W: chunk_prep ran in full before it
#endif
    }
    const int len = at.len, j = at.head, hq = j / G;
    const long long t0 = at.start;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int gr = lane >> 2, tq = (lane & 3) * 2;

    bf16_t* sK = reinterpret_cast<bf16_t*>(smem + kOff_k);
    bf16_t* sV = reinterpret_cast<bf16_t*>(smem + kOff_v);
    bf16_t* sTb = reinterpret_cast<bf16_t*>(smem + kOff_tb);
    float* sg = reinterpret_cast<float*>(smem + kOff_g);
    float* sb = reinterpret_cast<float*>(smem + kOff_beta);

    fwd::tile_to_smem_async<kThreads>(sK, LDK, p.k + (t0 * H + hq) * K, (long long)H * K, C, K, len);
    if (Cfg::WRITES_U)
      fwd::tile_to_smem_async<kThreads>(sV, LDV, p.v + (t0 * HV + j) * V, (long long)HV * V, C, V, len);
    fwd::cp_async_commit();
    if (tid < C) {
      const bool ok = tid < len;
      sg[tid] = ok ? p.gc[(t0 + tid) * HV + j] : 0.f;
      sb[tid] = ok ? p.beta[(t0 + tid) * HV + j] : 0.f;
    }
    {
      // Rows >= len (the next document's) and the part above the diagonal read as 0, as the
      // solve left them, so W and U see the solve's operand whatever the buffer holds there.
      const bf16_t* src = p.tm + (t0 * HV + j) * C;
      for (int i = tid; i < C * (C / 8); i += kThreads) {
        const int r = i / (C / 8), c8 = (i % (C / 8)) * 8;
        uint4 x = make_uint4(0, 0, 0, 0);
        if (r < len) x = *reinterpret_cast<const uint4*>(src + r * (long long)HV * C + c8);
        bf16_t e[8];
        *reinterpret_cast<uint4*>(e) = x;
#pragma unroll
        for (int q = 0; q < 8; ++q)
          if (c8 + q > r || c8 + q >= len) e[q] = 0;
        *reinterpret_cast<uint4*>(sTb + r * LDT + c8) = *reinterpret_cast<uint4*>(e);
      }
    }
    fwd::cp_async_wait<0>();
    __syncthreads();

    // W then U; warp w owns output rows 16 (w % 4) .. +15 and column half w / 4 and, Tm being
    // lower triangular, needs only the k-blocks 0..w % 4. Results are staged in the warp's own
    // part of the consumed operand tile. The factors beta exp2(gc) go on Tm's columns in the A
    // fragments, W = bf16(Tm diag(beta exp2(gc))) K, not on K's rows as FLA rounds it: the reverse
    // walk's sm_90a body forms W that way without a scratch tile, and every program that reads W
    // must see the same bits.
    wu_product<K, LDK>(sTb, sK, p.w + (t0 * HV + j) * K, (long long)HV * K, len, warp, lane, gr, tq,
                       fwd::BetaGateFactor{sg, sb, len});
    if (!Cfg::WRITES_U) return;
    scale_rows<V, LDV>(sV, [&](int r) { return sb[r]; });
    __syncthreads();
    wu_product<V, LDV>(sTb, sV, p.u + (t0 * HV + j) * V, (long long)HV * V, len, warp, lane, gr, tq);
  }

 private:
  template <int D, int LD, class F>
  __device__ static void scale_rows(bf16_t* s, F factor) {
    for (int i = threadIdx.x; i < C * (D / 8); i += kThreads) {
      const int r = i / (D / 8), c8 = (i % (D / 8)) * 8;
      const float f = factor(r);
      uint4 x = *reinterpret_cast<const uint4*>(s + r * LD + c8);
      u32* w = reinterpret_cast<u32*>(&x);
#pragma unroll
      for (int q = 0; q < 4; ++q)
        w[q] = f2bf_pair(bf2f(static_cast<bf16_t>(w[q] & 0xffffu)) * f, bf2f(static_cast<bf16_t>(w[q] >> 16)) * f);
      *reinterpret_cast<uint4*>(s + r * LD + c8) = x;
    }
  }

  template <int D, int LD, class ColFactor = fwd::NoColumnFactor>
  __device__ static void wu_product(const bf16_t* sTb, bf16_t* sX, bf16_t* dst, long long dst_stride, int len, int warp,
                                    int lane, int gr, int tq, ColFactor col_factor = {}) {
    constexpr int kHalf = D / 2;
    const int rb = warp & 3, c0 = (warp >> 2) * kHalf;
    float acc[kHalf / 8][4];
    fwd::lower_tri_product<C, kHalf, LDT, LD>(acc, sTb, sX, rb, c0, col_factor);
    __syncthreads();  // every warp is done reading sX
#pragma unroll
    for (int n = 0; n < kHalf / 8; ++n) {
      const int r = rb * 16 + gr, c = c0 + n * 8 + tq;
      *reinterpret_cast<u32*>(sX + r * LD + c) = f2bf_pair(acc[n][0], acc[n][1]);
      *reinterpret_cast<u32*>(sX + (r + 8) * LD + c) = f2bf_pair(acc[n][2], acc[n][3]);
    }
    __syncwarp();
    const int rows = min(16, len - rb * 16);
    if (rows > 0)
      fwd::tile_to_global<32>(dst + (long long)rb * 16 * dst_stride + c0, dst_stride, sX + rb * 16 * LD + c0, LD, kHalf,
                              rows, lane, 32);
  }
};

}  // namespace gdn
