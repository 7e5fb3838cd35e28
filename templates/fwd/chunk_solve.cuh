/**
 * @file chunk_solve.cuh
 * @brief Forward stage F2 per (chunk, value head): L = tril1(diag(beta)(K K^T) .* Dec) and
 *        Tm = (I + L)^-1 in fp32 by the 16 x 16 block method (ALGORITHM F2: forward substitution
 *        inside the diagonal blocks, then the block merge), written as bf16 for chunk_prep (W, U),
 *        the fused walk and the backward. Each Tm element is one fixed FMA chain (m, then x
 *        ascending, from 0), so Tm is deterministic and independent of the thread mapping.
 *
 * - 4 warps and 27 KB of shared memory (8 blocks per SM): the K tile is XOR-swizzled instead of
 *   padded, L and the merge scratch reuse its bytes once K K^T is in registers, and only the ten
 *   lower 16 x 16 blocks of L and Tm are stored, their 16-byte groups swizzled so that the
 *   row-wise reads of the merge and the substitution are free of bank conflicts (the shared-memory
 *   pipe, not the FMAs, bounds this kernel).
 * - The block merge runs per column block of Tm, not per sub-diagonal: column b needs only the
 *   diagonal blocks and its own blocks above, so warps 0-1 walk column 0 (three steps), warp 2
 *   column 1 (two), warp 3 column 2 (one), with named barriers or warp syncs between steps instead
 *   of six block-wide barriers. A thread keeps a 1 x 4 or 2 x 4 piece of the product and reads L
 *   and Tm in 16-byte pieces.
 * - The bf16 Tm goes to global memory straight from the fp32 blocks, 16 bytes per store.
 */
#pragma once

#include "common/async_copy.cuh"
#include "common/grid.cuh"
#include "common/mma.cuh"
#include "common/numeric.cuh"
#include "fwd/chunk_prep.cuh"  // gdn::fwd tile helpers
#include "fwd/geometry.hpp"
#include "params.cuh"

namespace gdn {

template <class Cfg>
struct ChunkSolve {
  static_assert(Cfg::CHUNK == 64, "ChunkSolve supports CHUNK == 64 only (four 16-row blocks)");
  static_assert(Cfg::K == ChunkSolveGeometry::kK, "ChunkSolve's swizzled K tile is sized for K == 128");
  static_assert(Cfg::HV == Cfg::H * Cfg::G, "Cfg::G must equal HV / H");
  static_assert(ChunkSolveGeometry::kThreads == 128,
                "ChunkSolve assumes 4 warps: the K K^T split, the two diagonal-block warps and the column owners");

  static constexpr int K = Cfg::K, C = Cfg::CHUNK, H = Cfg::H, HV = Cfg::HV, G = Cfg::G;
  static constexpr int kThreads = ChunkSolveGeometry::kThreads;
  static constexpr int kBlock = ChunkSolveGeometry::kBlockFloats;  ///< floats per stored 16 x 16 block

  /// Storage index of the lower block (a, m), m <= a: row-major over the block triangle.
  __device__ __forceinline__ static constexpr int blk(int a, int m) { return a * (a + 1) / 2 + m; }

  /// Offset of element (r, x) inside a stored block: rows of 16 floats whose four 16-byte groups
  /// are XOR-swizzled by (r / 2) % 4, so the 8 rows a warp reads at one column group fall in 8
  /// distinct bank groups (a row stride of 16 floats alone would put 4 of them on one bank).
  __device__ __forceinline__ static constexpr int at(int r, int x) {
    return r * 16 + ((((x >> 2) ^ (r >> 1)) & 3) << 2) + (x & 3);
  }
  /// The 16-byte group of row r holding columns x4..x4+3 (x4 % 4 == 0).
  __device__ __forceinline__ static const float4& group(const float* b, int r, int x4) {
    return *reinterpret_cast<const float4*>(b + at(r, x4));
  }
  __device__ __forceinline__ static float4& group(float* b, int r, int x4) {
    return *reinterpret_cast<float4*>(b + at(r, x4));
  }

  /// Element offset of 16-byte piece j of row r of the swizzled K tile (128 bf16 per row).
  __device__ __forceinline__ static int k_at(int r, int j) { return r * K + ((j ^ (r & 7)) << 3); }

  __device__ static void run(const ChunkSolveParams& p) {
    extern __shared__ __align__(16) unsigned char smem[];
    const ChunkHead at = chunk_head_of_block();
    const ChunkInfo ci = p.chunks[at.chunk];
    if (ci.len == 0) return;
    const int len = ci.len, j = at.head, hq = j / G;
    const long long t0 = ci.start;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;

    bf16_t* sK = reinterpret_cast<bf16_t*>(smem + ChunkSolveGeometry::kOffK);
    float* sL = reinterpret_cast<float*>(smem + ChunkSolveGeometry::kOffL);
    float* sP = reinterpret_cast<float*>(smem + ChunkSolveGeometry::kOffP);
    float* sT = reinterpret_cast<float*>(smem + ChunkSolveGeometry::kOffT);
    float* sg = reinterpret_cast<float*>(smem + ChunkSolveGeometry::kOffG);
    float* sb = reinterpret_cast<float*>(smem + ChunkSolveGeometry::kOffBeta);

    {
      const bf16_t* src = p.k + (t0 * H + hq) * K;
      constexpr int kPieces = K / 8;
#pragma unroll
      for (int i = tid; i < C * kPieces; i += kThreads) {
        const int r = i / kPieces, piece = i % kPieces;
        const bool ok = r < len;
        fwd::cp_async16(sK + k_at(r, piece), ok ? src + r * (long long)H * K + piece * 8 : src, ok);
      }
      cp_async_commit();
    }
    if (tid < C) {
      const bool ok = tid < len;
      sg[tid] = ok ? p.gc[(t0 + tid) * HV + j] : 0.f;
      sb[tid] = ok ? p.beta[(t0 + tid) * HV + j] : 0.f;
    }
    cp_async_wait<0>();
    __syncthreads();

    gram_to_l(sK, sL, sg, sb, len, warp, lane);
    diagonal_blocks(sL, sT, warp, lane);
    __syncthreads();
    if (warp < 2)
      merge_column<0, 1>(sL, sT, sP, warp * 8 + (lane >> 2), (lane & 3) * 4, [] { named_sync_64(); });
    else if (warp == 2)
      merge_column<1, 2>(sL, sT, sP, lane >> 2, (lane & 3) * 4, [] { __syncwarp(); });
    else
      merge_column<2, 2>(sL, sT, sP, lane >> 2, (lane & 3) * 4, [] { __syncwarp(); });
    __syncthreads();
    store_tm(sT, p.tm + (t0 * HV + j) * C, len);
  }

 private:
  __device__ __forceinline__ static void named_sync_64() { asm volatile("bar.sync 1, 64;\n" ::: "memory"); }

  __device__ __forceinline__ static float4 fma4(float l, float4 t, float4 s) {
    return make_float4(fmaf(l, t.x, s.x), fmaf(l, t.y, s.y), fmaf(l, t.z, s.z), fmaf(l, t.w, s.w));
  }
  __device__ __forceinline__ static float lane_of(float4 v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
  }

  /// K K^T's ten lower 16 x 16 blocks on the tensor cores, then L in fp32 into the K tile's bytes.
  /// Warp w computes the blocks (a0, m0), (a0, m0 + 1) and, for warps 1 and 2, (a2, m2):
  /// w0 (3,0) (3,1); w1 (3,2) (3,3) (0,0); w2 (2,0) (2,1) (2,2); w3 (1,0) (1,1).
  __device__ static void gram_to_l(const bf16_t* sK, float* sL, const float* sg, const float* sb, int len, int warp,
                                   int lane) {
    const int a0 = warp == 0 ? 3 : warp == 1 ? 3 : warp == 2 ? 2 : 1;
    const int m0 = warp == 1 ? 2 : 0;
    const bool third = warp == 1 || warp == 2;
    const int a2 = warp == 1 ? 0 : 2, m2 = a2;
    const int rows[3] = {a0, a0, a2};
    const int cols[3] = {m0, m0 + 1, m2};
    float acc[3][2][4];
#pragma unroll
    for (int i = 0; i < 3; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) acc[i][h][0] = acc[i][h][1] = acc[i][h][2] = acc[i][h][3] = 0.f;
#pragma unroll
    for (int k0 = 0; k0 < K; k0 += 16) {
      u32 a[4], a_third[4];
      fwd::ldsm_x4(a, sK + k_at(a0 * 16 + (lane & 15), k0 / 8 + (lane >> 4)));
      if (warp == 1)
        fwd::ldsm_x4(a_third, sK + k_at(a2 * 16 + (lane & 15), k0 / 8 + (lane >> 4)));
      else
#pragma unroll
        for (int q = 0; q < 4; ++q) a_third[q] = a[q];  // warp 2's third block shares row block 2
#pragma unroll
      for (int i = 0; i < 3; ++i) {
        if (i == 2 && !third) break;
        u32 b[4];
        fwd::ldsm_x4(b, sK + k_at(cols[i] * 16 + (lane & 7) + ((lane >> 4) << 3), k0 / 8 + ((lane >> 3) & 1)));
        if (i == 2)
          fwd::mma_pair(acc[i][0], acc[i][1], a_third, b);
        else
          fwd::mma_pair(acc[i][0], acc[i][1], a, b);
      }
    }
    __syncthreads();  // every warp is done reading K; L takes its bytes
    const int gr = lane >> 2, tq = (lane & 3) * 2;
#pragma unroll
    for (int i = 0; i < 3; ++i) {
      if (i == 2 && !third) break;
      float* dst = sL + blk(rows[i], cols[i]) * kBlock;
      float g_row[2], b_row[2], g_col[2][2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        g_row[e] = sg[rows[i] * 16 + gr + 8 * e];
        b_row[e] = sb[rows[i] * 16 + gr + 8 * e];
        g_col[e][0] = sg[cols[i] * 16 + e * 8 + tq];
        g_col[e][1] = sg[cols[i] * 16 + e * 8 + tq + 1];
      }
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int rr = gr + (e >> 1) * 8, cc = h * 8 + tq + (e & 1);
          const int r = rows[i] * 16 + rr, c = cols[i] * 16 + cc;
          const bool ok = c < r && r < len;  // strict lower part inside the chunk (c < r < len)
          dst[at(rr, cc)] = ok ? acc[i][h][e] * gate_exp2(g_row[e >> 1] - g_col[h][e & 1], true) * b_row[e >> 1] : 0.f;
        }
    }
    __syncthreads();
  }

  /// The four diagonal blocks by forward substitution: warps 0-1, half-warp per block, lane c of
  /// a half solves column c (the other warps wait at the barrier that follows). The half-warp
  /// reads row r of L as broadcast 16-byte groups; the two blocks of a warp lie on different banks.
  __device__ static void diagonal_blocks(const float* sL, float* sT, int warp, int lane) {
    if (warp >= 2) return;
    const int a = 2 * warp + (lane >> 4), c = lane & 15;
    const float* l = sL + blk(a, a) * kBlock;
    float x[16];
#pragma unroll
    for (int r = 0; r < 16; ++r) x[r] = (r == c) ? 1.f : 0.f;
#pragma unroll
    for (int r = 1; r < 16; ++r) {
      float row[16];
#pragma unroll
      for (int x4 = 0; x4 < r; x4 += 4) {
        const float4 v = group(l, r, x4);
        row[x4] = v.x;
        row[x4 + 1] = v.y;
        row[x4 + 2] = v.z;
        row[x4 + 3] = v.w;
      }
      float s = 0.f;
#pragma unroll
      for (int m = 0; m < r; ++m) s = fmaf(row[m], x[m], s);
      if (r > c) x[r] = -s;
    }
    float* t = sT + blk(a, a) * kBlock;
#pragma unroll
    for (int r = 0; r < 16; ++r) t[at(r, c)] = x[r];
  }

  /// Column block B of Tm below the diagonal: for a = B+1..3, P = sum_{m=B}^{a-1} L_am Tm_mB, then
  /// Tm_aB = -Tm_aa P. The thread owns rows r0 (and r0 + 8 when NR == 2), columns c4..c4+3; each
  /// output is one FMA chain, m then x ascending, from 0. `sync` joins the threads that own the
  /// column.
  template <int B, int NR, class Sync>
  __device__ static void merge_column(const float* sL, float* sT, float* sP, int r0, int c4, Sync sync) {
    float* P = sP + B * kBlock;
#pragma unroll
    for (int a = B + 1; a < 4; ++a) {
      float4 s[NR];
#pragma unroll
      for (int i = 0; i < NR; ++i) s[i] = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int m = B; m < a; ++m) {
        const float* L = sL + blk(a, m) * kBlock;
        const float* T = sT + blk(m, B) * kBlock;
#pragma unroll
        for (int x4 = 0; x4 < 16; x4 += 4) {
          float4 l[NR];
#pragma unroll
          for (int i = 0; i < NR; ++i) l[i] = group(L, r0 + 8 * i, x4);
#pragma unroll
          for (int xx = 0; xx < 4; ++xx) {
            const float4 t = group(T, x4 + xx, c4);
#pragma unroll
            for (int i = 0; i < NR; ++i) s[i] = fma4(lane_of(l[i], xx), t, s[i]);
          }
        }
      }
#pragma unroll
      for (int i = 0; i < NR; ++i) group(P, r0 + 8 * i, c4) = s[i];
      sync();
      const float* Taa = sT + blk(a, a) * kBlock;
#pragma unroll
      for (int i = 0; i < NR; ++i) s[i] = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int x4 = 0; x4 < 16; x4 += 4) {
        float4 l[NR];
#pragma unroll
        for (int i = 0; i < NR; ++i) l[i] = group(Taa, r0 + 8 * i, x4);
#pragma unroll
        for (int xx = 0; xx < 4; ++xx) {
          const float4 pv = group(P, x4 + xx, c4);
#pragma unroll
          for (int i = 0; i < NR; ++i) s[i] = fma4(lane_of(l[i], xx), pv, s[i]);
        }
      }
      float* dst = sT + blk(a, B) * kBlock;
#pragma unroll
      for (int i = 0; i < NR; ++i)
        group(dst, r0 + 8 * i, c4) = make_float4(-s[i].x, -s[i].y, -s[i].z, -s[i].w);
      sync();  // Tm_aB is the next step's operand, and P is written again
    }
  }

  /// Rows < len of bf16(Tm) (the part above the diagonal as 0), 16 bytes per store.
  __device__ static void store_tm(const float* sT, bf16_t* dst, int len) {
    constexpr int kPiecesPerRow = C / 8;
#pragma unroll
    for (int i = threadIdx.x; i < C * kPiecesPerRow; i += kThreads) {
      const int r = i / kPiecesPerRow, c8 = (i % kPiecesPerRow) * 8;
      if (r >= len) break;  // rows grow with i
      const int a = r >> 4, m = c8 >> 4;
      u32 w[4] = {0u, 0u, 0u, 0u};
      if (m <= a) {
        const float* b = sT + blk(a, m) * kBlock;
        const float4 lo = group(b, r & 15, c8 & 15);
        const float4 hi = group(b, r & 15, (c8 & 15) + 4);
        const float v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
        for (int q = 0; q < 8; q += 2) {
          const bf16_t e0 = c8 + q <= r ? f2bf(v[q]) : bf16_t(0);
          const bf16_t e1 = c8 + q + 1 <= r ? f2bf(v[q + 1]) : bf16_t(0);
          w[q / 2] = pack_bf16x2(e0, e1);
        }
      }
      *reinterpret_cast<uint4*>(dst + r * (long long)HV * C + c8) = make_uint4(w[0], w[1], w[2], w[3]);
    }
  }
};

}  // namespace gdn
