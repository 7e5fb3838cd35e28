/**
 * @file walk_bwd_fused_sm90.cuh
 * @brief The fused backward on sm_90a (walk_bwd_layout "fused", docs/design_fused_bwd_sm90.md
 *        3.11): the reverse state walk (B2, B3) and chunk_bwd's body (B4-B6) in one persistent block
 *        per (document, value head), chunks walked last to first. The dh tape and dv_new never leave
 *        the block: bf16(Z) and dV' of a chunk are shared tiles that the chunk's body reads where
 *        chunk_bwd loaded them. The update takes K^T X, X = -diag(b exp2(gc)) Tm^T bf16(dV') (the
 *        body's dvb, scaled), where the split walk takes W^T bf16(dV'): the same sum without
 *        forming W (design 3.12), rounded once where W's way rounds W. So the gradient Z, and with it
 *        every result of the backward, has its own bits, held to the fp64 bounds; the products and
 *        epilogues are otherwise state_walk_bwd_sm90.cuh's (z_owner layout) and chunk_bwd_sm90.cuh's.
 *
 * Warpgroups (setmaxnreg 32 / 160 / 160 / 160):
 *  - P, the producer: TMA loads of a chunk's tiles into single slots (cp.async with the rows past
 *    the length zero-filled for a chunk cut short), each group of slots refilled for the next
 *    chunk as soon as its last reader has arrived on the group's `empty` barrier.
 *  - B0 and B1, the body: the SAME code on the two halves h of every product's output columns (32
 *    of the 64 x 64 products', 64 of the 64 x 128 ones'; the walk's transposed D^T and
 *    dv_local^T by their m64 half): P~ = Q K^T gated; dv_local^T = dO^T P~, D^T = Zb^T K^T and
 *    dV' (the chain); dvb = Tm^T dV' (dv, dbeta's V term, the update's X); dS~ = dO V'^T with the
 *    M sums; dQ = dO S^T + dS~ K; dK = diag(exp2(gcL - gc)) V' Zb^T + dS~^T Q + diag(b Gam) Tm^T dW +
 *    (Eb + Eb^T) K; dW = -dV' S^T; dTm (through a shared tile: Y's k runs over all its columns);
 *    Y = dTm Tm^T; E = tril1(-Tm^T Y); K K^T; the row terms; B0 also dg and dbeta. Each stores its
 *    halves of dq, dv and dk. The halves meet at 256-thread barriers where a product reads a
 *    whole tile the other half wrote. One copy of the body's code serves eight warps: the fused
 *    walk's first version (a different warpgroup per product) ran 154 KB of code per chunk and
 *    waited for instruction fetch (docs/PERF.md).
 *  - Z, the gradient's owner: Z^T (128 x 128 fp32 in registers), bf16(Z) into its tile, <S, Zb>,
 *    dOs hi over dO's slot and lo into its own, the update Z^T = exp2(gcL) Z^T + (dOs hi)^T Q +
 *    (dOs lo)^T Q + X^T K; dh0 at the end.
 * The chain from chunk to chunk is bf16(Z) -> D -> dV' -> dvb, X -> the update. Every mbarrier completes
 * once per chunk (a waiter of chunk u waits parity u & 1) and has ONE arriving warpgroup, or
 * several whose arrivals for chunk u + 1 all follow its completion for chunk u: the two body
 * warpgroups pass a 256-thread barrier (P~ whole) at the start of every chunk, after all of
 * their arrivals of the chunk before; the load groups' `empty`s that the owner shares are
 * arrived by it only after the group's next `full`. The owner reads the scalars of the K / Tm
 * group without arriving on its `empty`: the two buffers by chunk parity cover it, since the
 * body's arrival for chunk u + 1 follows bZFull(u + 1), which the owner arrives after chunk u.
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
    bZEmpty,               // B0, B1: D and dKst have read it
    bWFull,                // B0, B1: the update's factor X is in W
    bDvFull,               // B0, B1: dV' is in its tile
    bDvEmpty,              // Z: the update is done (dV' of the next chunk may come)
    bZDone,                // Z: the update read dOs hi, lo, X and K; <S, Zb> is written
    bORead,                // B0, B1: dv_local, dS~ and dO S^T have read dO
    bERead,                // B0, B1: E K has read Lo
    kBarriers
  };
  // Named barriers: 1 for both body warpgroups (256 threads), 3 the owner's, 4 + h body h's.
  enum : int { kBarPair = 1, kBarOwner = 3, kBarBody0 = 4 };
  static_assert(kBarriers <= Lay::kFuBarriers, "the layout's mbarrier slots");

  static constexpr int kProducerRegs = 32, kBodyRegs = 160, kOwnerRegs = 160;
  static_assert(kProducerRegs + 2 * kBodyRegs + kOwnerRegs <= 4 * 128, "setmaxnreg: the block's pinned registers");

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
      pipe::mbar_init(bars + bEmpty + gKT, 256);  // B0, B1
      pipe::mbar_init(bars + bEmpty + gQ, 384);   // B0, B1, Z
      pipe::mbar_init(bars + bEmpty + gV, 256);   // B0, B1
      pipe::mbar_init(bars + bEmpty + gO, 256);   // B0, B1 (after the owner's update read dOs hi)
      pipe::mbar_init(bars + bEmpty + gVn, 256);  // B0, B1
      pipe::mbar_init(bars + bEmpty + gS, 384);   // B0, B1, Z
      // The owner's barriers have its 128 arrivals, the others both body warpgroups' 256.
      for (int b = bZFull; b < kBarriers; ++b)
        pipe::mbar_init(bars + b, (b == bZFull || b == bDvEmpty || b == bZDone) ? 128 : 256);
      pipe::fence_mbar_init();
    }
    __syncthreads();
    const int role = threadIdx.x / 128;
    if (role == 0) {
      pipe::setmaxnreg_dec<kProducerRegs>();
      producer(p, maps, range, smem, bars);
    } else if (role < 3) {
      pipe::setmaxnreg_inc<kBodyRegs>();
      body(p, maps, range, smem, bars, role - 1);
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

  /// This half's 64 columns of a 64 x 128 tile of bf16 pairs (pr[2 i + hh]: row L.r[hh], columns
  /// 64 h + 8 i + tq, + 1) into the free SW128 slot at `tile` by stmatrix, then out: a whole chunk
  /// by one TMA box from the warpgroup's first thread (after every warp's fence and the
  /// warpgroup's barrier), a cut chunk by each thread's rows below the length.
  __device__ __forceinline__ static void stage_store_half(const TensorMaps& maps, int map, int col, long long t0,
                                                          int len, u32 tile, const u32 (&pr)[16], const Lane& L, int h,
                                                          int bar, bf16_t* rows, long long stride) {
    if (len == C) {
      const int mi = (L.ctid & 31) >> 3, r = 16 * L.w + 8 * (mi & 1) + (L.ctid & 7);
#pragma unroll
      for (int i = 0; i < 8; i += 2) {
        const u32 f[4] = {pr[2 * i], pr[2 * i + 1], pr[2 * i + 2], pr[2 * i + 3]};
        wg::stsm_x4(tile + sw128::offset(r, 64 * h + 8 * i + 8 * (mi >> 1), C), f);
      }
      wg::fence_smem_for_async();
      pipe::named_sync(bar, 128);
      if (L.ctid == 0) {
        pipe::tma_store_2d(&maps.map[map], col + 64 * h, static_cast<int>(t0), tile + h * C * 128);
        pipe::bulk_commit();
      }
    } else {
      store_rows_half(len, pr, L, h, rows, stride);
    }
  }

  /// A half's bf16 pairs straight from registers to rows of global memory (rows past len skipped):
  /// eight rows of 16 bytes per warp instruction, which L2 joins into whole sectors.
  __device__ __forceinline__ static void store_rows_half(int len, const u32 (&pr)[16], const Lane& L, int h,
                                                         bf16_t* rows, long long stride) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int r = L.r[hh];
      if (r >= len) continue;
#pragma unroll
      for (int i = 0; i < 8; ++i) *reinterpret_cast<u32*>(rows + r * stride + 64 * h + 8 * i + L.tq) = pr[2 * i + hh];
    }
  }

  /// acc (+)= A B over STEPS k-steps of 16 (wg::mma_k16's operand forms), descriptors by step.
  template <int N, int TA, int TB, int STEPS, class DA, class DB>
  __device__ __forceinline__ static void mma(float (&acc)[N / 2], DA&& da, DB&& db, bool accumulate) {
    wg::fence_acc(acc);
    wg::fence();
#pragma unroll
    for (int ks = 0; ks < STEPS; ++ks) wg::mma_k16<N, TA, TB>(acc, da(ks), db(ks), (accumulate || ks > 0) ? 1 : 0);
  }

  /// Both rows' sums of the thread over the quad (complete sums of this half's columns).
  __device__ __forceinline__ static void quad_sums(float (&rs)[2]) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) rs[hh] = CB::quad_sum(rs[hh]);
  }

  /// A row term's half: warpgroup B0 writes its sums, B1 keeps them (`held`) and adds them after
  /// B0's are in (add_held), so each row's term is (B0's + B1's) in that order.
  __device__ __forceinline__ static void put_row_term(float* out, const float (&rs)[2], float (&held)[2], int h,
                                                      const Lane& L) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      if (h == 0) {
        if ((L.ctid & 3) == 0) out[L.r[hh]] = rs[hh];
      } else {
        held[hh] = rs[hh];
      }
    }
  }

  /// Warpgroups 1 and 2, the body (see the file's comment): the same code on the halves h of
  /// every product's columns, in chunk_bwd's and the walk's arithmetic.
  __device__ static void body(const StateWalkBwdParams& p, const TensorMaps& maps, const SegmentWalk<Cfg>& range,
                              unsigned char* smem, mbar_t* bars, const int h) {
    // threadIdx.x & 127: the compiler knows the lane's rows are 0..63 (chunk_bwd's lane index).
    const Lane L(static_cast<int>(threadIdx.x) & 127);
    const int ctid = L.ctid, warp = ctid >> 5, lane = ctid & 31, tq = (lane & 3) * 2;
    const int kBarOwn = kBarBody0 + h;
    const int c32 = 32 * h, c64 = 64 * h;  // this half's first column of the 64- and 128-wide products
    const int j = walk_head<Cfg>();
    const int c_last = range.end - 1, nc = range.end - range.begin;
    const u32 s0 = wg::smem_u32(smem);
    const u32 q_a = s0 + kOffQ, k_a = s0 + kOffK, v_a = s0 + kOffV, o_a = s0 + kOffO, vn_a = s0 + kOffVn;
    const u32 dv_a = s0 + kOffDv, w_a = s0 + kOffW, lo_a = s0 + kOffLo, s_a = s0 + kOffS, zb_a = s0 + kOffZb;
    const u32 t_a = s0 + kOffT, p_a = s0 + kOffP;
    const float scale = p.scale;
    auto kmaj = [](u32 t, int rows) { return [=](int ks) { return wg::desc_k_major(t, rows, ks); }; };
    auto mnmaj = [](u32 t, int rows) { return [=](int ks) { return wg::desc_mn_major(t, rows, ks); }; };
    auto kmaj_rows = [](u32 t, int rows, int r0) {
      return [=](int ks) { return wg::desc_k_major_rows(t, rows, r0, ks); };
    };
    auto mnmaj_cols = [](u32 t, int rows, int c0) {
      return [=](int ks) { return wg::desc_mn_major_cols(t, rows, c0, ks); };
    };
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
      float held_gq[2] = {0.f, 0.f}, held_attr[2] = {0.f, 0.f}, held_dbv[2] = {0.f, 0.f};
      float held_kst[2] = {0.f, 0.f}, held_r1[2] = {0.f, 0.f}, held_r2[2] = {0.f, 0.f};

      // 1. Q K^T (columns c32 ..; kept for the M sums) and P~ = bf16(scale (Q K^T) exp2(gc_r - gc_c))
      //    on r >= c, r < len, the walk's scores, into P. B0 also puts the dV' factors.
      float QK[16];
      wait_full(bars, gKT, u);
      wait_full(bars, gQ, u);
      mma<32, 0, 0, K / 16>(QK, kmaj(q_a, C), kmaj_rows(k_a, C, c32), false);
      wg::commit();
      if (h == 0 && ctid < C) sc[sEv + ctid] = gate_exp2(g[m - 1] - g[ctid], true);  // exp2(gcL - gc_t)
      CB::template wait<0>(QK);
      {
        const int r_lo = L.r[0], r_hi = L.r[1];
        const float g_lo = g[r_lo], g_hi = g[r_hi];
#pragma unroll
        for (int ii = 0; ii < 4; ++ii) {
          const int i = 4 * h + ii, col = i * 8 + tq;
          u32 lo = 0u, hi = 0u;
          if (i * 8 <= 16 * L.w + 15) {
            const float gc0 = g[col], gc1 = g[col + 1];
            const bool ok00 = col <= r_lo && r_lo < m, ok01 = col + 1 <= r_lo && r_lo < m;
            const bool ok10 = col <= r_hi && r_hi < m, ok11 = col + 1 <= r_hi && r_hi < m;
            const float p00 = select_f32(ok00, scale * QK[4 * ii] * gate_exp2(g_lo - gc0, true), 0.f);
            const float p01 = select_f32(ok01, scale * QK[4 * ii + 1] * gate_exp2(g_lo - gc1, true), 0.f);
            const float p10 = select_f32(ok10, scale * QK[4 * ii + 2] * gate_exp2(g_hi - gc0, true), 0.f);
            const float p11 = select_f32(ok11, scale * QK[4 * ii + 3] * gate_exp2(g_hi - gc1, true), 0.f);
            lo = pack(p00, p01);
            hi = pack(p10, p11);
          }
          wg::sts_u32(p_a + sw128::offset(r_lo, col, C), lo);
          wg::sts_u32(p_a + sw128::offset(r_hi, col, C), hi);
        }
      }
      wg::fence_smem_for_async();
      pipe::named_sync(kBarPair, 256);  // P~ whole, the dV' factors

      // 2. The chain: for the value rows c64 .., D^T = bf16(Z)^T K^T and dv_local^T = dO^T P~, then
      //    dV'^T = exp2(gcL - gc_t) D^T + bf16(dv_local^T) into the dV' tile as [t][v] rows.
      pipe::mbar_wait(bars + bZFull, ph);
      wait_full(bars, gO, u);
      {
        const u32 vec = wg::smem_u32(sc + sEv);
        float D[32], Lc[32];
        wg::fence();
#pragma unroll
        for (int ks = 0; ks < K / 16; ++ks)
          wg::mma_m64n64k16<1, 0>(D, wg::desc_mn_major(zb_a + h * K * 128, K, ks), wg::desc_k_major(k_a, C, ks),
                                  ks > 0);
#pragma unroll
        for (int ks = 0; ks < C / 16; ++ks)
          wg::mma_m64n64k16<1, 1>(Lc, wg::desc_mn_major(o_a + h * C * 128, C, ks), wg::desc_mn_major(p_a, C, ks),
                                  ks > 0);
        wg::commit();
        wg::wait<0>();
        wg::fence_acc(D);
        wg::fence_acc(Lc);
        if (u > 0) pipe::mbar_wait(bars + bDvEmpty, prev);  // the owner's update of the chunk before
        stage_dv_prime<C>(dv_a, vec, D, Lc, m, c64, warp, lane);
      }
      wg::fence_smem_for_async();
      pipe::named_sync(kBarOwn, 128);
      pipe::mbar_arrive(bars + bDvFull);

      // 3. (No -W: the update's factor X that replaces it is formed in step 6.)

      // 4. dS~ = scale * tril0((dO V'^T) .* Dec), columns c32 .., into P once both halves' dv_local
      //    read P~; the M sums M = dS~ .* (Q K^T), strictly lower: rowsum(M) - colsum(M) enters dgam.
      float Ad[16];
      wait_full(bars, gVn, u);
      mma<32, 0, 0, V / 16>(Ad, kmaj(o_a, C), kmaj_rows(vn_a, C, c32), false);
      wg::commit();
      CB::template wait<0>(Ad);
      u32 ds[8];
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int r = L.r[hh];
        const float gr = g[r];
#pragma unroll
        for (int ii = 0; ii < 4; ++ii) {
          const int c = c32 + 8 * ii + tq;
          const float e0 = exp2f(fminf(gr - g[c], 0.f)), e1 = exp2f(fminf(gr - g[c + 1], 0.f));
          const float v0 = select_f32(r >= c && r < m, scale * Ad[4 * ii + 2 * hh] * e0, 0.f);
          const float v1 = select_f32(r >= c + 1 && r < m, scale * Ad[4 * ii + 2 * hh + 1] * e1, 0.f);
          ds[2 * ii + hh] = f2bf_pair(v0, v1);
        }
      }
      pipe::named_sync(kBarPair, 256);  // both halves' dv_local read P~
#pragma unroll
      for (int ii = 0; ii < 4; ii += 2)
        CB::stsm_pairs(p_a, 4 * h + ii, L, ds[2 * ii], ds[2 * ii + 1], ds[2 * ii + 2], ds[2 * ii + 3]);
      wg::fence_smem_for_async();
      {
        float rs[2] = {0.f, 0.f};
        float cs[8];
#pragma unroll
        for (int ii = 0; ii < 4; ++ii) {
#pragma unroll
          for (int e = 0; e < 2; ++e) cs[2 * ii + e] = 0.f;
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            const int r = L.r[hh], c = c32 + 8 * ii + tq;
            const float m0 = r > c ? QK[4 * ii + 2 * hh] * CB::lo_f(ds[2 * ii + hh]) : 0.f;
            const float m1 = r > c + 1 ? QK[4 * ii + 2 * hh + 1] * CB::hi_f(ds[2 * ii + hh]) : 0.f;
            rs[hh] += m0 + m1;
            cs[2 * ii] += m0;
            cs[2 * ii + 1] += m1;
          }
        }
        quad_sums(rs);
        put_row_term(sc + CB::sAttR, rs, held_attr, h, L);
#pragma unroll
        for (int q = 0; q < 8; ++q) {
          const float s = CB::octet_sum(cs[q]);
          if (L.g == 0) sc[CB::sAttC + 64 * L.w + c32 + 8 * (q >> 1) + tq + (q & 1)] = s;
        }
      }

      // 5. dQ (columns c64 ..) = scale diag(exp2(gc)) dO S^T, its row sum with Q, + dS~ K; held as
      //    bf16 pairs until dO's slot is free (after the owner's update read dOs hi there).
      u32 dq[16];
      {
        float D[32];
        wait_full(bars, gS, u);
        mma<64, 0, 0, V / 16>(D, kmaj(o_a, C), kmaj_rows(s_a, K, c64), false);
        wg::commit();
        CB::template wait<0>(D);
        pipe::mbar_arrive(bars + bORead);  // dv_local, dS~ and dO S^T have read dO
        float rs[2] = {0.f, 0.f};
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const float f = L.r[hh] < m ? scale * exp2f(fminf(g[L.r[hh]], 0.f)) : 0.f;
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            D[4 * i + 2 * hh] *= f;
            D[4 * i + 2 * hh + 1] *= f;
          }
        }
        CB::row_dot(smem, kOffQ, D, 8 * h, 8, L, rs);
        quad_sums(rs);
        put_row_term(sc + CB::sGq, rs, held_gq, h, L);
        pipe::named_sync(kBarPair, 256);  // dS~ whole
        mma<64, 0, 1, C / 16>(D, kmaj(p_a, C), mnmaj_cols(k_a, C, c64), true);
        wg::commit();
        CB::template wait<0>(D);
#pragma unroll
        for (int i = 0; i < 8; ++i)
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) dq[2 * i + hh] = pack(D[4 * i + 2 * hh], D[4 * i + 2 * hh + 1]);
        store_rows_half(m, dq, L, h, p.dq_v + (t0 * HV + j) * K, (long long)HV * K);
      }

      // 6. dvb = Tm^T dV' (columns c64 ..), then the update's factor X = -diag(b exp2(gc)) dvb into W's
      //    half h: the owner's W^T bf16(dV') is K^T (diag(b exp2(gc)) Tm^T bf16(dV')), so it takes K
      //    and X, and no W is formed (docs/design_fused_bwd_sm90.md 3.12). Not sooner: the update
      //    waits for dO's readers (bORead, step 5) anyway. W's half h last held this warpgroup's dk
      //    box (its store was read). Then dv = diag(b) dvb as bf16 pairs and dbeta's V term.
      u32 dv[16];
      {
        float Xb[32];
        pipe::mbar_wait(bars + bDvFull, ph);  // both halves of dV'
        mma<64, 1, 1, C / 16>(Xb, mnmaj(t_a, C), mnmaj_cols(dv_a, C, c64), false);
        wg::commit();
        CB::template wait<0>(Xb);
        const float f0 = b[L.r[0]], f1 = b[L.r[1]];
        {
          const float x0 = L.r[0] < m ? -(f0 * exp2f(g[L.r[0]])) : 0.f;
          const float x1 = L.r[1] < m ? -(f1 * exp2f(g[L.r[1]])) : 0.f;
          // The lane laundered: the same swizzled addresses as dW's store in step 8, which the
          // compiler would otherwise hoist out of the chunk loop and keep live (spilled).
          Lane Lx = L;
          asm volatile("" : "+r"(Lx.ctid), "+r"(Lx.w));
          const u32 x_a = w_a;
#pragma unroll
          for (int ii = 0; ii < 8; ii += 2) {
            auto pr = [&](int k) {
              const float x = ((k >> 1) & 1) ? x1 : x0;
              return f2bf_pair(x * Xb[k], x * Xb[k + 1]);
            };
            CB::stsm_pairs(x_a, 8 * h + ii, Lx, pr(4 * ii), pr(4 * ii + 2), pr(4 * ii + 4), pr(4 * ii + 6));
          }
          wg::fence_smem_for_async();
          pipe::mbar_arrive(bars + bWFull);
        }
        wait_full(bars, gV, u);
        float rs[2] = {0.f, 0.f};
        CB::row_dot(smem, kOffV, Xb, 8 * h, 8, L, rs);
        quad_sums(rs);
        put_row_term(sc + CB::sDbv, rs, held_dbv, h, L);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          dv[2 * i] = pack(f0 * Xb[4 * i], f0 * Xb[4 * i + 1]);
          dv[2 * i + 1] = pack(f1 * Xb[4 * i + 2], f1 * Xb[4 * i + 3]);
        }
        store_rows_half(m, dv, L, h, p.dv + (t0 * HV + j) * V, (long long)HV * V);
      }

      // 7. dK (columns c64 ..): the state term diag(exp2(gcL - gc)) V' Zb^T with its row sum
      //    (dgam's shifted terms), then += dS~^T Q.
      float Dk[32];
      mma<64, 0, 0, V / 16>(Dk, kmaj(vn_a, C), kmaj_rows(zb_a, K, c64), false);
      wg::commit();
      CB::template wait<0>(Dk);
      pipe::named_sync(kBarOwn, 128);  // every warp's D and dKst have read bf16(Z)
      pipe::mbar_arrive(bars + bZEmpty);
      {
        const float gL = g[m - 1];
        float rs[2] = {0.f, 0.f};
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const float f = L.r[hh] < m ? gate_exp2(gL - g[L.r[hh]], true) : 0.f;
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            Dk[4 * i + 2 * hh] *= f;
            Dk[4 * i + 2 * hh + 1] *= f;
          }
        }
        CB::row_dot(smem, kOffK, Dk, 8 * h, 8, L, rs);
        quad_sums(rs);
        put_row_term(sc + CB::sKst, rs, held_kst, h, L);
      }
      mma<64, 1, 1, C / 16>(Dk, mnmaj(p_a, C), mnmaj_cols(q_a, C, c64), true);
      wg::commit();
      CB::template wait<0>(Dk);
      pipe::mbar_arrive(bars + bEmpty + gQ);  // Q K^T, the row sum and dS~^T Q read Q

      // 8. After the owner's update (it read dOs hi in dO's slot, lo, X and K): dW = -dV' S^T
      //    (columns c64 ..) into W; dV' V^T (columns c32 ..) beside it.
      pipe::mbar_wait(bars + bZDone, ph);
      float T2[16];
      {
        float Wd[32];
        mma<64, 0, 0, V / 16>(Wd, kmaj(dv_a, C), kmaj_rows(s_a, K, c64), false);
        wg::commit();
        mma<32, 0, 0, V / 16>(T2, kmaj(dv_a, C), kmaj_rows(v_a, C, c32), false);
        wg::commit();
        CB::template wait<1>(Wd);
#pragma unroll
        for (int ii = 0; ii < 8; ii += 2) {
          auto pr = [&](int k) { return f2bf_pair(-Wd[k], -Wd[k + 1]); };
          CB::stsm_pairs(w_a, 8 * h + ii, L, pr(4 * ii), pr(4 * ii + 2), pr(4 * ii + 4), pr(4 * ii + 6));
        }
      }
      wg::fence_smem_for_async();
      pipe::mbar_arrive(bars + bEmpty + gS);  // dO S^T and dV' S^T read S
      pipe::named_sync(kBarPair, 256);        // dW whole; both halves' dS~ and dKst read V'

      // 9. dTm = tril1((dW K^T) diag(b Gam) + (dV' V^T) diag(b)) (columns c32 ..) as hi + lo into
      //    Lo (dOs lo was read by the update); Y = dTm Tm^T (columns c32 ..) over it.
      float T1[16];
      mma<32, 0, 0, K / 16>(T1, kmaj(w_a, C), kmaj_rows(k_a, C, c32), false);
      wg::commit();
      CB::template wait<0>(T1, T2);
      pipe::mbar_arrive(bars + bEmpty + gV);  // dvb's row sum and dV' V^T read V
      {
        u32 hi2[8], lo2[8];
#pragma unroll
        for (int ii = 0; ii < 4; ++ii)
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            float v[2];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int r = L.r[hh], c = c32 + 8 * ii + tq + e;
              const float gate = exp2f(fminf(g[c], 0.f));
              v[e] = select_f32(r > c && r < m, b[c] * (gate * T1[4 * ii + 2 * hh + e] + T2[4 * ii + 2 * hh + e]), 0.f);
            }
            split_bf16_pair(v[0], v[1], hi2[2 * ii + hh], lo2[2 * ii + hh]);
          }
#pragma unroll
        for (int ii = 0; ii < 4; ii += 2) {
          CB::stsm_pairs(lo_a, 4 * h + ii, L, hi2[2 * ii], hi2[2 * ii + 1], hi2[2 * ii + 2], hi2[2 * ii + 3]);
          CB::stsm_pairs(lo_a + kCC, 4 * h + ii, L, lo2[2 * ii], lo2[2 * ii + 1], lo2[2 * ii + 2], lo2[2 * ii + 3]);
        }
      }
      wg::fence_smem_for_async();
      pipe::named_sync(kBarPair, 256);  // dTm whole
      {
        float Y[16];
        mma<32, 0, 0, C / 16>(Y, kmaj(lo_a, C), kmaj_rows(t_a, C, c32), false);
        mma<32, 0, 0, C / 16>(Y, kmaj(lo_a + kCC, C), kmaj_rows(t_a, C, c32), true);
        wg::commit();
        CB::template wait<0>(Y);
        u32 yh[8], yl[8];
#pragma unroll
        for (int ii = 0; ii < 4; ++ii)
#pragma unroll
          for (int hh = 0; hh < 2; ++hh)
            split_bf16_pair(Y[4 * ii + 2 * hh], Y[4 * ii + 2 * hh + 1], yh[2 * ii + hh], yl[2 * ii + hh]);
        pipe::named_sync(kBarPair, 256);  // both halves' Y products read dTm
#pragma unroll
        for (int ii = 0; ii < 4; ii += 2) {
          CB::stsm_pairs(lo_a, 4 * h + ii, L, yh[2 * ii], yh[2 * ii + 1], yh[2 * ii + 2], yh[2 * ii + 3]);
          CB::stsm_pairs(lo_a + kCC, 4 * h + ii, L, yl[2 * ii], yl[2 * ii + 1], yl[2 * ii + 2], yl[2 * ii + 3]);
        }
      }
      wg::fence_smem_for_async();
      pipe::named_sync(kBarPair, 256);  // Y whole

      // 10. E = tril1(-Tm^T Y) .* Dec (columns c32 ..) and K K^T beside it; Eb + Eb^T over Y (the
      //     blocks of this half's columns and their mirrors); the E sums.
      float X[16], KK[16];
      mma<32, 1, 1, C / 16>(X, mnmaj(t_a, C), mnmaj_cols(lo_a, C, c32), false);
      mma<32, 1, 1, C / 16>(X, mnmaj(t_a, C), mnmaj_cols(lo_a + kCC, C, c32), true);
      mma<32, 0, 0, K / 16>(KK, kmaj(k_a, C), kmaj_rows(k_a, C, c32), false);
      wg::commit();
      CB::template wait<0>(KK, X);
      pipe::named_sync(kBarPair, 256);  // both halves' Tm^T Y read Y
#pragma unroll
      for (int ii = 0; ii < 4; ++ii)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int r = L.r[hh], c = c32 + 8 * ii + tq + e;
            float& v = X[4 * ii + 2 * hh + e];
            const float gate = exp2f(fminf(g[r] - g[c], 0.f));
            v = select_f32(r > c && r < m, -v * gate, 0.f);
          }
      store_e_half(lo_a, lo_a + kCC, X, b, L, h);
      wg::fence_smem_for_async();
      {  // rowsum(E .* KK) -> dbeta and dgam, colsum(diag(b) E .* KK) -> dgam.
        float rs[2] = {0.f, 0.f};
        float cs[8];
#pragma unroll
        for (int ii = 0; ii < 4; ++ii) {
          cs[2 * ii] = cs[2 * ii + 1] = 0.f;
#pragma unroll
          for (int hh = 0; hh < 2; ++hh)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const float v = KK[4 * ii + 2 * hh + e] * X[4 * ii + 2 * hh + e];
              rs[hh] += v;
              cs[2 * ii + e] += b[L.r[hh]] * v;
            }
        }
        quad_sums(rs);
        put_row_term(sc + CB::sR2, rs, held_r2, h, L);
#pragma unroll
        for (int q = 0; q < 8; ++q) {
          const float s = CB::octet_sum(cs[q]);
          if (L.g == 0) sc[CB::sCs + 64 * L.w + c32 + 8 * (q >> 1) + tq + (q & 1)] = s;
        }
      }
      pipe::named_sync(kBarPair, 256);  // E whole

      // 11. dK += diag(b Gam) Tm^T dW (dW's half h: this half's columns), R1 = rowsum(Tm^T dW .* K).
      {
        float Xh[32], rs[2] = {0.f, 0.f};
        mma<64, 1, 1, C / 16>(Xh, mnmaj(t_a, C), mnmaj(w_a + h * C * 128, C), false);
        wg::commit();
        CB::template wait<0>(Xh);
        CB::row_dot(smem, kOffK, Xh, 8 * h, 8, L, rs);
        quad_sums(rs);
        put_row_term(sc + CB::sR1, rs, held_r1, h, L);
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const float f = L.r[hh] < m ? b[L.r[hh]] * exp2f(fminf(g[L.r[hh]], 0.f)) : 0.f;
#pragma unroll
          for (int i = 0; i < 8; ++i)
#pragma unroll
            for (int e = 0; e < 2; ++e) Dk[4 * i + 2 * hh + e] += f * Xh[4 * i + 2 * hh + e];
        }
      }

      // 12. dK += (Eb + Eb^T) K (hi, then lo); dk leaves from W's half h (this warpgroup's dW
      //     readers are done, and both halves' dW K^T passed the barriers above).
      mma<64, 0, 1, C / 16>(Dk, kmaj(lo_a, C), mnmaj_cols(k_a, C, c64), true);
      mma<64, 0, 1, C / 16>(Dk, kmaj(lo_a + kCC, C), mnmaj_cols(k_a, C, c64), true);
      wg::commit();
      CB::template wait<0>(Dk);
      pipe::named_sync(kBarOwn, 128);  // every warp's reads of Lo, K, Tm and dW are done
      pipe::mbar_arrive(bars + bERead);
      pipe::mbar_arrive(bars + bEmpty + gKT);
      {
        u32 dk[16];
#pragma unroll
        for (int i = 0; i < 8; ++i)
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) dk[2 * i + hh] = pack(Dk[4 * i + 2 * hh], Dk[4 * i + 2 * hh + 1]);
        stage_store_half(maps, kMapDk, j * K, t0, m, w_a, dk, L, h, kBarOwn, p.dk_v + (t0 * HV + j) * K,
                         (long long)HV * K);
      }
      // dk's store has read W's half h, so this warpgroup's next X may go over it; dO's and V''s
      // readers (the owner's update among them, before bZDone) are done, so the next chunk's may
      // come.
      if (ctid == 0) pipe::bulk_wait_read<0>();
      pipe::named_sync(kBarOwn, 128);
      pipe::mbar_arrive(bars + bEmpty + gO);
      pipe::mbar_arrive(bars + bEmpty + gVn);

      // 13. The row terms: B1 adds its halves after B0's (one order); then B0 makes dgam and dbeta
      //     per row (chunk_bwd's order), the reverse cumsum of dgam, and stores dg and dbeta.
      pipe::named_sync(kBarPair, 256);  // B0's halves of the row terms are in
      if (h == 1 && (ctid & 3) == 0) {
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int r = L.r[hh];
          sc[CB::sGq + r] += held_gq[hh];
          sc[CB::sAttR + r] += held_attr[hh];
          sc[CB::sDbv + r] += held_dbv[hh];
          sc[CB::sKst + r] += held_kst[hh];
          sc[CB::sR1 + r] += held_r1[hh];
          sc[CB::sR2 + r] += held_r2[hh];
        }
      }
      pipe::named_sync(kBarPair, 256);
      if (h == 1) continue;
      float* const gam = sc + CB::sGam;
      float* const db = sc + CB::sDb;
      if (ctid < C) {
        const int r = ctid;
        const int l = ctid & 31;
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
      pipe::named_sync(kBarOwn, 128);
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

  /// CB::store_e for the column blocks of half h (4 h .. 4 h + 3; X[4 ii + 2 hh + e] at column
  /// 32 h + 8 ii + tq + e): each block below the diagonal and its mirror belong to one half, so the
  /// two halves write disjoint 8 x 8 blocks.
  __device__ __forceinline__ static void store_e_half(u32 eh, u32 el, const float (&X)[16], const float* b,
                                                      const Lane& L, int h) {
    const int lane = L.ctid & 31, w = L.w, arow = lane & 7, amat = (lane >> 3) & 1;
#pragma unroll
    for (int ii = 0; ii < 4; ++ii) {
      const int i = 4 * h + ii;
      u32 hp[2], lp[2];
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        float v[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int r = L.r[hh], c = 8 * i + L.tq + e;
          v[e] = select_f32(r > c, b[r] * X[4 * ii + 2 * hh + e], 0.f);
        }
        split_bf16_pair(v[0], v[1], hp[hh], lp[hh]);
      }
      const u32 direct = CB::swz(16 * w + 8 * amat + arow, 8 * i, C);
      if (i < 2 * w) {
        const u32 mirror = CB::swz(8 * i + arow, 16 * w + 8 * amat, C);
        wg::stsm_x2(eh + direct, hp[0], hp[1]);
        wg::stsm_x2(el + direct, lp[0], lp[1]);
        wg::stsm_x2_trans(eh + mirror, hp[0], hp[1]);
        wg::stsm_x2_trans(el + mirror, lp[0], lp[1]);
      } else if (i == 2 * w) {
        const u32 mirror = CB::swz(8 * i + arow, 16 * w + 8, C);
        wg::stsm_x2(eh + direct, hp[0] | wg::movmatrix_trans(hp[0]), hp[1]);
        wg::stsm_x2(el + direct, lp[0] | wg::movmatrix_trans(lp[0]), lp[1]);
        wg::stsm_x1_trans(eh + mirror, hp[1]);
        wg::stsm_x1_trans(el + mirror, lp[1]);
      } else if (i == 2 * w + 1) {
        const u32 diag = CB::swz(16 * w + 8 + arow, 8 * i, C);
        wg::stsm_x1(eh + diag, hp[1] | wg::movmatrix_trans(hp[1]));
        wg::stsm_x1(el + diag, lp[1] | wg::movmatrix_trans(lp[1]));
      }
    }
  }

  /// Warpgroup 3, the gradient's owner: the z_owner layout's, with <S, Zb> (chunk_bwd's order).
  __device__ static void owner(const StateWalkBwdParams& p, const SegmentWalk<Cfg>& range, unsigned char* smem,
                               mbar_t* bars) {
    const int ctid = static_cast<int>(threadIdx.x) - 384, warp = ctid >> 5, lane = ctid & 31;
    constexpr int kBar = kBarOwner;
    const int j = walk_head<Cfg>(), n = range.n;
    const int c_last = range.end - 1, nc = range.end - range.begin;
    const int tq = (lane & 3) * 2, m_lane = lane >> 3;
    const int v_lo = warp * 16 + (lane >> 2), v_hi = v_lo + 8;
    const u32 s0 = wg::smem_u32(smem);
    const u32 zb = s0 + kOffZb, hi_addr = s0 + kOffO, lo_addr = s0 + kOffLo;
    const u32 w_addr = s0 + kOffW, q_addr = s0 + kOffQ, k_addr = s0 + kOffK;
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
        wg::mma_k16<128, 1, 1>(Z0, wg::desc_mn_major(w_addr, C, ks), wg::desc_mn_major(k_addr, C, ks), 1);
        wg::mma_k16<128, 1, 1>(Z1, wg::desc_mn_major(w_addr + C * 128, C, ks), wg::desc_mn_major(k_addr, C, ks), 1);
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
