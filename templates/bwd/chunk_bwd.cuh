/**
 * @file chunk_bwd.cuh
 * @brief Stages B4 + B5 + B6 fused, one block per (chunk, value head): dq/dk per value head
 *        (fp32), dv, dbeta and dg (natural-log units, reverse cumsum inside the chunk done).
 *
 * Inputs per chunk: S = h_tape[c] (state entering), Z = dh_tape[c] (gradient at the end),
 * V' = v_new, dV' = dv_new, Tm, and q/k/v/beta/gc/dO. The math is docs/algorithm.md B4/B5/B6 (the
 * Appendix B numpy chunk_bwd) with these rewrites, all exact in real arithmetic:
 *  - dW kbg^T = (dW Kc^T) diag(beta Gam) and dV' vb^T = (dV' Vc^T) diag(beta): the row scalings
 *    move onto the fp32 result, so kbg and vb are never rounded to bf16;
 *  - diag(b) E Kc + E^T diag(b) Kc = (Eb + Eb^T) Kc with Eb = diag(b) E strictly lower, stored
 *    once as the symmetric tile;
 *  - dL.*L = diag(b) E .* KK^T, so rowsum(dL.*L) = b .* rowsum(E.*KK^T) reuses the dbeta sum.
 * dTm, Y = dTm Tm^T and Eb are fp32 values that enter the tensor cores as bf16 hi + lo pairs
 * (FLA rounds them to plain bf16), which keeps dL = -Tm^T dTm Tm^T near fp32 accuracy.
 * All reductions are fixed-order (partials per tile, then a serial sum): no atomics.
 */
#pragma once

#include "bwd/dv_local.cuh"
#include "bwd/chunk_bwd_sm90.cuh"

namespace gdn {

template <class Cfg>
struct ChunkBwdMmaSync {
  static constexpr int K = Cfg::K, V = Cfg::V, C = Cfg::CHUNK, H = Cfg::H, HV = Cfg::HV;
  static constexpr int kThreads = ChunkBwdGeometry::kThreads, kWarps = kThreads / 32;
  static constexpr int PK = bwd_pitch(K), PV = bwd_pitch(V), PC = bwd_pitch(C);
  static_assert(C == 64, "ChunkBwd: only chunk size 64 is supported");
  static_assert(K % 16 == 0 && V % 16 == 0, "ChunkBwd: K and V must be multiples of 16 (mma depth)");
  static_assert(K == V, "ChunkBwd: the shared scratch layout assumes K == V");
  static_assert((C / 16) * (K / 8) % kWarps == 0, "ChunkBwd: the C x K tiles must divide over the warps");
  static_assert(HV == H * Cfg::G, "ChunkBwd: HV must equal H * G");

  static constexpr int kScalarOffset =
      ChunkBwdGeometry::persist_bytes(K, V, C) + ChunkBwdGeometry::phase_bytes(K, V, C);
  static_assert(ChunkBwdGeometry::smem_bytes(K, V, C) <= 227 * 1024, "ChunkBwd: shared memory exceeds 227 KB");

  using AccCK = Acc<C, K, kWarps>;
  using AccCV = Acc<C, V, kWarps>;
  using AccCC = Acc<C, C, kWarps>;

  /// The entry with wgmma allowed: the maps are for the sm_90a body only.
  __device__ static void run(const ChunkBwdParams& p, const TensorMaps&) { run(p); }
  __device__ static void run(const ChunkBwdParams& p) {
    // Chunks fastest (blockIdx order), not value heads fastest as in the forward's chunk_heads
    // programs: measured faster on the H200 (docs/PERF.md).
    const ChunkInfo ci = p.chunks[blockIdx.x];
    if (ci.len == 0) return;
    const int j = blockIdx.y, h = j / Cfg::G, m = ci.len, tid = threadIdx.x;
    const long long t0 = ci.start, cg = blockIdx.x;
    extern __shared__ __align__(16) unsigned char smem[];
    // Persistent tiles.
    bf16_t* sQ = reinterpret_cast<bf16_t*>(smem);
    bf16_t* sK = sQ + C * PK;
    bf16_t* sV = sK + C * PK;
    bf16_t* sDV = sV + C * PV;
    bf16_t* sT = sDV + C * PV;
    // B4 phase tiles.
    bf16_t* ph = sT + C * PC;
    bf16_t* sS = ph;
    bf16_t* sZ = sS + K * PV;
    bf16_t* sO = sZ + K * PV;
    bf16_t* sVn = sO + C * PV;
    bf16_t* sDS = sVn + C * PV;
    // B5 phase tiles, over the dead B4 ones.
    bf16_t* sDW = ph;
    bf16_t* sDTh = sDW + C * PK;
    bf16_t* sDTl = sDTh + C * PC;
    bf16_t* sYh = sDTl + C * PC;
    bf16_t* sYl = sYh + C * PC;
    bf16_t* sEh = sYl + C * PC;
    bf16_t* sEl = sEh + C * PC;
    static_assert(C * PK + 6 * C * PC <= 2 * K * PV + 2 * C * PV + C * PC, "ChunkBwd: B5 tiles overflow");
    float* sg = reinterpret_cast<float*>(smem + kScalarOffset);
    float* sb = sg + C;
    float* sgam = sb + C;   // dL/dgamma per row
    float* sdb = sgam + C;  // dL/dbeta per row
    float* stmp = sdb + C;
    float* spart = stmp + C;            // [C][K/8] or [C cols][C/16] partials
    float* sred = spart + C * (K / 8);  // [64] block-sum scratch

    {
      const long long qs = (long long)H * K, vs = (long long)HV * V;
      // Three groups, in the order of use: what dS~ needs (dO, V'); what dQ and the attention
      // part of the gate add (Q, K, S); the rest (Z, dV', Tm, V), each still loading while the
      // products before it run.
      const long long st = (cg * HV + j) * K * V;
      bwd::load_tile_async<C, V, kThreads>(sO, PV, p.d_o + (t0 * HV + j) * V, vs, m);
      bwd::load_tile_async<C, V, kThreads>(sVn, PV, p.v_new + (t0 * HV + j) * V, vs, m);
      bwd::cp_async_commit();
      bwd::load_tile_async<C, K, kThreads>(sQ, PK, p.q + (t0 * H + h) * K, qs, m);
      bwd::load_tile_async<C, K, kThreads>(sK, PK, p.k + (t0 * H + h) * K, qs, m);
      bwd::load_tile_async<K, V, kThreads>(sS, PV, p.h_tape + st, V, K);
      bwd::cp_async_commit();
      bwd::load_tile_async<K, V, kThreads>(sZ, PV, p.dh_tape + st, V, K);
      bwd::load_tile_async<C, V, kThreads>(sDV, PV, p.dv_new + (t0 * HV + j) * V, vs, m);
      bwd::load_tile_async<C, C, kThreads>(sT, PC, p.tm + (t0 * HV + j) * C, (long long)HV * C, m);
      bwd::load_tile_async<C, V, kThreads>(sV, PV, p.v + (t0 * HV + j) * V, vs, m);
      bwd::cp_async_commit();
    }
    for (int i = tid; i < C; i += kThreads) {
      sg[i] = i < m ? p.gc[(t0 + i) * HV + j] : 0.f;
      sb[i] = i < m ? p.beta[(t0 + i) * HV + j] : 0.f;
      sgam[i] = 0.f;
      sdb[i] = 0.f;
    }
    bwd::cp_async_wait<2>();  // dO and V'
    __syncthreads();

    const float scale = p.scale;
    const float gL = sg[m - 1];
    const auto K_at = [&](int r, int c) { return bf2f(sK[r * PK + c]); };

    // ---- B4 ---------------------------------------------------------------------------------
    {  // dS~ = scale * tril0((dO V'^T) .* Dec).
      AccCC a;
      a.zero();
      bwd::mma(a, MatRef{sO, PV, 1}, transposed(MatRef{sVn, PV, 1}), V);
      bwd::for_pairs(a, [&](int r, int c, float& x, float& y) {
        const float v0 = (r >= c && r < m) ? scale * x * gate_exp2(sg[r] - sg[c], true) : 0.f;
        const float v1 = (r >= c + 1 && r < m) ? scale * y * gate_exp2(sg[r] - sg[c + 1], true) : 0.f;
        bwd::store_bf16x2(sDS + r * PC + c, v0, v1);
      });
    }
    bwd::cp_async_wait<1>();  // Q, K and S
    __syncthreads();

    {  // dQ = scale diag(exp2(gc)) dO S^T + dS~ Kc. The gate sees the state part here:
       // dgam += rowsum(dQ_state .* Qc); the attention part is taken below without its diagonal.
      AccCK dq;
      dq.zero();
      bwd::mma(dq, MatRef{sO, PV, 1}, transposed(MatRef{sS, PV, 1}), V);
      dq.for_each([&](int r, int, float& x) { x *= r < m ? scale * exp2f(fminf(sg[r], 0.f)) : 0.f; });
      bwd::row_partials(
          dq, [&](int r, int c, float x) { return x * bf2f(sQ[r * PK + c]); }, spart);
      bwd::mma(dq, MatRef{sDS, PC, 1}, MatRef{sK, PK, 1}, C);
      store_group_grad(p.dq_v, dq, t0, j, m);
    }
    __syncthreads();
    if (tid < C) sgam[tid] += bwd::partials_sum<K / 8>(spart, tid);
    __syncthreads();
    {  // Attention part of the gate gradient: q_i.(dS~ K)_i - k_i.(dS~^T Q)_i = rowsum(M) - colsum(M)
       // with M = dS~ .* (Qc Kc^T). The diagonal cancels exactly, so it is left out instead of
       // being computed along two differently rounded paths (with strong decay the true dgam is
       // tiny and that rounding noise would dominate it).
      AccCC qk;
      qk.zero();
      bwd::mma(qk, MatRef{sQ, PK, 1}, transposed(MatRef{sK, PK, 1}), K);
      qk.for_each([&](int r, int c, float& v) { v = r > c ? v * bf2f(sDS[r * PC + c]) : 0.f; });
      bwd::row_partials(
          qk, [](int, int, float v) { return v; }, spart);
      bwd::col_partials(
          qk, [](int, int, float v) { return v; }, spart + C * (C / 8));
    }
    __syncthreads();
    if (tid < C && tid < m)
      sgam[tid] += bwd::partials_sum<C / 8>(spart, tid) - bwd::partials_sum<C / 16>(spart + C * (C / 8), tid);
    __syncthreads();

    bwd::cp_async_wait<0>();  // Z, dV', Tm and V
    __syncthreads();
    {  // <S, Z>: per-warp sums, added in warp order below (fixed order).
      float sz = 0.f;
      for (int i = tid; i < K * V; i += kThreads) {
        const int r = i / V, c = i % V;
        sz += bf2f(sS[r * PV + c]) * bf2f(sZ[r * PV + c]);
      }
      sz = warp_sum(sz);
      if (tid % 32 == 0) sred[tid / 32] = sz;
    }
    // dKst = diag(exp2(gcL - gc)) V' Z^T. Row i loses k_i.dKst_i through exp2(gcL - gc_i) and
    // the last valid row gains the total through gcL, so the last row's own term cancels
    // exactly: it is left out on both sides rather than subtracted after rounding.
    AccCK dk;
    dk.zero();
    bwd::mma(dk, MatRef{sVn, PV, 1}, transposed(MatRef{sZ, PV, 1}), V);
    dk.for_each([&](int r, int, float& x) { x *= r < m ? gate_exp2(gL - sg[r], true) : 0.f; });
    bwd::row_partials(
        dk, [&](int r, int c, float x) { return x * K_at(r, c); }, spart);
    __syncthreads();
    if (tid < C) stmp[tid] = bwd::partials_sum<K / 8>(spart, tid);
    __syncthreads();
    if (tid == 0) {
      float szs = 0.f, kst = 0.f;
      for (int w = 0; w < kWarps; ++w) szs += sred[w];
      for (int r = 0; r < m - 1; ++r) kst += stmp[r];
      sgam[m - 1] += exp2f(fminf(gL, 0.f)) * szs + kst;
    } else if (tid < m) {
      sgam[tid - 1] -= stmp[tid - 1];
    }
    // dK = dKst + dS~^T Qc (its attention part reached the gate above).
    bwd::mma(dk, transposed(MatRef{sDS, PC, 1}), MatRef{sQ, PK, 1}, C);

    {  // dW = -dV' S^T, rounded to bf16 as FLA stores it; written over the dead B4 tiles.
      AccCK w;
      w.zero();
      bwd::mma(w, MatRef{sDV, PV, 1}, transposed(MatRef{sS, PV, 1}), V);
      __syncthreads();
      bwd::for_pairs(w, [&](int r, int c, float& x, float& y) { bwd::store_bf16x2(sDW + r * PK + c, -x, -y); });
    }
    __syncthreads();

    // ---- B5 ---------------------------------------------------------------------------------
    {  // dkbg = Tm^T dW: dK += diag(b Gam) dkbg; R1 = rowsum(dkbg .* Kc) feeds dbeta and dgam.
      AccCK x;
      x.zero();
      bwd::mma(x, transposed(MatRef{sT, PC, 1}), MatRef{sDW, PK, 1}, C);
      bwd::row_partials(
          x, [&](int r, int c, float v) { return v * K_at(r, c); }, spart);
      // Element-wise combine: every Acc of one shape maps elements to threads identically.
#pragma unroll
      for (int q = 0; q < AccCK::kSlots; ++q) {
        const int r0 = AccCK::tile_row(tid / 32, q) * 16 + (tid % 32) / 4;
        const float f0 = r0 < m ? sb[r0] * exp2f(fminf(sg[r0], 0.f)) : 0.f;
        const float f1 = r0 + 8 < m ? sb[r0 + 8] * exp2f(fminf(sg[r0 + 8], 0.f)) : 0.f;
        dk.c[q][0] += f0 * x.c[q][0];
        dk.c[q][1] += f0 * x.c[q][1];
        dk.c[q][2] += f1 * x.c[q][2];
        dk.c[q][3] += f1 * x.c[q][3];
      }
    }
    __syncthreads();
    if (tid < C && tid < m) {
      const float r1 = bwd::partials_sum<K / 8>(spart, tid);
      const float gam = exp2f(fminf(sg[tid], 0.f));
      sdb[tid] += gam * r1;
      sgam[tid] += sb[tid] * gam * r1;
    }
    {  // dvb = Tm^T dV': dv = diag(b) dvb; dbeta += rowsum(dvb .* Vc).
      AccCV x;
      x.zero();
      bwd::mma(x, transposed(MatRef{sT, PC, 1}), MatRef{sDV, PV, 1}, C);
      bf16_t* out = p.dv + (t0 * HV + j) * V;
      bwd::for_pairs(x, [&](int r, int c, float& a, float& b) {
        if (r < m) bwd::store_bf16x2(out + (long long)r * HV * V + c, sb[r] * a, sb[r] * b);
      });
      __syncthreads();  // spart of R1 consumed above
      bwd::row_partials(
          x, [&](int r, int c, float v) { return v * bf2f(sV[r * PV + c]); }, spart);
    }
    {  // dTm = tril1((dW Kc^T) diag(b Gam) + (dV' Vc^T) diag(b)), split into bf16 hi + lo.
      AccCC t1, t2;
      t1.zero();
      t2.zero();
      bwd::mma(t1, MatRef{sDW, PK, 1}, transposed(MatRef{sK, PK, 1}), K);
      bwd::mma(t2, MatRef{sDV, PV, 1}, transposed(MatRef{sV, PV, 1}), V);
#pragma unroll
      for (int q = 0; q < AccCC::kSlots; ++q) {
        const int r0 = AccCC::tile_row(tid / 32, q) * 16 + (tid % 32) / 4;
        const int c0 = AccCC::tile_col(tid / 32, q) * 8 + (tid % 4) * 2;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = r0 + (e >= 2 ? 8 : 0), c = c0 + (e & 1);
          float v = 0.f;
          if (r > c && r < m) v = sb[c] * (exp2f(fminf(sg[c], 0.f)) * t1.c[q][e] + t2.c[q][e]);
          bf16_t hi, lo;
          bwd::split_bf16(v, hi, lo);
          sDTh[r * PC + c] = hi;
          sDTl[r * PC + c] = lo;
        }
      }
    }
    __syncthreads();
    if (tid < C && tid < m) sdb[tid] += bwd::partials_sum<V / 8>(spart, tid);
    {  // Y = dTm Tm^T (hi + lo operands, fp32 accumulate), split again.
      AccCC y;
      y.zero();
      bwd::mma(y, MatRef{sDTh, PC, 1}, transposed(MatRef{sT, PC, 1}), C);
      bwd::mma(y, MatRef{sDTl, PC, 1}, transposed(MatRef{sT, PC, 1}), C);
      bwd::for_pairs(y, [&](int r, int c, float& a, float& b) {
        bf16_t h0, l0, h1, l1;
        bwd::split_bf16(a, h0, l0);
        bwd::split_bf16(b, h1, l1);
        *reinterpret_cast<u32*>(sYh + r * PC + c) = pack_bf16x2(h0, h1);
        *reinterpret_cast<u32*>(sYl + r * PC + c) = pack_bf16x2(l0, l1);
      });
    }
    __syncthreads();
    {  // dL = tril1(-Tm^T Y); E = dL .* Dec; with KK = Kc Kc^T:
       // dbeta += rowsum(E .* KK); dgam += b .* rowsum(E .* KK) - colsum(diag(b) E .* KK).
      AccCC x, kk;
      x.zero();
      kk.zero();
      bwd::mma(x, transposed(MatRef{sT, PC, 1}), MatRef{sYh, PC, 1}, C);
      bwd::mma(x, transposed(MatRef{sT, PC, 1}), MatRef{sYl, PC, 1}, C);
      bwd::mma(kk, MatRef{sK, PK, 1}, transposed(MatRef{sK, PK, 1}), K);
      x.for_each([&](int r, int c, float& v) {
        const bool ok = r > c && r < m;
        v = ok ? -v * gate_exp2(sg[r] - sg[c], true) : 0.f;  // v is now E
      });
      // Store Eb + Eb^T (Eb = diag(b) E is strictly lower): each lower element is written to
      // both mirror slots by its owner, so no slot has two writers.
      x.for_each([&](int r, int c, float& v) {
        if (r < c) return;
        bf16_t hi = 0, lo = 0;
        if (r > c) bwd::split_bf16(sb[r] * v, hi, lo);
        sEh[r * PC + c] = hi;
        sEl[r * PC + c] = lo;
        sEh[c * PC + r] = hi;
        sEl[c * PC + r] = lo;
      });
      // E.*KK elementwise, in place in kk.
#pragma unroll
      for (int q = 0; q < AccCC::kSlots; ++q)
#pragma unroll
        for (int e = 0; e < 4; ++e) kk.c[q][e] *= x.c[q][e];
      bwd::row_partials(
          kk, [&](int, int, float v) { return v; }, spart);
      bwd::col_partials(
          kk, [&](int r, int, float v) { return sb[r] * v; }, spart + C * (C / 8));
    }
    __syncthreads();
    if (tid < C && tid < m) {
      const float r2 = bwd::partials_sum<C / 8>(spart, tid);
      const float cs = bwd::partials_sum<C / 16>(spart + C * (C / 8), tid);
      sdb[tid] += r2;
      sgam[tid] += sb[tid] * r2 - cs;
    }
    // dK += (Eb + Eb^T) Kc with Eb = diag(b) E.
    bwd::mma(dk, MatRef{sEh, PC, 1}, MatRef{sK, PK, 1}, C);
    bwd::mma(dk, MatRef{sEl, PC, 1}, MatRef{sK, PK, 1}, C);
    store_group_grad(p.dk_v, dk, t0, j, m);
    __syncthreads();

    // ---- B6: dg = reverse cumsum of dgam inside the chunk (one warp, fixed order). -------------
    if (tid < 32) {
      // Each lane owns two adjacent rows; a suffix scan over lanes then adds the later rows.
      const int i0 = 2 * tid, i1 = 2 * tid + 1;
      const float a = i0 < m ? sgam[i0] : 0.f, b = i1 < m ? sgam[i1] : 0.f;
      const float pair = a + b;
      float incl = pair;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const float dn = __shfl_down_sync(0xffffffffu, incl, o);
        if (tid + o < 32) incl += dn;
      }
      const float after = incl - pair;  // sum of rows > i1
      if (i0 < m) {
        p.dg[(t0 + i0) * HV + j] = after + b + a;
        p.dbeta[(t0 + i0) * HV + j] = sdb[i0];
      }
      if (i1 < m) {
        p.dg[(t0 + i1) * HV + j] = after + b;
        p.dbeta[(t0 + i1) * HV + j] = sdb[i1];
      }
    }
  }

 private:
  /// dq/dk of one value head as bf16 rows (FLA rounds these to bf16 too), summed over the group
  /// in a fixed order by Finalize. (fp32 atomics into the q/k head's row were measured slower:
  /// docs/PERF.md.)
  template <class AccT>
  __device__ static void store_group_grad(bf16_t* buf, AccT& a, long long t0, int j, int m) {
    bf16_t* out = buf + (t0 * HV + j) * K;
    bwd::for_pairs(a, [&](int r, int c, float& x, float& y) {
      if (r < m) bwd::store_bf16x2(out + (long long)r * HV * K + c, x, y);
    });
  }
};

/// The program's class: the warpgroup-MMA version (chunk_bwd_sm90.cuh) on sm_90a when the spec's
/// tensor_cores is "auto" (Cfg::WGMMA), the mma.sync one otherwise and on every other target.
template <class Cfg, bool kWgmma>
struct ChunkBwdPick {
  using type = ChunkBwdMmaSync<Cfg>;
};
#if GDN_HAS_WGMMA
template <class Cfg>
struct ChunkBwdPick<Cfg, true> {
  using type = ChunkBwdSm90<Cfg>;
};
#endif
template <class Cfg>
using ChunkBwd = typename ChunkBwdPick<Cfg, Cfg::WGMMA>::type;

}  // namespace gdn
