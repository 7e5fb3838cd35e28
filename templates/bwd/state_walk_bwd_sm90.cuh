/**
 * @file state_walk_bwd_sm90.cuh
 * @brief The reverse state walk (B3) with the local part of dV' (B2) on sm_90a: the math and
 *        rounding points of dv_local.cuh and state_walk_bwd.cuh (read their comments), 128 V
 *        columns per block, 512 threads in four warpgroups:
 *  - warpgroup 0 (32 registers after setmaxnreg) loads chunk c (walked last to first) into a
 *    ring of two stages at 128-byte-swizzled positions (K, Q, W, the dO slab, gc): a whole chunk's
 *    tiles as TMA boxes from one thread, a chunk cut short by its document's end by cp.async
 *    with its rows past the length zero-filled, gc by cp.async; the stage's `full` barrier
 *    completes when the bytes and every thread's copies are in;
 *  - warpgroup 1 (80 registers) computes dv_local's gated scores of a chunk as soon as it lands,
 *    P~ = bf16(scale (Q K^T) exp2(gc_r - gc_c)) on r >= c, into one of two P tiles (`pfull`;
 *    `pempty` when both walks have read it), up to a chunk ahead of the walks;
 *  - warpgroups 2 and 3 (200 registers) walk 64 columns each. The gradient is kept transposed,
 *    Z^T (64 x K fp32, 64 registers), so every product has the slab's columns on M:
 *      D^T  = bf16(Z)^T K^T                    8 x m64n64k16  (A: the dh tape's staging tile)
 *      L^T  = dO^T P~                           4 x m64n64k16  (dv_local, both from shared memory)
 *      Z^T  = exp2(gcL) Z^T + dOs^T Q           8 x m64n128k16 (hi, lo from registers)
 *      Z^T += (-bf16(dV'))^T W                  4 x m64n128k16 (from registers)
 *    with dV'^T = exp2(gcL - gc_t) D^T + bf16(L^T). dO arrives transposed in the A layout through
 *    ldmatrix.trans; bf16(Z) (the dh tape) and bf16(dV') (dv_new) pass through two SW128 staging
 *    tiles per walk, by chunk parity (stmatrix.trans), and leave by TMA stores that one thread
 *    issues while the tensor cores run. The chain per chunk is bf16(Z) -> D -> dV' -> Z.
 * Each k loop keeps the portable programs' order and each element its rounding: the block gives
 * the bits of dv_local followed by state_walk_bwd (gpu_determinism holds it to them), and the
 * layer's dv_local program does nothing on sm_90a when this body runs (Cfg::WALK_FUSES_DV there).
 */
#pragma once

#include "bwd/dv_local.cuh"
#include "common/pipeline.cuh"
#include "common/segments.cuh"
#include "common/wgmma.cuh"

#if GDN_HAS_WGMMA

namespace gdn {

/// The bf16 pair of dV'^T = exp2(gcL - gc_t) D^T + bf16(dv_local^T) at accumulator columns at,
/// at + 1 (tokens t, t + 1; 0 from len on), the two factors read as a float2 at `factors`.
/// PAIRED rounds bf16(dv_local^T) as a pair (one conversion and two unpacks instead of two
/// conversions and two unpacks; the same bits), for the walk whose issue sets its period. The
/// unpaired form stays as it is written: sharing the sums' lines with it moves the split walk's
/// machine code.
template <bool PAIRED = false>
__device__ __forceinline__ u32 dv_prime_pair(u32 factors, const float* D, const float* Lc, int at, int t, int len) {
  const float2 e = wg::lds_f32x2(factors);
  if constexpr (PAIRED) {
    const u32 lp = f2bf_pair(Lc[at], Lc[at + 1]);
    const float y0 = t < len ? e.x * D[at] + bf16_lo_f(lp) : 0.f;
    const float y1 = t + 1 < len ? e.y * D[at + 1] + bf16_hi_f(lp) : 0.f;
    return f2bf_pair(y0, y1);
  } else {
    const float y0 = t < len ? e.x * D[at] + round_bf(Lc[at]) : 0.f;
    const float y1 = t + 1 < len ? e.y * D[at + 1] + round_bf(Lc[at + 1]) : 0.f;
    return f2bf_pair(y0, y1);
  }
}

/// The four bf16 pairs of dV'^T at k-step ks (tokens 16 ks + 8 (q >> 1) + tq, + 1 for d4[q]: one
/// stmatrix x4 or one A fragment), the token factors from `factors` on.
template <bool PAIRED = false>
__device__ __forceinline__ void dv_prime_frag(u32 factors, const float* D, const float* Lc, int ks, int tq, int len,
                                              u32 (&d4)[4]) {
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int t = 16 * ks + 8 * (q >> 1) + tq;
    d4[q] = dv_prime_pair<PAIRED>(factors + 4 * t, D, Lc, 8 * ks + 2 * q, t, len);
  }
}

/// One warpgroup's 64 value columns from col0 of dV' (D and Lc its accumulators over the chunk's
/// tokens) as bf16 [t][v] rows into the SW128 tile at dv_addr, by transposing stmatrix.
template <int C, bool PAIRED = false>
__device__ __forceinline__ void stage_dv_prime(u32 dv_addr, u32 vec, const float* D, const float* Lc, int len, int col0,
                                               int warp, int lane) {
  const int tq = (lane & 3) * 2, m_lane = lane >> 3;
#pragma unroll
  for (int ks = 0; ks < C / 16; ++ks) {
    u32 d4[4];
    dv_prime_frag<PAIRED>(vec, D, Lc, ks, tq, len, d4);
    const int r = 16 * ks + 8 * (m_lane >> 1) + (lane & 7), v = col0 + 16 * warp + 8 * (m_lane & 1);
    wg::stsm_x4_trans(dv_addr + sw128::offset(r, v, C), d4);
  }
}

/// W = bf16(bf16(Tm diag(beta exp2(gc))) K) (chunk_prep's rounding) into the SW128 tile at w_addr by
/// one warpgroup (its warp and lane): Tm's elements times their column's factor (0 past len)
/// rounded as the A operand from registers, K read N-major, four 32-column quarters of fp32
/// accumulators rounded to bf16 pairs. gc and beta of the chunk at the shared addresses sg and sb.
template <int C>
__device__ __forceinline__ void form_w_tile(u32 t_addr, u32 k_addr, u32 sg, u32 sb, u32 w_addr, int len, int warp,
                                            int lane) {
  auto pack = [](float lo, float hi) { return f2bf_pair(lo, hi); };
  // The row and column of the thread are laundered per call: loop-invariant, the compiler would
  // hoist every swizzled address of the tiles out of the chunk loop and spill them.
  int r_lo = warp * 16 + (lane >> 2), tq = (lane & 3) * 2;
  asm volatile("" : "+r"(r_lo), "+r"(tq));
  const int r_hi = r_lo + 8;
  u32 A[C / 16][4];
#pragma unroll
  for (int ks = 0; ks < C / 16; ++ks) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {  // columns 16 ks + 8 half + tq, + 1
      const int c = 16 * ks + 8 * half + tq;
      const float2 g2 = wg::lds_f32x2(sg + 4 * c), b2 = wg::lds_f32x2(sb + 4 * c);
      const float d0 = c < len ? b2.x * exp2f(g2.x) : 0.f, d1 = c + 1 < len ? b2.y * exp2f(g2.y) : 0.f;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const u32 x = wg::lds_u32(t_addr + sw128::offset(h ? r_hi : r_lo, c, C));
        A[ks][2 * half + h] =
            pack(bf2f(static_cast<bf16_t>(x & 0xffffu)) * d0, bf2f(static_cast<bf16_t>(x >> 16)) * d1);
      }
    }
  }
#pragma unroll
  for (int ks = 0; ks < C / 16; ++ks) wg::fence_operand(A[ks]);
#pragma unroll
  for (int quarter = 0; quarter < 4; ++quarter) {
    float acc[16];
    wg::fence();
#pragma unroll
    for (int ks = 0; ks < C / 16; ++ks)
      wg::mma_rs_k16<32, 1>(acc, A[ks], wg::desc_mn_major_cols(k_addr, C, 32 * quarter, ks), ks > 0 ? 1 : 0);
    wg::commit();
    wg::wait<0>();
    wg::fence_acc(acc);
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        wg::sts_u32(w_addr + sw128::offset(h ? r_hi : r_lo, 32 * quarter + 8 * i + tq, C),
                    pack(acc[4 * i + 2 * h], acc[4 * i + 2 * h + 1]));
  }
}

/// Cfg::WALK_FUSED where the program has it (walk_bwd_layout "fused"), else 0. An enumerator, not
/// a static member: the other programs' constant banks (and code digests) stay as they were.
template <class Cfg, class = int>
struct WalkFused {
  enum : int { value = 0 };
};
template <class Cfg>
struct WalkFused<Cfg, decltype((void)Cfg::WALK_FUSED, 0)> {
  enum : int { value = Cfg::WALK_FUSED ? 1 : 0 };
};

template <class Cfg>
struct StateWalkBwdSm90 {
  static_assert(Cfg::K == 128 && Cfg::V == 128 && Cfg::CHUNK == 64 && Cfg::BV == 128,
                "StateWalkBwdSm90: K = V = 128, chunk 64, 128 columns per block");
  static constexpr int K = Cfg::K, V = Cfg::V, C = Cfg::CHUNK, H = Cfg::H, HV = Cfg::HV, G = Cfg::G, BV = Cfg::BV;
  using L = StateWalkBwdSm90Layout;
  static_assert(L::kThreads == StateWalkBwdGeometry::threads(128), "the sm_90a body runs the portable block size");
  static constexpr int kSlab = L::kSlab, kStages = L::kStages;
  /// W formed here (the scores' warpgroup: W = bf16(Tm diag(beta exp2(gc))) K, chunk_prep's
  /// product and rounding) instead of loaded from chunk_prep: a stage holds Tm and beta instead
  /// of W, and one W tile behind wfull / wempty passes it to the walks (read in their last product).
  static constexpr bool kFusesW = Cfg::WALK_FUSES_W;
  static constexpr int kStage = kFusesW ? L::fw_stage_bytes(K, C) : L::stage_bytes(K, C);
  static constexpr int kOffK = L::off_k(K, C), kOffQ = L::off_q(K, C), kOffW = L::off_w(K, C);
  static constexpr int kOffT = L::fw_off_t(K, C), kOffB = L::fw_off_b(K, C);
  // An enumerator, not a static member: the body's constant bank (and code digest) stays.
  enum : int { kOffWTile = L::fw_off_w(K, C) };
  static constexpr int kOffO = kFusesW ? L::fw_off_o(K, C) : L::off_o(K, C);
  static constexpr int kOffG = kFusesW ? L::fw_off_g(K, C) : L::off_g(K, C);
  static constexpr int kOffStaging = kFusesW ? L::fw_off_staging(K, C) : L::off_staging(K, C);
  static constexpr int kOffP = kFusesW ? L::fw_off_p(K, C) : L::off_p(K, C);
  static constexpr int kOffBar = kFusesW ? L::fw_off_bar(K, C) : L::off_bar(K, C);
  static constexpr int kOffVec = kFusesW ? L::fw_off_vec(K, C) : L::off_vec(K, C);
  static constexpr int kStagingBytes = L::staging_bytes(K), kVecBytes = L::vec_bytes(C);
  static constexpr int kPTiles = L::kPTiles;
  // 32 + 80 + 2 x 200 = 4 x the pinned 128; the walks spill at 192, the scores at 72.
  static constexpr int kLoaderRegs = 32, kScoreRegs = 80, kWalkRegs = 200;
  static_assert(kLoaderRegs + kScoreRegs + 2 * kWalkRegs <= 4 * 128, "setmaxnreg: the block's pinned registers");

  typedef unsigned long long mbar_t;
  using Carry = ReverseCarry<Cfg>;

  __device__ __forceinline__ static u32 pack(float lo, float hi) { return f2bf_pair(lo, hi); }

  __device__ __forceinline__ static bf16_t* tile(unsigned char* base, int stage, int off) {
    return reinterpret_cast<bf16_t*>(base + stage * kStage + off);
  }

  /// Whole chunks arrive by TMA: K, Q, W (or Tm) and the dO slab in 64 x 64 boxes, the bytes
  /// counted on the stage's `full` barrier (Program::tensor_maps lists the maps in this order).
  /// The walks store the dh tape and whole chunks of dv_new from their staging tiles by TMA too.
  enum TmaOperand { kMapK = 0, kMapQ = 1, kMapW = 2, kMapO = 3, kMapDh = 4, kMapDv = 5 };
  static constexpr u32 kTmaBytes = (2 * C * K + (kFusesW ? C * C : C * K) + C * BV) * 2;

  __device__ static void run(const StateWalkBwdParams& p, const TensorMaps& maps) {
    extern __shared__ unsigned char smem_raw[];
    // SW128 tiles need 1024-byte aligned addresses; the layout reserves the slack.
    unsigned char* const smem = smem_raw + ((1024u - (wg::smem_u32(smem_raw) & 1023u)) & 1023u);
    SegmentWalk<Cfg> range(p.doc_chunk_offset, p.chunks, p.doc_order);
    if (!range.active) return;                                // past the document's segments ("auto")
    if (!Carry::prepare(range, p, walk_head<Cfg>())) return;  // every thread: a block-wide vote
    mbar_t* const bars = reinterpret_cast<mbar_t*>(smem + kOffBar);
    mbar_t* const full = bars;                 // [kStages], 129 arrivals: the loader's cp.async and its TMA issue
    mbar_t* const empty = bars + kStages;      // [kStages], 384 arrivals: the scores' and both walks' threads
    mbar_t* const pfull = bars + 2 * kStages;  // [kPTiles], 128 arrivals: the scores' threads
    mbar_t* const pempty = pfull + kPTiles;    // [kPTiles], 256 arrivals: both walks' threads
    mbar_t* const wtile = pempty + kPTiles;    // kFusesW: [0] wfull (128: the scores), [1] wempty (256: the walks)
    constexpr int kReaders = 256;              // a tile's readers: both walks
    if (threadIdx.x == 0) {
      for (int s = 0; s < kStages; ++s) {
        pipe::mbar_init(full + s, 129);
        pipe::mbar_init(empty + s, 384);
      }
      for (int b = 0; b < kPTiles; ++b) {
        pipe::mbar_init(pfull + b, 128);
        pipe::mbar_init(pempty + b, kReaders);
      }
      if (kFusesW) {
        pipe::mbar_init(wtile, 128);
        pipe::mbar_init(wtile + 1, kReaders);
      }
      pipe::fence_mbar_init();
    }
    __syncthreads();
    const int role = threadIdx.x / 128;
    if (role == 0) {
      pipe::setmaxnreg_dec<kLoaderRegs>();
      loader(p, maps, range, smem, full, empty);
    } else if (role == 1) {
      pipe::setmaxnreg_dec<kScoreRegs>();
      scores(p, range, smem, full, empty, pfull, pempty, wtile);
    } else {
      pipe::setmaxnreg_inc<kWalkRegs>();
      walk(p, maps, range, smem, role - 2, full, empty, pfull, pempty, wtile);
    }
  }

 private:
  /// Chunk `ci` into `stage`: a whole chunk as TMA boxes issued by one thread (the stage's
  /// transaction count), a chunk cut short by its document's end by every thread's cp.async, which
  /// zero-fills its rows past the length (the next document's rows would arrive by TMA); gc (and
  /// beta) by cp.async in either case. Each loading thread then arrives once through cp.async.
  __device__ __forceinline__ static void load_chunk(const StateWalkBwdParams& p, const TensorMaps& maps,
                                                    unsigned char* smem, int stage, mbar_t* full, const ChunkInfo ci,
                                                    int j, int hq, int v0, int tid) {
    const long long t0 = ci.start;
    const int len = ci.len;
    if (len == C) {
      if (tid == 0) {
        const int row = static_cast<int>(t0);
        pipe::mbar_arrive_expect_tx(full, kTmaBytes);
        pipe::tma_load_tile<C, K>(tile(smem, stage, kOffK), &maps.map[kMapK], hq * K, row, full);
        pipe::tma_load_tile<C, K>(tile(smem, stage, kOffQ), &maps.map[kMapQ], hq * K, row, full);
        if constexpr (kFusesW)
          pipe::tma_load_tile<C, C>(tile(smem, stage, kOffT), &maps.map[kMapW], j * C, row, full);
        else
          pipe::tma_load_tile<C, K>(tile(smem, stage, kOffW), &maps.map[kMapW], j * K, row, full);
        pipe::tma_load_tile<C, BV>(tile(smem, stage, kOffO), &maps.map[kMapO], j * V + v0, row, full);
      }
    } else {
      const auto copy16 = [](void* d, const void* g, bool ok) { bwd::cp_async16(d, g, ok); };
      wg::load_tile_sw128<C, K>(tile(smem, stage, kOffK), p.k + (t0 * H + hq) * K, (long long)H * K, len, tid, copy16);
      wg::load_tile_sw128<C, K>(tile(smem, stage, kOffQ), p.q + (t0 * H + hq) * K, (long long)H * K, len, tid, copy16);
      if constexpr (kFusesW)
        wg::load_tile_sw128<C, C>(tile(smem, stage, kOffT), p.tm + (t0 * HV + j) * C, (long long)HV * C, len, tid,
                                  copy16);
      else
        wg::load_tile_sw128<C, K>(tile(smem, stage, kOffW), p.w + (t0 * HV + j) * K, (long long)HV * K, len, tid,
                                  copy16);
      wg::load_tile_sw128<C, BV>(tile(smem, stage, kOffO), p.d_o + (t0 * HV + j) * V + v0, (long long)HV * V, len, tid,
                                 copy16);
      if (tid == 0) pipe::mbar_arrive(full);  // the arrival the TMA issue makes for a whole chunk
    }
    if (tid < C) {
      float* const sg = reinterpret_cast<float*>(smem + stage * kStage + kOffG);
      const bool ok = tid < len;
      if constexpr (kFusesW) {
        const long long at = ok ? (t0 + tid) * HV + j : 0;
        bwd::cp_async4(sg + tid, p.gc + at, ok);
        bwd::cp_async4(sg + C + tid, p.beta + at, ok);  // beta follows gc (fw_off_b)
      } else {
        bwd::cp_async4(sg + tid, ok ? p.gc + (t0 + tid) * HV + j : p.gc, ok);
      }
    }
  }

  /// Warpgroup 0: the u-th chunk walked (chunk end - 1 - u) into stage u % 2 once the stage's
  /// previous chunk (u - 2) is released.
  __device__ __forceinline__ static void loader(const StateWalkBwdParams& p, const TensorMaps& maps,
                                                const SegmentWalk<Cfg>& range, unsigned char* smem, mbar_t* full,
                                                mbar_t* empty) {
    const int tid = threadIdx.x;
    if (tid == 0)
#pragma unroll
      for (int m = 0; m < 6; ++m) pipe::tma_prefetch_map(&maps.map[m]);
    const int j = walk_head<Cfg>(), hq = j / G, v0 = blockIdx.x * BV;
    const int c_last = range.end - 1, nc = range.end - range.begin;
    int s = 0, phase = 0;
    ChunkInfo next = nc > 0 ? p.chunks[c_last] : ChunkInfo{};
#pragma unroll 1
    for (int u = 0; u < nc; ++u) {
      const ChunkInfo ci = next;  // read one chunk ahead: its latency is off the loop
      if (u + 1 < nc) next = p.chunks[c_last - u - 1];
      if (u >= kStages) pipe::mbar_wait(empty + s, phase ^ 1);
      load_chunk(p, maps, smem, s, full + s, ci, j, hq, v0, tid);
      pipe::cp_async_arrive(full + s);
      if (++s == kStages) s = 0, phase ^= 1;
    }
  }

  /// Warpgroup 1: dv_local's gated scores of the u-th chunk walked, P = Q K^T on the tensor cores,
  /// then scale, the gate and the mask (r >= c, r < len), into P tile u % 2 once both walks have
  /// read its previous scores (chunk u - 2).
  __device__ __forceinline__ static void scores(const StateWalkBwdParams& p, const SegmentWalk<Cfg>& range,
                                                unsigned char* smem, mbar_t* full, mbar_t* empty, mbar_t* pfull,
                                                mbar_t* pempty, mbar_t* wtile) {
    const int tid = threadIdx.x - 128, warp = tid >> 5, lane = tid & 31;
    const int c_last = range.end - 1, nc = range.end - range.begin;
    const float scale = p.scale;
    int s = 0, phase = 0;
    int next_len = nc > 0 ? p.chunks[c_last].len : 0;
#pragma unroll 1
    for (int u = 0; u < nc; ++u) {
      const int b = kPTiles == 1 ? 0 : u & 1;
      const int len = next_len;  // read one chunk ahead: its latency is off the loop
      if (u + 1 < nc) next_len = p.chunks[c_last - u - 1].len;
      const u32 p_addr = wg::smem_u32(smem + kOffP + b * C * C * 2);
      pipe::mbar_wait(full + s, phase);
      wg::fence_smem_for_async();  // the cp.async writes (short chunks) are read by wgmma (the async proxy)
      const u32 q_addr = wg::smem_u32(tile(smem, s, kOffQ)), k_addr = wg::smem_u32(tile(smem, s, kOffK));
      float P[32];
      wg::fence();
#pragma unroll
      for (int ks = 0; ks < K / 16; ++ks)
        wg::mma_m64n64k16<0, 0>(P, wg::desc_k_major(q_addr, C, ks), wg::desc_k_major(k_addr, C, ks), ks > 0);
      wg::commit();
      // The gates of the thread's rows and columns while the product runs.
      const u32 sg = wg::smem_u32(smem + s * kStage + kOffG);
      const int r_lo = warp * 16 + (lane >> 2), r_hi = r_lo + 8, tq = (lane & 3) * 2;
      const float g_lo = wg::lds_f32(sg + 4 * r_lo), g_hi = wg::lds_f32(sg + 4 * r_hi);
      float gcol[C / 8][2];
#pragma unroll
      for (int i = 0; i < C / 8; ++i) {
        const float2 g2 = wg::lds_f32x2(sg + 4 * (i * 8 + tq));
        gcol[i][0] = g2.x;
        gcol[i][1] = g2.y;
      }
      wg::wait<0>();
      wg::fence_acc(P);
      // Tile b's previous scores (chunk u - kPTiles) have been read.
      if (u >= kPTiles) pipe::mbar_wait(pempty + b, (kPTiles == 1 ? u - 1 : (u >> 1) - 1) & 1);
#pragma unroll
      for (int i = 0; i < C / 8; ++i) {
        const int col = i * 8 + tq;
        u32 lo = 0u, hi = 0u;
        // Column blocks right of the warp's 16 rows are above the diagonal: zeros, no gates.
        if (i * 8 <= 16 * warp + 15) {
          const bool ok00 = col <= r_lo && r_lo < len, ok01 = col + 1 <= r_lo && r_lo < len;
          const bool ok10 = col <= r_hi && r_hi < len, ok11 = col + 1 <= r_hi && r_hi < len;
          const float p00 = select_f32(ok00, scale * P[4 * i] * gate_exp2(g_lo - gcol[i][0], true), 0.f);
          const float p01 = select_f32(ok01, scale * P[4 * i + 1] * gate_exp2(g_lo - gcol[i][1], true), 0.f);
          const float p10 = select_f32(ok10, scale * P[4 * i + 2] * gate_exp2(g_hi - gcol[i][0], true), 0.f);
          const float p11 = select_f32(ok11, scale * P[4 * i + 3] * gate_exp2(g_hi - gcol[i][1], true), 0.f);
          lo = pack(p00, p01);
          hi = pack(p10, p11);
        }
        wg::sts_u32(p_addr + sw128::offset(r_lo, col, C), lo);
        wg::sts_u32(p_addr + sw128::offset(r_hi, col, C), hi);
      }
      wg::fence_smem_for_async();  // the walks' wgmma read P through the async proxy
      pipe::mbar_arrive(pfull + b);
      if constexpr (kFusesW) {
        // The walks read W_(u-1) in their last product of chunk u - 1: the tile is free once both
        // have arrived after it.
        if (u >= 1) pipe::mbar_wait(wtile + 1, (u - 1) & 1);
        form_w(smem, s, len, warp, lane);
        wg::fence_smem_for_async();  // the walks' wgmma read W through the async proxy
        pipe::mbar_arrive(wtile);
      }
      pipe::mbar_arrive(empty + s);  // this warpgroup's reads of the stage are done (wait<0> above)
      if (++s == kStages) s = 0, phase ^= 1;
    }
  }

  /// W = bf16(bf16(Tm diag(beta exp2(gc))) K) of the stage's chunk into the W tile, in chunk_prep's
  /// rounding: each Tm element times its column's factor (0 past the chunk's length)
  /// rounded to bf16 as the A operand (from registers), K from the stage read N-major, four
  /// 32-column quarters of fp32 accumulators (16 beside the 16 A registers fit the warpgroup's 80)
  /// rounded to bf16 pairs. Tm is zero above the diagonal and in rows past the length
  /// (chunk_solve's store, the loader's zero fill), so W's rows there are zero.
  __device__ __forceinline__ static void form_w(unsigned char* smem, int s, int len, int warp, int lane) {
    form_w_tile<C>(wg::smem_u32(tile(smem, s, kOffT)), wg::smem_u32(tile(smem, s, kOffK)),
                   wg::smem_u32(smem + s * kStage + kOffG), wg::smem_u32(smem + s * kStage + kOffB),
                   wg::smem_u32(smem + kOffWTile), len, warp, lane);
  }

  /// The A fragment of k-step ks of an m64nN accumulator (columns 16 ks .. 16 ks + 15), rounded.
  template <int R>
  __device__ __forceinline__ static void to_a(u32 (&a)[4], const float (&acc)[R], int ks) {
    a[0] = pack(acc[8 * ks + 0], acc[8 * ks + 1]);
    a[1] = pack(acc[8 * ks + 2], acc[8 * ks + 3]);
    a[2] = pack(acc[8 * ks + 4], acc[8 * ks + 5]);
    a[3] = pack(acc[8 * ks + 6], acc[8 * ks + 7]);
  }

  /// Warpgroups 2 and 3: walk `slab` (columns 64 slab .. + 63 of the block's 128).
  __device__ __forceinline__ static void walk(const StateWalkBwdParams& p, const TensorMaps& maps,
                                              const SegmentWalk<Cfg>& range, unsigned char* smem, int slab,
                                              mbar_t* full, mbar_t* empty, mbar_t* pfull, mbar_t* pempty,
                                              mbar_t* wtile) {
    const int ctid = threadIdx.x - 256 - 128 * slab, warp = ctid >> 5, lane = ctid & 31;
    const int j = walk_head<Cfg>(), n = range.n, v0 = blockIdx.x * BV + slab * kSlab;
    const int barrier = 1 + slab;        // the named barrier of this warpgroup
    const int store_barrier = 3 + slab;  // and the one around its TMA stores
    const int c_last = range.end - 1, nc = range.end - range.begin;
    const int tq = (lane & 3) * 2, m_lane = lane >> 3;
    const int v_lo = warp * 16 + (lane >> 2), v_hi = v_lo + 8;  // this thread's slab columns (M rows)

    // Z^T: element (v, k) at Z[4 i + 2 h + e] for v = v_lo (h = 0) or v_hi (h = 1), k = 8 i + tq + e;
    // for_state visits each with its offset in a [K, V] state of this value head.
    float Z[64];
    auto for_state = [&](long long base, auto&& f) {
#pragma unroll
      for (int i = 0; i < K / 8; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int e = 0; e < 2; ++e)
            f(Z[4 * i + 2 * h + e], base + (long long)(8 * i + tq + e) * V + v0 + (h ? v_hi : v_lo));
    };
    // One load loop over a selected base (two loops spilled the ranks' variant).
    if (!Carry::load_end(p, range, j, for_state)) {
#pragma unroll
      for (int i = 0; i < 64; ++i) Z[i] = 0.f;
    }

    const u32 vec0 = wg::smem_u32(smem + kOffVec + slab * 2 * kVecBytes);  // this walk's two buffers
    // The walk's two SW128 staging tiles, by chunk parity: bf16(Z) as [k][v] rows in tile u % 2
    // (the dh tape, and the A operand of D), bf16(dV') as [t][v] rows (dv_new) in the other one.
    // D's wgmma reads all of its A tile, and a warp's wait for it says nothing of the other
    // warps' reads, so dv_new may not overwrite that tile in the same chunk; by the next chunk's
    // warpgroup barrier every warp has waited for it. A warp writes only its own 16 columns
    // (stmatrix.trans: rows of matrix m = 2 ii + h are rows 16 q + 8 ii .. +7, columns
    // 16 warp + 8 h .. +7; lane L gives the row address of matrix L / 8, row L % 8). The tiles
    // leave by TMA stores from one thread once every warp has written and fenced its part: the
    // dh tape always, dv_new for a whole chunk (a chunk cut short stores its rows below the
    // length from each warp's own columns, as the next document's rows follow in dv_new).
    const u32 st0 = wg::smem_u32(smem + kOffStaging + slab * 2 * kStagingBytes);
    auto stage_frags = [&](u32 st_addr, int rows, int q, const u32(&f)[4]) {
      const int r = 16 * q + 8 * (m_lane >> 1) + (lane & 7), v = 16 * warp + 8 * (m_lane & 1);
      wg::stsm_x4_trans(st_addr + sw128::offset(r, v, rows), f);
    };
    const int c8 = 16 * warp + 8 * (lane & 1);  // the 16-byte piece a lane stores, per row
    const float scale = p.scale;

    int s = 0, phase = 0;  // the stage of the u-th chunk and the parity of its use count u / kStages
    ChunkInfo next = nc > 0 ? p.chunks[c_last] : ChunkInfo{};
#pragma unroll 1
    for (int u = 0; u < nc; ++u) {
      const int c = c_last - u, b = u & 1;
      const u32 vec = vec0 + b * kVecBytes;
      const u32 p_addr = wg::smem_u32(smem + kOffP + b * C * C * 2);
      const ChunkInfo ci = next;  // read one chunk ahead: its latency is off the chain
      if (u + 1 < nc) next = p.chunks[c - 1];
      const int len = ci.len;
      const long long t0 = ci.start;
      const u32 sg = wg::smem_u32(smem + s * kStage + kOffG);
      const u32 k_addr = wg::smem_u32(tile(smem, s, kOffK));
      const u32 q_addr = wg::smem_u32(tile(smem, s, kOffQ));
      const u32 w_addr = kFusesW ? wg::smem_u32(smem + kOffWTile) : wg::smem_u32(tile(smem, s, kOffW));
      const u32 o_addr = wg::smem_u32(tile(smem, s, kOffO)) + slab * C * 128;  // the slab's 64-column block
      const u32 z_addr = st0 + b * kStagingBytes, dv_addr = st0 + (b ^ 1) * kStagingBytes;

      // bf16(Z^T) into its staging tile as [k][v] rows, while the chunk may still be arriving,
      // once the chunk before's stores have read both tiles (the TMA stores; a short chunk's
      // dv_new stores from this tile).
      if (u > 0) {
        if (ctid == 0) pipe::bulk_wait_read<0>();
        pipe::named_sync(store_barrier, 128);
      }
#pragma unroll
      for (int ks = 0; ks < K / 16; ++ks) {
        u32 zb[4];
        to_a(zb, Z, ks);
        stage_frags(z_addr, K, ks, zb);
      }
      pipe::mbar_wait(full + s, phase);
      // The chunk's column factors, once per column: scale exp2(min(gc_t, 0)) for dO by threads
      // 0..63, exp2(gcL - gc_t) for dV' by 64..127.
      const float gl = wg::lds_f32(sg + 4 * (len - 1));
      {
        const int t = ctid & (C - 1);
        const float g = wg::lds_f32(sg + 4 * t);
        wg::sts_f32(vec + 4 * ctid, ctid < C ? scale * exp2f(fminf(g, 0.f)) : gate_exp2(gl - g, true));
      }
      wg::fence_smem_for_async();  // the staging tile and the cp.async writes are read by wgmma
      pipe::named_sync(barrier, 128);
      // Z^T's decay before the chain's first product: ptxas would otherwise wait for that product
      // before touching Z (it tracks accumulators per warpgroup, not per group).
      const float decay = gate_exp2(gl, true);
#pragma unroll
      for (int i = 0; i < 64; ++i) Z[i] *= decay;

      float D[32], Lc[32];
      wg::fence();
#pragma unroll
      for (int ks = 0; ks < K / 16; ++ks)
        wg::mma_m64n64k16<1, 0>(D, wg::desc_mn_major(z_addr, K, ks), wg::desc_k_major(k_addr, C, ks), ks > 0);
      wg::commit();
      // dv_local^T = dO^T P~ once the scores are in.
      pipe::mbar_wait(pfull + b, (u >> 1) & 1);
#pragma unroll
      for (int ks = 0; ks < C / 16; ++ks)
        wg::mma_m64n64k16<1, 1>(Lc, wg::desc_mn_major(o_addr, C, ks), wg::desc_mn_major(p_addr, C, ks), ks > 0);
      wg::commit();

      // Z^T += (dOs^T hi) Q + (dOs^T lo) Q, dOs = scale exp2(gc_t) dO_t, behind the chain's first
      // product. dO^T arrives in the A layout through ldmatrix.trans (matrix m = 2 ii + h of k-step
      // ks: tokens 16 ks + 8 ii .. +7, slab columns 16 warp + 8 h .. +7).
      u32 Oh[C / 16][4], Ol[C / 16][4];
#pragma unroll
      for (int ks = 0; ks < C / 16; ++ks) {
        u32 o4[4];
        wg::ldsm_x4_trans(
            o4, o_addr + sw128::offset(16 * ks + 8 * (m_lane >> 1) + (lane & 7), 16 * warp + 8 * (m_lane & 1), C));
#pragma unroll
        for (int q = 0; q < 4; ++q) {  // register q: tokens t = 16 ks + 8 (q / 2) + tq (+1)
          const int t = 16 * ks + 8 * (q >> 1) + tq;
          const float2 f = wg::lds_f32x2(vec + 4 * t);
          const float x0 = f.x * bf2f(static_cast<bf16_t>(o4[q] & 0xffffu));
          const float x1 = f.y * bf2f(static_cast<bf16_t>(o4[q] >> 16));
          split_bf16_pair(x0, x1, Oh[ks][q], Ol[ks][q]);
        }
      }
#pragma unroll
      for (int ks = 0; ks < C / 16; ++ks) {
        wg::fence_operand(Oh[ks]);
        wg::fence_operand(Ol[ks]);
      }
      wg::fence();
#pragma unroll
      for (int ks = 0; ks < C / 16; ++ks) wg::mma_rs_k16<128, 1>(Z, Oh[ks], wg::desc_mn_major(q_addr, C, ks), 1);
#pragma unroll
      for (int ks = 0; ks < C / 16; ++ks) wg::mma_rs_k16<128, 1>(Z, Ol[ks], wg::desc_mn_major(q_addr, C, ks), 1);
      wg::commit();

      // dh_tape[c] = bf16(Z) from the staging (written and fenced before the barrier above).
      if (ctid == 0) {
        pipe::tma_store_2d(&maps.map[kMapDh], v0, (c * HV + j) * K, z_addr);
        pipe::bulk_commit();
      }

      wg::wait<1>();  // D and dv_local^T
      wg::fence_acc(D);
      wg::fence_acc(Lc);
      pipe::mbar_arrive(pempty + b);
      // dV'^T = exp2(gcL - gc_t) D^T + bf16(dv_local^T) (0 for t >= len); -bf16(dV'^T) as A
      // fragments, bf16(dV'^T) staged as dv_new rows [t][v] in the other tile (the chunk before's
      // Z: the warpgroup barrier above came after every warp's wait for that chunk's D).
      u32 Dn[C / 16][4];
#pragma unroll
      for (int ks = 0; ks < C / 16; ++ks) {
        u32 d4[4];
        dv_prime_frag(vec + 4 * C, D, Lc, ks, tq, len, d4);
#pragma unroll
        for (int q = 0; q < 4; ++q) Dn[ks][q] = d4[q] ^ 0x80008000u;  // negating a bf16 is exact
        stage_frags(dv_addr, C, ks, d4);
      }
#pragma unroll
      for (int ks = 0; ks < C / 16; ++ks) wg::fence_operand(Dn[ks]);
      const bool whole = len == C;
      if (whole) {  // dv_new's rows by TMA while the last product runs
        wg::fence_smem_for_async();
        pipe::named_sync(store_barrier, 128);
        if (ctid == 0) {
          pipe::tma_store_2d(&maps.map[kMapDv], j * V + v0, static_cast<int>(t0), dv_addr);
          pipe::bulk_commit();
        }
      }
      // W_u from the scores' warpgroup, as late as possible: it forms W_u once both walks are
      // done with W_(u-1).
      if constexpr (kFusesW) pipe::mbar_wait(wtile, u & 1);
      wg::fence();
#pragma unroll
      for (int ks = 0; ks < C / 16; ++ks) wg::mma_rs_k16<128, 1>(Z, Dn[ks], wg::desc_mn_major(w_addr, C, ks), 1);
      wg::commit();

      if (!whole) {
        __syncwarp();
        bf16_t* const dst = p.dv_new + (t0 * HV + j) * V + v0 + c8;
#pragma unroll 2
        for (int r = lane >> 1; r < C; r += 16)
          if (r < len) bwd::st_global_v4(dst + (long long)r * HV * V, wg::lds_v4(dv_addr + sw128::offset(r, c8, C)));
      }
      wg::wait<0>();
      wg::fence_acc(Z);
      // Every thread arrives after its own reads of the stage (the ldmatrix reads and, through
      // wait<0>, the tensor cores'), and of the W tile.
      if constexpr (kFusesW) pipe::mbar_arrive(wtile + 1);
      pipe::mbar_arrive(empty + s);
      if (++s == kStages) s = 0, phase ^= 1;
      Carry::checkpoint(p, range, j, u, for_state);
    }

    if (ctid == 0) pipe::bulk_wait<0>();  // the stores are complete before the block's shared memory goes
    // Each warpgroup votes for its 64 columns in the verify walk.
    if (!Carry::finish(p, range, j, nc, barrier, 128, ctid, for_state)) return;
    if (Cfg::HAS_H0 && p.dh0 != nullptr)
      for_state(((long long)n * HV + j) * K * V, [&](float& x, long long at) { p.dh0[at] = x; });
  }
};

}  // namespace gdn

#endif  // GDN_HAS_WGMMA
