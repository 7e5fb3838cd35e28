/**
 * @file walk_bwd_fused_sm90.cuh
 * @brief The fused backward on sm_90a (walk_bwd_layout "fused", docs/design_fused_bwd_sm90.md
 *        3.9): the reverse state walk (B2, B3) and chunk_bwd's body (B4-B6) in one persistent block
 *        per (document, value head), chunks walked last to first. The dh tape and dv_new never leave
 *        the block: bf16(Z) and dV' of a chunk are shared tiles that the chunk's body reads where
 *        chunk_bwd loaded them. Every product keeps its operands, rounding and k order from
 *        state_walk_bwd_sm90.cuh (z_owner layout) and chunk_bwd_sm90.cuh, and every epilogue its
 *        arithmetic, so the results are the programs path's bits.
 *
 * Warpgroups (setmaxnreg 32 / 160 / 160 / 160: the value side and the algebra spill more at 152):
 *  - P, the producer: TMA loads of a chunk's tiles into single slots (cp.async with the rows past
 *    the length zero-filled for a chunk cut short), each group of slots refilled for the next
 *    chunk as soon as its last reader has arrived on the group's `empty` barrier.
 *  - A, the 64 x 64 algebra: P~ = Q K^T gated, -W (formed from Tm, beta, gc and K), dS~ = dO V'^T
 *    with the M sums, dQ = dO S^T + dS~ K, dW = -dV' S^T, dTm, Y = dTm Tm^T, E = tril1(-Tm^T Y),
 *    K K^T, the row terms, dg and dbeta; stores dq.
 *  - X, the value side: dv_local^T = dO^T P~ and D^T = Zb^T K^T (the walk's), dV' into its tile,
 *    dvb = Tm^T dV' (dv, dbeta's V term), dK = diag(exp2(gcL - gc)) V' Zb^T + dS~^T Q +
 *    diag(b Gam) Tm^T dW + (Eb + Eb^T) K with its row terms; stores dv and dk.
 *  - Z, the gradient's owner: Z^T (128 x 128 fp32 in registers), bf16(Z) into its tile, <S, Zb>,
 *    dOs hi over dO's slot and lo into its own, the update Z^T = exp2(gcL) Z^T + (dOs hi)^T Q +
 *    (dOs lo)^T Q + dV'^T (-W); dh0 at the end.
 * The chain from chunk to chunk is bf16(Z) -> D -> dV' -> the update. Every mbarrier completes
 * once per chunk (a waiter of chunk u waits parity u & 1) and has ONE arriving warpgroup, or
 * several whose arrivals for chunk u + 1 all follow its completion for chunk u (the load groups'
 * `empty`, which each arriver reaches only after the group's next `full`; bDvEmpty, whose arrivals
 * follow bDvFull, which X arrives after waiting bDvEmpty; bORead, whose arrivals follow bPRead
 * and the next dO, both after the owner's wait): a barrier cannot take a later chunk's arrival
 * into an earlier phase, nor complete twice before a waiter looks. The owner reads the scalars
 * of the K / Tm group without arriving on its `empty`: the two buffers by chunk parity cover it,
 * since X's arrival for chunk u + 1 follows bZFull(u + 1), which the owner arrives after chunk u.
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
  static_assert(Cfg::SEGMENTS == 1 && Cfg::RANKS == 1 && Cfg::WALK_FUSES_W,
                "WalkBwdFusedSm90: one segment, one rank, W formed in the walk");
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
    kOffLo = Lay::fu_off_tok(Lay::fu_lo, K, C),
    kOffS = Lay::fu_off_s(K, C),
    kOffZb = Lay::fu_off_zb(K, C),
    kOffT = Lay::fu_off_t(K, C),
    kOffP = Lay::fu_off_p(K, C),
    kOffSc = Lay::fu_off_sc(K, C),
    kScBytes = Lay::fu_sc_bytes(C),
    kOffBar = Lay::fu_off_bar(K, C)
  };
  // One chunk's scalars (floats): chunk_bwd's (gc, beta and the row terms, at its offsets), then
  // the dOs factor scale exp2(min(gc_t, 0)) (Z) and the dV' factor exp2(gcL - gc_t) (X).
  enum : int { sEo = 1160, sEv = 1224, kScFloats = 1288 };
  static_assert(CB::kScalarFloats <= sEo && kScFloats * 4 == Lay::fu_sc_bytes(64), "the scalars' layout");

  // The tensor maps (Program::tensor_maps in this order): the walk's loads, then chunk_bwd's.
  enum TmaOperand { kMapK, kMapQ, kMapT, kMapO, kMapS, kMapVn, kMapV, kMapDq, kMapDk, kMapDv, kMaps };

  // mbarriers. Load groups, each a full (129 arrivals: the producer's cp.async arrivals and the
  // TMA issue) and an empty: K, Tm and the scalars; Q; V; dO; V'; the h tape.
  enum LoadGroup : int { gKT, gQ, gV, gO, gVn, gS, kGroups };
  enum Barrier : int {
    bFull = 0,             // + group
    bEmpty = kGroups,      // + group
    bZFull = 2 * kGroups,  // Z: bf16(Z) is in its tile
    bZEmpty,               // X: D and dKst have read it
    bPFull,                // A: P~ is in P
    bPRead,                // X: dv_local has read P~ (A may write dS~ over it)
    bDsFull,               // A: dS~ is in P (and A's dS~ has read V')
    bPEmpty,               // X: dS~^T Q has read dS~
    bWFull,                // A: -W is in W
    bWEmpty,               // X: dk's store has read W
    bDvFull,               // X: dV' is in its tile
    bDvEmpty,              // Z and A: the update, dW and dV' V^T have read dV'
    bZDone,                // Z: the update read dOs hi, lo, -W; <S, Zb> is written
    bORead,                // X and A: dv_local, dS~ and dO S^T have read dO
    bDwFull,               // A: dW is in W
    bEFull,                // A: E hi, lo are in Lo
    bERead,                // X: E K has read Lo
    bXTerms,               // X: its row terms are written
    kBarriers
  };
  static_assert(kBarriers <= Lay::kFuBarriers, "the layout's mbarrier slots");

  static constexpr int kProducerRegs = 32, kAlgebraRegs = 160, kValueRegs = 160, kOwnerRegs = 160;
  static_assert(kProducerRegs + kAlgebraRegs + kValueRegs + kOwnerRegs <= 4 * 128,
                "setmaxnreg: the block's pinned registers");

  __device__ __forceinline__ static u32 pack(float lo, float hi) { return f2bf_pair(lo, hi); }
  __device__ __forceinline__ static void wait_full(mbar_t* bars, int g, int u) {
    pipe::mbar_wait(bars + bFull + g, u & 1);
    wg::fence_smem_for_async();  // a cut chunk's cp.async writes are read by wgmma
  }
  __device__ __forceinline__ static float* scalars(unsigned char* smem, int u) {
    return reinterpret_cast<float*>(smem + kOffSc + (u & 1) * kScBytes);
  }

  __device__ static void run(const StateWalkBwdParams& p, const TensorMaps& maps) {
    extern __shared__ unsigned char smem_raw[];
    // SW128 tiles need 1024-byte aligned addresses; the layout reserves the slack.
    unsigned char* const smem = smem_raw + ((1024u - (wg::smem_u32(smem_raw) & 1023u)) & 1023u);
    SegmentWalk<Cfg> range(p.doc_chunk_offset, p.chunks, p.doc_order);
    if (!range.active) return;
    if (!Carry::prepare(range, p, walk_head<Cfg>())) return;  // every thread: a block-wide vote
    mbar_t* const bars = reinterpret_cast<mbar_t*>(smem + kOffBar);
    if (threadIdx.x == 0) {
      for (int g = 0; g < kGroups; ++g) pipe::mbar_init(bars + bFull + g, 129);
      pipe::mbar_init(bars + bEmpty + gKT, 256);  // A, X
      pipe::mbar_init(bars + bEmpty + gQ, 384);   // A, X, Z
      pipe::mbar_init(bars + bEmpty + gV, 256);   // A, X
      pipe::mbar_init(bars + bEmpty + gO, 128);   // A (dq's store read the slot)
      pipe::mbar_init(bars + bEmpty + gVn, 128);  // X (dv's store read the slot)
      pipe::mbar_init(bars + bEmpty + gS, 256);   // A, Z
      for (int b = bZFull; b < kBarriers; ++b) pipe::mbar_init(bars + b, (b == bDvEmpty || b == bORead) ? 256 : 128);
      pipe::fence_mbar_init();
    }
    __syncthreads();
    const int role = threadIdx.x / 128;
    if (role == 0) {
      pipe::setmaxnreg_dec<kProducerRegs>();
      producer(p, maps, range, smem, bars);
    } else if (role == 1) {
      pipe::setmaxnreg_inc<kAlgebraRegs>();
      algebra(p, maps, range, smem, bars);
    } else if (role == 2) {
      pipe::setmaxnreg_inc<kValueRegs>();
      value_side(p, maps, range, smem, bars);
    } else {
      pipe::setmaxnreg_inc<kOwnerRegs>();
      owner(p, range, smem, bars);
    }
  }

 private:
  /// One load group of chunk u: its slots' previous readers (chunk u - 1) arrived on `empty`; a
  /// whole chunk (or a group that is always whole) by TMA from thread 0 on the group's
  /// transaction count, a cut chunk by every thread's cp.async; every thread then arrives through
  /// cp.async (the group's scalars, where it has any, are its cp.async).
  template <class Tma, class Copy>
  __device__ __forceinline__ static void load_group(mbar_t* bars, int g, int u, bool tma, u32 bytes, int tid,
                                                    Tma&& issue_tma, Copy&& issue_copies) {
    if (u > 0) pipe::mbar_wait(bars + bEmpty + g, (u - 1) & 1);
    if (tma) {
      if (tid == 0) {
        pipe::mbar_arrive_expect_tx(bars + bFull + g, bytes);
        issue_tma(bars + bFull + g);
      }
    } else {
      issue_copies();
      if (tid == 0) pipe::mbar_arrive(bars + bFull + g);
    }
  }

  __device__ static void producer(const StateWalkBwdParams& p, const TensorMaps& maps, const SegmentWalk<Cfg>& range,
                                  unsigned char* smem, mbar_t* bars) {
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
      // In about the order the chunk before frees the slots (Q at the owner's update, S after dW, V
      // after dV' V^T, V' after dv's store, dO after dq's store, K and Tm at its end).
      load_group(
          bars, gQ, u, whole, kTok, tid,
          [&](mbar_t* b) { pipe::tma_load_tile<C, K>(at(kOffQ), &maps.map[kMapQ], hq * K, row, b); },
          [&] { wg::load_tile_sw128<C, K>(at(kOffQ), p.q + (t0 * H + hq) * K, (long long)H * K, len, tid, copy16); });
      pipe::cp_async_arrive(bars + bFull + gQ);
      load_group(
          bars, gS, u, true, kSq, tid,
          [&](mbar_t* b) {
            pipe::tma_load_tile<K, V>(at(kOffS), &maps.map[kMapS], 0, static_cast<int>((c * HV + j) * K), b);
          },
          [] {});
      pipe::cp_async_arrive(bars + bFull + gS);
      load_group(
          bars, gV, u, whole, kTok, tid,
          [&](mbar_t* b) { pipe::tma_load_tile<C, V>(at(kOffV), &maps.map[kMapV], j * V, row, b); },
          [&] { wg::load_tile_sw128<C, V>(at(kOffV), p.v + hv_row * V, (long long)HV * V, len, tid, copy16); });
      pipe::cp_async_arrive(bars + bFull + gV);
      load_group(
          bars, gVn, u, whole, kTok, tid,
          [&](mbar_t* b) { pipe::tma_load_tile<C, V>(at(kOffVn), &maps.map[kMapVn], j * V, row, b); },
          [&] { wg::load_tile_sw128<C, V>(at(kOffVn), p.v_new + hv_row * V, (long long)HV * V, len, tid, copy16); });
      pipe::cp_async_arrive(bars + bFull + gVn);
      load_group(
          bars, gO, u, whole, kTok, tid,
          [&](mbar_t* b) { pipe::tma_load_tile<C, V>(at(kOffO), &maps.map[kMapO], j * V, row, b); },
          [&] { wg::load_tile_sw128<C, V>(at(kOffO), p.d_o + hv_row * V, (long long)HV * V, len, tid, copy16); });
      pipe::cp_async_arrive(bars + bFull + gO);
      load_group(
          bars, gKT, u, whole, kTok + kCC, tid,
          [&](mbar_t* b) {
            pipe::tma_load_tile<C, K>(at(kOffK), &maps.map[kMapK], hq * K, row, b);
            pipe::tma_load_tile<C, C>(at(kOffT), &maps.map[kMapT], j * C, row, b);
          },
          [&] {
            wg::load_tile_sw128<C, K>(at(kOffK), p.k + (t0 * H + hq) * K, (long long)H * K, len, tid, copy16);
            wg::load_tile_sw128<C, C>(at(kOffT), p.tm + hv_row * C, (long long)HV * C, len, tid, copy16);
          });
      if (tid < C) {  // gc and beta of the chunk into its scalars' buffer (0 past the length)
        float* const sc = scalars(smem, u);
        const bool ok = tid < len;
        const long long a = ok ? (t0 + tid) * HV + j : 0;
        bwd::cp_async4(sc + CB::sG + tid, p.gc + a, ok);
        bwd::cp_async4(sc + CB::sB + tid, p.beta + a, ok);
      }
      pipe::cp_async_arrive(bars + bFull + gKT);
    }
  }

  /// A 64 x 128 tile of bf16 pairs (pr[2 i + hh]: row L.r[hh], columns 8 i + tq, + 1) into the free
  /// SW128 slot at `tile` by stmatrix, then out: a whole chunk by two TMA boxes from the
  /// warpgroup's first thread (after every warp's fence and the warpgroup's barrier), a cut chunk
  /// by each thread's rows below the length.
  __device__ __forceinline__ static void stage_store(const TensorMaps& maps, int map, int col, long long t0, int len,
                                                     u32 tile, const u32 (&pr)[32], const Lane& L, int bar,
                                                     bf16_t* rows, long long stride) {
    if (len == C) {
      const int mi = (L.ctid & 31) >> 3, r = 16 * L.w + 8 * (mi & 1) + (L.ctid & 7);
#pragma unroll
      for (int i = 0; i < 16; i += 2) {
        const u32 f[4] = {pr[2 * i], pr[2 * i + 1], pr[2 * i + 2], pr[2 * i + 3]};
        wg::stsm_x4(tile + sw128::offset(r, 8 * i + 8 * (mi >> 1), C), f);
      }
      wg::fence_smem_for_async();
      pipe::named_sync(bar, 128);
      if (L.ctid == 0) {
#pragma unroll
        for (int b = 0; b < 2; ++b)
          pipe::tma_store_2d(&maps.map[map], col + 64 * b, static_cast<int>(t0), tile + b * C * 128);
        pipe::bulk_commit();
      }
    } else {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int r = L.r[hh];
        if (r >= len) continue;
#pragma unroll
        for (int i = 0; i < 16; ++i) *reinterpret_cast<u32*>(rows + r * stride + 8 * i + L.tq) = pr[2 * i + hh];
      }
    }
  }

  /// The rows of a 64 x 128 accumulator scaled by f[hh] (row L.r[hh]), then rowsum(D .* X) with
  /// the bf16 tile X at byte offset `tile` into out[row] (chunk_bwd's order: one lane a quad writes).
  __device__ __forceinline__ static void scale_rows_and_dot(float (&D)[64], const float (&f)[2],
                                                            const unsigned char* smem, u32 tile, float* out,
                                                            const Lane& L) {
#pragma unroll
    for (int i = 0; i < 16; ++i)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        D[4 * i + 2 * hh] *= f[hh];
        D[4 * i + 2 * hh + 1] *= f[hh];
      }
    float rs[2] = {0.f, 0.f};
    CB::row_dot(smem, tile, D, 0, 16, L, rs);
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const float sum = CB::quad_sum(rs[hh]);
      if ((L.ctid & 3) == 0) out[L.r[hh]] = sum;
    }
  }

  /// Warpgroup 1, the algebra (see the file's comment), in chunk_bwd's arithmetic.
  __device__ static void algebra(const StateWalkBwdParams& p, const TensorMaps& maps, const SegmentWalk<Cfg>& range,
                                 unsigned char* smem, mbar_t* bars) {
    // threadIdx.x & 127, not threadIdx.x - 128: the compiler then knows the lane's rows are 0..63,
    // as in chunk_bwd's scores warpgroup, and folds the same masks of the M sums and contracts the
    // same three products into FMAs there. With the subtraction dgam's attention terms (and so dg)
    // came out of other FMAs and differed from the programs path's bits in the last place.
    const Lane L(static_cast<int>(threadIdx.x) & 127);
    constexpr int kBar = 1;  // this warpgroup's named barrier
    const int j = walk_head<Cfg>();
    const int c_last = range.end - 1, nc = range.end - range.begin;
    const u32 s0 = wg::smem_u32(smem);
    const float scale = p.scale;
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

      // P~ = bf16(scale (Q K^T) exp2(gc_r - gc_c)) on r >= c, r < len: the walk's scores. Q K^T
      // itself stays for the M sums (chunk_bwd's product, the same one).
      float QK[32];
      wait_full(bars, gKT, u);
      wait_full(bars, gQ, u);
      CB::template issue<64, 0, 0>(QK, s0 + kOffQ, C, s0 + kOffK, C, K / 16, false);
      wg::commit();
      CB::template wait<0>(QK);
      if (u > 0) pipe::mbar_wait(bars + bPEmpty, prev);  // X's dS~^T Q of the chunk before
      {
        const int r_lo = L.r[0], r_hi = L.r[1], tq = L.tq;
        const float g_lo = g[r_lo], g_hi = g[r_hi];
        const u32 p_addr = s0 + kOffP;
#pragma unroll
        for (int i = 0; i < C / 8; ++i) {
          const int col = i * 8 + tq;
          u32 lo = 0u, hi = 0u;
          if (i * 8 <= 16 * L.w + 15) {
            const float gc0 = g[col], gc1 = g[col + 1];
            const bool ok00 = col <= r_lo && r_lo < m, ok01 = col + 1 <= r_lo && r_lo < m;
            const bool ok10 = col <= r_hi && r_hi < m, ok11 = col + 1 <= r_hi && r_hi < m;
            const float p00 = select_f32(ok00, scale * QK[4 * i] * gate_exp2(g_lo - gc0, true), 0.f);
            const float p01 = select_f32(ok01, scale * QK[4 * i + 1] * gate_exp2(g_lo - gc1, true), 0.f);
            const float p10 = select_f32(ok10, scale * QK[4 * i + 2] * gate_exp2(g_hi - gc0, true), 0.f);
            const float p11 = select_f32(ok11, scale * QK[4 * i + 3] * gate_exp2(g_hi - gc1, true), 0.f);
            lo = pack(p00, p01);
            hi = pack(p10, p11);
          }
          wg::sts_u32(p_addr + sw128::offset(r_lo, col, C), lo);
          wg::sts_u32(p_addr + sw128::offset(r_hi, col, C), hi);
        }
      }
      wg::fence_smem_for_async();
      pipe::mbar_arrive(bars + bPFull);

      // -W once X's dk store of the chunk before has read the W slot.
      if (u > 0) pipe::mbar_wait(bars + bWEmpty, prev);
      // -W, the walk's form_w (chunk_prep's rounding) with the sign flipped on the stored pairs (exact).
      form_w_tile<C>(s0 + kOffT, s0 + kOffK, wg::smem_u32(sc + CB::sG), wg::smem_u32(sc + CB::sB), s0 + kOffW, m, L.w,
                     L.ctid & 31, 0x80008000u);
      wg::fence_smem_for_async();
      pipe::mbar_arrive(bars + bWFull);

      // dS~ = scale * tril0((dO V'^T) .* Dec) into P once X's dv_local has read P~; the M sums.
      float Ad[32];
      wait_full(bars, gO, u);
      wait_full(bars, gVn, u);
      CB::template issue<64, 0, 0>(Ad, s0 + kOffO, C, s0 + kOffVn, C, V / 16, false);
      wg::commit();
      CB::template wait<0>(Ad);
      u32 ds[16];
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int r = L.r[hh];
        const float gr = g[r];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const int c = 8 * i + L.tq;
          const float e0 = exp2f(fminf(gr - g[c], 0.f)), e1 = exp2f(fminf(gr - g[c + 1], 0.f));
          const float v0 = select_f32(r >= c && r < m, scale * Ad[4 * i + 2 * hh] * e0, 0.f);
          const float v1 = select_f32(r >= c + 1 && r < m, scale * Ad[4 * i + 2 * hh + 1] * e1, 0.f);
          ds[2 * i + hh] = f2bf_pair(v0, v1);
        }
      }
      pipe::mbar_wait(bars + bPRead, ph);
      pipe::named_sync(kBar, 128);  // every warp's P~ stores before any warp's dS~ over the same bytes
#pragma unroll
      for (int i = 0; i < 8; i += 2)
        CB::stsm_pairs(s0 + kOffP, i, L, ds[2 * i], ds[2 * i + 1], ds[2 * i + 2], ds[2 * i + 3]);
      wg::fence_smem_for_async();
      pipe::named_sync(kBar, 128);  // dS~ whole before this warpgroup's dS~ K
      pipe::mbar_arrive(bars + bDsFull);
      {  // M = dS~ .* (Q K^T), strictly lower: rowsum(M) - colsum(M) enters dgam.
        float rs[2] = {0.f, 0.f};
        float cs[16];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
#pragma unroll
          for (int e = 0; e < 2; ++e) cs[2 * i + e] = 0.f;
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            const int r = L.r[hh], c = 8 * i + L.tq;
            const float m0 = r > c ? QK[4 * i + 2 * hh] * CB::lo_f(ds[2 * i + hh]) : 0.f;
            const float m1 = r > c + 1 ? QK[4 * i + 2 * hh + 1] * CB::hi_f(ds[2 * i + hh]) : 0.f;
            rs[hh] += m0 + m1;
            cs[2 * i] += m0;
            cs[2 * i + 1] += m1;
          }
        }
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const float s = CB::quad_sum(rs[hh]);
          if ((L.ctid & 3) == 0) sc[CB::sAttR + L.r[hh]] = s;
        }
#pragma unroll
        for (int q = 0; q < 16; ++q) {
          const float s = CB::octet_sum(cs[q]);
          if (L.g == 0) sc[CB::sAttC + 64 * L.w + 8 * (q >> 1) + L.tq + (q & 1)] = s;
        }
      }

      // dQ = scale diag(exp2(gc)) dO S^T + dS~ K, rounded to bf16 pairs and held until dO's slot
      // is free (after the owner's update read dOs hi there).
      u32 dq[32];
      {
        float D[64];
        wait_full(bars, gS, u);
        CB::template issue<128, 0, 0>(D, s0 + kOffO, C, s0 + kOffS, K, V / 16, false);
        wg::commit();
        CB::template wait<0>(D);
        pipe::mbar_arrive(bars + bORead);
        float f[2];
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) f[hh] = L.r[hh] < m ? scale * exp2f(fminf(g[L.r[hh]], 0.f)) : 0.f;
        scale_rows_and_dot(D, f, smem, kOffQ, sc + CB::sGq, L);
        pipe::mbar_arrive(bars + bEmpty + gQ);  // this warpgroup's reads of Q (the row sum)
        CB::template issue<128, 0, 1>(D, s0 + kOffP, C, s0 + kOffK, C, C / 16, true);
        wg::commit();
        CB::template wait<0>(D);
#pragma unroll
        for (int i = 0; i < 16; ++i)
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) dq[2 * i + hh] = pack(D[4 * i + 2 * hh], D[4 * i + 2 * hh + 1]);
      }

      // The owner's update has read dOs hi (dO's slot), lo and -W: dq leaves from dO's slot.
      pipe::mbar_wait(bars + bZDone, ph);
      pipe::named_sync(kBar, 128);
      stage_store(maps, kMapDq, j * K, t0, m, s0 + kOffO, dq, L, kBar, p.dq_v + (t0 * HV + j) * K, (long long)HV * K);

      // dW = -dV' S^T into W (bf16), dV' V^T beside it; then dTm in hi + lo registers, Y.
      float T2[32];
      {
        float Wd[64];
        pipe::mbar_wait(bars + bDvFull, ph);
        CB::template issue<128, 0, 0>(Wd, s0 + kOffDv, C, s0 + kOffS, K, V / 16, false);
        wg::commit();
        wait_full(bars, gV, u);
        CB::template issue<64, 0, 0>(T2, s0 + kOffDv, C, s0 + kOffV, C, V / 16, false);
        wg::commit();
        CB::template wait<1>(Wd);
#pragma unroll
        for (int i = 0; i < 16; i += 2) {
          auto pr = [&](int k) { return f2bf_pair(-Wd[k], -Wd[k + 1]); };
          CB::stsm_pairs(s0 + kOffW, i, L, pr(4 * i), pr(4 * i + 2), pr(4 * i + 4), pr(4 * i + 6));
        }
      }
      wg::fence_smem_for_async();
      pipe::named_sync(kBar, 128);
      pipe::mbar_arrive(bars + bEmpty + gS);  // dO S^T and dV' S^T have read S
      pipe::mbar_arrive(bars + bDwFull);
      float T1[32];
      CB::template issue<64, 0, 0>(T1, s0 + kOffW, C, s0 + kOffK, C, K / 16, false);
      wg::commit();
      CB::template wait<0>(T1, T2);
      pipe::mbar_arrive(bars + bDvEmpty);     // dW and dV' V^T have read dV'
      pipe::mbar_arrive(bars + bEmpty + gV);  // dV' V^T has read V
      u32 hi2[16], lo2[16];
      CB::split_dtm(T1, T2, g, b, m, L, hi2, lo2);
      {
        float Y[32];
        CB::template issue_rs<64, 0>(Y, hi2, s0 + kOffT, C, false);
        CB::template issue_rs<64, 0>(Y, lo2, s0 + kOffT, C, true);
        wg::commit();
        CB::template wait<0>(Y);
        u32 yh[16], yl[16];
#pragma unroll
        for (int i = 0; i < 8; ++i)
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            split_bf16_pair(Y[4 * i + 2 * hh], Y[4 * i + 2 * hh + 1], yh[2 * i + hh], yl[2 * i + hh]);
          }
          // Lo held dOs lo, which the owner's update read (bZDone above).
#pragma unroll
        for (int i = 0; i < 8; i += 2) {
          CB::stsm_pairs(s0 + kOffLo, i, L, yh[2 * i], yh[2 * i + 1], yh[2 * i + 2], yh[2 * i + 3]);
          CB::stsm_pairs(s0 + kOffLo + kCC, i, L, yl[2 * i], yl[2 * i + 1], yl[2 * i + 2], yl[2 * i + 3]);
        }
      }
      wg::fence_smem_for_async();
      pipe::named_sync(kBar, 128);

      // E = tril1(-Tm^T Y) .* Dec over Y (hi + lo, mirrored: Eb + Eb^T), K K^T, the E sums.
      float X[32], KK[32];
      CB::template issue<64, 1, 1>(X, s0 + kOffT, C, s0 + kOffLo, C, C / 16, false);
      CB::template issue<64, 1, 1>(X, s0 + kOffT, C, s0 + kOffLo + kCC, C, C / 16, true);
      CB::template issue<64, 0, 0>(KK, s0 + kOffK, C, s0 + kOffK, C, K / 16, false);
      wg::commit();
      CB::template wait<0>(KK, X);
      pipe::named_sync(kBar, 128);  // every warp's Tm^T Y has read Y before E goes over it
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int r = L.r[hh], c = 8 * i + L.tq + e;
            float& v = X[4 * i + 2 * hh + e];
            const float gate = exp2f(fminf(g[r] - g[c], 0.f));
            v = select_f32(r > c && r < m, -v * gate, 0.f);
          }
      CB::store_e(s0 + kOffLo, s0 + kOffLo + kCC, X, b, L);
      wg::fence_smem_for_async();
      pipe::named_sync(kBar, 128);
      pipe::mbar_arrive(bars + bEFull);
      pipe::mbar_arrive(bars + bEmpty + gKT);  // K K^T, dW K^T and Tm^T Y were this warpgroup's last reads
      {                                        // rowsum(E .* KK) -> dbeta and dgam, colsum(diag(b) E .* KK) -> dgam.
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
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const float s = CB::quad_sum(rs[hh]);
          if ((L.ctid & 3) == 0) sc[CB::sR2 + L.r[hh]] = s;
        }
#pragma unroll
        for (int q = 0; q < 16; ++q) {
          const float s = CB::octet_sum(cs[q]);
          if (L.g == 0) sc[CB::sCs + 64 * L.w + 8 * (q >> 1) + L.tq + (q & 1)] = s;
        }
      }
      // dq's store has read dO's slot: the next chunk's dO may come.
      if (L.ctid == 0) pipe::bulk_wait_read<0>();
      pipe::mbar_arrive(bars + bEmpty + gO);

      // dgam and dbeta per row (chunk_bwd's order), then B6: the reverse cumsum of dgam.
      pipe::mbar_wait(bars + bXTerms, ph);
      pipe::named_sync(kBar, 128);  // sGq, sAttR, sAttC, sR2, sCs from every warp
      float* const gam = sc + CB::sGam;
      float* const db = sc + CB::sDb;
      if (L.ctid < C) {
        const int r = L.ctid;
        const int l = L.ctid & 31;
        const float kst = warp_sum((2 * l < m - 1 ? sc[CB::sKst + 2 * l] : 0.f) +
                                   (2 * l + 1 < m - 1 ? sc[CB::sKst + 2 * l + 1] : 0.f));
        float gr = 0.f, dbr = 0.f;
        if (r < m) {
          const float gg = g[r], bb = b[r], gmr = exp2f(fminf(gg, 0.f));
          gr = sc[CB::sGq + r];
          gr += sc[CB::sAttR + r] -
                (((sc[CB::sAttC + r] + sc[CB::sAttC + 64 + r]) + sc[CB::sAttC + 128 + r]) + sc[CB::sAttC + 192 + r]);
          if (r == m - 1) {
            const float szs = ((sc[CB::sSz] + sc[CB::sSz + 1]) + sc[CB::sSz + 2]) + sc[CB::sSz + 3];
            gr += exp2f(fminf(g[m - 1], 0.f)) * szs + kst;
          } else {
            gr -= sc[CB::sKst + r];
          }
          const float r1 = sc[CB::sR1 + r], r2 = sc[CB::sR2 + r];
          gr += bb * gmr * r1;
          gr += bb * r2 - (((sc[CB::sCs + r] + sc[CB::sCs + 64 + r]) + sc[CB::sCs + 128 + r]) + sc[CB::sCs + 192 + r]);
          dbr = gmr * r1 + sc[CB::sDbv + r] + r2;
        }
        gam[r] = gr;
        db[r] = dbr;
      }
      pipe::named_sync(kBar, 128);
      if (L.ctid < 32) {
        const int i0 = 2 * L.ctid, i1 = 2 * L.ctid + 1;
        const float a = gam[i0], bq = gam[i1];
        const float pair = a + bq;
        float incl = pair;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
          const float dn = __shfl_down_sync(0xffffffffu, incl, o);
          if (L.ctid + o < 32) incl += dn;
        }
        const float after = incl - pair;
        if (i0 < m) {
          p.dg[(t0 + i0) * HV + j] = after + bq + a;
          p.dbeta[(t0 + i0) * HV + j] = db[i0];
        }
        if (i1 < m) {
          p.dg[(t0 + i1) * HV + j] = after + bq;
          p.dbeta[(t0 + i1) * HV + j] = db[i1];
        }
      }
    }
    if (L.ctid == 0) pipe::bulk_wait<0>();  // the stores are complete before the block's shared memory goes
  }

  /// Warpgroup 2, the value side (see the file's comment).
  __device__ static void value_side(const StateWalkBwdParams& p, const TensorMaps& maps, const SegmentWalk<Cfg>& range,
                                    unsigned char* smem, mbar_t* bars) {
    const int ctid = static_cast<int>(threadIdx.x) - 256, warp = ctid >> 5, lane = ctid & 31;
    const Lane L(ctid);
    constexpr int kBar = 2;
    const int j = walk_head<Cfg>();
    const int c_last = range.end - 1, nc = range.end - range.begin;
    const int tq = (lane & 3) * 2, m_lane = lane >> 3;
    const u32 s0 = wg::smem_u32(smem);
    const u32 zb = s0 + kOffZb, dv_addr = s0 + kOffDv, p_addr = s0 + kOffP, k_addr = s0 + kOffK, o_addr = s0 + kOffO;
    ChunkInfo next = nc > 0 ? p.chunks[c_last] : ChunkInfo{};
#pragma unroll 1
    for (int u = 0; u < nc; ++u) {
      const ChunkInfo ci = next;
      if (u + 1 < nc) next = p.chunks[c_last - u - 1];
      const int len = ci.len, m = len;
      const long long t0 = ci.start;
      const u32 ph = u & 1, prev = (u - 1) & 1;
      float* const sc = scalars(smem, u);
      const float* g = sc + CB::sG;
      const float* b = sc + CB::sB;
      const u32 vec = wg::smem_u32(sc + sEv);

      wait_full(bars, gKT, u);
      if (ctid < C) sc[sEv + ctid] = gate_exp2(g[len - 1] - g[ctid], true);  // exp2(gcL - gc_t)
      pipe::named_sync(kBar, 128);

      // Per 64-column half: D^T = bf16(Z)^T K^T and dv_local^T = dO^T P~, then
      // dV'^T = exp2(gcL - gc_t) D^T + bf16(dv_local^T) into the dV' tile as [t][v] rows.
      pipe::mbar_wait(bars + bZFull, ph);
      wait_full(bars, gO, u);
      pipe::mbar_wait(bars + bPFull, ph);
#pragma unroll 1
      for (int half = 0; half < 2; ++half) {
        float D[32], Lc[32];
        wg::fence();
#pragma unroll
        for (int ks = 0; ks < K / 16; ++ks)
          wg::mma_m64n64k16<1, 0>(D, wg::desc_mn_major(zb + half * K * 128, K, ks), wg::desc_k_major(k_addr, C, ks),
                                  ks > 0);
#pragma unroll
        for (int ks = 0; ks < C / 16; ++ks)
          wg::mma_m64n64k16<1, 1>(Lc, wg::desc_mn_major(o_addr + half * C * 128, C, ks),
                                  wg::desc_mn_major(p_addr, C, ks), ks > 0);
        wg::commit();
        wg::wait<0>();
        wg::fence_acc(D);
        wg::fence_acc(Lc);
        if (half == 1) {
          pipe::mbar_arrive(bars + bPRead);
          pipe::mbar_arrive(bars + bORead);
        }
        if (half == 0 && u > 0) {  // the owner's update and A's dW, dV' V^T of the chunk before
          pipe::mbar_wait(bars + bDvEmpty, prev);
        }
#pragma unroll
        for (int ks = 0; ks < C / 16; ++ks) {
          u32 d4[4];
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const int t = 16 * ks + 8 * (q >> 1) + tq;
            const int at = 8 * ks + 2 * q;
            const float2 e = wg::lds_f32x2(vec + 4 * t);
            const float y0 = t < len ? e.x * D[at] + round_bf(Lc[at]) : 0.f;
            const float y1 = t + 1 < len ? e.y * D[at + 1] + round_bf(Lc[at + 1]) : 0.f;
            d4[q] = pack(y0, y1);
          }
          const int r = 16 * ks + 8 * (m_lane >> 1) + (lane & 7), v = 64 * half + 16 * warp + 8 * (m_lane & 1);
          wg::stsm_x4_trans(dv_addr + sw128::offset(r, v, C), d4);
        }
      }
      wg::fence_smem_for_async();
      pipe::named_sync(kBar, 128);
      pipe::mbar_arrive(bars + bDvFull);

      // dvb = Tm^T dV': dv = diag(b) dvb (bf16 pairs, stored once V' is read), dbeta's V term.
      u32 dv[32];
      {
        float Xb[64];
        CB::template issue<128, 1, 1>(Xb, s0 + kOffT, C, dv_addr, C, C / 16, false);
        wg::commit();
        CB::template wait<0>(Xb);
        wait_full(bars, gV, u);
        float rs[2] = {0.f, 0.f};
        CB::row_dot(smem, kOffV, Xb, 0, 16, L, rs);
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const float s = CB::quad_sum(rs[hh]);
          if ((L.ctid & 3) == 0) sc[CB::sDbv + L.r[hh]] = s;
        }
        pipe::mbar_arrive(bars + bEmpty + gV);
        const float f0 = b[L.r[0]], f1 = b[L.r[1]];
#pragma unroll
        for (int i = 0; i < 16; ++i) {
          dv[2 * i] = pack(f0 * Xb[4 * i], f0 * Xb[4 * i + 1]);
          dv[2 * i + 1] = pack(f1 * Xb[4 * i + 2], f1 * Xb[4 * i + 3]);
        }
      }

      // dK's state term: diag(exp2(gcL - gc)) V' Zb^T; rowsum(dKst .* K) -> dgam's shifted terms.
      float D[64];
      wait_full(bars, gVn, u);
      CB::template issue<128, 0, 0>(D, s0 + kOffVn, C, zb, K, V / 16, false);
      wg::commit();
      CB::template wait<0>(D);
      pipe::named_sync(kBar, 128);  // every warp's D and dKst have read bf16(Z)
      pipe::mbar_arrive(bars + bZEmpty);
      {
        const float gL = g[m - 1];
        float f[2];
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) f[hh] = L.r[hh] < m ? gate_exp2(gL - g[L.r[hh]], true) : 0.f;
        scale_rows_and_dot(D, f, smem, kOffK, sc + CB::sKst, L);
      }

      // V' was read by A's dS~ (bDsFull) and this warpgroup's dKst (the barrier above): dv leaves
      // from V''s slot. Then dK += dS~^T Q.
      pipe::mbar_wait(bars + bDsFull, ph);
      stage_store(maps, kMapDv, j * V, t0, m, s0 + kOffVn, dv, L, kBar, p.dv + (t0 * HV + j) * V, (long long)HV * V);
      wait_full(bars, gQ, u);
      CB::template issue<128, 1, 1>(D, p_addr, C, s0 + kOffQ, C, C / 16, true);
      wg::commit();
      CB::template wait<0>(D);
      pipe::mbar_arrive(bars + bPEmpty);
      pipe::mbar_arrive(bars + bEmpty + gQ);

      // dkbg = Tm^T dW in two 64-column halves: dK += diag(b Gam) dkbg, R1 = rowsum(dkbg .* K).
      pipe::mbar_wait(bars + bDwFull, ph);
      {
        float f[2], rs[2] = {0.f, 0.f};
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) f[hh] = L.r[hh] < m ? b[L.r[hh]] * exp2f(fminf(g[L.r[hh]], 0.f)) : 0.f;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          float Xh[32];
          CB::template issue<64, 1, 1>(Xh, s0 + kOffT, C, s0 + kOffW + half * C * 128, C, C / 16, false);
          wg::commit();
          CB::template wait<0>(Xh);
          CB::row_dot(smem, kOffK, Xh, 8 * half, 8, L, rs);
#pragma unroll
          for (int i = 0; i < 8; ++i)
#pragma unroll
            for (int hh = 0; hh < 2; ++hh)
#pragma unroll
              for (int e = 0; e < 2; ++e) D[4 * (i + 8 * half) + 2 * hh + e] += f[hh] * Xh[4 * i + 2 * hh + e];
        }
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const float s = CB::quad_sum(rs[hh]);
          if ((L.ctid & 3) == 0) sc[CB::sR1 + L.r[hh]] = s;
        }
      }
      pipe::mbar_arrive(bars + bXTerms);           // sDbv, sKst, sR1
      if (L.ctid == 0) pipe::bulk_wait_read<0>();  // dv's store has read V''s slot
      pipe::mbar_arrive(bars + bEmpty + gVn);

      // dK += (Eb + Eb^T) K (hi, then lo); dk leaves from W's slot (dW's readers are done).
      pipe::mbar_wait(bars + bEFull, ph);
      CB::template issue<128, 0, 1>(D, s0 + kOffLo, C, k_addr, C, C / 16, true);
      CB::template issue<128, 0, 1>(D, s0 + kOffLo + kCC, C, k_addr, C, C / 16, true);
      wg::commit();
      CB::template wait<0>(D);
      pipe::named_sync(kBar, 128);  // every warp's reads of Lo, K, Tm and dW are done
      pipe::mbar_arrive(bars + bERead);
      pipe::mbar_arrive(bars + bEmpty + gKT);
      u32 dk[32];
#pragma unroll
      for (int i = 0; i < 16; ++i)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) dk[2 * i + hh] = pack(D[4 * i + 2 * hh], D[4 * i + 2 * hh + 1]);
      stage_store(maps, kMapDk, j * K, t0, m, s0 + kOffW, dk, L, kBar, p.dk_v + (t0 * HV + j) * K, (long long)HV * K);
      if (L.ctid == 0) pipe::bulk_wait_read<0>();
      pipe::mbar_arrive(bars + bWEmpty);
    }
    if (L.ctid == 0) pipe::bulk_wait<0>();
  }

  /// Warpgroup 3, the gradient's owner: the z_owner layout's, with <S, Zb> (chunk_bwd's order).
  __device__ static void owner(const StateWalkBwdParams& p, const SegmentWalk<Cfg>& range, unsigned char* smem,
                               mbar_t* bars) {
    const int ctid = static_cast<int>(threadIdx.x) - 384, warp = ctid >> 5, lane = ctid & 31;
    constexpr int kBar = 3;
    const int j = walk_head<Cfg>(), n = range.n;
    const int c_last = range.end - 1, nc = range.end - range.begin;
    const int tq = (lane & 3) * 2, m_lane = lane >> 3;
    const int v_lo = warp * 16 + (lane >> 2), v_hi = v_lo + 8;
    const u32 s0 = wg::smem_u32(smem);
    const u32 zb = s0 + kOffZb, dv_addr = s0 + kOffDv, hi_addr = s0 + kOffO, lo_addr = s0 + kOffLo;
    const u32 w_addr = s0 + kOffW, q_addr = s0 + kOffQ;
    const float scale = p.scale;

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
    if (Cfg::HAS_HT && p.dht != nullptr) {
      for_state(((long long)n * HV + j) * K * V, [&](float& x, long long at) { x = p.dht[at]; });
    } else {
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
      const u32 vec = wg::smem_u32(sc + sEo);

      // bf16(Z^T) as [k][v] rows once X's D and dKst of the chunk before read the tile.
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
        if (lane == 0) sc[CB::sSz + warp] = sz;
      }
      pipe::mbar_arrive(bars + bEmpty + gS);

      // dOs = scale exp2(min(gc_t, 0)) dO_t in hi (over dO, once X and A have read it) and lo (once
      // X's E K of the chunk before has read Lo).
      wait_full(bars, gKT, u);
      const float gl = sc[CB::sG + len - 1];
      if (ctid < C) sc[sEo + ctid] = scale * exp2f(fminf(sc[CB::sG + ctid], 0.f));
      pipe::mbar_wait(bars + bORead, ph);
      wait_full(bars, gO, u);
      if (u > 0) pipe::mbar_wait(bars + bERead, prev);
      pipe::named_sync(kBar, 128);
      split_rows_hi_lo<C, V>(hi_addr, hi_addr, lo_addr, vec, ctid);  // hi over dO
      wg::fence_smem_for_async();
      pipe::named_sync(kBar, 128);

      const float decay = gate_exp2(gl, true);
#pragma unroll
      for (int i = 0; i < 64; ++i) {
        Z0[i] *= decay;
        Z1[i] *= decay;
      }
      wait_full(bars, gQ, u);
      wg::fence();
#pragma unroll
      for (int ks = 0; ks < C / 16; ++ks) {
        wg::mma_k16<128, 1, 1>(Z0, wg::desc_mn_major(hi_addr, C, ks), wg::desc_mn_major(q_addr, C, ks), 1);
        wg::mma_k16<128, 1, 1>(Z1, wg::desc_mn_major(hi_addr + C * 128, C, ks), wg::desc_mn_major(q_addr, C, ks), 1);
      }
#pragma unroll
      for (int ks = 0; ks < C / 16; ++ks) {
        wg::mma_k16<128, 1, 1>(Z0, wg::desc_mn_major(lo_addr, C, ks), wg::desc_mn_major(q_addr, C, ks), 1);
        wg::mma_k16<128, 1, 1>(Z1, wg::desc_mn_major(lo_addr + C * 128, C, ks), wg::desc_mn_major(q_addr, C, ks), 1);
      }
      wg::commit();
      pipe::mbar_wait(bars + bDvFull, ph);
      pipe::mbar_wait(bars + bWFull, ph);
      wg::fence();
#pragma unroll
      for (int ks = 0; ks < C / 16; ++ks) {
        wg::mma_k16<128, 1, 1>(Z0, wg::desc_mn_major(dv_addr, C, ks), wg::desc_mn_major(w_addr, C, ks), 1);
        wg::mma_k16<128, 1, 1>(Z1, wg::desc_mn_major(dv_addr + C * 128, C, ks), wg::desc_mn_major(w_addr, C, ks), 1);
      }
      wg::commit();
      wg::wait<0>();
      wg::fence_acc(Z0);
      wg::fence_acc(Z1);
      pipe::named_sync(kBar, 128);  // every warp's update has read the tiles
      pipe::mbar_arrive(bars + bDvEmpty);
      pipe::mbar_arrive(bars + bEmpty + gQ);
      pipe::mbar_arrive(bars + bZDone);
    }
    if (Cfg::HAS_H0 && p.dh0 != nullptr && range.seg == 0)
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
