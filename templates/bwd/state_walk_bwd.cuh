/**
 * @file state_walk_bwd.cuh
 * @brief Stage B3: the reverse state walk. Per (V slab, value head, document) the K x BV fp32
 *        gradient Z lives in registers across the document's chunks, walked last to first.
 *
 * Per chunk c (m valid rows, gcL = gc of the last valid row):
 *   dh_tape[c] = bf16(Z)
 *   dV'_c      = exp2(gcL - gc_i) .* (Kc bf16(Z)) + dv_local_c     -> bf16, rows >= m are 0
 *   Z          = exp2(gcL) Z + (scale exp2(gc) .* Qc)^T dO_c - W_c^T bf16(dV'_c)
 * The serial dependency is Z -> Kc Z -> dV' -> W^T dV' -> Z; everything else (the next chunk's
 * loads, the Q-side product) is issued off that path. The row gate scale*exp2(gc) is applied to
 * the dO slab (C x BV) rather than to Q (C x K): Q^T diag(s) dO is the same product, the scaled
 * slab enters the tensor cores as bf16 hi + lo parts (FLA uses tf32 there), and the per-chunk
 * conversion touches BV/K as many elements.
 */
#pragma once

#include "bwd/dv_local.cuh"

namespace gdn {

template <class Cfg>
struct StateWalkBwd {
  static constexpr int K = Cfg::K, V = Cfg::V, C = Cfg::CHUNK;
  static constexpr int BV = StateWalkBwdGeometry::bv(Cfg::V);
  static constexpr int kThreads = StateWalkBwdGeometry::kThreads, kWarps = kThreads / 32;
  static constexpr int PK = bwd_pitch(K), PB = bwd_pitch(BV);
  static_assert(C == 64, "StateWalkBwd: only chunk size 64 is supported");
  static_assert(BV == 32 && V % BV == 0, "StateWalkBwd: V must be a multiple of the 32-column slab");
  static_assert(K % 16 == 0 && K <= 256, "StateWalkBwd: K must be a multiple of 16 and at most 256");
  static_assert(Cfg::HV == Cfg::H * Cfg::G, "StateWalkBwd: HV must equal H * G");

  /// Element offsets of one pipeline stage (bf16 units; gc follows as floats).
  static constexpr int kOffK = 0, kOffQ = C * PK, kOffW = 2 * C * PK, kOffO = 3 * C * PK;
  static constexpr int kOffL = kOffO + C * PB, kOffG = kOffL + C * PB;
  static constexpr int kStageBytes = StateWalkBwdGeometry::stage_bytes(K, V, C);
  static_assert(kStageBytes % 16 == 0, "StateWalkBwd: stages must stay 16-byte aligned");

  __device__ static void load_stage(unsigned char* st, const StateWalkBwdParams& p, const ChunkInfo& ci, int j,
                                    int v0) {
    bf16_t* b = reinterpret_cast<bf16_t*>(st);
    const long long t0 = ci.start;
    const int h = j / Cfg::G, m = ci.len;
    bwd::load_tile_async<C, K, kThreads>(b + kOffK, PK, p.k + (t0 * Cfg::H + h) * K, (long long)Cfg::H * K, m);
    bwd::load_tile_async<C, K, kThreads>(b + kOffQ, PK, p.q + (t0 * Cfg::H + h) * K, (long long)Cfg::H * K, m);
    bwd::load_tile_async<C, K, kThreads>(b + kOffW, PK, p.w + (t0 * Cfg::HV + j) * K, (long long)Cfg::HV * K, m);
    bwd::load_tile_async<C, BV, kThreads>(b + kOffO, PB, p.d_o + (t0 * Cfg::HV + j) * V + v0,
                                          (long long)Cfg::HV * V, m);
    bwd::load_tile_async<C, BV, kThreads>(b + kOffL, PB, p.dv_local + (t0 * Cfg::HV + j) * V + v0,
                                          (long long)Cfg::HV * V, m);
    float* g = reinterpret_cast<float*>(b + kOffG);
    for (int i = threadIdx.x; i < C; i += kThreads) g[i] = i < m ? p.gc[(t0 + i) * Cfg::HV + j] : 0.f;
  }

  __device__ static void run(const StateWalkBwdParams& p) {
    const int v0 = blockIdx.x * BV, j = blockIdx.y, n = blockIdx.z;
    const int c_first = p.doc_chunk_offset[n], c_last = p.doc_chunk_offset[n + 1] - 1;
    extern __shared__ __align__(16) unsigned char smem[];
    bf16_t* sOh = reinterpret_cast<bf16_t*>(smem + kStageBytes);
    bf16_t* sOl = sOh + C * PB;
    bf16_t* sZ = sOl + C * PB;
    bf16_t* sD = sZ + K * PB;  // holds -bf16(dV') so the W^T product subtracts through an add

    Acc<K, BV, kWarps> z;
    z.zero();
    if (Cfg::HAS_HT && p.dht != nullptr) {
      const float* src = p.dht + ((long long)n * Cfg::HV + j) * K * V + v0;
      bwd::for_pairs(z, [&](int r, int c, float& a, float& b) {
        const float2 x = *reinterpret_cast<const float2*>(src + (long long)r * V + c);
        a = x.x;
        b = x.y;
      });
    }

    // One stage, not two: with the smaller footprint and at most 128 registers per thread two
    // blocks share an SM, and the other block's work hides this block's loads (the walk is
    // latency-bound: a few small dependent products per chunk).
    unsigned char* cur = smem;
    if (c_last >= c_first) load_stage(cur, p, p.chunks[c_last], j, v0);
    bwd::cp_async_commit();

    const float scale = p.scale;
    for (int c = c_last; c >= c_first; --c) {
      bwd::cp_async_wait<0>();
      __syncthreads();

      const ChunkInfo ci = p.chunks[c];
      const int m = ci.len;
      const bf16_t* sK = reinterpret_cast<const bf16_t*>(cur) + kOffK;
      const bf16_t* sQ = reinterpret_cast<const bf16_t*>(cur) + kOffQ;
      const bf16_t* sW = reinterpret_cast<const bf16_t*>(cur) + kOffW;
      const bf16_t* sO = reinterpret_cast<const bf16_t*>(cur) + kOffO;
      const bf16_t* sL = reinterpret_cast<const bf16_t*>(cur) + kOffL;
      const float* sg = reinterpret_cast<const float*>(reinterpret_cast<const bf16_t*>(cur) + kOffG);
      const float gL = sg[m - 1];

      bf16_t* tape = p.dh_tape + (((long long)c * Cfg::HV + j) * K) * V + v0;
      bwd::for_pairs(z, [&](int r, int cc, float& a, float& b) {
        const u32 x = pack_bf16x2(f2bf(a), f2bf(b));
        *reinterpret_cast<u32*>(tape + (long long)r * V + cc) = x;
        *reinterpret_cast<u32*>(sZ + r * PB + cc) = x;
      });
      for (int i = threadIdx.x; i < C * BV; i += kThreads) {
        const int r = i / BV, cc = i % BV;
        // Rows >= m hold dO = 0 (zero-filled), so the gate value there is irrelevant.
        const float x = scale * exp2f(fminf(sg[r], 0.f)) * bf2f(sO[r * PB + cc]);
        bf16_t hi, lo;
        bwd::split_bf16(x, hi, lo);
        sOh[r * PB + cc] = hi;
        sOl[r * PB + cc] = lo;
      }
      __syncthreads();

      Acc<C, BV, kWarps> d;
      d.zero();
      bwd::mma(d, MatRef{sK, PK, 1}, MatRef{sZ, PB, 1}, K);
      bf16_t* dvn = p.dv_new + ((long long)ci.start * Cfg::HV + j) * V + v0;
      bwd::for_pairs(d, [&](int r, int cc, float& a, float& b) {
        float x0 = 0.f, x1 = 0.f;
        if (r < m) {
          const float e = gate_exp2(gL - sg[r], true);
          x0 = e * a + bf2f(sL[r * PB + cc]);
          x1 = e * b + bf2f(sL[r * PB + cc + 1]);
        }
        const bf16_t b0 = f2bf(x0), b1 = f2bf(x1);
        if (r < m) *reinterpret_cast<u32*>(dvn + (long long)r * Cfg::HV * V + cc) = pack_bf16x2(b0, b1);
        // Negating a bf16 is exact: flip the sign bit.
        *reinterpret_cast<u32*>(sD + r * PB + cc) = pack_bf16x2(b0 ^ 0x8000u, b1 ^ 0x8000u);
      });
      // The Q-side update does not need dV', so it fills the wait at the barrier.
      const float eL = gate_exp2(gL, true);
      z.for_each([&](int, int, float& v) { v *= eL; });
      bwd::mma(z, transposed(MatRef{sQ, PK, 1}), MatRef{sOh, PB, 1}, C);
      bwd::mma(z, transposed(MatRef{sQ, PK, 1}), MatRef{sOl, PB, 1}, C);
      __syncthreads();
      bwd::mma(z, transposed(MatRef{sW, PK, 1}), MatRef{sD, PB, 1}, C);
      __syncthreads();  // the stage is free: load the previous chunk into it
      if (c > c_first) load_stage(cur, p, p.chunks[c - 1], j, v0);
      bwd::cp_async_commit();
    }
    bwd::cp_async_wait<0>();

    if (Cfg::HAS_H0 && p.dh0 != nullptr) {
      float* dst = p.dh0 + ((long long)n * Cfg::HV + j) * K * V + v0;
      bwd::for_pairs(z, [&](int r, int c, float& a, float& b) {
        *reinterpret_cast<float2*>(dst + (long long)r * V + c) = make_float2(a, b);
      });
    }
  }
};

}  // namespace gdn
