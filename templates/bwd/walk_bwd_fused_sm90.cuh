/**
 * @file walk_bwd_fused_sm90.cuh
 * @brief The fused backward on sm_90a (walk_bwd_layout "fused", docs/design_fused_bwd_sm90.md
 *        3.11, 3.14 and 3.16): the reverse state walk (B2, B3) and chunk_bwd's body (B4-B6) in
 *        one persistent block per (document, value head), chunks walked last to first. The dh
 *        tape and dv_new never leave the block: bf16(Z) and dV' of a chunk are shared tiles that the chunk's body reads
 * where chunk_bwd loaded them. The update takes K^T X, X = -diag(b exp2(gc)) Tm^T bf16(dV') (the body's dvb, scaled),
 * where the split walk takes W^T bf16(dV'): the same sum without forming W (design 3.12), rounded once where W's way
 * rounds W. So the gradient Z, and with it every result of the backward, has its own bits, held to the fp64 bounds; the
 * products and epilogues are otherwise the split walk's (state_walk_bwd_sm90.cuh, one warpgroup owning the whole
 * gradient: design 3.7) and chunk_bwd_sm90.cuh's.
 *
 * Warpgroups (setmaxnreg 32 / 160 / 160 / 160):
 *  - P, the producer: TMA loads of a chunk's tiles into single slots (cp.async with the rows past
 *    the length zero-filled for a chunk cut short), each group of slots refilled for the next
 *    chunk as soon as its last reader has arrived on the group's `empty` barrier, the groups in
 *    the order their slots free (a non-blocking test of each `empty`).
 *  - The algebra (warpgroup 1): Q K^T and P~; dS~ = dO V'^T gated, with the M sums; dQ = dO S^T +
 *    dS~ K; dTm = tril1((dV' W_f^T) diag(b)) through a shared tile (Y's k runs over all its
 *    columns); Y = dTm Tm^T; E = tril1(-Tm^T Y); K K^T; the row terms, dg and dbeta.
 *  - The values (warpgroup 2): the chain D^T = Zb^T K^T, dv_local^T = dO^T P~, dV'; dvb = Tm^T dV'
 *    (dv, dbeta's V term, the update's X); U = K S, R1 = -rowsum(dvb .* U) and W_f = V - diag(Gam)
 *    U over V's tile; dK = diag(exp2(gcL - gc)) V' Zb^T + dS~^T Q + X S^T (= diag(b Gam) Tm^T dW,
 *    dW = -dV' S^T never formed) + (Eb + Eb^T) K.
 *    Every product at the full N; the two roles run different code at the same time, so one's
 *    epilogues overlap the other's products (docs/design_fused_bwd_sm90.md 3.14). They hand tiles
 *    to each other through named barriers that the writer arrives on and the reader waits for.
 *    dq, dk and dv leave from registers.
 *  - Z, the gradient's owner: Z^T (128 x 128 fp32 in registers), bf16(Z) into its tile, <S, Zb>,
 *    dOs (one bf16 rounding) over dO's slot, the update Z^T = exp2(gcL) Z^T + dOs^T Q + X^T K; dh0
 *    at the end.
 * The chain from chunk to chunk is bf16(Z) -> D -> dV' -> dvb, X -> the update. Every mbarrier completes
 * once per chunk (a waiter of chunk u waits parity u & 1) and has ONE arriving warpgroup, or
 * several whose arrivals for chunk u + 1 all follow its completion for chunk u: the two body
 * warpgroups pass a 256-thread barrier (P~ whole) at the start of every chunk, after all of
 * their arrivals of the chunk before; the load groups' `empty`s that the owner shares are
 * arrived by it only after the group's next `full`. The owner reads the K / Tm group (K in its
 * update, the scalars) and dO's slot without arriving on their `empty`s: the algebra arrives on
 * both only after bZDone, which the owner arrives once its update has read them; the scalars'
 * two buffers by chunk parity cover the owner's reads at the next chunk's start, since the
 * values' arrival for chunk u + 1 follows bZFull(u + 1), which the owner arrives after chunk u.
 *
 * Segments (the verified carry only, docs/design_fused_bwd_sm90.md 3.20): every reverse walk of
 * the carry is this body, one block per (segment, value head). The speculative walk walks every
 * segment (the earlier ones from zero) and writes the outputs of all its chunks, the owner the
 * checkpoints and the gradient at the segment's start; the verify walk re-walks each earlier
 * segment's window (its last chunks) from its successor's start gradient, rewriting the window's
 * outputs, and marks the chain where the gradient does not come out bitwise the same; the walk
 * of the marked chains rewrites all of their outputs from the merged gradients. A chain that
 * verifies thus has every bit of the unsegmented walk.
 */
#pragma once

#include "bwd/chunk_bwd_sm90.cuh"
#include "bwd/state_walk_bwd.cuh"
#include "common/pipeline.cuh"
#include "common/segments.cuh"
#include "common/wgmma.cuh"

#if GDN_HAS_WGMMA

namespace gdn {

template <class Cfg>
struct WalkBwdFusedSm90 {
  static_assert(Cfg::K == 128 && Cfg::V == 128 && Cfg::CHUNK == 64 && Cfg::BV == 128,
                "WalkBwdFusedSm90: K = V = 128, chunk 64, 128 columns per block");
  static_assert(Cfg::RANKS == 1 && Cfg::WALK_FUSES_W && (Cfg::SEGMENTS == 1 || VerifiedCarry<Cfg>::value),
                "WalkBwdFusedSm90: one rank, W formed in the walk, segments only under the verified carry");
  static constexpr int K = Cfg::K, V = Cfg::V, C = Cfg::CHUNK, H = Cfg::H, HV = Cfg::HV, G = Cfg::G;
  using CB = ChunkBwdSm90<Cfg>;
  using Lane = typename CB::Lane;
  using Lay = StateWalkBwdSm90Layout;
  using Carry = ReverseCarry<Cfg>;
  typedef unsigned long long mbar_t;

  enum : int { kTok = C * K * 2, kSq = K * V * 2, kCC = C * C * 2 };
  enum : int {
    kOffQ = Lay::fu_off_tok(Lay::fu_q, K, C),
    kOffK = Lay::fu_off_tok(Lay::fu_k, K, C),
    kOffV = Lay::fu_off_tok(Lay::fu_v, K, C),
    kOffO = Lay::fu_off_tok(Lay::fu_o, K, C),
    kOffVn = Lay::fu_off_tok(Lay::fu_vn, K, C),
    kOffDv = Lay::fu_off_tok(Lay::fu_dv, K, C),
    kOffW = Lay::fu_off_tok(Lay::fu_w, K, C),
    kOffK1 = Lay::fu_off_tok(Lay::fu_k1, K, C),
    kOffLo = Lay::fu_off_lo(K, C),
    kOffS = Lay::fu_off_s(K, C),
    kOffZb = Lay::fu_off_zb(K, C),
    kOffT = Lay::fu_off_t(K, C),
    kOffP = Lay::fu_off_p(K, C),
    kOffSc = Lay::fu_off_sc(K, C),
    kGateBytes = Lay::fu_gate_floats(C) * 4,
    kOffRows = Lay::fu_off_sc(K, C) + 2 * Lay::fu_gate_floats(C) * 4,
    kOffBar = Lay::fu_off_bar(K, C)
  };
  // The scalars (floats). Two buffers by chunk parity of those written ahead of their readers'
  // chunk: gc and beta (the producer) at chunk_bwd's offsets, <S, Zb> (the owner, at sSzAt), the
  // values' row terms. One buffer of the rest at chunk_bwd's offsets (its gc, beta, <S, Zb> and
  // values' slots unused), then the
  // dOs factor scale exp2(min(gc_t, 0)) (Z) and the dV' factor exp2(gcL - gc_t) (X): each is
  // written and read in one chunk by roles whose chunks u + 1 follow each other's chunks u
  // (docs/design_fused_bwd_sm90.md 3.15's table).
  // The values' row terms (sKstAt, sR1At, sDbvAt) are in the two buffers too: the values write
  // chunk u + 1's while the algebra's row terms of chunk u read chunk u's (the algebra forms chunk
  // u + 1's scores first).
  enum : int { sSzAt = 128, sKstAt = 136, sR1At = 200, sDbvAt = 264, sEo = 1160, sEv = 1224, kRowFloats = 1288 };
  static_assert(CB::sG == 0 && CB::sB == 64 && sDbvAt + 64 <= Lay::fu_gate_floats(64), "the gate scalars' layout");
  static_assert(kOffSc % 8 == 0 && kGateBytes % 8 == 0, "pair_at: 8-byte aligned scalar blocks");
  static_assert(CB::kScalarFloats <= sEo && kRowFloats == Lay::fu_row_floats(64), "the row scalars' layout");

  // The tensor maps (Program::tensor_maps in this order): the walk's loads, then chunk_bwd's.
  enum TmaOperand { kMapK, kMapQ, kMapT, kMapO, kMapS, kMapVn, kMapV, kMapDq, kMapDk, kMapDv, kMaps };

  // mbarriers. Load groups, each a full (129 arrivals: the producer's cp.async arrivals and the
  // TMA issue) and an empty: K and gc, beta (two buffers by chunk parity, the odd chunks' pair of
  // barriers at bK1Full, bK1Empty); Tm; Q; V; dO; V'; the h tape.
  enum LoadGroup : int { gK, gT, gQ, gV, gO, gVn, gS, kGroups };
  enum Barrier : int {
    bFull = 0,             // + group
    bEmpty = kGroups,      // + group
    bZFull = 2 * kGroups,  // Z: bf16(Z) is in its tile
    bZEmpty,               // the values: D^T and dKst have read it
    bWFull,                // the values: the update's factor X is in W
    bDvFull,               // the values: dV' is in its tile
    bDvEmpty,              // Z: the update is done (the values' next dV' may come)
    bZDone,                // Z: the update read dOs, X and K; <S, Zb> is written
    bORead,                // the algebra and the values: dv_local, dS~ and dO S^T have read dO
    bK1Full,               // K's second buffer (odd chunks)
    bK1Empty,
    // Cfg::RAW_QK: raw q and k land here (the load's bytes and arrivals); the producer then
    // normalizes the rows in place and arrives on the group's full (128 arrivals).
    bQLanded,
    bKLanded,
    bK1Landed,
    // Cfg::RAW_QK: the algebra's Q K^T of the chunk has read the raw Q (128 arrivals): the
    // producer normalizes Q only then, so that the scores need not wait for it.
    bQScored,
    kBarriers
  };
  // Named barriers: 1 for the algebra and the values at a chunk's start (256 threads), 3 the
  // owner's, 4 and 5 each body warpgroup's own (128); the hand-offs between the two body
  // warpgroups, each arrived by the writer and waited for by the reader (256): the values'
  // dv_local^T has read P~, dS~ is in P, W_f is in V's tile, E is in Lo, the values' row terms
  // are in.
  enum : int {
    kBarPair = 1,
    kBarOwner = 3,
    kBarAlgebra = 4,
    kBarValues = 5,
    kBarPRead = 6,
    kBarDS = 7,
    kBarWf = 8,
    kBarE = 9,
    kBarRows = 10
  };
  static_assert(kBarriers <= Lay::kFuBarriers, "the layout's mbarrier slots");

  /// Raw q and k tiles, normalized in shared memory by the producer from the saved rows' rstd
  /// (backward_norm "in_walk"); else qn and kn from the backward's l2norm launches.
  enum : bool { kRawQK = RawQkOf<Cfg>::value };

  static constexpr int kProducerRegs = 32, kBodyRegs = 160, kOwnerRegs = 160;
  static_assert(kProducerRegs + 2 * kBodyRegs + kOwnerRegs <= 4 * 128, "setmaxnreg: the block's pinned registers");

  __device__ __forceinline__ static u32 pack(float lo, float hi) { return f2bf_pair(lo, hi); }
  /// Group g's barriers for chunk u, and the parity of their completion for it: K's two buffers
  /// complete every other chunk each.
  __device__ __forceinline__ static mbar_t* full_of(mbar_t* bars, int g, int u) {
    return g == gK && (u & 1) ? bars + bK1Full : bars + bFull + g;
  }
  __device__ __forceinline__ static mbar_t* empty_of(mbar_t* bars, int g, int u) {
    return g == gK && (u & 1) ? bars + bK1Empty : bars + bEmpty + g;
  }
  __device__ __forceinline__ static u32 phase_of(int g, int u) {
    return static_cast<u32>(g == gK ? (u >> 1) & 1 : u & 1);
  }
  /// Whether group g's raw tile is normalized by the producer before its readers see it.
  __device__ __forceinline__ static constexpr bool normalized_here(int g) { return kRawQK && (g == gQ || g == gK); }
  /// The barrier group g's loads of chunk u complete: its landing barrier where the producer
  /// normalizes the tile after the load, else its full.
  __device__ __forceinline__ static mbar_t* loads_of(mbar_t* bars, int g, int u) {
    if (!normalized_here(g)) return full_of(bars, g, u);
    return g == gQ ? bars + bQLanded : (u & 1) ? bars + bK1Landed : bars + bKLanded;
  }
  __device__ __forceinline__ static void wait_full(mbar_t* bars, int g, int u) {
    pipe::mbar_wait(full_of(bars, g, u), phase_of(g, u));
    wg::fence_smem_for_async();  // a cut chunk's cp.async writes are read by wgmma
  }
  /// Group g's tile of chunk u as loaded: raw where the producer normalizes it afterwards.
  __device__ __forceinline__ static void wait_loaded(mbar_t* bars, int g, int u) {
    pipe::mbar_wait(loads_of(bars, g, u), phase_of(g, u));
    wg::fence_smem_for_async();
  }
  /// gc, beta and <S, Zb> of chunk u (its parity's buffer).
  __device__ __forceinline__ static float* scalars(unsigned char* smem, int u) {
    return reinterpret_cast<float*>(smem + kOffSc + (u & 1) * kGateBytes);
  }
  /// The row terms and the gate vectors (one buffer).
  __device__ __forceinline__ static float* row_scalars(unsigned char* smem) {
    return reinterpret_cast<float*>(smem + kOffRows);
  }
  /// K's tile for chunk u.
  __device__ __forceinline__ static int k_off(int u) { return (u & 1) ? kOffK1 : kOffK; }

  __device__ static void run(const StateWalkBwdFusedParams& p, const TensorMaps& maps) {
    extern __shared__ unsigned char smem_raw[];
    // SW128 tiles need 1024-byte aligned addresses; the layout reserves the slack.
    unsigned char* const smem = smem_raw + ((1024u - (wg::smem_u32(smem_raw) & 1023u)) & 1023u);
    SegmentWalk<Cfg> range(p.doc_chunk_offset, p.chunks, p.doc_order);
    if (!range.active) return;
    if (!Carry::prepare(range, p, walk_head<Cfg>())) return;  // every thread: a block-wide vote
    mbar_t* const bars = reinterpret_cast<mbar_t*>(smem + kOffBar);
    if (threadIdx.x == 0) {
      // A full: the producer's 128 cp.async arrivals and the TMA issue; where the producer
      // normalizes the tile, those go to the landing barrier and the full takes the 128 arrivals
      // that follow the normalization.
      for (int g = 0; g < kGroups; ++g) pipe::mbar_init(bars + bFull + g, normalized_here(g) ? 128 : 129);
      pipe::mbar_init(bars + bK1Full, normalized_here(gK) ? 128 : 129);
      if (kRawQK) {
        for (int b = bQLanded; b <= bK1Landed; ++b) pipe::mbar_init(bars + b, 129);
        pipe::mbar_init(bars + bQScored, 128);
      }
      // Each load group's readers: the algebra and the values (each arrives once a chunk, after its
      // last read), and the owner for K, Q and S.
      pipe::mbar_init(bars + bEmpty + gK, 384);
      pipe::mbar_init(bars + bK1Empty, 384);
      pipe::mbar_init(bars + bEmpty + gT, 256);
      pipe::mbar_init(bars + bEmpty + gQ, 384);
      pipe::mbar_init(bars + bEmpty + gV, 256);
      pipe::mbar_init(bars + bEmpty + gO, 256);  // the algebra after the owner's update read dOs
      pipe::mbar_init(bars + bEmpty + gVn, 256);
      pipe::mbar_init(bars + bEmpty + gS, 384);
      // dO's readers are both body warpgroups; every other barrier has one warpgroup's 128
      // arrivals (the owner's, or the values').
      for (int b = bZFull; b <= bORead; ++b) pipe::mbar_init(bars + b, b == bORead ? 256 : 128);
      pipe::fence_mbar_init();
    }
    __syncthreads();
    const int role = threadIdx.x / 128;
    if (role == 0) {
      pipe::setmaxnreg_dec<kProducerRegs>();
      producer(p, maps, range, smem, bars);
    } else if (role == 1) {
      pipe::setmaxnreg_inc<kBodyRegs>();
      algebra(p, range, smem, bars);
    } else if (role == 2) {
      pipe::setmaxnreg_inc<kBodyRegs>();
      values(p, range, smem, bars);
    } else {
      pipe::setmaxnreg_inc<kOwnerRegs>();
      owner(p, range, smem, bars);
    }
  }

 private:
  /// Whether group g's slots are free for chunk u: its readers of the slots' chunk before (u - 1,
  /// or u - 2 for K's buffers) have all arrived (one non-blocking test).
  __device__ __forceinline__ static bool slot_free(mbar_t* bars, int g, int u) {
    const int before = u - (g == gK ? 2 : 1);
    if (before < 0) return true;
    return phase_done(empty_of(bars, g, before), phase_of(g, before));
  }
  /// Whether `bar`'s phase of this parity has completed (one non-blocking test).
  __device__ __forceinline__ static bool phase_done(mbar_t* bar, u32 parity) {
    u32 done = 0;
    asm volatile("{\n.reg .pred p;\nmbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(pipe::smem_u32(bar)), "r"(parity)
                 : "memory");
    return done != 0;
  }

  /// Cfg::RAW_QK: this thread's row of a landed raw q or k tile normalized in place, y =
  /// bf16(x * rstd) with l2norm's arithmetic (store_row: the same bits as its qn), `rstd` the
  /// row's saved rstd (0 past the chunk's length, whose rows are zeros). Thread t owns the
  /// 128-byte line t of the SW128 tile: row t % 64 of column block t / 64 (the swizzle moves
  /// 16-byte pieces only inside a line).
  __device__ __forceinline__ static void normalize_line(bf16_t* tile, float rstd, int tid) {
    uint4* const line = reinterpret_cast<uint4*>(reinterpret_cast<unsigned char*>(tile) + tid * 128);
    // Every line starts on bank 0: eight neighbouring threads taking the same piece index would
    // queue on one bank group (8-way). Starting each at piece tid % 8 spreads them over all 32
    // banks; the element-wise scaling does not care about the order.
    const int first = tid & 7;
    // Two 16-byte pieces in flight: the producer has 32 registers.
#pragma unroll 2
    for (int i = 0; i < 8; ++i) {
      uint4& piece = line[i ^ first];
      uint4 w = piece;
      w.x = f2bf_pair(bf16_lo_f(w.x) * rstd, bf16_hi_f(w.x) * rstd);
      w.y = f2bf_pair(bf16_lo_f(w.y) * rstd, bf16_hi_f(w.y) * rstd);
      w.z = f2bf_pair(bf16_lo_f(w.z) * rstd, bf16_hi_f(w.z) * rstd);
      w.w = f2bf_pair(bf16_lo_f(w.w) * rstd, bf16_hi_f(w.w) * rstd);
      piece = w;
    }
  }

  /// One load group of chunk u, once its slots' previous readers (chunk u - 1) arrived on `empty`: a
  /// whole chunk (or a group that is always whole) by TMA from thread 0 on the group's
  /// transaction count, a cut chunk by every thread's cp.async; every thread then arrives through
  /// cp.async (the group's scalars, where it has any, are its cp.async).
  template <class Tma, class Copy>
  __device__ __forceinline__ static void load_group(mbar_t* bars, int g, int u, bool tma, u32 bytes, int tid,
                                                    Tma&& issue_tma, Copy&& issue_copies) {
    mbar_t* const done = loads_of(bars, g, u);
    if (tma) {
      if (tid == 0) {
        pipe::mbar_arrive_expect_tx(done, bytes);
        issue_tma(done);
      }
    } else {
      issue_copies();
      if (tid == 0) pipe::mbar_arrive(done);
    }
  }

  __device__ static void producer(const StateWalkBwdFusedParams& p, const TensorMaps& maps,
                                  const SegmentWalk<Cfg>& range, unsigned char* smem, mbar_t* bars) {
    const int tid = threadIdx.x;
    if (tid == 0)
#pragma unroll
      for (int m = 0; m < kMaps; ++m) pipe::tma_prefetch_map(&maps.map[m]);
    const int j = walk_head<Cfg>(), hq = j / G;
    const int c_last = range.end - 1, nc = range.end - range.begin;
    auto at = [&](int off) { return reinterpret_cast<bf16_t*>(smem + off); };
    const auto copy16 = [](void* d, const void* g, bool ok) { bwd::cp_async16(d, g, ok); };
    ChunkInfo next = nc > 0 ? p.chunks[c_last] : ChunkInfo{};
#pragma unroll 1
    for (int u = 0; u < nc; ++u) {
      const int c = c_last - u;
      const ChunkInfo ci = next;  // read one chunk ahead: its latency is off the loop
      if (u + 1 < nc) next = p.chunks[c - 1];
      const long long t0 = ci.start;
      const int len = ci.len, row = static_cast<int>(t0);
      const bool whole = len == C;
      const long long hv_row = (t0 * HV + j);
      // Each group is loaded as soon as its slots' readers of the chunk before have all arrived, in
      // whatever order that happens: a group that frees early does not wait behind one that frees
      // late (the roles' timing decides the order, not this code).
      u32 pending = (1u << kGroups) - 1;
      // Cfg::RAW_QK: the groups whose raw tile is loading, normalized once it has landed, and the
      // saved rstd of this thread's row in each (normalize_line), read while the tile loads.
      u32 landing = 0;
      float rstd_q = 0.f, rstd_k = 0.f;
      while ((pending | landing) != 0) {
        const u32 before = pending | (landing << kGroups);
#pragma unroll
        for (int g = 0; g < kGroups; ++g) {
          if (!((pending >> g) & 1u) || !slot_free(bars, g, u)) continue;
          pending &= ~(1u << g);
          if (normalized_here(g)) {
            const int r = tid & (C - 1);
            const float rstd = r < len ? (g == gQ ? p.rstd_q : p.rstd_k)[(t0 + r) * H + hq] : 0.f;
            (g == gQ ? rstd_q : rstd_k) = rstd;
            landing |= 1u << g;
          }
          switch (g) {
            case gQ:
              load_group(
                  bars, gQ, u, whole, kTok, tid,
                  [&](mbar_t* b) { pipe::tma_load_tile<C, K>(at(kOffQ), &maps.map[kMapQ], hq * K, row, b); },
                  [&] {
                    wg::load_tile_sw128<C, K>(at(kOffQ), p.q + (t0 * H + hq) * K, (long long)H * K, len, tid, copy16);
                  });
              break;
            case gS:
              load_group(
                  bars, gS, u, true, kSq, tid,
                  [&](mbar_t* b) {
                    pipe::tma_load_tile<K, V>(at(kOffS), &maps.map[kMapS], 0, static_cast<int>((c * HV + j) * K), b);
                  },
                  [] {});
              break;
            case gV:
              load_group(
                  bars, gV, u, whole, kTok, tid,
                  [&](mbar_t* b) { pipe::tma_load_tile<C, V>(at(kOffV), &maps.map[kMapV], j * V, row, b); },
                  [&] { wg::load_tile_sw128<C, V>(at(kOffV), p.v + hv_row * V, (long long)HV * V, len, tid, copy16); });
              break;
            case gVn:
              load_group(
                  bars, gVn, u, whole, kTok, tid,
                  [&](mbar_t* b) { pipe::tma_load_tile<C, V>(at(kOffVn), &maps.map[kMapVn], j * V, row, b); },
                  [&] {
                    wg::load_tile_sw128<C, V>(at(kOffVn), p.v_new + hv_row * V, (long long)HV * V, len, tid, copy16);
                  });
              break;
            case gO:
              load_group(
                  bars, gO, u, whole, kTok, tid,
                  [&](mbar_t* b) { pipe::tma_load_tile<C, V>(at(kOffO), &maps.map[kMapO], j * V, row, b); },
                  [&] {
                    wg::load_tile_sw128<C, V>(at(kOffO), p.d_o + hv_row * V, (long long)HV * V, len, tid, copy16);
                  });
              break;
            case gK:
              load_group(
                  bars, gK, u, whole, kTok, tid,
                  [&](mbar_t* b) { pipe::tma_load_tile<C, K>(at(k_off(u)), &maps.map[kMapK], hq * K, row, b); },
                  [&] {
                    wg::load_tile_sw128<C, K>(at(k_off(u)), p.k + (t0 * H + hq) * K, (long long)H * K, len, tid,
                                              copy16);
                  });
              if (tid < C) {  // gc and beta of the chunk into its scalars' buffer
                float* const sc = scalars(smem, u);
                const bool ok = tid < len;  // gc padded with its last value, beta with 0: no masks downstream
                const long long a = (t0 + (ok ? tid : len - 1)) * HV + j;
                bwd::cp_async4(sc + CB::sG + tid, p.gc + a, true);
                bwd::cp_async4(sc + CB::sB + tid, p.beta + a, ok);
              }
              break;
            case gT:
              load_group(
                  bars, gT, u, whole, kCC, tid,
                  [&](mbar_t* b) { pipe::tma_load_tile<C, C>(at(kOffT), &maps.map[kMapT], j * C, row, b); },
                  [&] {
                    wg::load_tile_sw128<C, C>(at(kOffT), p.tm + hv_row * C, (long long)HV * C, len, tid, copy16);
                  });
              break;
          }
          // Every thread arrives through its cp.async (the group's copies, where it has any).
          pipe::cp_async_arrive(loads_of(bars, g, u));
        }
        if constexpr (kRawQK) {
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            const int g = i == 0 ? gQ : gK;
            if (!((landing >> g) & 1u) || !phase_done(loads_of(bars, g, u), phase_of(g, u))) continue;
            // Q is rewritten only once the algebra's Q K^T has read it raw.
            if (g == gQ && !phase_done(bars + bQScored, static_cast<u32>(u & 1))) continue;
            landing &= ~(1u << g);
            normalize_line(at(g == gQ ? kOffQ : k_off(u)), g == gQ ? rstd_q : rstd_k, tid);
            wg::fence_smem_for_async();  // the readers' wgmma see the normalized rows
            pipe::mbar_arrive(full_of(bars, g, u));
          }
        }
        // Nothing freed or landed in this pass: yield the issue slots to the roles for a moment.
        if ((pending | (landing << kGroups)) == before) __nanosleep(32);
      }
    }
  }

  /// A 64 x 128 tile of bf16 pairs (pr[2 i + hh]: row L.r[hh], columns 8 i + tq, + 1) straight from
  /// registers to rows of global memory (rows past len skipped): eight rows of 16 bytes per warp
  /// instruction, which L2 joins into whole sectors.
  __device__ __forceinline__ static void store_rows(int len, const u32 (&pr)[32], const Lane& L, bf16_t* rows,
                                                    long long stride) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int r = L.r[hh];
      if (r >= len) continue;
#pragma unroll
      for (int i = 0; i < 16; ++i) *reinterpret_cast<u32*>(rows + r * stride + 8 * i + L.tq) = pr[2 * i + hh];
    }
  }

  /// A 64 x 128 fp32 accumulator rounded to bf16 pairs and stored as store_rows stores them.
  __device__ __forceinline__ static void store_acc_rows(int len, const float (&acc)[64], const Lane& L, bf16_t* rows,
                                                        long long stride) {
    u32 pr[32];
#pragma unroll
    for (int i = 0; i < 16; ++i)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) pr[2 * i + hh] = pack(acc[4 * i + 2 * hh], acc[4 * i + 2 * hh + 1]);
    store_rows(len, pr, L, rows, stride);
  }

  /// acc (+)= A B over STEPS k-steps of 16 (wg::mma_k16's operand forms), descriptors by step.
  template <int N, int TA, int TB, int STEPS, class DA, class DB>
  __device__ __forceinline__ static void mma(float (&acc)[N / 2], DA&& da, DB&& db, bool accumulate) {
    wg::fence_acc(acc);
    wg::fence();
#pragma unroll
    for (int ks = 0; ks < STEPS; ++ks) wg::mma_k16<N, TA, TB>(acc, da(ks), db(ks), (accumulate || ks > 0) ? 1 : 0);
  }

  /// Both rows' sums of the thread over the quad (complete sums of the row's columns).
  __device__ __forceinline__ static void quad_sums(float (&rs)[2]) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) rs[hh] = CB::quad_sum(rs[hh]);
  }
  /// A row term: the quad's first lane writes each of the thread's two rows.
  __device__ __forceinline__ static void put_rows(float* out, const float (&rs)[2], const Lane& L) {
    if ((L.ctid & 3) == 0) {
      out[L.r[0]] = rs[0];
      out[L.r[1]] = rs[1];
    }
  }
  /// The address of the row this lane gives to a four-matrix ldmatrix / stmatrix of column blocks
  /// i, i + 1 of a 64-row SW128 tile (CB::stsm_pairs' matrices: x[0], x[1] rows L.r[0], L.r[1] at
  /// columns 8 i + tq, x[2], x[3] the same rows at 8 (i + 1) + tq).
  __device__ __forceinline__ static u32 pairs_row_addr(u32 tile, int row, int i, const Lane& L) {
    return tile + CB::swz(row, 8 * i + 8 * ((L.ctid & 31) >> 4), C);
  }
  __device__ __forceinline__ static int pairs_row(const Lane& L) {
    int row = 16 * L.w + 8 * (((L.ctid & 31) >> 3) & 1) + (L.ctid & 7);
    // Recomputed per call: held across the products in between, the row's addresses spill.
    asm volatile("" : "+r"(row));
    return row;
  }
  /// CB::row_dot over all 128 columns (the same sums in the same order, so the same bits) with one
  /// ldmatrix for every four 4-byte loads, each of which computed its own swizzled address.
  __device__ __forceinline__ static void row_dot_ldsm(u32 tile, const float (&d)[64], const Lane& L, float (&out)[2]) {
    const int row = pairs_row(L);
    float s0 = 0.f, s1 = 0.f;
#pragma unroll
    for (int i = 0; i < 16; i += 2) {
      u32 x[4];
      wg::ldsm_x4(x, pairs_row_addr(tile, row, i, L));
      s0 += d[4 * i] * CB::lo_f(x[0]) + d[4 * i + 1] * CB::hi_f(x[0]);
      s1 += d[4 * i + 2] * CB::lo_f(x[1]) + d[4 * i + 3] * CB::hi_f(x[1]);
      s0 += d[4 * i + 4] * CB::lo_f(x[2]) + d[4 * i + 5] * CB::hi_f(x[2]);
      s1 += d[4 * i + 6] * CB::lo_f(x[3]) + d[4 * i + 7] * CB::hi_f(x[3]);
    }
    out[0] += s0;
    out[1] += s1;
  }
  /// Entries c and c + 1 (c even) of a chunk's per-token scalars (gc, beta) in one 8-byte load:
  /// the scalar blocks start 8-byte aligned (static_asserts at the layout), and a lane's columns
  /// come in even pairs.
  __device__ __forceinline__ static float2 pair_at(const float* v, int c) {
    return *reinterpret_cast<const float2*>(v + c);
  }
  /// The warp's 16 column sums (cs[2 i + e]: column 8 i + tq + e of its 16 rows) into out[64 w +
  /// column]. Each is summed over the 8 row groups in CB::octet_sum's order (lane xor 4, 8, 16:
  /// the same pairs, so the same bits), but every exchange also halves what a lane keeps: 14
  /// shuffles (and 28 selects) in place of 48 shuffles and 48 adds, and each lane stores the two
  /// sums of column block i = 4 (g & 1) + 2 ((g >> 1) & 1) + (g >> 2), where one lane in eight
  /// stored sixteen.
  __device__ __forceinline__ static void put_cols(float* out, const float (&cs)[16], const Lane& L) {
    const int lane = L.ctid & 31;
    const bool b0 = lane & 4, b1 = lane & 8, b2 = lane & 16;
    float a[8], c[4], d[2];
#pragma unroll
    for (int k = 0; k < 8; ++k)
      a[k] = select_f32(b0, cs[k + 8], cs[k]) + __shfl_xor_sync(0xffffffffu, select_f32(b0, cs[k], cs[k + 8]), 4);
#pragma unroll
    for (int k = 0; k < 4; ++k)
      c[k] = select_f32(b1, a[k + 4], a[k]) + __shfl_xor_sync(0xffffffffu, select_f32(b1, a[k], a[k + 4]), 8);
#pragma unroll
    for (int k = 0; k < 2; ++k)
      d[k] = select_f32(b2, c[k + 2], c[k]) + __shfl_xor_sync(0xffffffffu, select_f32(b2, c[k], c[k + 2]), 16);
    const int i = 4 * b0 + 2 * b1 + b2;
    float* const at = out + 64 * L.w + 8 * i + L.tq;
    at[0] = d[0];
    at[1] = d[1];
  }
  /// Half h (16 of the 32 values) of a 64 x 64 accumulator, as store_e_half takes it.
  __device__ __forceinline__ static const float (&half_of(const float (&x)[32], int h))[16] {
    return *reinterpret_cast<const float(*)[16]>(x + 16 * h);
  }

  struct Tiles {
    u32 q, v, o, vn, dv, w, lo, s, zb, t, p;  // K's two buffers: k_off
    __device__ __forceinline__ explicit Tiles(unsigned char* smem) {
      const u32 s0 = wg::smem_u32(smem);
      q = s0 + kOffQ, v = s0 + kOffV, o = s0 + kOffO, vn = s0 + kOffVn, dv = s0 + kOffDv;
      w = s0 + kOffW, lo = s0 + kOffLo, s = s0 + kOffS, zb = s0 + kOffZb, t = s0 + kOffT, p = s0 + kOffP;
    }
  };
  __device__ __forceinline__ static auto kmaj(u32 t, int rows) {
    return [=](int ks) { return wg::step_k_major(t, rows, ks); };
  }
  __device__ __forceinline__ static auto mnmaj(u32 t, int rows) {
    return [=](int ks) { return wg::step_mn_major(t, rows, ks); };
  }
  __device__ __forceinline__ static auto mnmaj_cols(u32 t, int rows, int c0) {
    return [=](int ks) { return wg::step_mn_major_cols(t, rows, c0, ks); };
  }

  /// Q K^T's rows (this thread's two: r_lo in the even pairs, r_hi in the odd) times their rstd.
  __device__ __forceinline__ static void scale_score_rows(float (&QK)[32], const float (&rq)[2]) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      QK[4 * i] *= rq[0];
      QK[4 * i + 1] *= rq[0];
      QK[4 * i + 2] *= rq[1];
      QK[4 * i + 3] *= rq[1];
    }
  }

  /// A1 of chunk u: Q K^T (kept for the M sums) and P~ = bf16(scale (Q K^T) exp2(gc_r - gc_c)) on
  /// r >= c, the walk's scores, into P, then the barrier at which the values take P~. The decay
  /// factors exp2(min(gc_r - gc_c, 0)) are not kept: live across A6 they spill, so A2 forms them
  /// again (the same bits). Cfg::RAW_QK: `rq` is the saved rstd of this thread's two rows; the
  /// product takes Q's raw rows as they land and scales each row by it in fp32 (qn's rows are
  /// bf16(q rstd): these scores have their own roundings), and the producer normalizes Q in place
  /// for the later readers once this product has read it. Q's single slot is loaded only after
  /// the owner's update of the chunk before has read it, so its normalization would otherwise sit
  /// on this chain. (A parameter pack, empty without RAW_QK: the default's machine code is that
  /// of the function before the parameter, which an added plain parameter changes.)
  template <class... RowScale>
  __device__ __forceinline__ static void scores(mbar_t* bars, unsigned char* smem, const Tiles& T, const Lane& L,
                                                float scale, int u, float (&QK)[32], const RowScale&... rq) {
    static_assert(sizeof...(RowScale) == (kRawQK ? 1 : 0), "scores: the rows' rstd with RAW_QK only");
    const int tq = ((L.ctid & 31) & 3) * 2;
    const float* g = scalars(smem, u) + CB::sG;
    const u32 tk = wg::smem_u32(smem) + k_off(u);
    float Dec[32];
    wait_full(bars, gK, u);
    if constexpr (kRawQK) {
      wait_loaded(bars, gQ, u);
    } else {
      wait_full(bars, gQ, u);
    }
    mma<64, 0, 0, K / 16>(QK, kmaj(T.q, C), kmaj(tk, C), false);
    wg::commit();
    CB::template wait<0>(QK);
    if constexpr (kRawQK) {
      pipe::mbar_arrive(bars + bQScored);
      scale_score_rows(QK, rq...);
    }
    {
      const int r_lo = L.r[0], r_hi = L.r[1];
      const float g_lo = g[r_lo], g_hi = g[r_hi];
      u32 ps[16];  // the rows' pairs per column block, as dS~'s: four stmatrix instead of 16 stores
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int col = i * 8 + tq;
        u32 lo = 0u, hi = 0u;
        const float2 gc = pair_at(g, col);
        const float gc0 = gc.x, gc1 = gc.y;
        Dec[4 * i] = exp2_ftz(fminf(g_lo - gc0, 0.f));
        Dec[4 * i + 1] = exp2_ftz(fminf(g_lo - gc1, 0.f));
        Dec[4 * i + 2] = exp2_ftz(fminf(g_hi - gc0, 0.f));
        Dec[4 * i + 3] = exp2_ftz(fminf(g_hi - gc1, 0.f));
        if (i * 8 <= 16 * L.w + 15) {
          const bool ok00 = col <= r_lo, ok01 = col + 1 <= r_lo;
          const bool ok10 = col <= r_hi, ok11 = col + 1 <= r_hi;
          const float p00 = select_f32(ok00, scale * QK[4 * i] * Dec[4 * i], 0.f);
          const float p01 = select_f32(ok01, scale * QK[4 * i + 1] * Dec[4 * i + 1], 0.f);
          const float p10 = select_f32(ok10, scale * QK[4 * i + 2] * Dec[4 * i + 2], 0.f);
          const float p11 = select_f32(ok11, scale * QK[4 * i + 3] * Dec[4 * i + 3], 0.f);
          lo = pack(p00, p01);
          hi = pack(p10, p11);
        }
        ps[2 * i] = lo;
        ps[2 * i + 1] = hi;
      }
#pragma unroll
      for (int i = 0; i < 8; i += 2) CB::stsm_pairs(T.p, i, L, ps[2 * i], ps[2 * i + 1], ps[2 * i + 2], ps[2 * i + 3]);
    }
    wg::fence_smem_for_async();
    pipe::named_sync_roles(kBarPair, 256);  // P~ whole
  }

  /// A6 of chunk u (m rows from token t0): dgam and dbeta per row (chunk_bwd's order), the reverse
  /// cumsum of dgam, dg and dbeta; then K's buffer (with the gates it carries) is released. szs:
  /// <S, Zb> of chunk u, read at bZDone(u): its slot (chunk u's parity) takes chunk u + 2's from the
  /// owner, whose chunk u + 2 need not follow this (it follows the values' V' Zb^T of chunk u + 1).
  __device__ __forceinline__ static void row_terms(const StateWalkBwdFusedParams& p, unsigned char* smem, mbar_t* bars,
                                                   int ctid, int j, int u, int m, long long t0, float szs) {
    float* const rt = row_scalars(smem);
    float* const sc = scalars(smem, u);
    const float* g = sc + CB::sG;
    const float* b = sc + CB::sB;
    pipe::named_sync(kBarAlgebra, 128);  // this warpgroup's row terms
    float* const gam = rt + CB::sGam;
    float* const db = rt + CB::sDb;
    if (ctid < C) {
      const int r = ctid;
      const int l = ctid & 31;
      const float kst =
          warp_sum((2 * l < m - 1 ? sc[sKstAt + 2 * l] : 0.f) + (2 * l + 1 < m - 1 ? sc[sKstAt + 2 * l + 1] : 0.f));
      float gr = 0.f, dbr = 0.f;
      if (r < m) {
        const float gg = g[r], bb = b[r], gmr = exp2_ftz(fminf(gg, 0.f));
        gr = rt[CB::sGq + r];
        gr += rt[CB::sAttR + r] -
              (((rt[CB::sAttC + r] + rt[CB::sAttC + 64 + r]) + rt[CB::sAttC + 128 + r]) + rt[CB::sAttC + 192 + r]);
        if (r == m - 1) {
          gr += exp2_ftz(fminf(g[m - 1], 0.f)) * szs + kst;
        } else {
          gr -= sc[sKstAt + r];
        }
        const float r1 = sc[sR1At + r], r2 = rt[CB::sR2 + r];
        gr += bb * gmr * r1;
        gr += bb * r2 - (((rt[CB::sCs + r] + rt[CB::sCs + 64 + r]) + rt[CB::sCs + 128 + r]) + rt[CB::sCs + 192 + r]);
        dbr = gmr * r1 + sc[sDbvAt + r] + r2;
      }
      gam[r] = gr;
      db[r] = dbr;
    }
    // Q K^T, dS~ K and K K^T read K; the row terms above were the last reads of gc, beta and
    // <S, Zb>, which share K's buffer parity.
    pipe::mbar_arrive(empty_of(bars, gK, u));
    pipe::named_sync(kBarAlgebra, 128);
    if (ctid < 32) {
      const int i0 = 2 * ctid, i1 = 2 * ctid + 1;
      const float a = gam[i0], bq = gam[i1];
      const float pair = a + bq;
      float incl = pair;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const float dn = __shfl_down_sync(0xffffffffu, incl, o);
        if (ctid + o < 32) incl += dn;
      }
      const float after = incl - pair;
      if (i0 < m) {
        p.out.dg[(t0 + i0) * HV + j] = after + bq + a;
        p.out.dbeta[(t0 + i0) * HV + j] = db[i0];
      }
      if (i1 < m) {
        p.out.dg[(t0 + i1) * HV + j] = after + bq;
        p.out.dbeta[(t0 + i1) * HV + j] = db[i1];
      }
    }
  }

  /// Warpgroup 1, the algebra (design 3.14, version 3's A role on the second version's tiles):
  /// Q K^T and P~, dS~ and the M sums, dQ, dTm = tril1((dV' W_f^T) diag(b)), Y, E, K K^T, the row
  /// terms, dg and dbeta. Every product at the full N.
  __device__ static void algebra(const StateWalkBwdFusedParams& p, const SegmentWalk<Cfg>& range, unsigned char* smem,
                                 mbar_t* bars) {
    // threadIdx.x & 127: the compiler knows the lane's rows are 0..63 (chunk_bwd's lane index).
    const Lane L(static_cast<int>(threadIdx.x) & 127);
    const int ctid = L.ctid, lane = ctid & 31, tq = (lane & 3) * 2;
    const int j = walk_head<Cfg>();
    const int c_last = range.end - 1, nc = range.end - range.begin;
    const Tiles T(smem);
    const float scale = p.scale;
    float* const rt = row_scalars(smem);
    ChunkInfo next = nc > 0 ? p.chunks[c_last] : ChunkInfo{};
    // A1 of chunk u + 1 runs at chunk u's end, before A6's row terms of chunk u: the values'
    // chain of chunk u + 1 waits for P~ and not for the row terms, which no role waits for.
    float QK[32];
    int m_before = 0;
    long long t0_before = 0;
    float szs_before = 0.f;
#pragma unroll 1
    for (int u = 0; u <= nc; ++u) {
      if (u < nc) {
        if constexpr (kRawQK) {
          // The rows' saved rstd, read before scores() waits for Q to land.
          const int hq = j / G;
          float rq[2];
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) rq[hh] = L.r[hh] < next.len ? p.rstd_q[(next.start + L.r[hh]) * H + hq] : 0.f;
          scores(bars, smem, T, L, scale, u, QK, rq);
        } else {
          scores(bars, smem, T, L, scale, u, QK);
        }
      }
      if (u > 0) row_terms(p, smem, bars, ctid, j, u - 1, m_before, t0_before, szs_before);
      if (u == nc) break;
      const ChunkInfo ci = next;
      if (u + 1 < nc) next = p.chunks[c_last - u - 1];
      const int m = ci.len;
      const long long t0 = ci.start;
      m_before = m;
      t0_before = t0;
      const u32 ph = u & 1;
      float* const sc = scalars(smem, u);
      const float* g = sc + CB::sG;
      const float* b = sc + CB::sB;
      const u32 tk = wg::smem_u32(smem) + k_off(u);

      // A2. dS~ = scale * tril0((dO V'^T) .* Dec) into P once the values' dv_local^T read P~; the M
      //     sums M = dS~ .* (Q K^T), strictly lower: rowsum(M) - colsum(M) enters dgam.
      u32 ds[16];
      {
        float Ad[32];
        wait_full(bars, gO, u);
        wait_full(bars, gVn, u);
        mma<64, 0, 0, V / 16>(Ad, kmaj(T.o, C), kmaj(T.vn, C), false);
        wg::commit();
        CB::template wait<0>(Ad);
        pipe::mbar_arrive(bars + bEmpty + gVn);  // dO V'^T read V'
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int r = L.r[hh];
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            const int c = 8 * i + tq;
            const float2 gc = pair_at(g, c);
            const float e0 = exp2_ftz(fminf(g[r] - gc.x, 0.f)), e1 = exp2_ftz(fminf(g[r] - gc.y, 0.f));
            const float v0 = select_f32(r >= c, scale * Ad[4 * i + 2 * hh] * e0, 0.f);
            const float v1 = select_f32(r >= c + 1, scale * Ad[4 * i + 2 * hh + 1] * e1, 0.f);
            ds[2 * i + hh] = f2bf_pair(v0, v1);
          }
        }
      }
      pipe::named_sync_roles(kBarPRead, 256);  // the values' dv_local^T read P~
#pragma unroll
      for (int i = 0; i < 8; i += 2) CB::stsm_pairs(T.p, i, L, ds[2 * i], ds[2 * i + 1], ds[2 * i + 2], ds[2 * i + 3]);
      wg::fence_smem_for_async();
      pipe::named_arrive_roles(kBarDS, 256);  // dS~ whole, for the values' dS~^T Q
      {
        float rs[2] = {0.f, 0.f};
        float cs[16];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          cs[2 * i] = cs[2 * i + 1] = 0.f;
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            const int r = L.r[hh], c = 8 * i + tq;
            const float m0 = r > c ? QK[4 * i + 2 * hh] * CB::lo_f(ds[2 * i + hh]) : 0.f;
            const float m1 = r > c + 1 ? QK[4 * i + 2 * hh + 1] * CB::hi_f(ds[2 * i + hh]) : 0.f;
            rs[hh] += m0 + m1;
            cs[2 * i] += m0;
            cs[2 * i + 1] += m1;
          }
        }
        quad_sums(rs);
        put_rows(rt + CB::sAttR, rs, L);
        put_cols(rt + CB::sAttC, cs, L);
      }

      // A3. dQ = scale diag(exp2(gc)) dO S^T, its row sum with Q, + dS~ K; dq leaves from the
      //     registers.
      {
        float D[64];
        wait_full(bars, gS, u);
        mma<128, 0, 0, V / 16>(D, kmaj(T.o, C), kmaj(T.s, K), false);
        wg::commit();
        CB::template wait<0>(D);
        pipe::mbar_arrive(bars + bORead);       // dO V'^T and dO S^T read dO
        pipe::mbar_arrive(bars + bEmpty + gS);  // dO S^T read S
        float rs[2] = {0.f, 0.f};
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const float f = scale * exp2_ftz(fminf(g[L.r[hh]], 0.f));
#pragma unroll
          for (int i = 0; i < 16; ++i) {
            D[4 * i + 2 * hh] *= f;
            D[4 * i + 2 * hh + 1] *= f;
          }
        }
        if constexpr (kRawQK) wait_full(bars, gQ, u);  // Q normalized (scores() read it raw)
        row_dot_ldsm(T.q, D, L, rs);
        quad_sums(rs);
        put_rows(rt + CB::sGq, rs, L);
        pipe::named_sync(kBarAlgebra, 128);  // every warp's dS~ is in P
        mma<128, 0, 1, C / 16>(D, kmaj(T.p, C), mnmaj(tk, C), true);
        wg::commit();
        CB::template wait<0>(D);
        pipe::mbar_arrive(bars + bEmpty + gQ);  // Q K^T and dQ's row sum read Q
        store_acc_rows(m, D, L, p.out.dq_v + (t0 * HV + j) * K, (long long)HV * K);
      }

      // A4. dTm = tril1((dW K^T) diag(b Gam) + (dV' V^T) diag(b)) = tril1((dV' W_f^T) diag(b)) as
      //     one bf16 tile into Lo (the algebra's and the values' own); Y = dTm Tm^T over it. dTm, Y
      //     and E are each rounded once to bf16, as FLA rounds its dots' operands.
      pipe::named_sync_roles(kBarWf, 256);  // W_f whole over V's tile (and dV' before it)
      {
        float T2[32];
        mma<64, 0, 0, V / 16>(T2, kmaj(T.dv, C), kmaj(T.v, C), false);
        wg::commit();
        CB::template wait<0>(T2);
        pipe::mbar_arrive(bars + bEmpty + gV);  // dV' W_f^T read V's tile
        u32 t2[16];
#pragma unroll
        for (int i = 0; i < 8; ++i)
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            const float2 bc = pair_at(b, 8 * i + tq);
            float v[2];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int r = L.r[hh], c = 8 * i + tq + e;
              v[e] = select_f32(r > c, (e ? bc.y : bc.x) * T2[4 * i + 2 * hh + e], 0.f);
            }
            t2[2 * i + hh] = pack(v[0], v[1]);
          }
#pragma unroll
        for (int i = 0; i < 8; i += 2)
          CB::stsm_pairs(T.lo, i, L, t2[2 * i], t2[2 * i + 1], t2[2 * i + 2], t2[2 * i + 3]);
      }
      wg::fence_smem_for_async();
      pipe::named_sync(kBarAlgebra, 128);  // dTm whole
      {
        float Y[32];
        wait_full(bars, gT, u);
        mma<64, 0, 0, C / 16>(Y, kmaj(T.lo, C), kmaj(T.t, C), false);
        wg::commit();
        CB::template wait<0>(Y);
        u32 yh[16];
#pragma unroll
        for (int i = 0; i < 8; ++i)
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) yh[2 * i + hh] = pack(Y[4 * i + 2 * hh], Y[4 * i + 2 * hh + 1]);
        pipe::named_sync(kBarAlgebra, 128);  // every warp's Y product read dTm
#pragma unroll
        for (int i = 0; i < 8; i += 2)
          CB::stsm_pairs(T.lo, i, L, yh[2 * i], yh[2 * i + 1], yh[2 * i + 2], yh[2 * i + 3]);
      }
      wg::fence_smem_for_async();
      pipe::named_sync(kBarAlgebra, 128);  // Y whole

      // A5. E = tril1(-Tm^T Y) .* Dec and K K^T beside it; Eb + Eb^T over Y; the E sums.
      {
        float X[32], KK[32];
        mma<64, 1, 1, C / 16>(X, mnmaj(T.t, C), mnmaj(T.lo, C), false);
        mma<64, 0, 0, K / 16>(KK, kmaj(tk, C), kmaj(tk, C), false);
        wg::commit();
        CB::template wait<0>(KK, X);
        pipe::mbar_arrive(bars + bEmpty + gT);  // Y and Tm^T Y read Tm
        pipe::named_sync(kBarAlgebra, 128);     // every warp's Tm^T Y read Y
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const float2 gc = pair_at(g, 8 * i + tq);
#pragma unroll
          for (int hh = 0; hh < 2; ++hh)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int r = L.r[hh], c = 8 * i + tq + e;
              float& v = X[4 * i + 2 * hh + e];
              const float gate = exp2_ftz(fminf(g[r] - (e ? gc.y : gc.x), 0.f));  // not Dec: live to here it spills
              v = select_f32(r > c, -v * gate, 0.f);
            }
        }
        store_e_half(T.lo, half_of(X, 0), b, L, 0);
        store_e_half(T.lo, half_of(X, 1), b, L, 1);
        wg::fence_smem_for_async();
        pipe::named_arrive_roles(kBarE, 256);  // E whole, for the values' (Eb + Eb^T) K
        // The owner's update read dOs in dO's slot (it arrives on no `empty` of dO's), and <S, Zb>
        // is written, for A6.
        pipe::mbar_wait(bars + bZDone, ph);
        szs_before = ((sc[sSzAt] + sc[sSzAt + 1]) + sc[sSzAt + 2]) + sc[sSzAt + 3];
        pipe::mbar_arrive(bars + bEmpty + gO);
        float rs[2] = {0.f, 0.f};
        float cs[16];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          cs[2 * i] = cs[2 * i + 1] = 0.f;
#pragma unroll
          for (int hh = 0; hh < 2; ++hh)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const float v = KK[4 * i + 2 * hh + e] * X[4 * i + 2 * hh + e];
              rs[hh] += v;
              cs[2 * i + e] += b[L.r[hh]] * v;
            }
        }
        quad_sums(rs);
        put_rows(rt + CB::sR2, rs, L);
        put_cols(rt + CB::sCs, cs, L);
      }

      // Chunk u + 1's scores (the loop's next pass) once the values' row terms are in and their
      // dS~^T Q has read P; then this chunk's row terms.
      pipe::named_sync_roles(kBarRows, 256);
    }
  }

  /// Warpgroup 2, the values (design 3.14, version 3's K role): the chain D^T, dv_local^T, dV';
  /// dvb, the update's factor X, dv and dbeta's V term; U = K S, R1 and W_f over V's tile; dK =
  /// diag(exp2(gcL - gc)) V' Zb^T + dS~^T Q + X S^T + (Eb + Eb^T) K. Every product at the full N.
  __device__ static void values(const StateWalkBwdFusedParams& p, const SegmentWalk<Cfg>& range, unsigned char* smem,
                                mbar_t* bars) {
    const Lane L(static_cast<int>(threadIdx.x) & 127);
    const int ctid = L.ctid, warp = ctid >> 5, lane = ctid & 31, tq = (lane & 3) * 2;
    const int j = walk_head<Cfg>();
    const int c_last = range.end - 1, nc = range.end - range.begin;
    const Tiles T(smem);
    float* const rt = row_scalars(smem);
    ChunkInfo next = nc > 0 ? p.chunks[c_last] : ChunkInfo{};
#pragma unroll 1
    for (int u = 0; u < nc; ++u) {
      const ChunkInfo ci = next;
      if (u + 1 < nc) next = p.chunks[c_last - u - 1];
      const int m = ci.len;
      const long long t0 = ci.start;
      const u32 ph = u & 1, prev = (u - 1) & 1;
      float* const sc = scalars(smem, u);
      const float* g = sc + CB::sG;
      const float* b = sc + CB::sB;
      const u32 tk = wg::smem_u32(smem) + k_off(u);

      // K1. The chain: D^T = bf16(Z)^T K^T for the 128 value rows, issued before P~ is whole; then
      //     per m64 half of the value rows dv_local^T = dO^T P~ and dV'^T = exp2(gcL - gc_t) D^T +
      //     bf16(dv_local^T) into the dV' tile as [t][v] rows.
      wait_full(bars, gK, u);
      pipe::mbar_wait(bars + bZFull, ph);
      {
        float D0[32], D1[32], Lc[32];
        wg::fence();
#pragma unroll
        for (int ks = 0; ks < K / 16; ++ks)
          wg::mma_m64n64k16<1, 0>(D0, wg::step_mn_major(T.zb, K, ks), wg::step_k_major(tk, C, ks), ks > 0);
#pragma unroll
        for (int ks = 0; ks < K / 16; ++ks)
          wg::mma_m64n64k16<1, 0>(D1, wg::step_mn_major(T.zb + K * 128, K, ks), wg::step_k_major(tk, C, ks), ks > 0);
        wg::commit();
        // The dV' factors exp2(gcL - gc_t), this warpgroup's own (written and read by it alone).
        if (ctid < C) rt[sEv + ctid] = exp2_ftz(fminf(g[m - 1] - g[ctid], 0.f));
        pipe::named_sync_roles(kBarPair, 256);  // P~ whole; the dV' factors
        wait_full(bars, gO, u);
        const u32 vec = wg::smem_u32(rt + sEv);
        wg::fence();
#pragma unroll
        for (int ks = 0; ks < C / 16; ++ks)
          wg::mma_m64n64k16<1, 1>(Lc, wg::step_mn_major(T.o, C, ks), wg::step_mn_major(T.p, C, ks), ks > 0);
        wg::commit();
        wg::wait<0>();
        wg::fence_acc(D0);
        wg::fence_acc(D1);
        wg::fence_acc(Lc);
        if (u > 0) pipe::mbar_wait(bars + bDvEmpty, prev);             // the owner's update of the chunk before
        stage_dv_prime<C, true>(T.dv, vec, D0, Lc, C, 0, warp, lane);  // no mask: rows past len are zeros
        wg::fence();
#pragma unroll
        for (int ks = 0; ks < C / 16; ++ks)
          wg::mma_m64n64k16<1, 1>(Lc, wg::step_mn_major(T.o + C * 128, C, ks), wg::step_mn_major(T.p, C, ks), ks > 0);
        wg::commit();
        wg::wait<0>();
        wg::fence_acc(Lc);
        pipe::named_arrive_roles(kBarPRead, 256);  // dv_local^T read P~: dS~ may go over it
        pipe::mbar_arrive(bars + bORead);          // and dO
        pipe::mbar_arrive(bars + bEmpty + gO);
        stage_dv_prime<C, true>(T.dv, vec, D1, Lc, C, 64, warp, lane);
      }
      wg::fence_smem_for_async();
      pipe::named_sync(kBarValues, 128);
      pipe::mbar_arrive(bars + bDvFull);

      // K2. dvb = Tm^T dV', then the update's factor X = -diag(b exp2(gc)) dvb into W's tile (the
      //     owner's W^T bf16(dV') is K^T X: docs/design_fused_bwd_sm90.md 3.12); dv = diag(b) dvb
      //     and dbeta's V term.
      float Xb[64];
      wait_full(bars, gT, u);
      mma<128, 1, 1, C / 16>(Xb, mnmaj(T.t, C), mnmaj(T.dv, C), false);
      wg::commit();
      CB::template wait<0>(Xb);
      pipe::mbar_arrive(bars + bEmpty + gT);  // dvb read Tm
      {
        const float f0 = b[L.r[0]], f1 = b[L.r[1]];
        {
          const float x0 = -(f0 * exp2_ftz(g[L.r[0]])), x1 = -(f1 * exp2_ftz(g[L.r[1]]));
          // The lane laundered: the compiler would otherwise hoist the swizzled addresses out of
          // the chunk loop and keep them live (spilled).
          Lane Lx = L;
          asm volatile("" : "+r"(Lx.ctid), "+r"(Lx.w));
#pragma unroll
          for (int i = 0; i < 16; i += 2) {
            auto pr = [&](int k) {
              const float x = ((k >> 1) & 1) ? x1 : x0;
              return f2bf_pair(x * Xb[k], x * Xb[k + 1]);
            };
            CB::stsm_pairs(T.w, i, Lx, pr(4 * i), pr(4 * i + 2), pr(4 * i + 4), pr(4 * i + 6));
          }
          wg::fence_smem_for_async();
          pipe::mbar_arrive(bars + bWFull);
        }
        wait_full(bars, gV, u);
        float rs[2] = {0.f, 0.f};
        row_dot_ldsm(T.v, Xb, L, rs);
        quad_sums(rs);
        put_rows(sc + sDbvAt, rs, L);
        u32 dv[32];
#pragma unroll
        for (int i = 0; i < 16; ++i) {
          dv[2 * i] = pack(f0 * Xb[4 * i], f0 * Xb[4 * i + 1]);
          dv[2 * i + 1] = pack(f1 * Xb[4 * i + 2], f1 * Xb[4 * i + 3]);
        }
        store_rows(m, dv, L, p.out.dv + (t0 * HV + j) * V, (long long)HV * V);
      }

      // K3. U = K S by halves of V's columns (loads only), R1 = rowsum((Tm^T dW) .* K) =
      //     -rowsum(dvb .* U) from the registers, and W_f = V - diag(Gam) U over V's tile (its one
      //     other reader, dbeta's V term above, is done); the algebra's dTm takes dV' W_f^T.
      wait_full(bars, gS, u);
      {
        float r1[2] = {0.f, 0.f};
#pragma unroll
        for (int hv = 0; hv < 2; ++hv) {
          float Us[32];
          mma<64, 0, 1, K / 16>(Us, kmaj(tk, C), mnmaj_cols(T.s, K, 64 * hv), false);
          wg::commit();
          CB::template wait<0>(Us);
          // W_f's pairs in place by ldmatrix and stmatrix (each warp its own 16 rows), four pairs
          // an instruction: the same bytes as a 4-byte load and store of each pair.
          const float gam[2] = {exp2_ftz(fminf(g[L.r[0]], 0.f)), exp2_ftz(fminf(g[L.r[1]], 0.f))};
          const int row = pairs_row(L);
#pragma unroll
          for (int i = 0; i < 8; i += 2) {
            const u32 at = pairs_row_addr(T.v, row, 8 * hv + i, L);
            u32 x[4];
            wg::ldsm_x4(x, at);
#pragma unroll
            for (int q = 0; q < 4; ++q) {
              const int hh = q & 1, k = 4 * (i + (q >> 1)) + 2 * hh;
              const float u0 = Us[k], u1 = Us[k + 1];
              r1[hh] -= Xb[32 * hv + k] * u0 + Xb[32 * hv + k + 1] * u1;
              x[q] = pack(CB::lo_f(x[q]) - gam[hh] * u0, CB::hi_f(x[q]) - gam[hh] * u1);
            }
            wg::stsm_x4(at, x);
          }
        }
        quad_sums(r1);
        put_rows(sc + sR1At, r1, L);
      }
      wg::fence_smem_for_async();
      pipe::named_arrive_roles(kBarWf, 256);  // W_f whole, for the algebra's dTm
      pipe::mbar_arrive(bars + bEmpty + gV);  // dv's row dot and W_f's writes are done

      // K4. dK: the state term diag(exp2(gcL - gc)) V' Zb^T with its row sum (dgam's shifted
      //     terms), + dS~^T Q + X S^T (= diag(b Gam) Tm^T dW, dW = -dV' S^T never formed).
      float Dk[64];
      wait_full(bars, gVn, u);
      mma<128, 0, 0, V / 16>(Dk, kmaj(T.vn, C), kmaj(T.zb, K), false);
      wg::commit();
      CB::template wait<0>(Dk);
      pipe::named_sync(kBarValues, 128);  // every warp's D^T and dKst have read bf16(Z)
      pipe::mbar_arrive(bars + bZEmpty);
      pipe::mbar_arrive(bars + bEmpty + gVn);
      {
        const float gL = g[m - 1];
        float rs[2] = {0.f, 0.f};
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const float f = exp2_ftz(fminf(gL - g[L.r[hh]], 0.f));
#pragma unroll
          for (int i = 0; i < 16; ++i) {
            Dk[4 * i + 2 * hh] *= f;
            Dk[4 * i + 2 * hh + 1] *= f;
          }
        }
        row_dot_ldsm(tk, Dk, L, rs);
        quad_sums(rs);
        put_rows(sc + sKstAt, rs, L);
      }
      pipe::named_sync_roles(kBarDS, 256);  // dS~ whole
      wait_full(bars, gQ, u);               // ordered by the algebra's wait already; explicit for cp.async's rows
      mma<128, 1, 1, C / 16>(Dk, mnmaj(T.p, C), mnmaj(T.q, C), true);
      pipe::mbar_wait(bars + bWFull, ph);  // every warp's X
      mma<128, 0, 0, V / 16>(Dk, kmaj(T.w, C), kmaj(T.s, K), true);
      wg::commit();
      CB::template wait<0>(Dk);
      pipe::mbar_arrive(bars + bEmpty + gQ);    // dS~^T Q read Q
      pipe::mbar_arrive(bars + bEmpty + gS);    // K S and X S^T read S
      pipe::named_arrive_roles(kBarRows, 256);  // sDbv, sR1, sKst are in; dS~ is read

      // K5. dK += (Eb + Eb^T) K once E is whole; dk leaves from the registers.
      pipe::named_sync_roles(kBarE, 256);
      mma<128, 0, 1, C / 16>(Dk, kmaj(T.lo, C), mnmaj(tk, C), true);
      wg::commit();
      CB::template wait<0>(Dk);
      pipe::mbar_arrive(empty_of(bars, gK, u));
      store_acc_rows(m, Dk, L, p.out.dk_v + (t0 * HV + j) * K, (long long)HV * K);
    }
  }

  /// CB::store_e for the column blocks of half h (4 h .. 4 h + 3; X[4 ii + 2 hh + e] at column
  /// 32 h + 8 ii + tq + e): each block below the diagonal and its mirror belong to one half, so the
  /// two halves write disjoint 8 x 8 blocks.
  __device__ __forceinline__ static void store_e_half(u32 e_tile, const float (&X)[16], const float* b, const Lane& L,
                                                      int h) {
    const int lane = L.ctid & 31, w = L.w, arow = lane & 7, amat = (lane >> 3) & 1;
#pragma unroll
    for (int ii = 0; ii < 4; ++ii) {
      const int i = 4 * h + ii;
      u32 ep[2];
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        float v[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int r = L.r[hh], c = 8 * i + L.tq + e;
          v[e] = select_f32(r > c, b[r] * X[4 * ii + 2 * hh + e], 0.f);
        }
        ep[hh] = pack(v[0], v[1]);
      }
      const u32 direct = CB::swz(16 * w + 8 * amat + arow, 8 * i, C);
      if (i < 2 * w) {
        const u32 mirror = CB::swz(8 * i + arow, 16 * w + 8 * amat, C);
        wg::stsm_x2(e_tile + direct, ep[0], ep[1]);
        wg::stsm_x2_trans(e_tile + mirror, ep[0], ep[1]);
      } else if (i == 2 * w) {
        const u32 mirror = CB::swz(8 * i + arow, 16 * w + 8, C);
        wg::stsm_x2(e_tile + direct, ep[0] | wg::movmatrix_trans(ep[0]), ep[1]);
        wg::stsm_x1_trans(e_tile + mirror, ep[1]);
      } else if (i == 2 * w + 1) {
        const u32 diag = CB::swz(16 * w + 8 + arow, 8 * i, C);
        wg::stsm_x1(e_tile + diag, ep[1] | wg::movmatrix_trans(ep[1]));
      }
    }
  }

  /// dOs = f_t dO_t rounded once to bf16, in place over dO's slot (f_t from `vec`): the update's
  /// dO term takes one product, as FLA's and FlashQLA's take their scaled q or dO.
  template <int CC, int VW>
  __device__ __forceinline__ static void scale_rows_bf16(u32 addr, u32 vec, int ctid) {
#pragma unroll 2
    for (int i = 0; i < CC * VW * 2 / 16 / 128; ++i) {
      const u32 x = static_cast<u32>(i * 128 + ctid) * 16u;
      const int t = static_cast<int>((x % static_cast<u32>(CC * 128)) >> 7);
      const float f = wg::lds_f32(vec + 4 * t);
      const uint4 o = wg::lds_v4(addr + x);
      const u32 ow[4] = {o.x, o.y, o.z, o.w};
      u32 hw[4];
#pragma unroll
      for (int e = 0; e < 4; ++e)
        hw[e] = f2bf_pair(f * bf2f(static_cast<bf16_t>(ow[e] & 0xffffu)), f * bf2f(static_cast<bf16_t>(ow[e] >> 16)));
      wg::sts_v4(addr + x, make_uint4(hw[0], hw[1], hw[2], hw[3]));
    }
  }

  /// Warpgroup 3, the gradient's owner (all 128 x 128 of Z^T, design 3.7), with <S, Zb> (chunk_bwd's order).
  __device__ static void owner(const StateWalkBwdFusedParams& p, const SegmentWalk<Cfg>& range, unsigned char* smem,
                               mbar_t* bars) {
    const int ctid = static_cast<int>(threadIdx.x) - 384, warp = ctid >> 5, lane = ctid & 31;
    constexpr int kBar = kBarOwner;
    const int j = walk_head<Cfg>(), n = range.n;
    const int c_last = range.end - 1, nc = range.end - range.begin;
    const int tq = (lane & 3) * 2, m_lane = lane >> 3;
    const int v_lo = warp * 16 + (lane >> 2), v_hi = v_lo + 8;
    const u32 s0 = wg::smem_u32(smem);
    const u32 zb = s0 + kOffZb, hi_addr = s0 + kOffO;
    const u32 w_addr = s0 + kOffW, q_addr = s0 + kOffQ;
    const float scale = p.scale;
    float* const rt = row_scalars(smem);

    float Z0[64], Z1[64];
    auto for_state = [&](long long base, auto&& f) {
#pragma unroll
      for (int half = 0; half < 2; ++half)
#pragma unroll
        for (int i = 0; i < K / 8; ++i)
#pragma unroll
          for (int hh = 0; hh < 2; ++hh)
#pragma unroll
            for (int e = 0; e < 2; ++e)
              f((half ? Z1 : Z0)[4 * i + 2 * hh + e],
                base + (long long)(8 * i + tq + e) * V + 64 * half + (hh ? v_hi : v_lo));
    };
    if (!Carry::load_end(p, range, j, for_state)) {
#pragma unroll
      for (int i = 0; i < 64; ++i) Z0[i] = Z1[i] = 0.f;
    }

    ChunkInfo next = nc > 0 ? p.chunks[c_last] : ChunkInfo{};
#pragma unroll 1
    for (int u = 0; u < nc; ++u) {
      const ChunkInfo ci = next;
      if (u + 1 < nc) next = p.chunks[c_last - u - 1];
      const int len = ci.len;
      const u32 ph = u & 1, prev = (u - 1) & 1;
      float* const sc = scalars(smem, u);
      const u32 vec = wg::smem_u32(rt + sEo);
      const u32 k_addr = s0 + k_off(u);

      // bf16(Z^T) as [k][v] rows once the values' D^T and dKst of the chunk before read the tile.
      if (u > 0) pipe::mbar_wait(bars + bZEmpty, prev);
      pipe::named_sync(kBar, 128);  // and this warpgroup's <S, Zb> of the chunk before
#pragma unroll
      for (int half = 0; half < 2; ++half)
#pragma unroll
        for (int ks = 0; ks < K / 16; ++ks) {
          u32 zf[4];
          const float* Zh = half ? Z1 : Z0;
#pragma unroll
          for (int q = 0; q < 4; ++q) zf[q] = pack(Zh[8 * ks + 2 * q], Zh[8 * ks + 2 * q + 1]);
          const int r = 16 * ks + 8 * (m_lane >> 1) + (lane & 7), v = 64 * half + 16 * warp + 8 * (m_lane & 1);
          wg::stsm_x4_trans(zb + sw128::offset(r, v, K), zf);
        }
      wg::fence_smem_for_async();
      pipe::named_sync(kBar, 128);
      pipe::mbar_arrive(bars + bZFull);

      // <S, Zb> over the two tiles' bytes in chunk_bwd's order (their layouts are the same).
      wait_full(bars, gS, u);
      {
        float sz = 0.f;
        const uint4* S = reinterpret_cast<const uint4*>(smem + kOffS);
        const uint4* Zt = reinterpret_cast<const uint4*>(smem + kOffZb);
#pragma unroll 2
        for (int i = 0; i < kSq / 16 / 128; ++i) {
          const uint4 a = S[i * 128 + ctid], z = Zt[i * 128 + ctid];
          sz += CB::lo_f(a.x) * CB::lo_f(z.x) + CB::hi_f(a.x) * CB::hi_f(z.x);
          sz += CB::lo_f(a.y) * CB::lo_f(z.y) + CB::hi_f(a.y) * CB::hi_f(z.y);
          sz += CB::lo_f(a.z) * CB::lo_f(z.z) + CB::hi_f(a.z) * CB::hi_f(z.z);
          sz += CB::lo_f(a.w) * CB::lo_f(z.w) + CB::hi_f(a.w) * CB::hi_f(z.w);
        }
        sz = warp_sum(sz);
        if (lane == 0) sc[sSzAt + warp] = sz;
      }
      pipe::mbar_arrive(bars + bEmpty + gS);

      // dOs = scale exp2(min(gc_t, 0)) dO_t in bf16 over dO, once the algebra and the values
      // have read it.
      wait_full(bars, gK, u);
      const float gl = sc[CB::sG + len - 1];
      if (ctid < C) rt[sEo + ctid] = scale * exp2_ftz(fminf(sc[CB::sG + ctid], 0.f));
      pipe::mbar_wait(bars + bORead, ph);
      wait_full(bars, gO, u);
      pipe::named_sync(kBar, 128);
      scale_rows_bf16<C, V>(hi_addr, vec, ctid);  // over dO
      wg::fence_smem_for_async();
      pipe::named_sync(kBar, 128);

      const float decay = exp2_ftz(fminf(gl, 0.f));
#pragma unroll
      for (int i = 0; i < 64; ++i) {
        Z0[i] *= decay;
        Z1[i] *= decay;
      }
      wait_full(bars, gQ, u);
      wg::fence();
#pragma unroll
      for (int ks = 0; ks < C / 16; ++ks) {
        wg::mma_k16<128, 1, 1>(Z0, wg::step_mn_major(hi_addr, C, ks), wg::step_mn_major(q_addr, C, ks), 1);
        wg::mma_k16<128, 1, 1>(Z1, wg::step_mn_major(hi_addr + C * 128, C, ks), wg::step_mn_major(q_addr, C, ks), 1);
      }
      wg::commit();
      pipe::mbar_wait(bars + bDvFull, ph);
      pipe::mbar_wait(bars + bWFull, ph);
      wg::fence();
#pragma unroll
      for (int ks = 0; ks < C / 16; ++ks) {
        wg::mma_k16<128, 1, 1>(Z0, wg::step_mn_major(w_addr, C, ks), wg::step_mn_major(k_addr, C, ks), 1);
        wg::mma_k16<128, 1, 1>(Z1, wg::step_mn_major(w_addr + C * 128, C, ks), wg::step_mn_major(k_addr, C, ks), 1);
      }
      wg::commit();
      wg::wait<0>();
      wg::fence_acc(Z0);
      wg::fence_acc(Z1);
      pipe::named_sync(kBar, 128);  // every warp's update has read the tiles
      pipe::mbar_arrive(bars + bDvEmpty);
      pipe::mbar_arrive(bars + bEmpty + gQ);
      pipe::mbar_arrive(empty_of(bars, gK, u));
      pipe::mbar_arrive(bars + bZDone);
      Carry::checkpoint(p, range, j, u, for_state);
    }
    // The verify walk's vote is over all 128 columns here; the window's outputs were written from
    // the true carry above, so a chain that verifies needs nothing more.
    if (!Carry::finish(p, range, j, nc, kBar, 128, ctid, for_state)) return;
    if (Cfg::HAS_H0 && p.dh0 != nullptr)
      for_state(((long long)n * HV + j) * K * V, [&](float& x, long long at) { p.dh0[at] = x; });
  }
};

/// The program's class (StateWalkBwd, state_walk_bwd.cuh) on sm_90a under WALK_FUSED.
template <class Cfg>
struct StateWalkBwdSm90Pick<Cfg, true> {
  using type = WalkBwdFusedSm90<Cfg>;
};

}  // namespace gdn

#endif  // GDN_HAS_WGMMA
