/**
 * @file chunk_bwd_sm90.cuh
 * @brief chunk_bwd (B4 + B5 + B6) with its products on Hopper's warpgroup MMA: the same math,
 *        order of phases, barriers and fixed-order reductions as the mma.sync ChunkBwd of
 *        chunk_bwd.cuh (read that file's comment for the math), with
 *  - every shared tile in the 128-byte-swizzled layout of common/wgmma.cuh (no padding), filled
 *    by cp.async at swizzled positions and read element-wise through `at`;
 *  - every product as wgmma.mma_async, split by columns over the block's 4 warpgroups (each
 *    warpgroup computes all 64 rows of N/4 columns), so an accumulator keeps the element-to-
 *    thread mapping that for_pairs / row_partials / col_partials expect (WgAcc below);
 *  - a proxy fence before each barrier that precedes a product reading freshly written tiles.
 * Independent products are issued back to back and waited for once (wmma_issue / wmma_wait).
 * Measured on the H200: the results have the same bits as the mma.sync ChunkBwd's
 * (a wgmma k16 step rounds like the mma.sync steps it replaces, and every k loop keeps its
 * order); gpu_determinism holds the two to that. Why this kernel looks the way it does:
 * docs/design_chunk_bwd_sm90.md; gpu_wgmma checks every operand form used here.
 */
#pragma once

#include "bwd/dv_local.cuh"
#include "common/wgmma.cuh"

#if GDN_HAS_WGMMA

namespace gdn {
namespace sm90 {

/// Element index of (r, c) in an SW128 tile of `rows` rows (common/sw128.hpp).
__device__ __forceinline__ int swz(int r, int c, int rows) { return static_cast<int>(sw128::offset(r, c, rows) / 2); }

/// A bf16 SW128 tile in shared memory.
struct SwTile {
  bf16_t* p;
  int rows;
  __device__ __forceinline__ bf16_t& at(int r, int c) const { return p[swz(r, c, rows)]; }
  /// The pair (r, c), (r, c + 1) for even c: both sit in one 16-byte chunk.
  __device__ __forceinline__ u32& pair(int r, int c) const { return *reinterpret_cast<u32*>(p + swz(r, c, rows)); }
  __device__ __forceinline__ u32 addr() const { return wg::smem_u32(p); }
};

/// Starts the copy of a ROWS x COLS bf16 tile (global row stride gstride) into an SW128 tile;
/// rows >= valid_rows become zeros. Each thread copies one fixed 16-byte column piece of every
/// kRowStep-th row: kRowStep is a multiple of 8, so the swizzle phase of its pieces never changes
/// and the shared and global addresses advance by constants (no per-piece index arithmetic).
template <int ROWS, int COLS, int THREADS>
__device__ __forceinline__ void load_sw_async(bf16_t* dst, const bf16_t* src, long long gstride, int valid_rows) {
  static_assert(COLS % 64 == 0 && ROWS % 8 == 0, "load_sw_async: SW128 tiles are 64-column blocks of 8-row groups");
  constexpr int kPieces = COLS / 8;
  static_assert(THREADS % kPieces == 0, "load_sw_async: every thread keeps one column piece");
  constexpr int kRowStep = THREADS / kPieces;
  static_assert(kRowStep % 8 == 0 && ROWS % kRowStep == 0, "load_sw_async: rows must advance by whole swizzle periods");
  const int r0 = static_cast<int>(threadIdx.x) / kPieces, col = (static_cast<int>(threadIdx.x) % kPieces) * 8;
  const u32 d0 = wg::smem_u32(dst) + sw128::offset(r0, col, ROWS);
  const bf16_t* s0 = src + r0 * gstride + col;
#pragma unroll
  for (int it = 0; it < ROWS / kRowStep; ++it) {
    const bool ok = r0 + it * kRowStep < valid_rows;
    const u32 d = d0 + static_cast<u32>(it * kRowStep * 128);
    const bf16_t* g = ok ? s0 + it * kRowStep * gstride : src + col;
    bwd::cp_async16(d, g, ok);
  }
}

/// 64 x N fp32 accumulator of a 16-warp block: warpgroup g owns columns [g N/4, (g+1) N/4), warp
/// w of it rows 16w..16w+15 (wgmma's m64 fragment). Same interface as Acc for the bwd helpers:
/// slot s of warp w is the 16 x 8 tile (tile_row, tile_col).
template <int N>
struct WgAcc {
  static constexpr int kWarps = 16;
  static constexpr int kNW = N / 4;  ///< columns per warpgroup
  static_assert(kNW == 16 || kNW == 32, "WgAcc: N must be 64 or 128");
  static constexpr int kSlots = kNW / 8;
  static constexpr int kTilesM = 4, kTilesN = N / 8;
  __device__ __forceinline__ static int tile_row(int w, int) { return w % 4; }
  __device__ __forceinline__ static int tile_col(int w, int s) { return (w / 4) * kSlots + s; }

  float c[kSlots][4];

  __device__ __forceinline__ void zero() { acc_zero(*this); }
  template <class F>
  __device__ __forceinline__ void for_each(F f) {
    acc_for_each(*this, f);
  }
  __device__ __forceinline__ float (&regs())[kSlots * 4] { return *reinterpret_cast<float(*)[kSlots * 4]>(&c[0][0]); }
};

/// Issues acc += A B over `depth` (a multiple of 16), A 64 x depth, B depth x N, on the tensor
/// cores, without waiting: chain several (into one accumulator or several), then wmma_wait.
/// TA = 0: A is K-major, its tile 64 x depth; TA = 1: A is M-major, its tile depth x 64 (A^T
/// stored). TB = 0: B is K-major, its tile N x depth (B^T stored); TB = 1: N-major, depth x N.
/// Every warp of the block calls it. A chain keeps each product's k order, so the bits do not
/// depend on how products are grouped.
template <int TA, int TB, int N>
__device__ __forceinline__ void wmma_issue(WgAcc<N>& acc, const SwTile& a, const SwTile& b, int depth) {
  constexpr int NW = WgAcc<N>::kNW;
  const int col0 = (threadIdx.x / 128) * NW;
  float(&d)[WgAcc<N>::kSlots * 4] = acc.regs();
  wg::fence_acc(d);
  wg::fence();
  for (int ks = 0; ks < depth / 16; ++ks) {
    const wg::u64 da = TA ? wg::desc_mn_major(a.addr(), a.rows, ks) : wg::desc_k_major(a.addr(), a.rows, ks);
    const wg::u64 db =
        TB ? wg::desc_mn_major_cols(b.addr(), b.rows, col0, ks) : wg::desc_k_major_rows(b.addr(), b.rows, col0, ks);
    wg::mma_k16<NW, TA, TB>(d, da, db, 1);
  }
}

/// Waits for every product issued since the last wait; the accumulators are complete on return.
template <class... Accs>
__device__ __forceinline__ void wmma_wait(Accs&... accs) {
  wg::commit();
  wg::wait<0>();
  (wg::fence_acc(accs.regs()), ...);
}

/// acc += A B, complete in registers on return.
template <int TA, int TB, int N>
__device__ __forceinline__ void wmma(WgAcc<N>& acc, const SwTile& a, const SwTile& b, int depth) {
  wmma_issue<TA, TB>(acc, a, b, depth);
  wmma_wait(acc);
}

/// The generic-proxy writes of this thread (cp.async, st.shared) become visible to the
/// tensor cores' reads once every thread has passed the barrier after this fence.
__device__ __forceinline__ void sync_for_wgmma() {
  wg::fence_smem_for_async();
  __syncthreads();
}

}  // namespace sm90

template <class Cfg>
struct ChunkBwdSm90 {
  static constexpr int K = Cfg::K, V = Cfg::V, C = Cfg::CHUNK, H = Cfg::H, HV = Cfg::HV;
  static constexpr int kThreads = ChunkBwdGeometry::kThreads, kWarps = kThreads / 32;
  static_assert(kThreads == 512, "ChunkBwdSm90: 4 warpgroups");
  static_assert(C == 64 && K == 128 && V == 128, "ChunkBwdSm90: chunk 64 and K = V = 128 only");
  static_assert(HV == H * Cfg::G, "ChunkBwdSm90: HV must equal H * G");

  // Tile sizes in elements; every tile is a multiple of 1024 bytes, so each stays 1024-aligned.
  static constexpr int kTok = C * K;                       // [64 tokens x 128]
  static constexpr int kSq = K * V;                        // [128 x 128]
  static constexpr int kCC = C * C;                        // [64 x 64]
  static constexpr int kPersist = 4 * kTok + kCC;          // Q, K, V, dV', Tm
  static constexpr int kPhase = 2 * kSq + 2 * kTok + kCC;  // S, Z, dO, V', dS~
  static_assert(kTok + 6 * kCC <= kPhase, "ChunkBwdSm90: B5 tiles overflow the B4 region");
  static constexpr int kScalarOffsetBytes = 2 * (kPersist + kPhase);
  static constexpr int kSmemBytes = kScalarOffsetBytes + 4 * (5 * C + C * (K / 8) + 64);
  static_assert(kSmemBytes <= ChunkBwdGeometry::smem_bytes(K, V, C),
                "ChunkBwdSm90: the host sizes shared memory for the mma.sync ChunkBwd; this one must fit in it");

  using AccCK = sm90::WgAcc<K>;
  using AccCV = sm90::WgAcc<V>;
  using AccCC = sm90::WgAcc<C>;

  __device__ static void run(const ChunkBwdParams& p) {
    const ChunkInfo ci = p.chunks[blockIdx.x];
    if (ci.len == 0) return;
    const int j = blockIdx.y, h = j / Cfg::G, m = ci.len, tid = threadIdx.x;
    const long long t0 = ci.start, cg = blockIdx.x;
    extern __shared__ __align__(1024) unsigned char smem[];
    // The swizzle is applied by the hardware on address bits, so every tile must start 1024-byte
    // aligned. That rests on the __align__(1024) declaration (dynamic shared memory starts at the
    // window's base when there is no static shared memory); the compiler folds a run-time test of
    // it away, and taking the address through inline asm to keep one costs 44 bytes of spills.
    // gpu_wgmma's probe checks the same declaration on the device.
    bf16_t* base = reinterpret_cast<bf16_t*>(smem);
    const sm90::SwTile sQ{base, C}, sK{base + kTok, C}, sV{base + 2 * kTok, C}, sDV{base + 3 * kTok, C},
        sT{base + 4 * kTok, C};
    bf16_t* ph = base + kPersist;
    const sm90::SwTile sS{ph, K}, sZ{ph + kSq, K}, sO{ph + 2 * kSq, C}, sVn{ph + 2 * kSq + kTok, C},
        sDS{ph + 2 * kSq + 2 * kTok, C};
    // B5 tiles over the dead B4 ones.
    const sm90::SwTile sDW{ph, C}, sDTh{ph + kTok, C}, sDTl{ph + kTok + kCC, C}, sYh{ph + kTok + 2 * kCC, C},
        sYl{ph + kTok + 3 * kCC, C}, sEh{ph + kTok + 4 * kCC, C}, sEl{ph + kTok + 5 * kCC, C};
    float* sg = reinterpret_cast<float*>(smem + kScalarOffsetBytes);
    float* sb = sg + C;
    float* sgam = sb + C;
    float* sdb = sgam + C;
    float* stmp = sdb + C;
    float* spart = stmp + C;
    float* sred = spart + C * (K / 8);

    {
      const long long qs = (long long)H * K, vs = (long long)HV * V;
      const long long st = (cg * HV + j) * K * V;
      sm90::load_sw_async<C, V, kThreads>(sO.p, p.d_o + (t0 * HV + j) * V, vs, m);
      sm90::load_sw_async<C, V, kThreads>(sVn.p, p.v_new + (t0 * HV + j) * V, vs, m);
      bwd::cp_async_commit();
      sm90::load_sw_async<C, K, kThreads>(sQ.p, p.q + (t0 * H + h) * K, qs, m);
      sm90::load_sw_async<C, K, kThreads>(sK.p, p.k + (t0 * H + h) * K, qs, m);
      sm90::load_sw_async<K, V, kThreads>(sS.p, p.h_tape + st, V, K);
      bwd::cp_async_commit();
      sm90::load_sw_async<K, V, kThreads>(sZ.p, p.dh_tape + st, V, K);
      sm90::load_sw_async<C, V, kThreads>(sDV.p, p.dv_new + (t0 * HV + j) * V, vs, m);
      sm90::load_sw_async<C, C, kThreads>(sT.p, p.tm + (t0 * HV + j) * C, (long long)HV * C, m);
      sm90::load_sw_async<C, V, kThreads>(sV.p, p.v + (t0 * HV + j) * V, vs, m);
      bwd::cp_async_commit();
    }
    for (int i = tid; i < C; i += kThreads) {
      sg[i] = i < m ? p.gc[(t0 + i) * HV + j] : 0.f;
      sb[i] = i < m ? p.beta[(t0 + i) * HV + j] : 0.f;
      sgam[i] = 0.f;
      sdb[i] = 0.f;
    }
    bwd::cp_async_wait<2>();  // dO and V'
    sm90::sync_for_wgmma();

    const float scale = p.scale;
    const float gL = sg[m - 1];

    // ---- B4 ---------------------------------------------------------------------------------
    {  // dS~ = scale * tril0((dO V'^T) .* Dec).
      AccCC a;
      a.zero();
      sm90::wmma<0, 0>(a, sO, sVn, V);
      bwd::for_pairs(a, [&](int r, int c, float& x, float& y) {
        const float v0 = (r >= c && r < m) ? scale * x * gate_exp2(sg[r] - sg[c], true) : 0.f;
        const float v1 = (r >= c + 1 && r < m) ? scale * y * gate_exp2(sg[r] - sg[c + 1], true) : 0.f;
        sDS.pair(r, c) = pack_bf16x2(f2bf(v0), f2bf(v1));
      });
    }
    bwd::cp_async_wait<1>();  // Q, K and S
    sm90::sync_for_wgmma();

    {  // dQ = scale diag(exp2(gc)) dO S^T + dS~ Kc; dgam += rowsum(dQ_state .* Qc).
      AccCK dq;
      dq.zero();
      sm90::wmma<0, 0>(dq, sO, sS, V);
      dq.for_each([&](int r, int, float& x) { x *= r < m ? scale * exp2f(fminf(sg[r], 0.f)) : 0.f; });
      bwd::row_partials(
          dq, [&](int r, int c, float x) { return x * bf2f(sQ.at(r, c)); }, spart);
      sm90::wmma<0, 1>(dq, sDS, sK, C);
      store_group_grad(p.dq_v, dq, t0, j, m);
    }
    __syncthreads();
    if (tid < C) sgam[tid] += bwd::partials_sum<K / 8>(spart, tid);
    __syncthreads();
    {  // Attention part of the gate gradient: rowsum(M) - colsum(M), M = dS~ .* (Qc Kc^T), no diagonal.
      AccCC qk;
      qk.zero();
      sm90::wmma<0, 0>(qk, sQ, sK, K);
      qk.for_each([&](int r, int c, float& v) { v = r > c ? v * bf2f(sDS.at(r, c)) : 0.f; });
      bwd::row_partials(
          qk, [](int, int, float v) { return v; }, spart);
      bwd::col_partials(
          qk, [](int, int, float v) { return v; }, spart + C * (C / 8));
    }
    __syncthreads();
    if (tid < C && tid < m)
      sgam[tid] += bwd::partials_sum<C / 8>(spart, tid) - bwd::partials_sum<C / 16>(spart + C * (C / 8), tid);
    bwd::cp_async_wait<0>();  // Z, dV', Tm and V
    sm90::sync_for_wgmma();
    // dKst = diag(exp2(gcL - gc)) V' Z^T; the last row's own term cancels and is left out.
    AccCK dk;
    dk.zero();
    sm90::wmma_issue<0, 0>(dk, sVn, sZ, V);  // runs under the <S, Z> sums
    {  // <S, Z>: per-warp sums, each thread over the same elements as the mma.sync kernel.
      float sz = 0.f;
      // Thread tid's elements (i / V, i % V) for i = tid, tid + kThreads, ...: column tid % V,
      // every (kThreads / V)-th row, in that order. The rows step by 4, so the swizzle phase
      // alternates between two values: two base offsets and constant steps.
      static_assert(kThreads / V == 4 && K % 8 == 0, "ChunkBwdSm90: <S, Z> walks rows in steps of 4");
      const int c = tid % V, r0 = tid / V;
      const int e0 = sm90::swz(r0, c, K), e1 = sm90::swz(r0 + 4, c, K);
#pragma unroll
      for (int r8 = 0; r8 < K; r8 += 8) {
        sz += bf2f(sS.p[e0 + r8 * 64]) * bf2f(sZ.p[e0 + r8 * 64]);
        sz += bf2f(sS.p[e1 + r8 * 64]) * bf2f(sZ.p[e1 + r8 * 64]);
      }
      sz = warp_sum(sz);
      if (tid % 32 == 0) sred[tid / 32] = sz;
    }
    sm90::wmma_wait(dk);
    dk.for_each([&](int r, int, float& x) { x *= r < m ? gate_exp2(gL - sg[r], true) : 0.f; });
    bwd::row_partials(
        dk, [&](int r, int c, float x) { return x * bf2f(sK.at(r, c)); }, spart);
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
    // dK = dKst + dS~^T Qc.
    sm90::wmma<1, 1>(dk, sDS, sQ, C);

    {  // dW = -dV' S^T, rounded to bf16; written over the dead B4 tiles.
      AccCK w;
      w.zero();
      sm90::wmma<0, 0>(w, sDV, sS, V);
      __syncthreads();
      bwd::for_pairs(w, [&](int r, int c, float& x, float& y) { sDW.pair(r, c) = pack_bf16x2(f2bf(-x), f2bf(-y)); });
    }
    sm90::sync_for_wgmma();

    // ---- B5 ---------------------------------------------------------------------------------
    {  // dkbg = Tm^T dW: dK += diag(b Gam) dkbg; R1 = rowsum(dkbg .* Kc).
      AccCK x;
      x.zero();
      sm90::wmma<1, 1>(x, sT, sDW, C);
      bwd::row_partials(
          x, [&](int r, int c, float v) { return v * bf2f(sK.at(r, c)); }, spart);
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
      sm90::wmma<1, 1>(x, sT, sDV, C);
      bf16_t* out = p.dv + (t0 * HV + j) * V;
      bwd::for_pairs(x, [&](int r, int c, float& a, float& b) {
        if (r < m) bwd::store_bf16x2(out + (long long)r * HV * V + c, sb[r] * a, sb[r] * b);
      });
      __syncthreads();  // spart of R1 consumed above
      bwd::row_partials(
          x, [&](int r, int c, float v) { return v * bf2f(sV.at(r, c)); }, spart);
    }
    {  // dTm = tril1((dW Kc^T) diag(b Gam) + (dV' Vc^T) diag(b)), split into bf16 hi + lo.
      AccCC t1, t2;
      t1.zero();
      t2.zero();
      sm90::wmma_issue<0, 0>(t1, sDW, sK, K);
      sm90::wmma_issue<0, 0>(t2, sDV, sV, V);
      sm90::wmma_wait(t1, t2);
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
          sDTh.at(r, c) = hi;
          sDTl.at(r, c) = lo;
        }
      }
    }
    sm90::sync_for_wgmma();
    if (tid < C && tid < m) sdb[tid] += bwd::partials_sum<V / 8>(spart, tid);
    {  // Y = dTm Tm^T (hi + lo operands, fp32 accumulate), split again.
      AccCC y;
      y.zero();
      sm90::wmma_issue<0, 0>(y, sDTh, sT, C);
      sm90::wmma_issue<0, 0>(y, sDTl, sT, C);
      sm90::wmma_wait(y);
      bwd::for_pairs(y, [&](int r, int c, float& a, float& b) {
        bf16_t h0, l0, h1, l1;
        bwd::split_bf16(a, h0, l0);
        bwd::split_bf16(b, h1, l1);
        sYh.pair(r, c) = pack_bf16x2(h0, h1);
        sYl.pair(r, c) = pack_bf16x2(l0, l1);
      });
    }
    sm90::sync_for_wgmma();
    {  // dL = tril1(-Tm^T Y); E = dL .* Dec; dbeta += rowsum(E .* KK); dgam += b .* rowsum - colsum(diag(b) E .* KK).
      AccCC x, kk;
      x.zero();
      kk.zero();
      sm90::wmma_issue<1, 1>(x, sT, sYh, C);
      sm90::wmma_issue<1, 1>(x, sT, sYl, C);
      sm90::wmma_issue<0, 0>(kk, sK, sK, K);
      sm90::wmma_wait(x, kk);
      x.for_each([&](int r, int c, float& v) {
        const bool ok = r > c && r < m;
        v = ok ? -v * gate_exp2(sg[r] - sg[c], true) : 0.f;  // v is now E
      });
      // Eb + Eb^T (Eb = diag(b) E strictly lower): each lower element's owner writes both slots.
      x.for_each([&](int r, int c, float& v) {
        if (r < c) return;
        bf16_t hi = 0, lo = 0;
        if (r > c) bwd::split_bf16(sb[r] * v, hi, lo);
        sEh.at(r, c) = hi;
        sEl.at(r, c) = lo;
        sEh.at(c, r) = hi;
        sEl.at(c, r) = lo;
      });
#pragma unroll
      for (int q = 0; q < AccCC::kSlots; ++q)
#pragma unroll
        for (int e = 0; e < 4; ++e) kk.c[q][e] *= x.c[q][e];
      bwd::row_partials(
          kk, [&](int, int, float v) { return v; }, spart);
      bwd::col_partials(
          kk, [&](int r, int, float v) { return sb[r] * v; }, spart + C * (C / 8));
    }
    sm90::sync_for_wgmma();
    if (tid < C && tid < m) {
      const float r2 = bwd::partials_sum<C / 8>(spart, tid);
      const float cs = bwd::partials_sum<C / 16>(spart + C * (C / 8), tid);
      sdb[tid] += r2;
      sgam[tid] += sb[tid] * r2 - cs;
    }
    // dK += (Eb + Eb^T) Kc.
    sm90::wmma_issue<0, 1>(dk, sEh, sK, C);
    sm90::wmma_issue<0, 1>(dk, sEl, sK, C);
    sm90::wmma_wait(dk);
    store_group_grad(p.dk_v, dk, t0, j, m);
    __syncthreads();

    // ---- B6: dg = reverse cumsum of dgam inside the chunk (one warp, fixed order). -------------
    if (tid < 32) {
      const int i0 = 2 * tid, i1 = 2 * tid + 1;
      const float a = i0 < m ? sgam[i0] : 0.f, b = i1 < m ? sgam[i1] : 0.f;
      const float pair = a + b;
      float incl = pair;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const float dn = __shfl_down_sync(0xffffffffu, incl, o);
        if (tid + o < 32) incl += dn;
      }
      const float after = incl - pair;
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
  template <class AccT>
  __device__ static void store_group_grad(bf16_t* buf, AccT& a, long long t0, int j, int m) {
    bf16_t* out = buf + (t0 * HV + j) * K;
    bwd::for_pairs(a, [&](int r, int c, float& x, float& y) {
      if (r < m) bwd::store_bf16x2(out + (long long)r * HV * K + c, x, y);
    });
  }
};

}  // namespace gdn

#endif  // GDN_HAS_WGMMA
