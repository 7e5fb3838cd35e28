/**
 * @file output.cuh
 * @brief Forward stage F5 per (chunk, value head):
 *        O = scale * (diag(exp2(gc)) Qc bf16(h) + bf16(tril0(Qc Kc^T .* exp2(gc_i - gc_j))) V').
 *
 * Warp w owns output rows 16 (w % 4) .. +15 and the column half w / 4 of V end to end: the gated
 * Q K^T tile never leaves registers (its accumulator layout is already the A-fragment layout of
 * the next product; both warps of a row block compute it, with the same bits), and only the causal
 * k-blocks 0..w % 4 of it are computed and used.
 */
#pragma once

#include "common/grid.cuh"
#include "fwd/chunk_prep.cuh"

namespace gdn {

template <class Cfg>
struct Output {
  static_assert(Cfg::K == 128, "Output supports K == 128 only");
  static_assert(Cfg::V == 128, "Output supports V == 128 only");
  static_assert(Cfg::CHUNK == 64, "Output supports CHUNK == 64 only (4 row blocks x 16 chunk rows)");
  static_assert(Cfg::HV == Cfg::H * Cfg::G, "Cfg::G must equal HV / H");
  static_assert(OutputGeometry::kThreads == 256, "Output assumes 8 warps: 4 row blocks x 2 column halves");

  static constexpr int K = Cfg::K, V = Cfg::V, C = Cfg::CHUNK, H = Cfg::H, HV = Cfg::HV, G = Cfg::G;
  static constexpr int kThreads = OutputGeometry::kThreads;
  static constexpr int LDK = OutputGeometry::ld_bf(K), LDV = OutputGeometry::ld_bf(V);
  // Offsets as constants: constexpr host functions are not callable from device code under NVRTC.
  static constexpr int kOff_q = OutputGeometry::off_q(K, V, C);
  static constexpr int kOff_k = OutputGeometry::off_k(K, V, C);
  static constexpr int kOff_vn = OutputGeometry::off_vn(K, V, C);
  static constexpr int kOff_h = OutputGeometry::off_h(K, V, C);
  static constexpr int kOff_g = OutputGeometry::off_g(K, V, C);

  __device__ static void run(const OutputParams& p) {
    extern __shared__ __align__(16) unsigned char smem[];
    const ChunkBlock at = chunk_block(p.chunks);
    if (at.len == 0) return;
    const int len = at.len, j = at.head, hq = j / G;
    const long long t0 = at.start, c = at.chunk;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int gr = lane >> 2, tq = (lane & 3) * 2;
    constexpr int kHalf = V / 2;
    const int rb = warp & 3, c0 = (warp >> 2) * kHalf;

    bf16_t* sQ = reinterpret_cast<bf16_t*>(smem + kOff_q);
    bf16_t* sK = reinterpret_cast<bf16_t*>(smem + kOff_k);
    bf16_t* sVn = reinterpret_cast<bf16_t*>(smem + kOff_vn);
    bf16_t* sH = reinterpret_cast<bf16_t*>(smem + kOff_h);
    float* sg = reinterpret_cast<float*>(smem + kOff_g);

    // Q and K first (the Q K^T product), h in a second group overlapping it; v_new replaces K
    // once the product is done (it shares K's bytes) and overlaps the Q h product.
    fwd::tile_to_smem_async<kThreads>(sQ, LDK, p.q + (t0 * H + hq) * K, (long long)H * K, C, K, len);
    fwd::tile_to_smem_async<kThreads>(sK, LDK, p.k + (t0 * H + hq) * K, (long long)H * K, C, K, len);
    fwd::cp_async_commit();
    fwd::tile_to_smem_async<kThreads>(sH, LDV, p.h_tape + (c * HV + j) * K * V, V, K, V, K);
    fwd::cp_async_commit();
    if (tid < C) sg[tid] = tid < len ? p.gc[(t0 + tid) * HV + j] : 0.f;
    fwd::cp_async_wait<1>();
    __syncthreads();

    // P = Q K^T for the causal blocks 0..rb.
    float P[C / 8][4];
    fwd::causal_scores<K, C, LDK>(P, sQ, sK, rb);
    // Gate, mask and round P to bf16 A fragments now: half the registers of the fp32 tile, which
    // the Q h accumulators need (the values are those the P V' product used to pack in place).
    const int r_lo = rb * 16 + gr, r_hi = r_lo + 8;
    const float g_lo = sg[r_lo], g_hi = sg[r_hi];
    u32 Pa[C / 16][4];
    fwd::gate_scores<C>(Pa, P, sg, g_lo, g_hi, rb, len, gr, tq);
    __syncthreads();  // every warp is done reading K: v_new takes its bytes
    fwd::tile_to_smem_async<kThreads>(sVn, LDV, p.v_new + (t0 * HV + j) * V, (long long)HV * V, C, V, len);
    fwd::cp_async_commit();
    fwd::cp_async_wait<1>();  // h
    __syncthreads();

    // O = Q h with the rows scaled by exp2(gc_i), this warp's column half.
    float O[kHalf / 8][4];
#pragma unroll
    for (int n = 0; n < kHalf / 8; ++n) O[n][0] = O[n][1] = O[n][2] = O[n][3] = 0.f;
#pragma unroll
    for (int k0 = 0; k0 < K; k0 += 16) {
      u32 a[4];
      fwd::load_a(a, sQ, LDK, rb * 16, k0);
#pragma unroll
      for (int np = 0; np < kHalf / 16; ++np) {
        u32 b[4];
        fwd::load_b_kn(b, sH, LDV, k0, c0 + np * 16);
        fwd::mma_pair(O[2 * np], O[2 * np + 1], a, b);
      }
    }
    {
      const float e_lo = r_lo < len ? exp2f(g_lo) : 0.f, e_hi = r_hi < len ? exp2f(g_hi) : 0.f;
#pragma unroll
      for (int n = 0; n < kHalf / 8; ++n) {
        O[n][0] *= e_lo;
        O[n][1] *= e_lo;
        O[n][2] *= e_hi;
        O[n][3] *= e_hi;
      }
    }

    fwd::cp_async_wait<0>();
    __syncthreads();

    // O += bf16(tril0(P .* exp2(gc_i - gc_j))) V'.
#pragma unroll
    for (int kk = 0; kk < C / 16; ++kk) {
      if (kk > rb) break;
#pragma unroll
      for (int np = 0; np < kHalf / 16; ++np) {
        u32 b[4];
        fwd::load_b_kn(b, sVn, LDV, kk * 16, c0 + np * 16);
        fwd::mma_pair(O[2 * np], O[2 * np + 1], Pa[kk], b);
      }
    }

    // Stage the warp's part in sQ for 16 B stores: the two warps of a row block share its rows of
    // Q, and the barrier before the P V' product already follows every read of Q.
    const float scale = p.scale;
#pragma unroll
    for (int n = 0; n < kHalf / 8; ++n) {
      const int col = c0 + n * 8 + tq;
      *reinterpret_cast<u32*>(sQ + r_lo * LDK + col) = f2bf_pair(O[n][0] * scale, O[n][1] * scale);
      *reinterpret_cast<u32*>(sQ + r_hi * LDK + col) = f2bf_pair(O[n][2] * scale, O[n][3] * scale);
    }
    __syncwarp();
    const int rows = min(16, len - rb * 16);
    if (rows > 0)
      fwd::tile_to_global<32>(p.o + ((t0 + rb * 16) * HV + j) * V + c0, (long long)HV * V, sQ + rb * 16 * LDK + c0, LDK,
                              kHalf, rows, lane, 32);
  }
};

}  // namespace gdn
