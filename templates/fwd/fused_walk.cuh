/**
 * @file fused_walk.cuh
 * @brief The fused forward walk: the state walk and the output in one program, one block per
 *        (V slab, value head, document), the K x BV fp32 state in registers across the chunks.
 *
 * Per chunk, from the raw tiles (no W, U or state tape passes through HBM):
 *   Sb = bf16(S)
 *   X  = K Sb                                      (the state's prediction of the values)
 *   Wf = bf16(beta_i (v_i - exp2(gc_i) X_i)),  0 for rows i >= len
 *   V' = Tm Wf                                      (= U - W Sb of the separate programs, exactly in
 *                                                    real arithmetic; one rounding fewer)
 *   Vn = bf16(V'),  Vg = bf16(V' exp2(gcL - gc_i))
 *   O  = scale (exp2(gc_i) (Q Sb)_i + (bf16(tril0(Q K^T .* exp2(gc_i - gc_j))) Vn)_i)
 *   S  = exp2(gcL) S + K^T Vg
 * Tm is chunk_solve's gated inverse (read back, bf16). With the in-kernel L2 norm (FOLD_RSTD) q and
 * k arrive raw and every product is scaled by their rows' rstd in fp32 instead (exp2(gc_i) rk_i for
 * X, exp2(gc_i) rq_i for O, exp2(gcL - gc_i) rk_i for Vg, rq_i rk_j for Q K^T): the normalized rows
 * are never rounded to bf16, and the forward writes no normalized copy (the backward makes its own).
 *
 * A block of 16 warps runs two independent halves, one per 64-column slab of its 128 V columns,
 * each with its own shared memory and named barrier (the grid and threads of the sm_90a body).
 * Warps of a half: 8. Warp w owns state rows 16 w .. +15 (all BV columns) for the state update,
 * and chunk rows 16 (w % 4) .. +15 with column half w / 4 of the slab for X, V' and O; both warps
 * of a row block compute its gated Q K^T (the same bits), as the output program does. Portable
 * mma.sync: every target runs it.
 *
 * Cfg::TAPES adds the backward's tapes, the separate walk's h_tape[c] = bf16(S entering chunk c)
 * and v_new = bf16(V') (this walk's V', so its roundings); without Cfg::OUTPUT (the walk_tape
 * program) Q, P and O are skipped. With the output, only where the call binds h_tape (full saves,
 * a light recompute handing its tapes over).
 */
#pragma once

#include "fwd/chunk_prep.cuh"
#include "fwd/fused_walk_sm90.cuh"

namespace gdn {

template <class Cfg>
struct FusedWalkMmaSync {
  static_assert(Cfg::K == 128, "FusedWalk supports K == 128 only (8 warps x 16 state rows)");
  static_assert(Cfg::V == 128, "FusedWalk supports V == 128 only");
  static_assert(Cfg::CHUNK == 64, "FusedWalk supports CHUNK == 64 only (4 row blocks of 16 chunk rows)");
  static_assert(Cfg::BV == FusedWalkGeometry::kBV, "FusedWalk's blocks hold FusedWalkGeometry::kBV columns");
  static_assert(Cfg::BV == 2 * FusedWalkGeometry::kSlab, "FusedWalk runs two slabs per block");
  static_assert(Cfg::HV == Cfg::H * Cfg::G, "Cfg::G must equal HV / H");
  static_assert(FusedWalkGeometry::kThreads == 2 * FusedWalkGeometry::kHalfThreads &&
                    FusedWalkGeometry::kHalfThreads == 256,
                "FusedWalk assumes two halves of 8 warps");

  static constexpr int K = Cfg::K, V = Cfg::V, C = Cfg::CHUNK, H = Cfg::H, HV = Cfg::HV, G = Cfg::G;
  static constexpr bool kOutput = Cfg::OUTPUT, kTapes = Cfg::TAPES;
  static_assert(kOutput || kTapes, "FusedWalk: a walk writes o, the tapes or both");
  static constexpr int BV = FusedWalkGeometry::kSlab;  ///< the columns of a half
  static constexpr int kThreads = FusedWalkGeometry::kHalfThreads;
  static constexpr int kHalf = BV / 2;  ///< columns of a warp's half of the slab
  static constexpr int NT = BV / 8;     ///< 8-wide n-tiles of the state's columns
  static constexpr int LDK = FusedWalkGeometry::ld_bf(K), LDS = FusedWalkGeometry::ld_bf(BV);
  static constexpr int LDT = FusedWalkGeometry::ld_bf(C);
  // Offsets as constants: constexpr host functions are not callable from device code under NVRTC.
  static constexpr int kHalfBytes = FusedWalkGeometry::portable_half_bytes(K, C);
  static constexpr int kOff_q = FusedWalkGeometry::off_q(K, C, BV);
  static constexpr int kOff_k = FusedWalkGeometry::off_k(K, C, BV);
  static constexpr int kOff_v = FusedWalkGeometry::off_v(K, C, BV);
  static constexpr int kOff_t = FusedWalkGeometry::off_t(K, C, BV);
  static constexpr int kOff_s = FusedWalkGeometry::off_s(K, C, BV);
  static constexpr int kOff_wf = FusedWalkGeometry::off_wf(K, C, BV);
  static constexpr int kOff_vn = FusedWalkGeometry::off_vn(K, C, BV);
  static constexpr int kOff_vg = FusedWalkGeometry::off_vg(K, C, BV);
  static constexpr int kOff_g = FusedWalkGeometry::off_g(K, C, BV);
  static constexpr int kOff_b = FusedWalkGeometry::off_b(K, C, BV);
  static constexpr int kOff_rq = FusedWalkGeometry::off_rq(K, C, BV);
  static constexpr int kOff_rk = FusedWalkGeometry::off_rk(K, C, BV);

  /// The entry with wgmma allowed: the maps are for the sm_90a body only.
  __device__ static void run(const FusedWalkParams& p, const TensorMaps&) { run(p); }
  __device__ static void run(const FusedWalkParams& p) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const int half = threadIdx.x / kThreads;
    unsigned char* const smem = smem_raw + half * kHalfBytes;
    using FC = FusedCarry<Cfg>;
    SegmentWalk<Cfg> range(p.doc_chunk_offset, p.chunks, p.doc_order);
    // Past the document's segments, or a chain this walk of the verified carry skips (every thread
    // votes in its gate test); a verify walk's range shrinks to its window.
    if (!FC::prepare(range, p.doc_chunk_offset, p.chunks, p.gc, p.seg_fail, walk_head<Cfg>())) return;
    const int j = walk_head<Cfg>(), n = range.n, hq = j / G, v0 = blockIdx.x * Cfg::BV + half * BV;
    const int tid = threadIdx.x % kThreads, warp = tid >> 5, lane = tid & 31;
    const auto sync = [half] { asm volatile("bar.sync %0, %1;\n" ::"r"(1 + half), "n"(kThreads) : "memory"); };
    const int gr = lane >> 2, tq = (lane & 3) * 2;
    const int rb = warp & 3, c0 = (warp >> 2) * kHalf;
    const int c_begin = range.begin, c_end = range.end;

    bf16_t* sQ = reinterpret_cast<bf16_t*>(smem + kOff_q);
    bf16_t* sK = reinterpret_cast<bf16_t*>(smem + kOff_k);
    bf16_t* sV = reinterpret_cast<bf16_t*>(smem + kOff_v);
    bf16_t* sT = reinterpret_cast<bf16_t*>(smem + kOff_t);
    bf16_t* sS = reinterpret_cast<bf16_t*>(smem + kOff_s);
    bf16_t* sWf = reinterpret_cast<bf16_t*>(smem + kOff_wf);
    bf16_t* sVn = reinterpret_cast<bf16_t*>(smem + kOff_vn);
    bf16_t* sVg = reinterpret_cast<bf16_t*>(smem + kOff_vg);
    float* sg = reinterpret_cast<float*>(smem + kOff_g);
    float* sb = reinterpret_cast<float*>(smem + kOff_b);
    float* srq = reinterpret_cast<float*>(smem + kOff_rq);
    float* srk = reinterpret_cast<float*>(smem + kOff_rk);

    // State rows 16 warp + gr (+8), columns nt * 8 + tq (+1).
    float S[NT][4];
    const long long state_base = ((long long)n * HV + j) * K * V + v0;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        float2 x = make_float2(0.f, 0.f);
        const int r = warp * 16 + gr + hh * 8;
        // The speculative walk of the verified carry starts a split document's later segments
        // from zero and its first from h0.
        if (FC::from_zero(range)) {
        } else if (Cfg::SEGMENTS > 1 && range.split && !FC::kSpeculate) {
          x = *reinterpret_cast<const float2*>(p.seg_h0 + (range.slot * HV + j) * K * V + v0 + (long long)r * V +
                                               nt * 8 + tq);
        } else if (Cfg::HAS_H0 && p.h0 != nullptr) {
          x = *reinterpret_cast<const float2*>(p.h0 + state_base + (long long)r * V + nt * 8 + tq);
        }
        S[nt][2 * hh] = x.x;
        S[nt][2 * hh + 1] = x.y;
      }
    // The verified carry's files for this segment: its first states (speculate writes them, verify
    // compares), its entry slot and the next segment's.
    float* const ckpt = FC::kSpeculate || FC::kVerify ? p.seg_ckpt + FC::checkpoint_base(range, j) + v0 : nullptr;
    if constexpr (FC::kSpeculate) {
      // A split document's first segment: its entry in its slot (the backward's re-run reads
      // every segment's), and its chain verified so far.
      if (range.split && range.seg == 0) {
        store_state(S, const_cast<float*>(p.seg_h0) + FC::entry_base(range, j, 0) + v0, warp, gr, tq);
        if (threadIdx.x == 0) p.seg_fail[(long long)n * HV + j] = 0;
      }
    }
    bool verified = false;

    if (c_begin < c_end) issue_chunk(p, c_begin, smem, j, hq, v0, tid);
    fwd::cp_async_commit();

    const float scale = p.scale;
    for (int c = c_begin; c < c_end; ++c) {
      // bf16(S) goes out while the chunk's tiles are still arriving.
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int r = warp * 16 + gr, col = nt * 8 + tq;
        *reinterpret_cast<u32*>(sS + r * LDS + col) = f2bf_pair(S[nt][0], S[nt][1]);
        *reinterpret_cast<u32*>(sS + (r + 8) * LDS + col) = f2bf_pair(S[nt][2], S[nt][3]);
      }
      const ChunkInfo ci = p.chunks[c];
      const int len = ci.len;
      const long long t0 = ci.start;
      if (tid < C) {
        const bool ok = tid < len;
        sg[tid] = ok ? p.gc[(t0 + tid) * HV + j] : 0.f;
        sb[tid] = ok ? p.beta[(t0 + tid) * HV + j] : 0.f;
        if (Cfg::FOLD_RSTD) {
          if (kOutput) srq[tid] = ok ? p.rstd_q[(t0 + tid) * H + hq] : 0.f;
          srk[tid] = ok ? p.rstd_k[(t0 + tid) * H + hq] : 0.f;
        }
      }
      fwd::cp_async_wait<0>();
      sync();

      const int r_lo = rb * 16 + gr, r_hi = r_lo + 8;
      const float g_lo = sg[r_lo], g_hi = sg[r_hi];

      // P = Q K^T over the causal blocks 0..rb, gated, masked and rounded to bf16 A fragments.
      u32 Pa[C / 16][4];
      if (kOutput) {
        float P[C / 8][4];
        fwd::causal_scores<K, C, LDK>(P, sQ, sK, rb);
        if (Cfg::FOLD_RSTD) {  // raw Q K^T times rstd_q of the row and rstd_k of the column
          const float rq_lo = srq[r_lo], rq_hi = srq[r_hi];
#pragma unroll
          for (int n = 0; n < C / 8; ++n) {
            const float rk0 = srk[n * 8 + tq], rk1 = srk[n * 8 + tq + 1];
            P[n][0] *= rq_lo * rk0;
            P[n][1] *= rq_lo * rk1;
            P[n][2] *= rq_hi * rk0;
            P[n][3] *= rq_hi * rk1;
          }
        }
        fwd::gate_scores<C>(Pa, P, sg, g_lo, g_hi, rb, len, gr, tq);
      }

      // X = K Sb and O = Q Sb, rows rb, this warp's column half.
      float X[kHalf / 8][4], O[kHalf / 8][4];
#pragma unroll
      for (int q = 0; q < kHalf / 8; ++q)
#pragma unroll
        for (int e = 0; e < 4; ++e) X[q][e] = O[q][e] = 0.f;
#pragma unroll
      for (int k0 = 0; k0 < K; k0 += 16) {
        u32 ak[4], aq[4];
        fwd::load_a(ak, sK, LDK, rb * 16, k0);
        if (kOutput) fwd::load_a(aq, sQ, LDK, rb * 16, k0);
#pragma unroll
        for (int np = 0; np < kHalf / 16; ++np) {
          u32 b[4];
          fwd::load_b_kn(b, sS, LDS, k0, c0 + np * 16);
          fwd::mma_pair(X[2 * np], X[2 * np + 1], ak, b);
          if (kOutput) fwd::mma_pair(O[2 * np], O[2 * np + 1], aq, b);
        }
      }

      // Wf = bf16(beta (v - exp2(gc) X)), zero past the chunk; with FOLD_RSTD the rows' rstd of k
      // scale X and those of q scale O.
      {
        const float e_lo = r_lo < len ? (Cfg::FOLD_RSTD ? exp2f(g_lo) * srk[r_lo] : exp2f(g_lo)) : 0.f;
        const float e_hi = r_hi < len ? (Cfg::FOLD_RSTD ? exp2f(g_hi) * srk[r_hi] : exp2f(g_hi)) : 0.f;
        const float o_lo = Cfg::FOLD_RSTD && kOutput ? (r_lo < len ? exp2f(g_lo) * srq[r_lo] : 0.f) : e_lo;
        const float o_hi = Cfg::FOLD_RSTD && kOutput ? (r_hi < len ? exp2f(g_hi) * srq[r_hi] : 0.f) : e_hi;
        const float b_lo = sb[r_lo], b_hi = sb[r_hi];
#pragma unroll
        for (int q = 0; q < kHalf / 8; ++q) {
          const int col = c0 + q * 8 + tq;
          const u32 vlo = *reinterpret_cast<const u32*>(sV + r_lo * LDS + col);
          const u32 vhi = *reinterpret_cast<const u32*>(sV + r_hi * LDS + col);
          const float w0 = b_lo * (bf2f(static_cast<bf16_t>(vlo & 0xffffu)) - e_lo * X[q][0]);
          const float w1 = b_lo * (bf2f(static_cast<bf16_t>(vlo >> 16)) - e_lo * X[q][1]);
          const float w2 = b_hi * (bf2f(static_cast<bf16_t>(vhi & 0xffffu)) - e_hi * X[q][2]);
          const float w3 = b_hi * (bf2f(static_cast<bf16_t>(vhi >> 16)) - e_hi * X[q][3]);
          *reinterpret_cast<u32*>(sWf + r_lo * LDS + col) = r_lo < len ? f2bf_pair(w0, w1) : 0u;
          *reinterpret_cast<u32*>(sWf + r_hi * LDS + col) = r_hi < len ? f2bf_pair(w2, w3) : 0u;
          O[q][0] *= o_lo;
          O[q][1] *= o_lo;
          O[q][2] *= o_hi;
          O[q][3] *= o_hi;
        }
      }
      sync();  // Wf complete: V' mixes every row of it

      // V' = Tm Wf (Tm is lower triangular: k-blocks 0..rb), then Vn and Vg.
      {
        float Vp[kHalf / 8][4];
        fwd::lower_tri_product<C, kHalf, LDT, LDS>(Vp, sT, sWf, rb, c0);
        const float gl = sg[len - 1];
        float d_lo = gate_exp2(gl - g_lo, r_lo < len), d_hi = gate_exp2(gl - g_hi, r_hi < len);
        if (Cfg::FOLD_RSTD) d_lo *= srk[r_lo], d_hi *= srk[r_hi];
#pragma unroll
        for (int q = 0; q < kHalf / 8; ++q) {
          const int col = c0 + q * 8 + tq;
          *reinterpret_cast<u32*>(sVn + r_lo * LDS + col) = f2bf_pair(Vp[q][0], Vp[q][1]);
          *reinterpret_cast<u32*>(sVn + r_hi * LDS + col) = f2bf_pair(Vp[q][2], Vp[q][3]);
          *reinterpret_cast<u32*>(sVg + r_lo * LDS + col) = f2bf_pair(Vp[q][0] * d_lo, Vp[q][1] * d_lo);
          *reinterpret_cast<u32*>(sVg + r_hi * LDS + col) = f2bf_pair(Vp[q][2] * d_hi, Vp[q][3] * d_hi);
        }
      }
      sync();  // Vn and Vg complete

      // O += P Vn (causal k-blocks), scaled, rounded, staged in this warp's part of Q, stored.
#pragma unroll
      for (int kk = 0; kk < C / 16; ++kk) {
        if (!kOutput) break;
        if (kk > rb) break;
#pragma unroll
        for (int np = 0; np < kHalf / 16; ++np) {
          u32 b[4];
          fwd::load_b_kn(b, sVn, LDS, kk * 16, c0 + np * 16);
          fwd::mma_pair(O[2 * np], O[2 * np + 1], Pa[kk], b);
        }
      }
#pragma unroll
      for (int q = 0; q < kHalf / 8; ++q) {
        if (!kOutput) break;
        const int col = c0 + q * 8 + tq;
        *reinterpret_cast<u32*>(sQ + r_lo * LDK + col) = f2bf_pair(O[q][0] * scale, O[q][1] * scale);
        *reinterpret_cast<u32*>(sQ + r_hi * LDK + col) = f2bf_pair(O[q][2] * scale, O[q][3] * scale);
      }
      __syncwarp();
      if (kOutput) {
        const int rows = min(16, len - rb * 16);
        if (rows > 0)
          fwd::tile_to_global<32>(p.o + ((t0 + rb * 16) * HV + j) * V + v0 + c0, (long long)HV * V,
                                  sQ + rb * 16 * LDK + c0, LDK, kHalf, rows, lane, 32);
      }

      // S = exp2(gcL) S + K^T Vg; k-steps past the chunk length only add zeros, so skip them.
      {
        const float decay = exp2f(sg[len - 1]);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) S[nt][e] *= decay;
#pragma unroll
        for (int k0 = 0; k0 < C; k0 += 16) {
          if (k0 >= len) break;
          u32 a[4];
          fwd::load_a_t(a, sK, LDK, warp * 16, k0);
#pragma unroll
          for (int np = 0; np < NT / 2; ++np) {
            u32 b[4];
            fwd::load_b_kn(b, sVg, LDS, k0, np * 16);
            fwd::mma_pair(S[2 * np], S[2 * np + 1], a, b);
          }
        }
      }
      if (kTapes && (!kOutput || p.h_tape)) {  // bf16(S) entering the chunk and Vn stay until the barrier below
        fwd::tile_to_global<kThreads>(p.h_tape + ((long long)c * HV + j) * K * V + v0, V, sS, LDS, BV, K, tid,
                                      kThreads);
        fwd::tile_to_global<kThreads>(p.v_new + (t0 * HV + j) * V + v0, (long long)HV * V, sVn, LDS, BV, len, tid,
                                      kThreads);
      }
      sync();  // every tile of this chunk is free (the O rows left through global stores)
      if (c + 1 < c_end) issue_chunk(p, c + 1, smem, j, hq, v0, tid);
      fwd::cp_async_commit();
      if constexpr (FC::kSpeculate) {
        if (FC::from_zero(range) && c - c_begin < kCarryCheckpoints)
          store_state(S, ckpt + (long long)(c - c_begin) * K * V, warp, gr, tq);
      }
      if constexpr (FC::kVerify) {
        // Bit for bit over both halves (a -0 against +0 counts as a difference, which costs a
        // chunk at most); the chunks after a match keep the speculative walk's bits.
        if (__syncthreads_and(state_equals(S, ckpt + (long long)(c - c_begin) * K * V, warp, gr, tq))) {
          verified = true;
          break;
        }
      }
    }
    fwd::cp_async_wait<0>();
    if constexpr (FC::kVerify) {
      // No checkpoint met within the window (an empty segment never verifies): the chain goes to
      // the merge, which walks it again with every output.
      if (!verified && threadIdx.x == 0) atomicExch(p.seg_fail + (long long)n * HV + j, 1);
      return;
    }
    if constexpr (FC::kSpeculate) {
      if (range.split && !range.last) {  // the next segment's entry, which its verify walk checks
        store_state(S, const_cast<float*>(p.seg_h0) + FC::entry_base(range, j, 1) + v0, warp, gr, tq);
        return;
      }
    }

    if (Cfg::HAS_HT && p.ht != nullptr && range.last) {  // a document's final state is its last segment's
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int r = warp * 16 + gr + hh * 8;
          *reinterpret_cast<float2*>(p.ht + state_base + (long long)r * V + nt * 8 + tq) =
              make_float2(S[nt][2 * hh], S[nt][2 * hh + 1]);
        }
    }
  }

 private:
  /// The half's fp32 state slab (rows 16 warp + gr (+8), columns nt * 8 + tq (+1)) to dst, row
  /// stride V.
  __device__ __forceinline__ static void store_state(const float (&S)[NT][4], float* dst, int warp, int gr, int tq) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int r = warp * 16 + gr + hh * 8;
        *reinterpret_cast<float2*>(dst + (long long)r * V + nt * 8 + tq) =
            make_float2(S[nt][2 * hh], S[nt][2 * hh + 1]);
      }
  }
  /// Whether the half's state slab equals the one at src (row stride V) bit for bit.
  __device__ __forceinline__ static bool state_equals(const float (&S)[NT][4], const float* src, int warp, int gr,
                                                      int tq) {
    bool same = true;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int r = warp * 16 + gr + hh * 8;
        const float2 x = *reinterpret_cast<const float2*>(src + (long long)r * V + nt * 8 + tq);
        same = same && __float_as_uint(x.x) == __float_as_uint(S[nt][2 * hh]) &&
               __float_as_uint(x.y) == __float_as_uint(S[nt][2 * hh + 1]);
      }
    return same;
  }

  /// Starts the asynchronous loads of chunk c's Q, K, V slab and Tm (rows past len zero-filled).
  /// Tm needs no masking here: chunk_prep stores its rows < len zero above the diagonal (so also
  /// in the columns >= len), and its rows >= len arrive as zeros.
  __device__ static void issue_chunk(const FusedWalkParams& p, int c, unsigned char* smem, int j, int hq, int v0,
                                     int tid) {
    const ChunkInfo ci = p.chunks[c];
    const long long t0 = ci.start;  // token offsets times heads times K outgrow int
    if (kOutput)
      fwd::tile_to_smem_async<kThreads>(reinterpret_cast<bf16_t*>(smem + kOff_q), LDK, p.q + (t0 * H + hq) * K,
                                        (long long)H * K, C, K, ci.len, tid);
    fwd::tile_to_smem_async<kThreads>(reinterpret_cast<bf16_t*>(smem + kOff_k), LDK, p.k + (t0 * H + hq) * K,
                                      (long long)H * K, C, K, ci.len, tid);
    fwd::tile_to_smem_async<kThreads>(reinterpret_cast<bf16_t*>(smem + kOff_v), LDS, p.v + (t0 * HV + j) * V + v0,
                                      (long long)HV * V, C, BV, ci.len, tid);
    fwd::tile_to_smem_async<kThreads>(reinterpret_cast<bf16_t*>(smem + kOff_t), LDT, p.tm + (t0 * HV + j) * C,
                                      (long long)HV * C, C, C, ci.len, tid);
  }
};

/// The program's class: the warp-specialized body (fused_walk_sm90.cuh) on sm_90a when the spec's
/// tensor_cores is "auto" (Cfg::WGMMA), the mma.sync one otherwise and on every other target.
template <class Cfg, bool kWgmma>
struct FusedWalkPick {
  using type = FusedWalkMmaSync<Cfg>;
};
#if GDN_HAS_WGMMA
template <class Cfg>
struct FusedWalkPick<Cfg, true> {
  using type = FusedWalkSm90<Cfg>;
};
#endif
template <class Cfg>
using FusedWalk = typename FusedWalkPick<Cfg, Cfg::WGMMA>::type;
/// The verified carry's walks on the fused path (FusedCarry, common/segments.cuh): every segment
/// from its speculative entry, then each later segment's checkpoint window from its predecessor's end.
template <class Cfg>
using FusedWalkSpeculate = FusedWalk<WithCarryWalk<Cfg, CarryWalk::speculate>>;
template <class Cfg>
using FusedWalkVerify = FusedWalk<WithCarryWalk<Cfg, CarryWalk::verify>>;

}  // namespace gdn
