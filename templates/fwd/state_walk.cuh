/**
 * @file state_walk.cuh
 * @brief Forward stage F4: the inter-chunk state walk, one block per (V slab, value head, document).
 *
 * The walk is the serial critical path of the forward, so the K x BV fp32 state never leaves
 * registers (warp w owns state rows 32w..32w+31), both products run on the tensor cores, and the
 * next chunk's W, U and gc (after V') and K (after the state update) are fetched with cp.async
 * while the current chunk is still being processed.
 * Per chunk:  h_tape[c] = bf16(S);  V' = U - W bf16(S);  v_new = bf16(V');
 *             Vg = bf16(V' .* exp2(gcL - gc_i));  S = exp2(gcL) S + K^T Vg.
 *
 * Intra-card segments (Cfg::SEGMENTS > 1, docs/algorithm.md 4.2 and 4.6): a document's chunks are cut
 * into SEGMENTS contiguous runs so that its chain of steps is SEGMENTS times shorter.
 * StateWalkPrescan walks every segment but the last from S = 0 (giving S_ext, V columns) and, with
 * U = 0, from S = I (giving the segment's transition M, K columns): S_end = M S_start + S_ext.
 * Both carry S and Vg as bf16 hi + lo pairs into their products, so (S_ext, M) hold the segment's
 * map to about fp32 accuracy and the merged entry states add no rounding of their own (with the
 * walk's bf16 roundings, M's error added to the walk's: dg on a 32768-token g = 0 document came
 * out 15 % worse with 4 segments). WalkMerge (walk_merge.cuh) chains the segments in fp32;
 * then StateWalk runs every segment from its merged entry state and writes the tapes.
 *
 * The verified carry (Cfg::VERIFIED_CARRY, docs/algorithm.md 4.7) runs the same chunk step in two
 * more modes first. StateWalkSpeculate walks a document's first segment from h0 and every other
 * from S = 0, writing the tapes of every chunk, the fp32 state after each of a segment's first
 * kCarryCheckpoints chunks (seg_ckpt) and each segment's end state as the next one's entry
 * (seg_h0; ht after the last). StateWalkVerify re-walks each later segment from that entry and
 * compares its state with the checkpoint after every chunk: once they are equal bit for bit, the
 * walk from zero from there on is the walk from the entry (the same steps on the same inputs), so
 * its tapes stand and the re-walk stops; a chain with a segment that never matches is marked in
 * seg_fail, and only for those do the prescan, the merge and the full walk run. A verified
 * document's forward has the bits of one unsegmented walk. Chains whose gates decay too slowly to
 * verify (chain_decays, common/segments.cuh) are marked before either walk and skip both.
 */
#pragma once

#include "common/segments.cuh"
#include "fwd/chunk_prep.cuh"

namespace gdn {

template <class Cfg>
struct StateWalk {
  static_assert(Cfg::K == 128, "StateWalk supports K == 128 only (4 warps x 32 state rows)");
  static_assert(Cfg::V == 128, "StateWalk supports V == 128 only");
  static_assert(Cfg::CHUNK == 64, "StateWalk supports CHUNK == 64 only (4 warps x 16 chunk rows)");
  static_assert(Cfg::BV == 32 || Cfg::BV == 64, "StateWalk supports V slabs of width 32 or 64");
  static_assert(Cfg::V % Cfg::BV == 0, "the V slabs must tile V exactly");
  // The host sizes shared memory with StateWalkGeometry::smem_bytes_bv(K, CHUNK, BV), the same
  // offsets as below (spec field walk_slab picks BV; "auto" is StateWalkGeometry::auto_bv(V, HV)).
  static_assert(Cfg::HV == Cfg::H * Cfg::G, "Cfg::G must equal HV / H");
  static_assert(StateWalkGeometry::kThreads == 128, "StateWalk assumes 4 warps");

  static constexpr int K = Cfg::K, V = Cfg::V, C = Cfg::CHUNK, H = Cfg::H, HV = Cfg::HV, G = Cfg::G, BV = Cfg::BV;
  static constexpr int kThreads = StateWalkGeometry::kThreads;
  static constexpr int NT = BV / 8;  ///< 8-wide n-tiles of a slab
  static constexpr int LDK = StateWalkGeometry::ld_bf(K), LDS = StateWalkGeometry::ld_bf(BV);
  // Offsets as constants: constexpr host functions are not callable from device code under NVRTC.
  static constexpr int kOff_s = StateWalkGeometry::off_s(K, C, BV);
  static constexpr int kOff_vg = StateWalkGeometry::off_vg(K, C, BV);
  static constexpr int kOff_vn = StateWalkGeometry::off_vn(K, C, BV);
  static constexpr int kOff_w = StateWalkGeometry::stage_w(K, C);
  static constexpr int kOff_k = StateWalkGeometry::stage_k(K, C);
  static constexpr int kOff_u = StateWalkGeometry::stage_u(K, C);
  static constexpr int kOff_g = StateWalkGeometry::stage_g(K, C, BV);

  static constexpr int SEG = Cfg::SEGMENTS;
  static_assert(SEG >= 1, "Cfg::SEGMENTS must be at least 1");

  enum class Mode { walk, prescan, speculate, verify };

  __device__ static void run(const StateWalkParams& p) { walk<Mode::walk>(p); }

  /// Mode::prescan: blockIdx.x < V / BV walks slab x from 0 (S_ext); the K / BV blocks after it
  /// walk columns of M from the identity with U = 0. No tapes; the final state goes to seg_hm.
  /// Mode::speculate and Mode::verify: the verified carry's two walks (the file's comment).
  template <Mode kMode>
  __device__ static void walk(const StateWalkParams& p) {
    constexpr bool kPrescan = kMode == Mode::prescan, kSpeculate = kMode == Mode::speculate,
                   kVerify = kMode == Mode::verify;
    constexpr bool kVerified = VerifiedCarry<Cfg>::value;
    static_assert(kVerified || !(kSpeculate || kVerify), "walk_speculate and walk_verify need Cfg::VERIFIED_CARRY");
    extern __shared__ __align__(16) unsigned char smem[];
    const int j = walk_head<Cfg>(), hq = j / G;
    const GridSegment at = grid_segment<SEG, Cfg::HV>(p.doc_order);
    const int n = at.n, seg = at.seg;
    // Prescan blocks past the V slabs compute M's columns m0 .. m0 + BV - 1.
    const bool transition = kPrescan && blockIdx.x >= V / BV;
    const int slab = transition ? blockIdx.x - V / BV : blockIdx.x, v0 = slab * BV;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int gr = lane >> 2, tq = (lane & 3) * 2;
    const DocSegments<Cfg> ds(p.doc_chunk_offset, p.chunks, n);
    if (!ds.local(seg)) return;  // past this document's segments ("auto"), or a remote piece
    const int c_begin = ds.begin(seg), c_end = ds.begin(seg + 1);
    const long long slot = ds.slot0 + seg;
    // The forward merge never needs the last segment's transition; the backward's merge takes it
    // from the saved maps (A = M^T) when they are saved. An unsplit document has no slot.
    if (kPrescan && (!ds.split() || (seg == ds.count - 1 && !(transition && SavedMaps<Cfg>::value)))) return;
    // The verified carry: seg_fail marks the chains that did not verify (written by the forward's
    // verify pass; null in the backward's re-run, which walks every segment). Only they need the
    // prescan (S_ext and M, with the last segment's M saved for the backward like the merge
    // carry's), the merge and the full walk.
    int* const fail = kVerified && p.seg_fail != nullptr ? p.seg_fail + (long long)n * HV + j : nullptr;
    if constexpr ((kMode == Mode::walk || kPrescan) && kVerified) {
      if (fail != nullptr && (!ds.split() || *fail == 0)) return;
    }
    if constexpr (kVerify) {
      if (!ds.split() || seg == 0) return;  // segment 0 walked from its true entry in speculate
    }
    if constexpr (kSpeculate || kVerify) {
      // A chain whose gates decay too slowly to verify is marked at once: the merge walks it.
      if (ds.split() && !chain_decays<Cfg, false>(ds, p.chunks, p.gc, j)) {
        if (kSpeculate && seg == 0 && blockIdx.x == 0 && tid == 0) *fail = 1;
        return;
      }
    }
    // speculate: segment 0 (and an unsplit document) from h0, the others from 0.
    const bool from_zero = kSpeculate && ds.split() && seg > 0;
    float* const seg_h0_out = const_cast<float*>(p.seg_h0);

    bf16_t* sS = reinterpret_cast<bf16_t*>(smem + kOff_s);
    bf16_t* sVg = reinterpret_cast<bf16_t*>(smem + kOff_vg);
    bf16_t* sVn = reinterpret_cast<bf16_t*>(smem + kOff_vn);
    // The prescan carries S and Vg as bf16 hi + lo pairs (its lo parts: sSl, and sVn, which it
    // does not otherwise use), so (S_ext, M) hold the segment's affine map to about fp32 accuracy.
    bf16_t* sSl = reinterpret_cast<bf16_t*>(smem + StateWalkGeometry::smem_bytes_bv(K, C, BV));

    // State rows r = 32 warp + 16 mi + gr (+8), columns nt * 8 + tq (+1).
    float S[2][NT][4];
    const long long state_base = ((long long)n * HV + j) * K * V + v0;
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          float2 x = make_float2(0.f, 0.f);
          const int r = warp * 32 + mi * 16 + gr + hh * 8;
          if (kPrescan) {
            if (transition) x = make_float2(r == v0 + nt * 8 + tq ? 1.f : 0.f, r == v0 + nt * 8 + tq + 1 ? 1.f : 0.f);
          } else if (from_zero) {
          } else if (SEG > 1 && ds.split() && !kSpeculate) {
            x = *reinterpret_cast<const float2*>(p.seg_h0 + (slot * HV + j) * K * V + v0 + (long long)r * V + nt * 8 +
                                                 tq);
          } else if (Cfg::HAS_H0 && p.h0 != nullptr) {
            x = *reinterpret_cast<const float2*>(p.h0 + state_base + (long long)r * V + nt * 8 + tq);
          }
          S[mi][nt][2 * hh] = x.x;
          S[mi][nt][2 * hh + 1] = x.y;
        }

    if constexpr (kSpeculate) {
      // A split document's entry states are complete in seg_h0 (the backward's re-run reads them):
      // segment 0's is h0 (or 0); each segment's end is written below as the next one's. Its chain
      // starts out verified.
      if (ds.split() && seg == 0) {
        store_state<V>(S, seg_h0_out + (slot * HV + j) * K * V + v0, warp, gr, tq);
        if (blockIdx.x == 0 && tid == 0) *fail = 0;
      }
    }
    // The checkpoints of this segment: the state after each of its first chunks.
    float* const ckpt =
        (kSpeculate || kVerify) ? p.seg_ckpt + (slot * HV + j) * kCarryCheckpoints * K * V + v0 : nullptr;
    // verify re-walks at most the checkpointed chunks.
    const int c_stop = kVerify ? min(c_end, c_begin + kCarryCheckpoints) : c_end;
    bool verified = false;

    // The stage is refilled in two cp.async groups, each issued once this chunk has read what it
    // replaces: W, U and gc after V' (mid-chunk), K after the state update (end of chunk). Every
    // iteration commits both (empty on the last chunk), so the wait counts stay fixed.
    if (c_begin < c_stop) issue_wug(p, c_begin, smem, j, v0, !transition);
    fwd::cp_async_commit();
    if (c_begin < c_stop) issue_k(p, c_begin, smem, hq);
    fwd::cp_async_commit();

    unsigned char* stage = smem;
    for (int c = c_begin; c < c_stop; ++c) {
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const int r = warp * 32 + mi * 16 + gr, col = nt * 8 + tq;
          if (kPrescan) {
            bf16_t h[4], l[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) split_bf16(S[mi][nt][e], h[e], l[e]);
            *reinterpret_cast<u32*>(sS + r * LDS + col) = pack_bf16x2(h[0], h[1]);
            *reinterpret_cast<u32*>(sS + (r + 8) * LDS + col) = pack_bf16x2(h[2], h[3]);
            *reinterpret_cast<u32*>(sSl + r * LDS + col) = pack_bf16x2(l[0], l[1]);
            *reinterpret_cast<u32*>(sSl + (r + 8) * LDS + col) = pack_bf16x2(l[2], l[3]);
          } else {
            *reinterpret_cast<u32*>(sS + r * LDS + col) = f2bf_pair(S[mi][nt][0], S[mi][nt][1]);
            *reinterpret_cast<u32*>(sS + (r + 8) * LDS + col) = f2bf_pair(S[mi][nt][2], S[mi][nt][3]);
          }
        }
      fwd::cp_async_wait<1>();  // W, U and gc of this chunk
      __syncthreads();

      const ChunkInfo ci = p.chunks[c];
      const int len = ci.len;
      const long long t0 = ci.start;
      const bf16_t* sW = reinterpret_cast<const bf16_t*>(stage + kOff_w);
      const bf16_t* sKc = reinterpret_cast<const bf16_t*>(stage + kOff_k);
      const bf16_t* sU = reinterpret_cast<const bf16_t*>(stage + kOff_u);
      const float* sg = reinterpret_cast<const float*>(stage + kOff_g);

      if (!kPrescan) fwd::tile_to_global<kThreads>(p.h_tape + ((long long)c * HV + j) * K * V + v0, V, sS, LDS, BV, K);

      // V' rows 16 warp + gr (+8): W bf16(S) on the tensor cores, then U - it (FLA's order).
      float acc[NT][4];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
#pragma unroll
      for (int k0 = 0; k0 < K; k0 += 16) {
        u32 a[4];
        fwd::load_a(a, sW, LDK, warp * 16, k0);
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
          u32 b[4];
          fwd::load_b_kn(b, sS, LDS, k0, np * 16);
          fwd::mma_pair(acc[2 * np], acc[2 * np + 1], a, b);
          if (kPrescan) {
            fwd::load_b_kn(b, sSl, LDS, k0, np * 16);
            fwd::mma_pair(acc[2 * np], acc[2 * np + 1], a, b);
          }
        }
      }
      const float gl = sg[len - 1];
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int r = warp * 16 + gr + hh * 8;
        const float gate = gate_exp2(gl - sg[r], r < len);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const int col = nt * 8 + tq;
          const u32 uu = transition ? 0u : *reinterpret_cast<const u32*>(sU + r * LDS + col);
          const float x0 = bf2f(static_cast<bf16_t>(uu & 0xffffu)) - acc[nt][2 * hh];
          const float x1 = bf2f(static_cast<bf16_t>(uu >> 16)) - acc[nt][2 * hh + 1];
          if (kPrescan) {  // Vg as hi (sVg) + lo (sVn)
            bf16_t h0, l0, h1, l1;
            split_bf16(x0 * gate, h0, l0);
            split_bf16(x1 * gate, h1, l1);
            *reinterpret_cast<u32*>(sVg + r * LDS + col) = pack_bf16x2(h0, h1);
            *reinterpret_cast<u32*>(sVn + r * LDS + col) = pack_bf16x2(l0, l1);
          } else {
            *reinterpret_cast<u32*>(sVn + r * LDS + col) = f2bf_pair(x0, x1);
            *reinterpret_cast<u32*>(sVg + r * LDS + col) = f2bf_pair(x0 * gate, x1 * gate);
          }
        }
      }
      fwd::cp_async_wait<0>();  // K of this chunk
      __syncthreads();          // sVn, sVg and K visible; W, U and gc are free
      if (c + 1 < c_stop) issue_wug(p, c + 1, stage, j, v0, !transition);
      fwd::cp_async_commit();

      if (!kPrescan)
        fwd::tile_to_global<kThreads>(p.v_new + (t0 * HV + j) * V + v0, (long long)HV * V, sVn, LDS, BV, len);

      // S = exp2(gcL) S + K^T Vg; k-steps past the chunk length only add zeros, so skip them.
      const float decay = exp2f(gl);
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) S[mi][nt][e] *= decay;
#pragma unroll
      for (int k0 = 0; k0 < C; k0 += 16) {
        if (k0 >= len) break;
          // The prescan adds the lo part of Vg (held in sVn) in a second pass.
#pragma unroll
        for (int pass = 0; pass < (kPrescan ? 2 : 1); ++pass) {
          u32 bq[NT / 2][4];
#pragma unroll
          for (int np = 0; np < NT / 2; ++np) fwd::load_b_kn(bq[np], pass ? sVn : sVg, LDS, k0, np * 16);
#pragma unroll
          for (int mi = 0; mi < 2; ++mi) {
            u32 a[4];
            fwd::load_a_t(a, sKc, LDK, warp * 32 + mi * 16, k0);
#pragma unroll
            for (int np = 0; np < NT / 2; ++np) fwd::mma_pair(S[mi][2 * np], S[mi][2 * np + 1], a, bq[np]);
          }
        }
      }
      __syncthreads();  // K, sS, sVg and sVn are free
      if (c + 1 < c_stop) issue_k(p, c + 1, stage, hq);
      fwd::cp_async_commit();
      if constexpr (kSpeculate) {
        if (from_zero && c - c_begin < kCarryCheckpoints)
          store_state<V>(S, ckpt + (long long)(c - c_begin) * K * V, warp, gr, tq);
      }
      if constexpr (kVerify) {
        // Bit for bit (a -0 against +0 counts as a difference, which only costs another chunk).
        if (__syncthreads_and(state_equals(S, ckpt + (long long)(c - c_begin) * K * V, warp, gr, tq))) {
          verified = true;
          break;
        }
      }
    }
    // An empty segment walks no chunk and never verifies (its end would be its zero start), so
    // its chain is always marked.
    fwd::cp_async_wait<0>();
    if constexpr (kVerify) {
      // Not equal within the checkpoints: this document's chain runs the merge and the full walk.
      if (!verified && tid == 0) atomicExch(fail, 1);
      return;
    }
    if constexpr (kSpeculate) {
      if (ds.split() && seg < ds.count - 1) {  // the next segment's entry (verified by its re-walk)
        store_state<V>(S, seg_h0_out + ((slot + 1) * HV + j) * K * V + v0, warp, gr, tq);
        return;
      }
    }

    if (kPrescan) {
      // seg_hm row r: S_ext in columns 0 .. V-1, M in V .. V+K-1.
      store_state<V + K>(S, p.seg_hm + (slot * HV + j) * K * (V + K) + (transition ? V : 0) + v0, warp, gr, tq);
      return;
    }
    // A document's final state is its last segment's.
    if (Cfg::HAS_HT && p.ht != nullptr && seg == ds.count - 1) store_state<V>(S, p.ht + state_base, warp, gr, tq);
  }

 private:
  /// The fp32 state slab (rows 32 warp + 16 mi + gr (+8), columns nt * 8 + tq (+1)) to dst, row
  /// stride LD floats.
  template <int LD>
  __device__ __forceinline__ static void store_state(const float (&S)[2][NT][4], float* dst, int warp, int gr, int tq) {
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int r = warp * 32 + mi * 16 + gr + hh * 8;
          *reinterpret_cast<float2*>(dst + (long long)r * LD + nt * 8 + tq) =
              make_float2(S[mi][nt][2 * hh], S[mi][nt][2 * hh + 1]);
        }
  }

  /// Whether the fp32 state slab equals the one at src (row stride V) bit for bit. Its loops are
  /// store_state's: sharing them through a visitor changed the default prescan's machine code.
  __device__ __forceinline__ static bool state_equals(const float (&S)[2][NT][4], const float* src, int warp, int gr,
                                                      int tq) {
    bool same = true;
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int r = warp * 32 + mi * 16 + gr + hh * 8;
          const float2 x = *reinterpret_cast<const float2*>(src + (long long)r * V + nt * 8 + tq);
          same = same && __float_as_uint(x.x) == __float_as_uint(S[mi][nt][2 * hh]) &&
                 __float_as_uint(x.y) == __float_as_uint(S[mi][nt][2 * hh + 1]);
        }
    return same;
  }

  /// Starts the asynchronous loads of chunk c's W, U slab and gc into the stage (rows past len
  /// zero-filled).
  __device__ static void issue_wug(const StateWalkParams& p, int c, unsigned char* stage, int j, int v0, bool with_u) {
    const ChunkInfo ci = p.chunks[c];
    const long long t0 = ci.start;
    bf16_t* sW = reinterpret_cast<bf16_t*>(stage + kOff_w);
    bf16_t* sU = reinterpret_cast<bf16_t*>(stage + kOff_u);
    float* sg = reinterpret_cast<float*>(stage + kOff_g);
    fwd::tile_to_smem_async<kThreads>(sW, LDK, p.w + (t0 * HV + j) * K, (long long)HV * K, C, K, ci.len);
    if (with_u)
      fwd::tile_to_smem_async<kThreads>(sU, LDS, p.u + (t0 * HV + j) * V + v0, (long long)HV * V, C, BV, ci.len);
    if (threadIdx.x < C) {
      const bool ok = threadIdx.x < ci.len;
      fwd::cp_async4(sg + threadIdx.x, ok ? p.gc + (t0 + threadIdx.x) * HV + j : p.gc, ok);
    }
  }
  /// Starts the asynchronous load of chunk c's K tile into the stage (rows past len zero-filled).
  __device__ static void issue_k(const StateWalkParams& p, int c, unsigned char* stage, int hq) {
    const ChunkInfo ci = p.chunks[c];
    const long long t0 = ci.start;  // token offsets times heads times K outgrow int
    bf16_t* sKc = reinterpret_cast<bf16_t*>(stage + kOff_k);
    fwd::tile_to_smem_async<kThreads>(sKc, LDK, p.k + (t0 * H + hq) * K, (long long)H * K, C, K, ci.len);
  }
};

/// The intra-card prescan: (S_ext, M) of every segment but each document's last; grid
/// ((V + K) / BV, HV * SEGMENTS, N).
template <class Cfg>
struct StateWalkPrescan {
  static_assert(Cfg::K == Cfg::V, "the prescan walks M's K columns as V-wide slabs: K must equal V");
  __device__ static void run(const StateWalkParams& p) {
    StateWalk<Cfg>::template walk<StateWalk<Cfg>::Mode::prescan>(p);
  }
};

/// The verified carry's first walk (the file's comment): every segment at once, a document's
/// first from h0 and the others from 0, with the tapes, checkpoints and end states.
template <class Cfg>
struct StateWalkSpeculate {
  __device__ static void run(const StateWalkParams& p) {
    StateWalk<Cfg>::template walk<StateWalk<Cfg>::Mode::speculate>(p);
  }
};

/// The verified carry's second walk: each later segment from its predecessor's end until the
/// state matches a checkpoint; marks the chains that do not.
template <class Cfg>
struct StateWalkVerify {
  __device__ static void run(const StateWalkParams& p) {
    StateWalk<Cfg>::template walk<StateWalk<Cfg>::Mode::verify>(p);
  }
};

}  // namespace gdn
