/**
 * @file numeric.cuh
 * @brief bf16 conversions, gate exponentials and warp reductions, free of host headers (NVRTC).
 */
#pragma once

#include "arch.cuh"
#include "params.cuh"

namespace gdn {

typedef unsigned int u32;

__device__ __forceinline__ float bf2f(bf16_t x) { return __uint_as_float(static_cast<u32>(x) << 16); }

/// Round-to-nearest-even, as cvt.rn.bf16.f32 does (NaN stays NaN).
__device__ __forceinline__ bf16_t f2bf(float x) {
  unsigned short r;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(x));
  return r;
}

__device__ __forceinline__ float round_bf(float x) { return bf2f(f2bf(x)); }

/// The low / high element of a bf16 pair (f2bf_pair's order) as a float.
__device__ __forceinline__ float bf16_lo_f(u32 pair) { return __uint_as_float(pair << 16); }
__device__ __forceinline__ float bf16_hi_f(u32 pair) { return __uint_as_float(pair & 0xffff0000u); }

/// The bf16 pair {lo, hi} (lo in the low 16 bits), each rounded to nearest even: the bits of
/// f2bf(lo) | f2bf(hi) << 16 in one instruction (cvt.rn.bf16x2.f32) instead of three. The
/// epilogues are long runs of these, and the warp-specialized kernels are bound by fetching their
/// instructions (docs/PERF.md), so every instruction an epilogue saves counts.
__device__ __forceinline__ u32 f2bf_pair(float lo, float hi) {
  u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

/// Splits x into bf16 hi + lo: two bf16 mma passes then carry about 16 mantissa bits, enough
/// to match the fp32/tf32 operands FLA uses where bf16 alone loses accuracy.
__device__ __forceinline__ void split_bf16(float x, bf16_t& hi, bf16_t& lo) {
  hi = f2bf(x);
  lo = f2bf(x - bf2f(hi));
}

/// split_bf16 of a pair: hi = f2bf_pair(x_lo, x_hi) and lo the pair of the remainders, the bits of
/// split_bf16 on each element packed as pack_bf16x2 would.
__device__ __forceinline__ void split_bf16_pair(float x_lo, float x_hi, u32& hi, u32& lo) {
  hi = f2bf_pair(x_lo, x_hi);
  lo = f2bf_pair(x_lo - __uint_as_float(hi << 16), x_hi - __uint_as_float(hi & 0xffff0000u));
}

/// a where p, else b, as one select instruction: both operands are computed first, so an
/// epilogue over many elements stays straight-line code the scheduler can interleave (a `?:` whose
/// arm holds an exp2 becomes a branch per element, its load, exp2 and multiply in series).
__device__ __forceinline__ float select_f32(bool p, float a, float b) {
  float d;
  asm("{\n\t.reg .pred q;\n\tsetp.ne.u32 q, %3, 0;\n\tselp.f32 %0, %1, %2, q;\n\t}"
      : "=f"(d)
      : "f"(a), "f"(b), "r"(static_cast<unsigned>(p)));
  return d;
}

/// 2^x by the special-function unit alone, subnormal results flushed to zero. exp2f's own code
/// wraps the same MUFU.EX2 in a range test and two predicated multiplies that produce the results
/// below 2^-126: the bits are exp2f's wherever x >= -126, and 0 below, where a decay factor of
/// 1e-38 multiplies values that are rounded to bf16 next. One instruction instead of four, which
/// counts where the gate factors sit on a walk's per-chunk chain.
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

/// exp2 of a gate difference, clamped to <= 0 (so never inf), where valid, else 0: computed either
/// way and selected.
__device__ __forceinline__ float gate_exp2(float d, bool valid) { return select_f32(valid, exp2f(fminf(d, 0.f)), 0.f); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/// 1 / ln 2 in fp32, as FLA's RCP_LN2: gate cumsums are kept in log2 units.
constexpr float kRcpLn2 = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

}  // namespace gdn
