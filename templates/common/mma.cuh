/**
 * @file mma.cuh
 * @brief Block-level tensor-core products on shared-memory operands (mma.sync m16n8k16,
 *        bf16 operands, fp32 accumulation), usable on sm_90a, sm_100a and sm_103a.
 *
 * Operands are read through accessors: any object with `bf16_t operator()(int row, int col)`.
 * That makes transposes, row scalings and masks free to express at the call site. An Acc<M, N,
 * WARPS> holds an M x N fp32 accumulator spread over the WARPS warps of the block; every Acc of
 * the same shape maps elements to threads the same way, so accumulators can be combined
 * element-wise in registers.
 */
#pragma once

#include "common/numeric.cuh"

namespace gdn {

/// Row-major (or strided) bf16 matrix in shared or global memory.
struct MatRef {
  const bf16_t* p;
  int rs;  ///< row stride in elements
  int cs;  ///< column stride in elements
  __device__ __forceinline__ bf16_t operator()(int r, int c) const { return p[r * rs + c * cs]; }
};

/// The transpose view of an accessor.
template <class A>
struct Transposed {
  A a;
  __device__ __forceinline__ bf16_t operator()(int r, int c) const { return a(c, r); }
};
template <class A>
__device__ __forceinline__ Transposed<A> transposed(A a) {
  return Transposed<A>{a};
}

__device__ __forceinline__ u32 pack_bf16x2(bf16_t lo, bf16_t hi) {
  return static_cast<u32>(lo) | (static_cast<u32>(hi) << 16);
}

__device__ __forceinline__ void mma_16816(float (&c)[4], const u32 (&a)[4], const u32 (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/// How an Acc's 16 x 8 tiles are dealt to warps: each warp owns a rectangle of WM x WN tiles,
/// so a product step loads WM A fragments and WN B fragments for WM * WN mma instructions. The
/// rectangle minimizes shared-memory bytes per mma, (WM * 512 + WN * 256) / (WM * WN); the
/// products are bound by shared-memory bandwidth when every tile loads its own fragments.
template <int TILES_M, int TILES_N, int SLOTS>
struct WarpRect {
  static constexpr bool fits(int wm) {
    return wm > 0 && SLOTS % wm == 0 && TILES_M % wm == 0 && TILES_N % (SLOTS / wm) == 0;
  }
  /// bytes per mma x 256 x SLOTS, compared as integers
  static constexpr int cost(int wm) { return wm * 2 + SLOTS / wm; }
  static constexpr int pick() {
    int best = 0;
    for (int wm = 1; wm <= SLOTS; ++wm)
      if (fits(wm) && (best == 0 || cost(wm) < cost(best))) best = wm;
    return best;
  }
  static constexpr int kWM = pick();
  static_assert(kWM > 0, "WarpRect: the tiles cannot be dealt to the warps as equal rectangles");
  static constexpr int kWN = SLOTS / kWM;
};

/// M x N fp32 accumulator owned by WARPS warps. Slot s of warp w is the tile at
/// origin(w, s); every Acc of the same shape maps elements to threads the same way.
/// The element walks of every accumulator made of m16n8 fragments (Acc below, and the wgmma
/// accumulator of chunk_bwd_sm90.cuh): AccT gives kSlots, tile_row(w, s), tile_col(w, s) and
/// c[kSlots][4].
template <class AccT>
__device__ __forceinline__ void acc_zero(AccT& a) {
#pragma unroll
  for (int s = 0; s < AccT::kSlots; ++s)
#pragma unroll
    for (int i = 0; i < 4; ++i) a.c[s][i] = 0.f;
}
/// Walks the elements this thread owns two adjacent columns at a time: f(row, col, v[col], v[col + 1]).
template <class AccT, class F>
__device__ __forceinline__ void acc_for_pairs(AccT& a, F f) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int gr = lane / 4, tq = (lane % 4) * 2;
#pragma unroll
  for (int s = 0; s < AccT::kSlots; ++s) {
    const int r0 = AccT::tile_row(warp, s) * 16, c0 = AccT::tile_col(warp, s) * 8;
    f(r0 + gr, c0 + tq, a.c[s][0], a.c[s][1]);
    f(r0 + gr + 8, c0 + tq, a.c[s][2], a.c[s][3]);
  }
}
/// Calls f(row, col, value&) for every element this thread owns.
template <class AccT, class F>
__device__ __forceinline__ void acc_for_each(AccT& a, F f) {
  acc_for_pairs(a, [&](int r, int c, float& x, float& y) {
    f(r, c, x);
    f(r, c + 1, y);
  });
}

template <int M, int N, int WARPS>
struct Acc {
  static_assert(M % 16 == 0, "Acc: M must be a multiple of 16 (the mma tile height)");
  static_assert(N % 8 == 0, "Acc: N must be a multiple of 8 (the mma tile width)");
  static constexpr int kTilesM = M / 16;
  static constexpr int kTilesN = N / 8;
  static constexpr int kTiles = kTilesM * kTilesN;
  static_assert(kTiles % WARPS == 0, "Acc: the 16x8 tiles must divide evenly over the warps");
  static constexpr int kSlots = kTiles / WARPS;
  static constexpr int kWarps = WARPS;
  using Rect = WarpRect<kTilesM, kTilesN, kSlots>;
  static constexpr int kWM = Rect::kWM, kWN = Rect::kWN;
  static constexpr int kWarpCols = kTilesN / kWN;  ///< warps across the tile columns

  /// Tile row and column (in tiles) of slot s of warp w.
  __device__ __forceinline__ static int tile_row(int w, int s) { return (w / kWarpCols) * kWM + s / kWN; }
  __device__ __forceinline__ static int tile_col(int w, int s) { return (w % kWarpCols) * kWN + s % kWN; }

  float c[kSlots][4];

  __device__ __forceinline__ void zero() { acc_zero(*this); }

  /// this += A[M x kd] * B[kd x N]; kd a multiple of 16. Call from every thread of the block.
  /// Every element accumulates its k steps in ascending order, whatever the warp rectangle.
  template <class A, class B>
  __device__ __forceinline__ void mma(const A& a, const B& b, int kd) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int gr = lane / 4, tq = (lane % 4) * 2;
    for (int k0 = 0; k0 < kd; k0 += 16) {
      u32 af[kWM][4], bf[kWN][2];
#pragma unroll
      for (int i = 0; i < kWM; ++i) {
        const int r0 = tile_row(warp, i * kWN) * 16;
        af[i][0] = pack_bf16x2(a(r0 + gr, k0 + tq), a(r0 + gr, k0 + tq + 1));
        af[i][1] = pack_bf16x2(a(r0 + gr + 8, k0 + tq), a(r0 + gr + 8, k0 + tq + 1));
        af[i][2] = pack_bf16x2(a(r0 + gr, k0 + tq + 8), a(r0 + gr, k0 + tq + 9));
        af[i][3] = pack_bf16x2(a(r0 + gr + 8, k0 + tq + 8), a(r0 + gr + 8, k0 + tq + 9));
      }
#pragma unroll
      for (int jn = 0; jn < kWN; ++jn) {
        const int c0 = tile_col(warp, jn) * 8;
        bf[jn][0] = pack_bf16x2(b(k0 + tq, c0 + gr), b(k0 + tq + 1, c0 + gr));
        bf[jn][1] = pack_bf16x2(b(k0 + tq + 8, c0 + gr), b(k0 + tq + 9, c0 + gr));
      }
#pragma unroll
      for (int s = 0; s < kSlots; ++s) mma_16816(c[s], af[s / kWN], bf[s % kWN]);
    }
  }

  /// Calls f(row, col, value&) for every element this thread owns.
  template <class F>
  __device__ __forceinline__ void for_each(F f) {
    acc_for_each(*this, f);
  }
};

}  // namespace gdn
