/**
 * @file fused_walk_sm90.cuh
 * @brief The fused forward walk on sm_90a: the math and rounding points of fused_walk.cuh (read
 *        its comment), the same grid and 512 threads, warp-specialized in four warpgroups that
 *        share each chunk's loads and gated scores between the block's two 64-column slabs:
 *  - warpgroup 0 (40 registers after setmaxnreg) loads chunk c into a ring of three stages at
 *    128-byte-swizzled positions, up to three chunks ahead of the walks: a whole chunk's tiles as
 *    TMA boxes from one thread, a chunk cut short by its document's end by cp.async with its rows
 *    past the length zero-filled, the row vectors (gc, beta, rstd) by cp.async; the stage's
 *    `full` barrier completes when the bytes and every thread's copies are in;
 *  - warpgroup 1 (88 registers) computes the gated Q K^T of a chunk as soon as it lands (wgmma
 *    from shared memory), rounds it to bf16 and publishes it in one of two P tiles (`pfull`;
 *    `pempty` when both walks have read it), up to two chunks ahead;
 *  - warpgroups 2 and 3 (192 registers) walk 64 columns each: the state is kept transposed, S^T
 *    (64 x K fp32, the accumulator of the state update, 64 registers), so every product has the
 *    slab's columns on M and takes its left operand from registers (the RS form): bf16(S)^T,
 *    Wf^T, Vn^T and Vg^T never pass through shared memory, and no block-wide barrier is on the
 *    chain.
 *      X^T  = Sb^T K^T,  O^T = Sb^T Q^T            8 + 8 x m64n64k16
 *      V'^T = Wf^T Tm^T                            4 x m64n64k16
 *      S^T  = exp2(gcL) S^T + Vg^T K               4 x m64n128k16 (K read N-major)
 *      O^T += Vn^T P^T                             4 x m64n64k16
 * With the in-kernel L2 norm (FOLD_RSTD) Q and K are the raw inputs and the rows' rstd scale the
 * products in fp32, as fused_walk.cuh describes.
 * A stage is released (`empty`) once the scores' warpgroup and both walks are done with it.
 * Each k loop keeps fused_walk's order and each element its rounding, so both bodies give the
 * same bits (gpu_fused holds them to it). A walk's O tile is staged (stmatrix.trans, SW128)
 * while the next chunk's first products run and leaves by a TMA store after that chunk's
 * warpgroup barrier (a chunk cut short: each warp's rows of its 16 columns).
 * With Cfg::TAPES the walks also write the backward's tapes, h_tape[c] = bf16(S entering chunk c)
 * and v_new = bf16(V'). Without Cfg::OUTPUT (the walk_tape program) there is no Q, no P and no O,
 * and warpgroup 1 stores the tapes instead of computing scores: each walk stages bf16(S) in its
 * stage's idle Q tile and V' in half of the idle P tiles (stmatrix.trans into SW128 tiles,
 * `tfull`), and warpgroup 1 stores them by TMA (a chunk cut short: copies of its rows) and frees
 * them (`tempty`) while the walk goes on: the HBM writes are off the walks' chain (stores from the walks
 * themselves, before or beside their products, made walk_tape 0.83-0.90 ms at M, slower than
 * the separate state_walk). With the output (full saves, or a light recompute that hands its tapes
 * over) those tiles are taken: each fragment is transposed across the warp (movmatrix) into rows
 * of contiguous columns and stored from registers. With the output the tapes are written where
 * they are bound: the light forward's call binds none and skips the stores.
 */
#pragma once

#include "common/pipeline.cuh"
#include "common/segments.cuh"
#include "common/wgmma.cuh"
#include "fwd/chunk_prep.cuh"

#if GDN_HAS_WGMMA

namespace gdn {

template <class Cfg>
struct FusedWalkSm90 {
  static_assert(Cfg::K == 128 && Cfg::V == 128 && Cfg::CHUNK == 64, "FusedWalkSm90: K = V = 128, chunk 64");
  static_assert(Cfg::BV == FusedWalkGeometry::kBV && FusedWalkGeometry::kBV == 2 * FusedWalkGeometry::kSlab &&
                    FusedWalkGeometry::kThreads == 512,
                "FusedWalkSm90: 128 columns per block in two walking warpgroups of 64, 512 threads");
  static constexpr int K = Cfg::K, V = Cfg::V, C = Cfg::CHUNK, H = Cfg::H, HV = Cfg::HV, G = Cfg::G, BV = Cfg::BV;
  static constexpr int kSlab = FusedWalkGeometry::kSlab;
  static constexpr bool kOutput = Cfg::OUTPUT, kTapes = Cfg::TAPES;
  static_assert(kOutput || kTapes, "FusedWalkSm90: a walk writes o, the tapes or both");
  using L = FusedWalkSm90Layout;
  static constexpr int kStage = L::stage_bytes(K, C);
  static constexpr int kOffQ = L::off_q(K, C), kOffK = L::off_k(K, C), kOffV = L::off_v(K, C);
  static constexpr int kOffT = L::off_t(K, C), kOffG = L::off_g(K, C), kOffB = L::off_b(K, C);
  static constexpr int kOffRq = L::off_rq(K, C), kOffRk = L::off_rk(K, C);
  static constexpr int kOffP = L::off_p(K, C), kOffO = L::off_o(K, C), kOffBar = L::off_bar(K, C);
  static constexpr int kOffVec = L::off_vec(K, C), kVecBytes = L::vec_bytes(C);
  static constexpr int kStages = L::kStages, kPTiles = 2;
  // 40 + 88 + 2 x 192 = 4 x the pinned 128; the scores hold P (32) and their column gates (16); the
  // loader's second cp.async per thread (the rstd rows) and the scores' rstd spilled at 32 and 80.
  static constexpr int kLoaderRegs = 40, kScoreRegs = 88, kWalkRegs = 192;
  static constexpr int kOutBytes = C * kSlab * 2;  ///< one O staging tile (SW128, the TMA store's box)

  typedef unsigned long long mbar_t;

  __device__ __forceinline__ static bf16_t* tile(unsigned char* base, int stage, int off) {
    return reinterpret_cast<bf16_t*>(base + stage * kStage + off);
  }

  /// Whole chunks arrive by TMA: K, the V slab, Tm and with the output Q in 64 x 64 boxes, the
  /// bytes counted on the stage's `full` barrier (Program::tensor_maps lists the maps in this order).
  /// walk_tape (no output) stores its tapes from the staging tiles: the h tape in K x 64 boxes,
  /// v_new in 64 x 64 boxes.
  enum TmaOperand { kMapK = 0, kMapV = 1, kMapT = 2, kMapQ = 3, kMapO = 4, kMapHTape = 3, kMapVNew = 4 };
  static constexpr u32 kTmaBytes = ((kOutput ? 2 : 1) * C * K + C * BV + C * C) * 2;

  __device__ static void run(const FusedWalkParams& p, const TensorMaps& maps) {
    extern __shared__ unsigned char smem_raw[];
    // SW128 tiles need 1024-byte aligned addresses; the layout reserves the slack.
    // (Offsetting the array itself, not an integer cast, keeps the accesses in the shared window.)
    unsigned char* const smem = smem_raw + ((1024u - (wg::smem_u32(smem_raw) & 1023u)) & 1023u);
    SegmentWalk<Cfg> range(p.doc_chunk_offset, p.chunks, p.doc_order);
    // Past the document's segments, or a chain this walk of the verified carry skips (every thread
    // votes in its gate test); a verify walk's range shrinks to its window.
    if (!FusedCarry<Cfg>::prepare(range, p.doc_chunk_offset, p.chunks, p.gc, p.seg_fail, walk_head<Cfg>())) return;
    mbar_t* const bars = reinterpret_cast<mbar_t*>(smem + kOffBar);
    mbar_t* const full = bars;                 // [kStages], 129 arrivals: the loader's cp.async and its TMA issue
    mbar_t* const empty = bars + kStages;      // [kStages]: the scores' (with OUTPUT) and both walks' threads
    mbar_t* const pfull = bars + 2 * kStages;  // [kPTiles], 128 arrivals: the scores' threads
    mbar_t* const pempty = pfull + kPTiles;    // [kPTiles], 256 arrivals: both walks' threads
    // Without the output, in their place: tfull[2 walk + tape] (128 arrivals: the walk's threads)
    // and tempty[2 walk + tape] (1: the storer's first thread), tape 0 = h, 1 = v_new.
    mbar_t* const tfull = bars + 2 * kStages;
    mbar_t* const tempty = tfull + 4;
    if (threadIdx.x == 0) {
      for (int s = 0; s < kStages; ++s) {
        pipe::mbar_init(full + s, 129);
        pipe::mbar_init(empty + s, kOutput ? 384 : 256);
      }
      if (kOutput) {
        for (int b = 0; b < kPTiles; ++b) {
          pipe::mbar_init(pfull + b, 128);
          pipe::mbar_init(pempty + b, 256);
        }
      } else {
        for (int b = 0; b < 4; ++b) {
          pipe::mbar_init(tfull + b, 128);
          pipe::mbar_init(tempty + b, 1);
        }
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
      if (kOutput)
        scores(p, range, smem, full, empty, pfull, pempty);
      else
        store_tapes(p, maps, range, smem, tfull, tempty);
    } else {
      pipe::setmaxnreg_inc<kWalkRegs>();
      walk(p, maps, range, smem, role - 2, full, empty, kOutput ? pfull : tfull, kOutput ? pempty : tempty);
    }
  }

 private:
  /// Chunk `ci` into `stage`: a whole chunk as TMA boxes issued by one thread (the stage's
  /// transaction count), a chunk cut short by its document's end by every thread's cp.async, which
  /// zero-fills its rows past the length (the next document's rows would arrive by TMA); the row
  /// vectors by cp.async in either case. Each loading thread then arrives once through cp.async.
  __device__ __forceinline__ static void load_chunk(const FusedWalkParams& p, const TensorMaps& maps,
                                                    unsigned char* smem, int stage, mbar_t* full, const ChunkInfo ci,
                                                    int j, int hq, int v0, int tid) {
    const long long t0 = ci.start;
    const int len = ci.len;
    if (len == C) {
      if (tid == 0) {
        const int row = static_cast<int>(t0);
        pipe::mbar_arrive_expect_tx(full, kTmaBytes);
        if (kOutput) pipe::tma_load_tile<C, K>(tile(smem, stage, kOffQ), &maps.map[kMapQ], hq * K, row, full);
        pipe::tma_load_tile<C, K>(tile(smem, stage, kOffK), &maps.map[kMapK], hq * K, row, full);
        pipe::tma_load_tile<C, BV>(tile(smem, stage, kOffV), &maps.map[kMapV], j * V + v0, row, full);
        pipe::tma_load_tile<C, C>(tile(smem, stage, kOffT), &maps.map[kMapT], j * C, row, full);
      }
    } else {
      const auto copy16 = [](void* d, const void* g, bool ok) { fwd::cp_async16(d, g, ok); };
      if (kOutput)
        wg::load_tile_sw128<C, K>(tile(smem, stage, kOffQ), p.q + (t0 * H + hq) * K, (long long)H * K, len, tid,
                                  copy16);
      wg::load_tile_sw128<C, K>(tile(smem, stage, kOffK), p.k + (t0 * H + hq) * K, (long long)H * K, len, tid, copy16);
      wg::load_tile_sw128<C, BV>(tile(smem, stage, kOffV), p.v + (t0 * HV + j) * V + v0, (long long)HV * V, len, tid,
                                 copy16);
      wg::load_tile_sw128<C, C>(tile(smem, stage, kOffT), p.tm + (t0 * HV + j) * C, (long long)HV * C, len, tid,
                                copy16);
      if (tid == 0) pipe::mbar_arrive(full);  // the arrival the TMA issue makes for a whole chunk
    }
    // gc and beta of the chunk's rows (zeros past the chunk, as fused_walk stages them), and with
    // FOLD_RSTD the rows' rstd of q (with OUTPUT) and k.
    float* const sv = reinterpret_cast<float*>(smem + stage * kStage + (tid < C ? kOffG : kOffB));
    const int r = tid % C;
    const float* src = (tid < C ? p.gc : p.beta) + (t0 + r) * HV + j;
    fwd::cp_async4(sv + r, r < len ? src : p.gc, r < len);
    if (Cfg::FOLD_RSTD && (kOutput || tid >= C)) {
      float* const sr = reinterpret_cast<float*>(smem + stage * kStage + (tid < C ? kOffRq : kOffRk));
      const float* rsrc = (tid < C ? p.rstd_q : p.rstd_k) + (t0 + r) * H + hq;
      fwd::cp_async4(sr + r, r < len ? rsrc : p.rstd_q, r < len);
    }
  }

  /// Warpgroup 0: chunk u into stage u % 3 once the stage's previous chunk (u - 3) is released.
  __device__ __forceinline__ static void loader(const FusedWalkParams& p, const TensorMaps& maps,
                                                const SegmentWalk<Cfg>& range, unsigned char* smem, mbar_t* full,
                                                mbar_t* empty) {
    const int tid = threadIdx.x;
    if (tid == 0)
#pragma unroll
      for (int m = 0; m < (kOutput ? 4 : 3); ++m) pipe::tma_prefetch_map(&maps.map[m]);
    const int j = walk_head<Cfg>(), hq = j / G, v0 = blockIdx.x * BV;
    const int c_begin = range.begin, nc = range.end - range.begin;
    int s = 0, phase = 0;  // the stage of chunk u and its use count u / kStages, parity only
    ChunkInfo next = nc > 0 ? p.chunks[c_begin] : ChunkInfo{};
#pragma unroll 1
    for (int u = 0; u < nc; ++u) {
      const ChunkInfo ci = next;  // read one chunk ahead: its latency is off the loop
      if (u + 1 < nc) next = p.chunks[c_begin + u + 1];
      if (u >= kStages) pipe::mbar_wait(empty + s, phase ^ 1);
      load_chunk(p, maps, smem, s, full + s, ci, j, hq, v0, tid);
      pipe::cp_async_arrive(full + s);
      if (++s == kStages) s = 0, phase ^= 1;
    }
  }

  /// Warpgroup 1: the gated scores of chunk u, P = Q K^T on the tensor cores, then the gate and
  /// the mask, into P tile u % 2 once both walks have read its previous scores (chunk u - 2).
  __device__ __forceinline__ static void scores(const FusedWalkParams& p, const SegmentWalk<Cfg>& range,
                                                unsigned char* smem, mbar_t* full, mbar_t* empty, mbar_t* pfull,
                                                mbar_t* pempty) {
    const int tid = threadIdx.x - 128, warp = tid >> 5, lane = tid & 31;
    const int c_begin = range.begin, nc = range.end - range.begin;
    int s = 0, phase = 0;
    int next_len = nc > 0 ? p.chunks[c_begin].len : 0;
#pragma unroll 1
    for (int u = 0; u < nc; ++u) {
      const int b = u & 1;
      const int len = next_len;  // read one chunk ahead: its latency is off the loop
      if (u + 1 < nc) next_len = p.chunks[c_begin + u + 1].len;
      const u32 p_addr = wg::smem_u32(smem + kOffP + b * C * C * 2);
      pipe::mbar_wait(full + s, phase);
      wg::fence_smem_for_async();  // the cp.async writes are read by wgmma (the async proxy)
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
      if (u >= kPTiles) pipe::mbar_wait(pempty + b, ((u >> 1) - 1) & 1);
      // With FOLD_RSTD the raw Q K^T times rstd_q of the row and rstd_k of the column first.
      const u32 sq = wg::smem_u32(smem + s * kStage + kOffRq), sk = wg::smem_u32(smem + s * kStage + kOffRk);
      const float rq_lo = Cfg::FOLD_RSTD ? wg::lds_f32(sq + 4 * r_lo) : 1.f;
      const float rq_hi = Cfg::FOLD_RSTD ? wg::lds_f32(sq + 4 * r_hi) : 1.f;
#pragma unroll
      for (int i = 0; i < C / 8; ++i) {
        const int col = i * 8 + tq;
        u32 lo = 0u, hi = 0u;
        // Column blocks right of the warp's 16 rows are above the diagonal: zeros, no gates.
        if (i * 8 <= 16 * warp + 15) {
          if (Cfg::FOLD_RSTD) {
            const float2 rk = wg::lds_f32x2(sk + 4 * col);
            P[4 * i] *= rq_lo * rk.x;
            P[4 * i + 1] *= rq_lo * rk.y;
            P[4 * i + 2] *= rq_hi * rk.x;
            P[4 * i + 3] *= rq_hi * rk.y;
          }
          const float p00 = P[4 * i] * gate_exp2(g_lo - gcol[i][0], col <= r_lo && r_lo < len);
          const float p01 = P[4 * i + 1] * gate_exp2(g_lo - gcol[i][1], col + 1 <= r_lo && r_lo < len);
          const float p10 = P[4 * i + 2] * gate_exp2(g_hi - gcol[i][0], col <= r_hi && r_hi < len);
          const float p11 = P[4 * i + 3] * gate_exp2(g_hi - gcol[i][1], col + 1 <= r_hi && r_hi < len);
          lo = f2bf_pair(p00, p01);
          hi = f2bf_pair(p10, p11);
        }
        wg::sts_u32(p_addr + sw128::offset(r_lo, col, C), lo);
        wg::sts_u32(p_addr + sw128::offset(r_hi, col, C), hi);
      }
      wg::fence_smem_for_async();  // the walks' wgmma read P through the async proxy
      pipe::mbar_arrive(pfull + b);
      pipe::mbar_arrive(empty + s);  // this warpgroup's reads of the stage are done (wait<0> above)
      if (++s == kStages) s = 0, phase ^= 1;
    }
  }

  /// The A fragment of k-step ks (accumulator columns 16 ks .. 16 ks + 15) of an m64nN
  /// accumulator, rounded to bf16, each value scaled by f(column) first.
  template <int R, class F>
  __device__ static void to_a(u32 (&a)[4], const float (&acc)[R], int ks, F f) {
    a[0] = f2bf_pair(f(acc[8 * ks + 0], 16 * ks, 0), f(acc[8 * ks + 1], 16 * ks, 1));
    a[1] = f2bf_pair(f(acc[8 * ks + 2], 16 * ks, 0), f(acc[8 * ks + 3], 16 * ks, 1));
    a[2] = f2bf_pair(f(acc[8 * ks + 4], 16 * ks + 8, 0), f(acc[8 * ks + 5], 16 * ks + 8, 1));
    a[3] = f2bf_pair(f(acc[8 * ks + 6], 16 * ks + 8, 0), f(acc[8 * ks + 7], 16 * ks + 8, 1));
  }

  /// Without the output: walk w's staging tiles, bf16(S) [K][64] in stage w's Q tile and V' [C][64]
  /// in half w of the P tiles (SW128).
  __device__ __forceinline__ static u32 h_staging(unsigned char* smem, int w) {
    return wg::smem_u32(tile(smem, w, kOffQ));
  }
  __device__ __forceinline__ static u32 v_staging(unsigned char* smem, int w) {
    return wg::smem_u32(smem + kOffP + w * C * kSlab * 2);
  }

  /// Warpgroup 1 without the output: per chunk, each walk's h tile, then each walk's V', stored
  /// from the staging by TMA from the first thread, which frees each tile once the TMA has read it.
  /// A chunk cut short by its document's end keeps the copy of its rows < len in coalesced 16-byte
  /// pieces (eight threads per 128-byte row) by the whole warpgroup.
  __device__ __forceinline__ static void store_tapes(const FusedWalkParams& p, const TensorMaps& maps,
                                                     const SegmentWalk<Cfg>& range, unsigned char* smem, mbar_t* tfull,
                                                     mbar_t* tempty) {
    static_assert(kStages >= 2 && C * K * 2 == K * kSlab * 2 && 2 * C * C * 2 >= 2 * C * kSlab * 2,
                  "FusedWalkSm90: the tapes' staging fits the idle Q and P tiles");
    constexpr int kBarStorer = 3;  // the walks' named barriers are 1 and 2
    const int tid = threadIdx.x - 128;
    const int j = walk_head<Cfg>(), v0 = blockIdx.x * BV;
    const int c_begin = range.begin, nc = range.end - range.begin;
    const int c16 = 8 * (tid & 7);  // the 16-byte piece of a row this thread copies
    if (tid == 0) {
      pipe::tma_prefetch_map(&maps.map[kMapHTape]);
      pipe::tma_prefetch_map(&maps.map[kMapVNew]);
    }
    // Frees a staging tile once this thread's stores of it have read it.
    auto release = [&](mbar_t* bar) {
      pipe::bulk_wait_read<0>();
      pipe::mbar_arrive(bar);
    };
#pragma unroll 1
    for (int u = 0; u < nc; ++u) {
      const ChunkInfo ci = p.chunks[c_begin + u];
      const u32 parity = u & 1;
      if (tid == 0) {
        const int hrow = ((c_begin + u) * HV + j) * K;
#pragma unroll 1
        for (int w = 0; w < 2; ++w) {
          pipe::mbar_wait(tfull + 2 * w, parity);
          pipe::tma_store_2d(&maps.map[kMapHTape], v0 + w * kSlab, hrow, h_staging(smem, w));
          pipe::bulk_commit();
          release(tempty + 2 * w);
        }
      }
#pragma unroll 1
      for (int w = 0; w < 2; ++w) {
        const u32 src = v_staging(smem, w);
        if (ci.len == C) {
          if (tid == 0) {
            pipe::mbar_wait(tfull + 2 * w + 1, parity);
            pipe::tma_store_2d(&maps.map[kMapVNew], j * V + v0 + w * kSlab, static_cast<int>(ci.start), src);
            pipe::bulk_commit();
            release(tempty + 2 * w + 1);
          }
          continue;
        }
        // Only the first thread waits on the tape barriers: the others skip the whole chunks, so
        // a parity wait of theirs could match a phase two chunks old. The named barrier passes the
        // staged tile on to them.
        bf16_t* const dst = p.v_new + ((long long)ci.start * HV + j) * V + v0 + w * kSlab + c16;
        if (tid == 0) pipe::mbar_wait(tfull + 2 * w + 1, parity);
        pipe::named_sync_roles(kBarStorer, 128);  // the tile is staged
#pragma unroll
        for (int r = tid >> 3; r < C; r += 16)
          if (r < ci.len)
            *reinterpret_cast<uint4*>(dst + (long long)r * HV * V) = wg::lds_v4(src + sw128::offset(r, c16, C));
        pipe::named_sync_roles(kBarStorer, 128);  // every copy has read it
        if (tid == 0) release(tempty + 2 * w + 1);
      }
    }
    if (tid == 0) pipe::bulk_wait<0>();  // the stores, before the shared memory goes
  }

  /// A walk's S^T (element (v, k) at S[4 i + 2 h + e], v = v_lo + 8 h, k = 8 i + tq + e) into the
  /// [K, V] state at dst (the slab's column 0), and whether it equals the one there bit for bit.
  __device__ __forceinline__ static void store_state(const float (&S)[64], float* dst, int tq, int v_lo) {
#pragma unroll
    for (int i = 0; i < K / 8; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int e = 0; e < 2; ++e) dst[(8 * i + tq + e) * V + v_lo + 8 * h] = S[4 * i + 2 * h + e];
  }
  __device__ __forceinline__ static bool state_equals(const float (&S)[64], const float* src, int tq, int v_lo) {
    u32 diff = 0u;  // the OR of every element's bit differences: no early exit, no predicate chain
#pragma unroll
    for (int i = 0; i < K / 8; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          diff |= __float_as_uint(src[(8 * i + tq + e) * V + v_lo + 8 * h]) ^ __float_as_uint(S[4 * i + 2 * h + e]);
    return diff == 0u;
  }

  /// The rows < rows of a transposed A-fragment tile from registers (h_tape[c] from Sb^T, v_new from
  /// Vn^T), dst at the tile's row 0, the slab's column 0: register r of k-step ks holds rows
  /// v = 16 warp + 8 (r % 2) + lane / 4 and columns 16 ks + 8 (r / 2) + tq, +1; movmatrix turns it
  /// into row 16 ks + 8 (r / 2) + lane / 4, columns v = 16 warp + 8 (r % 2) + 2 (lane % 4), +1: four
  /// lanes store a row's 16 contiguous bytes.
  template <int KS>
  __device__ __forceinline__ static void store_transposed(bf16_t* dst, long long row_stride, const u32 (&f)[KS][4],
                                                          int rows, int warp, int lane) {
#pragma unroll
    for (int ks = 0; ks < KS; ++ks)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const u32 x = wg::movmatrix_trans(f[ks][r]);
        const int row = 16 * ks + 8 * (r >> 1) + (lane >> 2), v = 16 * warp + 8 * (r & 1) + 2 * (lane & 3);
        if (row < rows) *reinterpret_cast<u32*>(dst + row * row_stride + v) = x;
      }
  }

  /// Warpgroups 2 and 3: walk `slab` (columns 64 slab .. + 63 of the block's 128).
  __device__ __forceinline__ static void walk(const FusedWalkParams& p, const TensorMaps& maps,
                                              const SegmentWalk<Cfg>& range, unsigned char* smem, int slab,
                                              mbar_t* full, mbar_t* empty, mbar_t* pfull, mbar_t* pempty) {
    const int ctid = threadIdx.x - 256 - 128 * slab, warp = ctid >> 5, lane = ctid & 31;
    const int j = walk_head<Cfg>(), n = range.n, v0 = blockIdx.x * BV + slab * kSlab;
    const int barrier = 1 + slab;  // the named barrier of this warpgroup
    const int c_begin = range.begin, nc = range.end - range.begin;
    const int tq = (lane & 3) * 2;
    const int v_lo = warp * 16 + (lane >> 2), v_hi = v_lo + 8;  // this thread's slab columns (M rows)

    // S^T: element (v, k) at S[4 i + 2 h + e] for v = v_lo (h = 0) or v_hi (h = 1), k = 8 i + tq + e;
    // for_state visits each with its offset in a [K, V] state of this (document, value head).
    float S[64];
    const long long state_base = ((long long)n * HV + j) * K * V + v0;
    auto for_state = [&](auto&& f) {
#pragma unroll
      for (int i = 0; i < K / 8; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int e = 0; e < 2; ++e)
            f(S[4 * i + 2 * h + e], state_base + (long long)(8 * i + tq + e) * V + (h ? v_hi : v_lo));
    };
    using FC = FusedCarry<Cfg>;
    if constexpr (Cfg::SEGMENTS > 1) {
      // The segment's entry state: a split document's slot (walk_merge, or the speculative walk of
      // the segment before), else h0; one load loop over a selected base. The speculative walk
      // starts a split document's later segments from zero and its first from h0.
      const bool from_slot = range.split && !FC::kSpeculate;
      const float* const src = FC::from_zero(range) ? nullptr : from_slot ? p.seg_h0 : Cfg::HAS_H0 ? p.h0 : nullptr;
      const long long shift = from_slot ? (range.slot - n) * HV * K * V : 0;
      for_state([&](float& x, long long at) { x = src != nullptr ? src[at + shift] : 0.f; });
      if constexpr (FC::kSpeculate) {
        // A split document's first segment: its entry in its slot (the backward's re-run reads
        // every segment's), and its chain verified so far.
        if (range.split && range.seg == 0) {
          store_state(S, const_cast<float*>(p.seg_h0) + FC::entry_base(range, j, 0) + v0, tq, v_lo);
          if (slab == 0 && ctid == 0) p.seg_fail[(long long)n * HV + j] = 0;
        }
      }
    } else {
      for_state([&](float& x, long long at) { x = Cfg::HAS_H0 && p.h0 != nullptr ? p.h0[at] : 0.f; });
    }

    const u32 vec0 = wg::smem_u32(smem + kOffVec + slab * 2 * kVecBytes);  // this walk's two buffers
    const u32 o_addr = wg::smem_u32(smem + kOffO + slab * L::kOutBuffers * kOutBytes);
    const float scale = p.scale;
    // The previous chunk's O^T, rounded (bf16 pairs in the layout of stmatrix's fragments), is
    // staged as [t][v] rows in one of this warpgroup's two SW128 O tiles (by the chunk's parity)
    // by stmatrix.trans (matrix m = 2 ii + h of group q: tokens 16 q + 8 ii .. +7, slab columns
    // 16 warp + 8 h .. +7; lane L gives the row address of matrix L / 8, row L % 8) while the
    // tensor cores run the next chunk's X^T and O^T. A whole chunk's tile leaves by one TMA
    // store from the warpgroup's first thread after the next chunk's barrier (every warp's
    // writes and fences are before it); that thread waits for the store's reads before the
    // barrier after, so the tile is free when it comes round again. A chunk cut short by its
    // document's end is stored by each warp from its own 16 columns (rows in 16-byte pieces).
    u32 Ob[C / 16][4];
    long long ob_t0 = 0;
    int ob_len = 0;
    int pend_row = -1;  // the first row of a staged whole chunk's O that waits for the next barrier
    auto issue_pending_o = [&](int buf) {
      if (kOutput && pend_row >= 0 && ctid == 0) {
        pipe::tma_store_2d(&maps.map[kMapO], j * V + v0, pend_row, o_addr + buf * kOutBytes);
        pipe::bulk_commit();
      }
      pend_row = -1;
    };
    // Without the output: this walk's tapes staged for the storer (stmatrix.trans, as O is staged:
    // rows of matrix m = 2 ii + h are rows 16 q + 8 ii .. +7, columns 16 warp + 8 h .. +7).
    // pfull / pempty are then the tape barriers tfull / tempty.
    auto stage_tape = [&](u32 addr, int rows, int q, const u32(&f)[4]) {
      const int m_lane = lane >> 3;
      const int r = 16 * q + 8 * (m_lane >> 1) + (lane & 7), v = 16 * warp + 8 * (m_lane & 1);
      wg::stsm_x4_trans(addr + sw128::offset(r, v, rows), f);
    };
    const u32 h_stage = h_staging(smem, slab), v_stage = v_staging(smem, slab);
    auto store_o = [&](int buf) {
      const u32 tile = o_addr + buf * kOutBytes;
#pragma unroll
      for (int q = 0; q < C / 16; ++q) stage_tape(tile, C, q, Ob[q]);
      if (ob_len == C) {
        wg::fence_smem_for_async();
        pend_row = static_cast<int>(ob_t0);
        return;
      }
      __syncwarp();
      const int c8 = 16 * warp + 8 * (lane & 1);
      bf16_t* const dst = p.o + (ob_t0 * HV + j) * V + v0 + c8;
#pragma unroll
      for (int t = lane >> 1; t < C; t += 16)
        if (t < ob_len)
          *reinterpret_cast<uint4*>(dst + (long long)t * HV * V) = wg::lds_v4(tile + sw128::offset(t, c8, C));
    };
    // The verified carry: the segment's checkpoints (speculate writes them, verify compares: after
    // each chunk a vote of both walking warpgroups, 256 threads, on named barrier kBarVote), from
    // the slab's column 0 (store_state, state_equals).
    constexpr int kBarVote = 4;  // the walks' own barriers are 1 and 2, the tape storer's 3
    float* const ckpt = FC::kSpeculate || FC::kVerify ? p.seg_ckpt + FC::checkpoint_base(range, j) + v0 : nullptr;
    bool verified = false;
    int s = 0, phase = 0;  // the stage of chunk u and the parity of its use count u / kStages
    ChunkInfo next = nc > 0 ? p.chunks[c_begin] : ChunkInfo{};
#pragma unroll 1
    for (int u = 0; u < nc; ++u) {
      const int b = u & 1;
      const u32 p_addr = wg::smem_u32(smem + kOffP + b * C * C * 2);
      // Column factors in two buffers: a warp may write chunk u + 1's while another still reads
      // chunk u's; the barrier after the writes orders chunk u - 1's reads before them.
      const u32 vec = vec0 + b * kVecBytes;
      const ChunkInfo ci = next;  // read one chunk ahead: its latency is off the chain
      if (u + 1 < nc) next = p.chunks[c_begin + u + 1];
      const int len = ci.len;
      const long long t0 = ci.start;
      const u32 sg = wg::smem_u32(smem + s * kStage + kOffG), sb = wg::smem_u32(smem + s * kStage + kOffB);
      const u32 q_addr = wg::smem_u32(tile(smem, s, kOffQ));
      const u32 v_addr = wg::smem_u32(tile(smem, s, kOffV)) + slab * C * 128;  // the slab's 64-column block
      const u32 k_addr = wg::smem_u32(tile(smem, s, kOffK));
      const u32 t_addr = wg::smem_u32(tile(smem, s, kOffT));

      // Sb^T = bf16(S^T) as A fragments, while the chunk may still be arriving.
      u32 Sb[K / 16][4];
#pragma unroll
      for (int ks = 0; ks < K / 16; ++ks) to_a(Sb[ks], S, ks, [](float x, int, int) { return x; });
      if (kTapes && kOutput && p.h_tape)
        store_transposed(p.h_tape + ((long long)(c_begin + u) * HV + j) * K * V + v0, V, Sb, K, warp, lane);
      if (kTapes && !kOutput) {  // bf16(S) to the storer once it has copied the chunk before's
        if (u > 0) pipe::mbar_wait(pempty + 2 * slab, (u - 1) & 1);
#pragma unroll
        for (int ks = 0; ks < K / 16; ++ks) stage_tape(h_stage, K, ks, Sb[ks]);
        wg::fence_smem_for_async();  // the storer's TMA reads the tile
        pipe::mbar_arrive(pfull + 2 * slab);
      }
      pipe::mbar_wait(full + s, phase);
      wg::fence_smem_for_async();
      // The chunk's column factors, once per column (not once per thread): exp2(gc_t) (0 past the
      // chunk) for X and O by threads 0..63, exp2(gcL - gc_t) by 64..127; with FOLD_RSTD times the
      // row's rstd of k (X, Vg) or q (O).
      const float gl = wg::lds_f32(sg + 4 * (len - 1));
      {
        const int t = ctid & (C - 1);
        const float g = wg::lds_f32(sg + 4 * t);
        if (Cfg::FOLD_RSTD) {
          const u32 sr = wg::smem_u32(smem + s * kStage + kOffRk);
          const float rk = wg::lds_f32(sr + 4 * t);
          if (ctid < C) {
            wg::sts_f32(vec + 4 * t, t < len ? exp2f(g) * rk : 0.f);
            if (kOutput) {
              const float rq = wg::lds_f32(wg::smem_u32(smem + s * kStage + kOffRq) + 4 * t);
              wg::sts_f32(vec + 4 * (2 * C + t), t < len ? exp2f(g) * rq : 0.f);
            }
          } else {
            wg::sts_f32(vec + 4 * ctid, gate_exp2(gl - g, t < len) * rk);
          }
        } else {
          wg::sts_f32(vec + 4 * ctid, ctid < C ? (t < len ? exp2f(g) : 0.f) : gate_exp2(gl - g, t < len));
        }
      }
      // The TMA store issued after the barrier before has read its tile (the one the store below
      // writes): known to every warp after this barrier.
      if (kOutput && ctid == 0) pipe::bulk_wait_read<0>();
      pipe::named_sync(barrier, 128);
      issue_pending_o(u & 1);  // chunk u - 2's

      float X[32], O[32];
      wg::fence();
#pragma unroll
      for (int ks = 0; ks < K / 16; ++ks) wg::mma_rs_k16<64, 0>(X, Sb[ks], wg::desc_k_major(k_addr, C, ks), ks > 0);
      if (kOutput) {
#pragma unroll
        for (int ks = 0; ks < K / 16; ++ks) wg::mma_rs_k16<64, 0>(O, Sb[ks], wg::desc_k_major(q_addr, C, ks), ks > 0);
      }
      wg::commit();
      if (kOutput && u > 0) store_o((u - 1) & 1);
      wg::wait<0>();
      wg::fence_acc(X);
      if (kOutput) wg::fence_acc(O);

      // Wf^T = bf16(beta_t (v_t - exp2(gc_t) X^T)), zero for t >= len; O^T's columns times exp2(gc_t).
      // Column t = 8 i + tq + e of the accumulators sits at [4 i + 2 h + e] (h: row v_lo or v_hi).
      // V^T arrives in the accumulator layout through ldmatrix.trans: matrix m = 2 ii + h of k-step
      // ks holds tokens 16 ks + 8 ii .. +7 (rows of the V tile) and slab columns 16 warp + 8 h .. +7.
      u32 Wf[C / 16][4];
      const int m_lane = lane >> 3;
#pragma unroll
      for (int ks = 0; ks < C / 16; ++ks) {
        u32 vt4[4];
        wg::ldsm_x4_trans(
            vt4, v_addr + sw128::offset(16 * ks + 8 * (m_lane >> 1) + (lane & 7), 16 * warp + 8 * (m_lane & 1), C));
        float w[8];
#pragma unroll
        for (int ii = 0; ii < 2; ++ii)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int i = 2 * ks + ii, t = 8 * i + tq + e;
            const float et = wg::lds_f32(vec + 4 * t), bt = wg::lds_f32(sb + 4 * t);
            const float eo = Cfg::FOLD_RSTD && kOutput ? wg::lds_f32(vec + 4 * (2 * C + t)) : et;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const u32 pair = vt4[2 * ii + h];
              const float vt = bf2f(static_cast<bf16_t>(e ? pair >> 16 : pair & 0xffffu));
              const float x = bt * (vt - et * X[4 * i + 2 * h + e]);
              w[4 * ii + 2 * h + e] = t < len ? x : 0.f;
              if (kOutput) O[4 * i + 2 * h + e] *= eo;
            }
          }
#pragma unroll
        for (int q = 0; q < 4; ++q) Wf[ks][q] = f2bf_pair(w[2 * q], w[2 * q + 1]);
      }

      // V'^T = Wf^T Tm^T.
      float Vp[32];
      wg::fence();
#pragma unroll
      for (int ks = 0; ks < C / 16; ++ks) wg::mma_rs_k16<64, 0>(Vp, Wf[ks], wg::desc_k_major(t_addr, C, ks), ks > 0);
      wg::commit();
      wg::wait<0>();
      wg::fence_acc(Vp);

      // Vn^T = bf16(V'^T), Vg^T = bf16(V'^T exp2(gcL - gc_t)) (0 past the chunk).
      u32 Vn[C / 16][4], Vg[C / 16][4];
#pragma unroll
      for (int ks = 0; ks < C / 16; ++ks) {
        float d[4];
#pragma unroll
        for (int ii = 0; ii < 2; ++ii)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int t = 16 * ks + 8 * ii + tq + e;
            d[2 * ii + e] = wg::lds_f32(vec + 4 * (C + t));
          }
#pragma unroll
        for (int q = 0; q < 4; ++q) {  // fragment register q: column block ii = q / 2, rows h = q % 2
          const float* x = Vp + 8 * ks + 4 * (q >> 1) + 2 * (q & 1);
          Vn[ks][q] = f2bf_pair(x[0], x[1]);
          Vg[ks][q] = f2bf_pair(x[0] * d[2 * (q >> 1)], x[1] * d[2 * (q >> 1) + 1]);
        }
      }

      // S^T = exp2(gcL) S^T + Vg^T K, then O^T += Vn^T P^T once the gated scores are in.
      const float decay = exp2f(gl);
#pragma unroll
      for (int i = 0; i < 64; ++i) S[i] *= decay;
      if (kOutput) pipe::mbar_wait(pfull + b, (u >> 1) & 1);
      wg::fence();
#pragma unroll
      for (int ks = 0; ks < C / 16; ++ks) wg::mma_rs_k16<128, 1>(S, Vg[ks], wg::desc_mn_major(k_addr, C, ks), 1);
      if (kOutput) {
#pragma unroll
        for (int ks = 0; ks < C / 16; ++ks) wg::mma_rs_k16<64, 0>(O, Vn[ks], wg::desc_k_major(p_addr, C, ks), 1);
      }
      wg::commit();
      if (kTapes && kOutput && p.v_new)
        store_transposed(p.v_new + (t0 * HV + j) * V + v0, (long long)HV * V, Vn, len, warp, lane);
      if (kTapes && !kOutput) {  // V' to the storer, likewise
        if (u > 0) pipe::mbar_wait(pempty + 2 * slab + 1, (u - 1) & 1);
#pragma unroll
        for (int ks = 0; ks < C / 16; ++ks) stage_tape(v_stage, C, ks, Vn[ks]);
        wg::fence_smem_for_async();
        pipe::mbar_arrive(pfull + 2 * slab + 1);
      }
      wg::wait<0>();
      wg::fence_acc(S);
      if (kOutput) {
        wg::fence_acc(O);
        pipe::mbar_arrive(pempty + b);
      }

      // O^T * scale, rounded; stored while the next chunk's first products run (store_o).
      if (kOutput) {
#pragma unroll
        for (int q = 0; q < C / 16; ++q)
#pragma unroll
          for (int m = 0; m < 4; ++m) {
            const float* x = O + 4 * (2 * q + (m >> 1)) + 2 * (m & 1);
            Ob[q][m] = f2bf_pair(x[0] * scale, x[1] * scale);
          }
        ob_t0 = t0;
        ob_len = len;
      }
      // The verified carry's checkpoint of this chunk's state (once O is packed: fewer registers live).
      if constexpr (FC::kSpeculate) {
        if (FC::from_zero(range) && u < kCarryCheckpoints) store_state(S, ckpt + u * K * V, tq, v_lo);
      }
      if constexpr (FC::kVerify) {
        // Bit for bit (a -0 against +0 counts as a difference, which costs a chunk at most).
        if (!verified) verified = pipe::named_all(kBarVote, 256, state_equals(S, ckpt + u * K * V, tq, v_lo));
      }
      // Every thread arrives after its own reads of the stage (one arrival per warp after a
      // __syncwarp orders the same, but compute-sanitizer's racecheck does not follow it).
      pipe::mbar_arrive(empty + s);
      if (++s == kStages) s = 0, phase ^= 1;
    }
    if (kOutput && nc > 0) {
      if (ctid == 0) pipe::bulk_wait_read<0>();
      pipe::named_sync(barrier, 128);
      issue_pending_o(nc & 1);
      store_o((nc - 1) & 1);
      if (pend_row >= 0) {
        pipe::named_sync(barrier, 128);
        issue_pending_o((nc - 1) & 1);
      }
      if (ctid == 0) pipe::bulk_wait<0>();  // the stores, before the shared memory goes
    }

    if constexpr (FC::kVerify) {
      // No checkpoint met within the window (an empty segment never verifies): the chain goes to
      // the merge, which walks it again with every output.
      if (!verified && slab == 0 && ctid == 0) atomicExch(p.seg_fail + (long long)n * HV + j, 1);
      return;
    }
    if constexpr (FC::kSpeculate) {
      if (range.split && !range.last) {  // the next segment's entry, which its verify walk checks
        store_state(S, const_cast<float*>(p.seg_h0) + FC::entry_base(range, j, 1) + v0, tq, v_lo);
        return;
      }
    }
    // A document's final state is its last segment's.
    if (Cfg::HAS_HT && p.ht != nullptr && range.last) for_state([&](float& x, long long at) { p.ht[at] = x; });
  }
};

}  // namespace gdn

#endif  // GDN_HAS_WGMMA
