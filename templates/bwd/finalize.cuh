/**
 * @file finalize.cuh
 * @brief Stage B7: sums the per-value-head bf16 dq/dk over each group of G value heads in a
 *        fixed order (deterministic), then applies the L2-norm backward dx = rstd (dy - (dy . y) y)
 *        in fp32 from the saved bf16 y (or the raw rows, normalized here) and fp32 rstd, and
 *        writes bf16 dq, dk [T, H, K].
 *
 * One warp per (token, q/k head) row; lane l owns elements l, l + 32, ... so every load of a
 * value head's row is one coalesced 128-byte line per 32 elements.
 */
#pragma once

#include "common/numeric.cuh"
#include "bwd/geometry.hpp"

namespace gdn {

template <class Cfg>
struct Finalize {
  static constexpr int K = Cfg::K, H = Cfg::H, HV = Cfg::HV, G = Cfg::G;
  static constexpr int kPerLane = K / 32;
  static_assert(K % 32 == 0, "Finalize: K must be a multiple of 32 (one warp per row)");
  static_assert(HV == H * G, "Finalize: HV must equal H * G");

  /// raw (Cfg::RAW_QK): y holds the raw rows, normalized here with l2norm's arithmetic
  /// (bf16(x * rstd): the bits of the qn or kn that l2norm would write with this rstd).
  __device__ static void one(const bf16_t* dxv, const bf16_t* y, const float* rstd, bf16_t* dx, long long t, int h,
                             int lane, bool raw) {
    float d[kPerLane];
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) d[e] = 0.f;
    for (int g = 0; g < G; ++g) {
      const bf16_t* src = dxv + (t * HV + h * G + g) * K;
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) d[e] += bf2f(src[lane + 32 * e]);
    }
    const long long row = (t * H + h) * K;
    if (Cfg::NORM) {
      float yv[kPerLane], dot = 0.f;
      // The same rstd as r below, read apart so that the default's machine code keeps its order
      // (the compiler merges the two loads where raw is set).
      const float r_raw = raw ? rstd[t * H + h] : 0.f;
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) {
        yv[e] = bf2f(y[row + lane + 32 * e]);
        if (raw) yv[e] = round_bf(yv[e] * r_raw);
        dot += d[e] * yv[e];
      }
      dot = warp_sum(dot);
      const float r = rstd[t * H + h];
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) d[e] = r * (d[e] - dot * yv[e]);
    }
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) dx[row + lane + 32 * e] = f2bf(d[e]);
  }

  __device__ static void run(const FinalizeParams& p) {
    const long long idx = (long long)blockIdx.x * FinalizeGeometry::kRowsPerBlock + threadIdx.x / 32;
    if (idx >= (long long)p.T * H) return;
    const long long t = idx / H;
    const int h = static_cast<int>(idx % H), lane = threadIdx.x % 32;
    constexpr bool raw = RawQkOf<Cfg>::value;
    one(p.dq_v, p.qn, p.rstd_q, p.dq, t, h, lane, raw);
    one(p.dk_v, p.kn, p.rstd_k, p.dk, t, h, lane, raw);
  }
};

}  // namespace gdn
