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
__device__ __forceinline__ Transposed<A> transposed(A a) { return Transposed<A>{a}; }

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

/// M x N fp32 accumulator owned by WARPS warps; tile t = warp + slot * WARPS of the 16 x 8 tiles.
template <int M, int N, int WARPS>
struct Acc {
  static_assert(M % 16 == 0, "Acc: M must be a multiple of 16 (the mma tile height)");
  static_assert(N % 8 == 0, "Acc: N must be a multiple of 8 (the mma tile width)");
  static constexpr int kTilesM = M / 16;
  static constexpr int kTilesN = N / 8;
  static constexpr int kTiles = kTilesM * kTilesN;
  static_assert(kTiles % WARPS == 0, "Acc: the 16x8 tiles must divide evenly over the warps");
  static constexpr int kSlots = kTiles / WARPS;

  float c[kSlots][4];

  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int s = 0; s < kSlots; ++s)
#pragma unroll
      for (int i = 0; i < 4; ++i) c[s][i] = 0.f;
  }

  /// this += A[M x kd] * B[kd x N]; kd a multiple of 16. Call from every thread of the block.
  template <class A, class B>
  __device__ __forceinline__ void mma(const A& a, const B& b, int kd) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int gr = lane / 4, tq = (lane % 4) * 2;
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      const int t = warp + s * WARPS;
      const int r0 = (t / kTilesN) * 16, c0 = (t % kTilesN) * 8;
      for (int k0 = 0; k0 < kd; k0 += 16) {
        u32 af[4], bf[2];
        af[0] = pack_bf16x2(a(r0 + gr, k0 + tq), a(r0 + gr, k0 + tq + 1));
        af[1] = pack_bf16x2(a(r0 + gr + 8, k0 + tq), a(r0 + gr + 8, k0 + tq + 1));
        af[2] = pack_bf16x2(a(r0 + gr, k0 + tq + 8), a(r0 + gr, k0 + tq + 9));
        af[3] = pack_bf16x2(a(r0 + gr + 8, k0 + tq + 8), a(r0 + gr + 8, k0 + tq + 9));
        bf[0] = pack_bf16x2(b(k0 + tq, c0 + gr), b(k0 + tq + 1, c0 + gr));
        bf[1] = pack_bf16x2(b(k0 + tq + 8, c0 + gr), b(k0 + tq + 9, c0 + gr));
        mma_16816(c[s], af, bf);
      }
    }
  }

  /// Calls f(row, col, value&) for every element this thread owns.
  template <class F>
  __device__ __forceinline__ void for_each(F f) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int gr = lane / 4, tq = (lane % 4) * 2;
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      const int t = warp + s * WARPS;
      const int r0 = (t / kTilesN) * 16, c0 = (t % kTilesN) * 8;
      f(r0 + gr, c0 + tq, c[s][0]);
      f(r0 + gr, c0 + tq + 1, c[s][1]);
      f(r0 + gr + 8, c0 + tq, c[s][2]);
      f(r0 + gr + 8, c0 + tq + 1, c[s][3]);
    }
  }
};

}  // namespace gdn
