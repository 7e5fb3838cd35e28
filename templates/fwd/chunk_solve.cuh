/**
 * @file chunk_solve.cuh
 * @brief Forward stage F2 per (chunk, value head): L = tril1(diag(beta)(K K^T) .* Dec) and
 *        Tm = (I + L)^-1 by the 16 x 16 block method (ALGORITHM F2: forward substitution inside
 *        the diagonal blocks in fp32, then the block merge), written as bf16 for chunk_prep (W, U),
 *        the fused walk and the backward. In the fused forward with the in-kernel L2 norm
 *        (FOLD_RSTD) K is the raw input, the rows' rstd come from the diagonal of the raw K K^T
 *        (written for the fused walk and the backward), and K K^T's (i, j) is scaled by
 *        rstd_i rstd_j in fp32.
 *
 * The kernel is bound by the shared-memory pipe, not by arithmetic, so it is built around the
 * bytes each warp reads (one wavefront moves 128 bytes; a warp's 16-byte load always costs four):
 * - 4 warps and 27 KB of shared memory (8 blocks per SM): the K tile is XOR-swizzled instead of
 *   padded; K K^T loads each row block's fragment once per warp and k step (the B fragment of a
 *   column block is the A fragment of the same rows, permuted); L and the merge scratch reuse the
 *   K tile's bytes; only the ten lower 16 x 16 blocks of L and Tm are stored, their 16-byte
 *   groups swizzled so that every fragment read is free of bank conflicts.
 * - The block merge runs per column block of Tm: column b needs only the diagonal blocks and its
 *   own blocks above, so warps 0-1 walk column 0 (three steps) and warps 2-3 columns 1 and 2, with
 *   64-thread named barriers. Its products are fp64 tensor-core products (m8n8k4) of the fp32
 *   blocks: each operand element is read once per fragment instead of once per FMA, and a sum's
 *   only rounding is the fp64 accumulation, then one to fp32 (more accurate than fp32 FMA chains).
 *   About 65 k fp64 FMAs per block: cheap on the H200 (67 TFLOP/s of fp64 tensor throughput), not
 *   measured on sm_100a / sm_103a, whose fp64 rates are lower (much lower on sm_103a).
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
  /// are XOR-swizzled by s(r) = the two bits of (r / 2) % 4 reversed. The fragments read 8 rows
  /// at one group (A) or 4 consecutive rows at two adjacent groups (B); both land on 32 distinct
  /// banks (a row stride of 16 floats alone would put 4 of 8 rows on one bank).
  __device__ __forceinline__ static constexpr int at(int r, int x) {
    return r * 16 + ((((x >> 2) ^ (((r >> 1) & 1) << 1) ^ ((r >> 2) & 1)) & 3) << 2) + (x & 3);
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
    const ChunkBlock at = chunk_block(p.chunks);
    if (at.len == 0) return;
    const int len = at.len, j = at.head, hq = j / G;
    const long long t0 = at.start;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;

    bf16_t* sK = reinterpret_cast<bf16_t*>(smem + ChunkSolveGeometry::kOffK);
    float* sL = reinterpret_cast<float*>(smem + ChunkSolveGeometry::kOffL);
    float* sP = reinterpret_cast<float*>(smem + ChunkSolveGeometry::kOffP);
    float* sT = reinterpret_cast<float*>(smem + ChunkSolveGeometry::kOffT);
    float* sg = reinterpret_cast<float*>(smem + ChunkSolveGeometry::kOffG);
    float* sb = reinterpret_cast<float*>(smem + ChunkSolveGeometry::kOffBeta);
    float* sr = reinterpret_cast<float*>(smem + ChunkSolveGeometry::kOffRstd);

    {
      // Thread tid copies piece tid % 16 of rows tid / 16 + 8 i: the rows' swizzle (r % 8) is the
      // same for all eight, so the shared offset steps by 8 rows and the source by 8 tokens.
      constexpr int kPieces = K / 8, kRowStep = kThreads / kPieces;
      static_assert(kRowStep == 8, "the swizzle repeats every 8 rows");
      const int r0 = tid / kPieces, piece = tid % kPieces;
      const bf16_t* src = p.k + (t0 * H + hq) * K + r0 * (long long)H * K + piece * 8;
      bf16_t* dst = sK + k_at(r0, piece);
#pragma unroll
      for (int i = 0; i < C / kRowStep; ++i) {
        const bool ok = r0 + kRowStep * i < len;
        fwd::cp_async16(dst + kRowStep * i * K, ok ? src + kRowStep * i * (long long)H * K : p.k, ok);
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

    gram_to_l(sK, sL, sg, sb, sr, len, warp, lane);
    // The rows' rstd for the backward and the fused walk, once per q/k head (the G value heads of
    // a group compute the same values).
    if (Cfg::FOLD_RSTD && j % G == 0 && tid < len) p.rstd_k[(t0 + tid) * H + hq] = sr[tid];
    diagonal_blocks(sL, sT, warp, lane);
    __syncthreads();
    // Column 0 (three steps) on warps 0-1, columns 1 then 2 (two steps, one) on warps 2-3; each
    // warp owns 8 rows of the column's blocks.
    const int half = warp & 1;
    const Fragments frag(8 * half, lane);
    if (warp < 2) {
      merge_column<0>(sL, sT, sP, half, frag, [] { named_sync<1>(); });
    } else {
      merge_column<1>(sL, sT, sP, half, frag, [] { named_sync<2>(); });
      merge_column<2>(sL, sT, sP, half, frag, [] { named_sync<2>(); });
    }
    __syncthreads();
    store_tm(sT, p.tm + (t0 * HV + j) * C, len);
  }

 private:
  template <int ID>
  __device__ __forceinline__ static void named_sync() {
    asm volatile("bar.sync %0, 64;\n" ::"n"(ID) : "memory");
  }

  /// c += a b for one m8n8k4 fp64 tensor-core product: the fp32 operands are exact in fp64 and so
  /// are their products, so a sum's only rounding is the fp64 accumulation (then one to fp32).
  __device__ __forceinline__ static void dmma(double (&c)[2], double a, double b) {
    asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0,%1}, {%2}, {%3}, {%0,%1};\n"
                 : "+d"(c[0]), "+d"(c[1])
                 : "d"(a), "d"(b));
  }

  /// A thread's element offsets inside any stored block for the merge's fragments, computed once:
  /// the A element (r0 + lane / 4, 4 ks + lane % 4) for k step ks, the B element
  /// (4 ks + lane % 4, 8 ci + lane / 4) = 64 ks + b[ks % 2][ci] (the swizzle of row 4 ks + lane % 4
  /// depends on ks only through its parity), and the accumulator pair (r0 + lane / 4, 8 ci + 2 (lane % 4)).
  struct Fragments {
    int a[4], b[2][2], acc[2];
    __device__ Fragments(int r0, int lane) {
      const int g = lane >> 2, t = lane & 3;
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) a[ks] = at(r0 + g, 4 * ks + t);
#pragma unroll
      for (int p = 0; p < 2; ++p)
#pragma unroll
        for (int ci = 0; ci < 2; ++ci) b[p][ci] = at(4 * p + t, 8 * ci + g) - 64 * p;
#pragma unroll
      for (int ci = 0; ci < 2; ++ci) acc[ci] = at(r0 + g, 8 * ci + 2 * t);
    }
  };

  /// acc[ci] += A[r0 .. r0 + 7][0 .. 4 KSTEPS) * B[0 .. 4 KSTEPS)[8 ci .. 8 ci + 7] for two stored
  /// blocks (fp32), as m8n8k4 fragments; the accumulator holds (r0 + lane / 4, 8 ci + 2 (lane % 4) + i).
  template <int KSTEPS>
  __device__ __forceinline__ static void product_rows8(double (&acc)[2][2], const float* A, const float* Bm,
                                                       const Fragments& f) {
#pragma unroll
    for (int ks = 0; ks < KSTEPS; ++ks) {
      const double a = A[f.a[ks]];
#pragma unroll
      for (int ci = 0; ci < 2; ++ci) dmma(acc[ci], a, static_cast<double>(Bm[f.b[ks & 1][ci] + 64 * ks]));
    }
  }

  /// Stores s * acc (8 rows, 16 columns) into a stored block in fp32.
  __device__ __forceinline__ static void store_rows8(float* dst, const double (&acc)[2][2], float s,
                                                     const Fragments& f) {
#pragma unroll
    for (int ci = 0; ci < 2; ++ci)
      *reinterpret_cast<float2*>(dst + f.acc[ci]) =
          make_float2(s * static_cast<float>(acc[ci][0]), s * static_cast<float>(acc[ci][1]));
  }

  /// K K^T's ten lower 16 x 16 blocks on the tensor cores, then L in fp32 into the K tile's bytes.
  /// Warp W computes row block W, blocks (W, 0..W): per k step it loads the A fragments of row
  /// blocks 0..W once each, and the B fragment of column block m is the A fragment of row block m
  /// with its registers permuted (10 fragment loads per k step for the block).
  template <int W>
  __device__ static void gram_row(const bf16_t* sK, float (&acc)[4][2][4], int lane) {
#pragma unroll
    for (int m = 0; m <= W; ++m)
#pragma unroll
      for (int h = 0; h < 2; ++h) acc[m][h][0] = acc[m][h][1] = acc[m][h][2] = acc[m][h][3] = 0.f;
    const int row_in = lane & 15, piece_in = lane >> 4;
#pragma unroll
    for (int k0 = 0; k0 < K; k0 += 16) {
      u32 a[4];
      fwd::ldsm_x4(a, sK + k_at(W * 16 + row_in, k0 / 8 + piece_in));
#pragma unroll
      for (int m = 0; m <= W; ++m) {
        u32 f[4];
        if (m == W) {
#pragma unroll
          for (int q = 0; q < 4; ++q) f[q] = a[q];
        } else {
          fwd::ldsm_x4(f, sK + k_at(m * 16 + row_in, k0 / 8 + piece_in));
        }
        const u32 b[4] = {f[0], f[2], f[1], f[3]};  // rows 0-7 then 8-15 of block m, k 0-7 then 8-15
        fwd::mma_pair(acc[m][0], acc[m][1], a, b);
      }
    }
  }

  /// L of row block W from its K K^T blocks, as fp32 pairs into the K tile's bytes.
  /// With Cfg::FOLD_RSTD the K tile is raw: (K K^T)_rc times rstd_r rstd_c is the normalized
  /// product (one rounding fewer than the product of rounded normalized rows).
  template <int W>
  __device__ static void l_row(const float (&acc)[4][2][4], float* sL, const float* sg, const float* sb,
                               const float* sr, int len, int lane) {
    const int gr = lane >> 2, tq = (lane & 3) * 2;
    float g_row[2], b_row[2], r_row[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      g_row[e] = sg[W * 16 + gr + 8 * e];
      b_row[e] = sb[W * 16 + gr + 8 * e];
      r_row[e] = Cfg::FOLD_RSTD ? sr[W * 16 + gr + 8 * e] : 1.f;
    }
#pragma unroll
    for (int m = 0; m <= W; ++m) {
      float* dst = sL + blk(W, m) * kBlock;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int cc = h * 8 + tq, c = m * 16 + cc;
        const float g_c0 = sg[c], g_c1 = sg[c + 1];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int rr = gr + e * 8, r = W * 16 + rr;
          const float a0 = Cfg::FOLD_RSTD ? acc[m][h][2 * e] * (r_row[e] * sr[c]) : acc[m][h][2 * e];
          const float a1 = Cfg::FOLD_RSTD ? acc[m][h][2 * e + 1] * (r_row[e] * sr[c + 1]) : acc[m][h][2 * e + 1];
          // strict lower part inside the chunk (c < r < len)
          const float l0 = select_f32(c < r && r < len, a0 * gate_exp2(g_row[e] - g_c0, true) * b_row[e], 0.f);
          const float l1 = select_f32(c + 1 < r && r < len, a1 * gate_exp2(g_row[e] - g_c1, true) * b_row[e], 0.f);
          *reinterpret_cast<float2*>(dst + at(rr, cc)) = make_float2(l0, l1);
        }
      }
    }
  }

  /// With Cfg::FOLD_RSTD: the rstd of row block W's rows from the diagonal of the raw K K^T (each
  /// row's sum of squares, summed on the tensor cores), into sr. Rows gr and gr + 8 of the
  /// diagonal sit in the lane with lane % 4 == gr / 2, in element gr % 2 of halves 0 and 1.
  template <int W>
  __device__ static void diag_rstd(const float (&acc)[4][2][4], float* sr, int lane) {
    const int gr = lane >> 2;
    if ((lane & 3) != (gr >> 1)) return;
    const bool odd = gr & 1;
    const float ss0 = odd ? acc[W][0][1] : acc[W][0][0];
    const float ss1 = odd ? acc[W][1][3] : acc[W][1][2];
    sr[W * 16 + gr] = 1.f / sqrtf(ss0 + 1e-6f);
    sr[W * 16 + gr + 8] = 1.f / sqrtf(ss1 + 1e-6f);
  }

  /// Every warp reaches the same two block barriers: bar.sync from per-warp code paths would be
  /// divergent barriers (compute-sanitizer's synccheck rejects them).
  template <int W>
  __device__ static void gram_and_rstd(const bf16_t* sK, float (&acc)[4][2][4], float* sr, int lane) {
    gram_row<W>(sK, acc, lane);
    if (Cfg::FOLD_RSTD) diag_rstd<W>(acc, sr, lane);
  }

  __device__ static void gram_to_l(const bf16_t* sK, float* sL, const float* sg, const float* sb, float* sr, int len,
                                   int warp, int lane) {
    float acc[4][2][4];
    switch (warp) {
      case 0: gram_and_rstd<0>(sK, acc, sr, lane); break;
      case 1: gram_and_rstd<1>(sK, acc, sr, lane); break;
      case 2: gram_and_rstd<2>(sK, acc, sr, lane); break;
      default: gram_and_rstd<3>(sK, acc, sr, lane); break;
    }
    __syncthreads();  // every warp is done reading K (and has its rows' rstd in sr); L takes K's bytes
    switch (warp) {
      case 0: l_row<0>(acc, sL, sg, sb, sr, len, lane); break;
      case 1: l_row<1>(acc, sL, sg, sb, sr, len, lane); break;
      case 2: l_row<2>(acc, sL, sg, sb, sr, len, lane); break;
      default: l_row<3>(acc, sL, sg, sb, sr, len, lane); break;
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
  /// Tm_aB = -Tm_aa P, on the fp64 tensor cores. The warp owns rows 8 half .. 8 half + 7 of each
  /// block; `sync` joins the two warps that own the column (P and Tm_aB are the next product's
  /// operands). Tm_aa is lower triangular: the first 8 rows need only its first 8 columns.
  template <int B, class Sync>
  __device__ static void merge_column(const float* sL, float* sT, float* sP, int half, const Fragments& f, Sync sync) {
    float* P = sP + B * kBlock;
#pragma unroll
    for (int a = B + 1; a < 4; ++a) {
      double acc[2][2] = {{0.0, 0.0}, {0.0, 0.0}};
#pragma unroll
      for (int m = B; m < a; ++m) product_rows8<4>(acc, sL + blk(a, m) * kBlock, sT + blk(m, B) * kBlock, f);
      store_rows8(P, acc, 1.f, f);
      sync();
      acc[0][0] = acc[0][1] = acc[1][0] = acc[1][1] = 0.0;
      const float* Taa = sT + blk(a, a) * kBlock;
      if (half == 0)
        product_rows8<2>(acc, Taa, P, f);
      else
        product_rows8<4>(acc, Taa, P, f);
      store_rows8(sT + blk(a, B) * kBlock, acc, -1.f, f);
      sync();  // Tm_aB is the next step's operand, and P is written again
    }
  }

  /// Rows < len of bf16(Tm) (the part above the diagonal as 0), 16 bytes per store. Thread tid
  /// writes columns 8 (tid % 8) .. + 7 of rows tid / 8 + 16 a: in row block a its piece lies in
  /// column block m = (tid % 8) / 2, below the diagonal block (m < a), on it, or above (zeros).
  __device__ static void store_tm(const float* sT, bf16_t* dst, int len) {
    const int rr = threadIdx.x >> 3, c8 = (threadIdx.x & 7) * 8, m = c8 >> 4, cm = c8 & 15;
    const int lo_at = at(rr, cm), hi_at = at(rr, cm + 4);
    bf16_t* out = dst + rr * (long long)HV * C + c8;
#pragma unroll
    for (int a = 0; a < 4; ++a) {
      if (16 * a + rr >= len) break;
      u32 w[4] = {0u, 0u, 0u, 0u};
      if (m <= a) {
        const float* b = sT + (blk(a, 0) + m) * kBlock;
        const float4 lo = *reinterpret_cast<const float4*>(b + lo_at);
        const float4 hi = *reinterpret_cast<const float4*>(b + hi_at);
        const float v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
        const int keep = m < a ? 8 : rr - cm + 1;  // columns kept from cm (the diagonal block: c <= r)
#pragma unroll
        for (int q = 0; q < 8; q += 2)
          w[q / 2] = pack_bf16x2(q < keep ? f2bf(v[q]) : bf16_t(0), q + 1 < keep ? f2bf(v[q + 1]) : bf16_t(0));
      }
      *reinterpret_cast<uint4*>(out + 16 * a * (long long)HV * C) = make_uint4(w[0], w[1], w[2], w[3]);
    }
  }
};

}  // namespace gdn
