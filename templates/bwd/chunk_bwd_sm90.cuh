/**
 * @file chunk_bwd_sm90.cuh
 * @brief chunk_bwd (B4 + B5 + B6) on sm_90a with every product on ONE warpgroup at its full
 *        width (m64n64 or m64n128), the four warpgroups working on different products at once:
 *        each operand is read once per k-step, the epilogues and row sums stay in the owner's
 *        registers (a row's sum is four lanes of one warp), and the warpgroups hand their
 *        intermediates to each other through shared tiles behind named barriers instead of
 *        block-wide phases. The math and the hi + lo splits are those of the mma.sync kernel in
 *        chunk_bwd.cuh (read its comment), every product keeps its k order; the fp32 sums of
 *        dgam and dbeta run in another fixed order, so dg and dbeta have their own bits (the
 *        tests hold both kernels to the fp64 reference).
 *
 * Who computes what (u = one 64 x 64 x 64 product):
 *   WG0  dS~ = dO V'^T (2u) -> tile;  Q K^T .* dS~ sums (2u);  K K^T (2u);  Tm^T Y (2u) -> E tiles
 *   WG1  dQ = dO S^T (4u) + dS~ K (2u) -> dq_v;  Tm^T dV' (2u) -> dv, dbeta's V term
 *   WG2  dW = -dV' S^T (4u) -> tile;  dW K^T, dV' V^T (4u) -> dTm;  dTm Tm^T (2u) -> Y tiles
 *   WG3  dK = V' Z^T (4u) + dS~^T Q (2u) + diag(b Gam) Tm^T dW (2u) + (Eb + Eb^T) K (4u) -> dk_v
 * The chain dW -> dTm -> Y -> E -> dK runs through WG2, WG0 and WG3; the other products fill
 * the gaps (dV' V^T runs during dW's epilogue; dTm Tm^T takes dTm from WG2's registers, so dTm
 * never goes to shared memory). Y has tiles of its own, E goes over Z once Z's readers have
 * passed a barrier; a whole chunk's dK leaves by a TMA store from the dW tile (the block's tail),
 * dQ and dv from the dO and V' tiles (stage_and_store).
 * Loads, exposed at the block start: a whole chunk's as TMA boxes from one thread in four sets
 * behind their own mbarriers, the chain's first (S and dV', then K, V and Tm), each role waiting
 * for the sets it reads; a chunk cut short by its document's end as cp.async by all 512 threads in
 * two groups with the zero fill of the rows past the length; the reverse walk that
 * keeps the state on chip is the step after (docs/design_fused_bwd_sm90.md). An earlier form split every product by
 * columns over the four warpgroups (m64n16 / m64n32 steps, block-wide barriers between phases): 4.47 ms at M against
 * 3.10 for this one (docs/PERF.md).
 */
#pragma once

#include "bwd/dv_local.cuh"
#include "common/grid.cuh"
#include "common/pipeline.cuh"
#include "common/wgmma.cuh"

#if GDN_HAS_WGMMA

namespace gdn {
namespace sm90 {

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

}  // namespace sm90

template <class Cfg>
struct WalkBwdFusedSm90;

template <class Cfg>
struct ChunkBwdSm90 {
  // The fused backward (walk_bwd_layout "fused") runs this body's products and epilogues.
  friend struct WalkBwdFusedSm90<Cfg>;
  static constexpr int K = Cfg::K, V = Cfg::V, C = Cfg::CHUNK, H = Cfg::H, HV = Cfg::HV;
  static constexpr int kThreads = ChunkBwdGeometry::kThreads;
  static_assert(kThreads == 512, "ChunkBwdSm90: 4 warpgroups");
  static_assert(C == 64 && K == 128 && V == 128, "ChunkBwdSm90: chunk 64 and K = V = 128 only");
  static_assert(HV == H * Cfg::G, "ChunkBwdSm90: HV must equal H * G");

  // Byte offsets of the SW128 tiles (each a multiple of 1024 bytes).
  static constexpr int kTok = C * K * 2, kSq = K * V * 2, kCC = C * C * 2;
  static constexpr int kOffQ = 0, kOffK = kTok, kOffV = 2 * kTok, kOffDV = 3 * kTok, kOffO = 4 * kTok,
                       kOffVn = 5 * kTok, kOffS = 6 * kTok, kOffZ = kOffS + kSq, kOffT = kOffZ + kSq,
                       kOffDS = kOffT + kCC, kOffDW = kOffDS + kCC, kOffYh = kOffDW + kTok, kOffYl = kOffYh + kCC,
                       kOffScalars = kOffYl + kCC;
  static constexpr int kOffEh = kOffZ, kOffEl = kOffZ + kCC;
  // fp32 scalars: gc, beta, then the per-row terms of dgam and dbeta, each written by one warpgroup.
  enum : int {
    sG = 0,
    sB = 64,
    sGq = 128,
    sAttR = 192,
    sKst = 256,
    sR1 = 320,
    sDbv = 384,
    sR2 = 448,
    sGam = 512,
    sDb = 576,
    sAttC = 640,
    sCs = 896,
    sSz = 1152,
    kScalarFloats = 1156
  };
  static constexpr int kOffBars = kOffScalars + 4 * kScalarFloats;  // four mbarriers: the TMA load sets
  static_assert(kOffBars % 8 == 0, "ChunkBwdSm90: mbarriers are 8-byte aligned");
  static constexpr int kSmemBytes = kOffBars + 4 * 8;
  /// A whole chunk's tiles arrive by TMA (Program::tensor_maps in this order): 64 x 64 boxes of
  /// the token tensors, K x 64 boxes of the state tapes, in the two groups the cp.async path has.
  /// dK, the block's last product, leaves the same way from the dW tile (free by then), dQ and dv
  /// from the dO and V' tiles (free once WG1 has passed kBarDS).
  enum TmaOperand { kMapQ, kMapK, kMapV, kMapDV, kMapO, kMapVn, kMapS, kMapZ, kMapT, kMapDk, kMapDq, kMapDv };
  /// A whole chunk's tiles arrive as four sets, each behind its own mbarrier, in the chain's order:
  /// S and dV' (dW = -dV' S^T, the chain's first product), K, V and Tm (its next three), dO and V'
  /// (dS~, dO S^T), Q and Z. Each role waits for the sets its products read, nothing more.
  enum LoadSet : int { kSetSDv, kSetKVT, kSetOVn, kSetQZ, kLoadSets };
  static_assert(kSmemBytes == ChunkBwdGeometry::smem_bytes_ws(K, V, C), "ChunkBwdSm90: the host's size differs");

  // Named barriers (0 is __syncthreads); each of 1-7 is passed once per block.
  enum : int {
    kBarDS = 1,
    kBarDW = 2,
    kBarY = 4,
    kBarZFree = 5,
    kBarE = 6,
    kBarLoaded = 7,
    kBarLocal = 8,       // + role: 8 .. 11
    kBarTerms = 12,      // WG0 and WG3 (which arrives): sKst, sSz and sR1 are written
    kBarQueryTerms = 13  // WG0 and WG1: sDbv is written
  };

  /// The warpgroup's view of a 64 x N accumulator: warp w rows 16w + g (h = 0) and + 8 (h = 1),
  /// columns 8i + tq + e at d[4i + 2h + e].
  struct Lane {
    int ctid, w, g, tq, r[2];
    __device__ __forceinline__ explicit Lane(int t) : ctid(t), w(t >> 5), g((t & 31) >> 2), tq((t & 3) * 2) {
      r[0] = 16 * w + g;
      r[1] = r[0] + 8;
    }
  };

  __device__ __forceinline__ static float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
  }
  /// Sum over the 8 row groups of the warp (lanes with the same tq).
  __device__ __forceinline__ static float octet_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 4);
    x += __shfl_xor_sync(0xffffffffu, x, 8);
    return x + __shfl_xor_sync(0xffffffffu, x, 16);
  }

  __device__ __forceinline__ static u32 swz(int r, int c, int rows) { return sw128::offset(r, c, rows); }
  __device__ __forceinline__ static u32 lds_u32(const unsigned char* smem, u32 off) {
    return *reinterpret_cast<const u32*>(smem + off);
  }
  __device__ __forceinline__ static float lo_f(u32 pair) { return bf16_lo_f(pair); }
  __device__ __forceinline__ static float hi_f(u32 pair) { return bf16_hi_f(pair); }

  /// acc (+)= A B over `steps` k-steps of 16; TA / TB: 1 = M- / N-major operand (as wg::mma_k16).
  /// With accumulate = false the first step overwrites acc. Not waited for: commit, then wait.
  template <int N, int TA, int TB>
  __device__ __forceinline__ static void issue(float (&acc)[N / 2], u32 a, int a_rows, u32 b, int b_rows, int steps,
                                               bool accumulate) {
    wg::fence_acc(acc);
    wg::fence();
#pragma unroll
    for (int ks = 0; ks < steps; ++ks) {
      const wg::u64 da = TA ? wg::desc_mn_major(a, a_rows, ks) : wg::desc_k_major(a, a_rows, ks);
      const wg::u64 db = TB ? wg::desc_mn_major(b, b_rows, ks) : wg::desc_k_major(b, b_rows, ks);
      wg::mma_k16<N, TA, TB>(acc, da, db, (accumulate || ks > 0) ? 1 : 0);
    }
  }
  /// acc (+)= A B with A in registers (RS): a[4 ks .. 4 ks + 3] is k-step ks's fragment, which is
  /// what an accumulator-layout tile's bf16 pairs at [2 i + hh] (row L.r[hh], columns 8 i + tq, + 1)
  /// are for column groups 2 ks and 2 ks + 1. B as `issue` takes it (TB: 1 = N-major).
  template <int N, int TB, int A4>
  __device__ __forceinline__ static void issue_rs(float (&acc)[N / 2], const u32 (&a)[A4], u32 b, int b_rows,
                                                  bool accumulate) {
    wg::fence_acc(acc);
    wg::fence();
#pragma unroll
    for (int ks = 0; ks < A4 / 4; ++ks) {
      const u32 f[4] = {a[4 * ks], a[4 * ks + 1], a[4 * ks + 2], a[4 * ks + 3]};
      const wg::u64 db = TB ? wg::desc_mn_major(b, b_rows, ks) : wg::desc_k_major(b, b_rows, ks);
      wg::mma_rs_k16<N, TB>(acc, f, db, (accumulate || ks > 0) ? 1 : 0);
    }
  }
  template <int W, class... Accs>
  __device__ __forceinline__ static void wait(Accs&... accs) {
    wg::wait<W>();
    (wg::fence_acc(accs), ...);
  }

  __device__ static void run(const ChunkBwdParams& p, const TensorMaps& maps) {
    // Value heads fastest in launch order: the G blocks of one (chunk, q/k head) run back to back
    // and read its Q and K tiles from L2. Measured 7 % faster for this body (the portable kernel's
    // longer blocks were 3.5 % slower so, docs/PERF.md).
    const ChunkHead at = chunk_head_of_block();
    const ChunkInfo ci = p.chunks[at.chunk];
    if (ci.len == 0) return;
    const int j = at.head, h = j / Cfg::G, m = ci.len, tid = threadIdx.x;
    const long long t0 = ci.start, cg = at.chunk;
    // SW128 tiles need 1024-byte aligned starts: the declaration's alignment holds because the
    // kernel has no static shared memory (gpu_wgmma probes the same declaration).
    extern __shared__ __align__(1024) unsigned char smem[];
    bf16_t* const base = reinterpret_cast<bf16_t*>(smem);
    auto tile = [&](int off) { return base + off / 2; };
    unsigned long long* const bars = reinterpret_cast<unsigned long long*>(smem + kOffBars);
    // A whole chunk: one thread issues the four load sets as TMA boxes, the chain's first (the
    // tapes are always whole); a chunk cut short by its document's end keeps every thread's
    // cp.async in two groups with the zero fill of its rows past the length.
    const bool whole = m == C;
    if (whole) {
      if (tid == 0) {
#pragma unroll
        for (int b = 0; b < kLoadSets; ++b) pipe::mbar_init(bars + b, 1);
        pipe::fence_mbar_init();
        const int row = static_cast<int>(t0), srow = static_cast<int>((cg * HV + j) * K);
        unsigned long long* bar = bars + kSetSDv;
        pipe::mbar_arrive_expect_tx(bar, kSq + kTok);
        pipe::tma_load_tile<K, V>(tile(kOffS), &maps.map[kMapS], 0, srow, bar);
        pipe::tma_load_tile<C, V>(tile(kOffDV), &maps.map[kMapDV], j * V, row, bar);
        bar = bars + kSetKVT;
        pipe::mbar_arrive_expect_tx(bar, 2 * kTok + kCC);
        pipe::tma_load_tile<C, K>(tile(kOffK), &maps.map[kMapK], h * K, row, bar);
        pipe::tma_load_tile<C, V>(tile(kOffV), &maps.map[kMapV], j * V, row, bar);
        pipe::tma_load_tile<C, C>(tile(kOffT), &maps.map[kMapT], j * C, row, bar);
        bar = bars + kSetOVn;
        pipe::mbar_arrive_expect_tx(bar, 2 * kTok);
        pipe::tma_load_tile<C, V>(tile(kOffO), &maps.map[kMapO], j * V, row, bar);
        pipe::tma_load_tile<C, V>(tile(kOffVn), &maps.map[kMapVn], j * V, row, bar);
        bar = bars + kSetQZ;
        pipe::mbar_arrive_expect_tx(bar, kTok + kSq);
        pipe::tma_load_tile<C, K>(tile(kOffQ), &maps.map[kMapQ], h * K, row, bar);
        pipe::tma_load_tile<K, V>(tile(kOffZ), &maps.map[kMapZ], 0, srow, bar);
      }
    } else {
      const long long qs = (long long)H * K, vs = (long long)HV * V;
      const long long st = (cg * HV + j) * K * V;
      sm90::load_sw_async<C, V, kThreads>(tile(kOffO), p.d_o + (t0 * HV + j) * V, vs, m);
      sm90::load_sw_async<C, V, kThreads>(tile(kOffVn), p.v_new + (t0 * HV + j) * V, vs, m);
      sm90::load_sw_async<K, V, kThreads>(tile(kOffS), p.h_tape + st, V, K);
      sm90::load_sw_async<C, V, kThreads>(tile(kOffDV), p.dv_new + (t0 * HV + j) * V, vs, m);
      bwd::cp_async_commit();
      sm90::load_sw_async<C, K, kThreads>(tile(kOffQ), p.q + (t0 * H + h) * K, qs, m);
      sm90::load_sw_async<C, K, kThreads>(tile(kOffK), p.k + (t0 * H + h) * K, qs, m);
      sm90::load_sw_async<K, V, kThreads>(tile(kOffZ), p.dh_tape + st, V, K);
      sm90::load_sw_async<C, C, kThreads>(tile(kOffT), p.tm + (t0 * HV + j) * C, (long long)HV * C, m);
      sm90::load_sw_async<C, V, kThreads>(tile(kOffV), p.v + (t0 * HV + j) * V, vs, m);
      bwd::cp_async_commit();
    }
    float* const sc = reinterpret_cast<float*>(smem + kOffScalars);
    if (tid < C) {
      sc[sG + tid] = tid < m ? p.gc[(t0 + tid) * HV + j] : 0.f;
      sc[sB + tid] = tid < m ? p.beta[(t0 + tid) * HV + j] : 0.f;
    }
    if (!whole) {
      bwd::cp_async_wait<1>();
      wg::fence_smem_for_async();
    }
    __syncthreads();  // the scalars (and the barriers' initialization)

    const int role = tid >> 7;
    const Lane L(tid & 127);
    // Each role's TMA stores are waited for by its issuing thread before it leaves (the shared
    // memory lives until the block's last thread has).
    if (role == 3) {
      key_side(p, maps, smem, sc, L, m, t0, j, bars);
      if (whole && tid == 3 * 128) pipe::bulk_wait<0>();
      return;
    }
    if (role == 2) return chain_side(smem, sc, L, m, bars);
    if (role == 1) {
      query_side(p, maps, smem, sc, L, m, t0, j, bars);
      // A barrier of its own, synced by both sides: WG1 has nothing left to do, and racecheck
      // reported WG0's reads of sDbv against these writes when WG1 arrived and left, and (96 of
      // them) when WG1 synced at a barrier that WG3's arrive could complete.
      pipe::named_sync_roles(kBarQueryTerms, 256);
      if (whole && tid == 128) pipe::bulk_wait<0>();
      return;
    }
    scores_and_inverse(p, smem, sc, L, m, bars);
    // WG0 finishes the block's per-row terms while WG3 runs the chain's last product (dK's E
    // term, which no row term needs): WG1 and WG3 reach their barriers once theirs are written.
    pipe::named_sync_roles(kBarQueryTerms, 256);
    pipe::named_sync_roles(kBarTerms, 256);

    // dgam and dbeta per row, each term in a fixed order, then B6: the reverse cumsum of dgam.
    float* const gam = sc + sGam;
    float* const db = sc + sDb;
    if (tid < C) {
      const int r = tid;
      // The last row's sum of the others' shifted state terms, by the same butterfly in both
      // warps: a serial loop over up to 63 rows kept the other 15 warps at the barrier below.
      const int l = tid & 31;
      const float kst =
          warp_sum((2 * l < m - 1 ? sc[sKst + 2 * l] : 0.f) + (2 * l + 1 < m - 1 ? sc[sKst + 2 * l + 1] : 0.f));
      float gr = 0.f, dbr = 0.f;
      if (r < m) {
        const float g = sc[sG + r], b = sc[sB + r], gmr = exp2f(fminf(g, 0.f));
        gr = sc[sGq + r];
        gr += sc[sAttR + r] - (((sc[sAttC + r] + sc[sAttC + 64 + r]) + sc[sAttC + 128 + r]) + sc[sAttC + 192 + r]);
        if (r == m - 1) {
          const float szs = ((sc[sSz] + sc[sSz + 1]) + sc[sSz + 2]) + sc[sSz + 3];
          gr += exp2f(fminf(sc[sG + m - 1], 0.f)) * szs + kst;
        } else {
          gr -= sc[sKst + r];
        }
        const float r1 = sc[sR1 + r], r2 = sc[sR2 + r];
        gr += b * gmr * r1;
        gr += b * r2 - (((sc[sCs + r] + sc[sCs + 64 + r]) + sc[sCs + 128 + r]) + sc[sCs + 192 + r]);
        dbr = gmr * r1 + sc[sDbv + r] + r2;
      }
      gam[r] = gr;
      db[r] = dbr;
    }
    local_sync(0);
    if (tid < 32) {
      const int i0 = 2 * tid, i1 = 2 * tid + 1;
      const float a = gam[i0], b = gam[i1];
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
        p.dbeta[(t0 + i0) * HV + j] = db[i0];
      }
      if (i1 < m) {
        p.dg[(t0 + i1) * HV + j] = after + b;
        p.dbeta[(t0 + i1) * HV + j] = db[i1];
      }
    }
  }

 private:
  /// A whole chunk's load sets are in (a cut chunk's first cp.async group, which holds the sets
  /// kSetSDv and kSetOVn, was waited for by every thread at the block's start).
  template <class... Sets>
  __device__ __forceinline__ static void sets_landed(int m, unsigned long long* bars, Sets... sets) {
    if (m == C) (pipe::mbar_wait(bars + sets, 0), ...);
  }
  /// The sets of the second cp.async group a role reads are in: their TMA bytes (a whole chunk),
  /// or every thread's cp.async (a block-wide barrier: one call per thread).
  template <class... Sets>
  __device__ __forceinline__ static void second_group_landed(int m, unsigned long long* bars, Sets... sets) {
    if (m == C) {
      (pipe::mbar_wait(bars + sets, 0), ...);
    } else {
      bwd::cp_async_wait<0>();
      wg::fence_smem_for_async();
      pipe::named_sync_roles(kBarLoaded, kThreads);
    }
  }
  __device__ __forceinline__ static void local_sync(int role) { pipe::named_sync(kBarLocal + role, 128); }

  /// Stores the rows < m of a 64 x 128 accumulator as bf16 pairs at out (row stride `stride`).
  __device__ __forceinline__ static void store_rows(bf16_t* out, long long stride, const float (&d)[64], const Lane& L,
                                                    int m, const float* row_scale = nullptr) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int r = L.r[hh];
      if (r >= m) continue;
      const float f = row_scale ? row_scale[r] : 1.f;
#pragma unroll
      for (int i = 0; i < 16; ++i)
        bwd::store_bf16x2(out + r * stride + 8 * i + L.tq, f * d[4 * i + 2 * hh], f * d[4 * i + 2 * hh + 1]);
    }
  }

  /// Four 8 x 8 blocks of a 64-row SW128 tile at `tile` by one stmatrix: this thread's bf16 pairs of
  /// rows L.r[0], L.r[1] at columns 8 i + tq (p0, p1) and 8 (i + 1) + tq (p2, p3), the bytes a 4-byte store
  /// of each pair at swz(r, c, C) would write. Lanes 8 mi .. 8 mi + 7 give the rows of matrix mi:
  /// rows 16 w + 8 (mi & 1) .., columns 8 i + 8 (mi >> 1) ... One instruction instead of four
  /// 4-byte stores, on the chain's epilogues.
  __device__ __forceinline__ static void stsm_pairs(u32 tile, int i, const Lane& L, u32 p0, u32 p1, u32 p2, u32 p3) {
    const int mi = (L.ctid & 31) >> 3, row = 16 * L.w + 8 * (mi & 1) + (L.ctid & 7);
    const u32 f[4] = {p0, p1, p2, p3};
    wg::stsm_x4(tile + swz(row, 8 * i + 8 * (mi >> 1), C), f);
  }

  /// A whole chunk's 64 x 128 accumulator (rows scaled by row_scale when given, then rounded as
  /// store_rows does) into the free SW128 tile at `tile` by stmatrix, and out by two TMA boxes
  /// from the warpgroup's first thread (matrix mi of column pair i: rows 16 w + 8 (mi & 1) ..,
  /// columns 8 i + 8 (mi >> 1) ..). The issuing thread waits for the bytes at the block's end.
  __device__ __forceinline__ static void stage_and_store(int role, const TensorMaps& maps, int map, int col,
                                                         long long t0, u32 tile, const float (&d)[64], const Lane& L,
                                                         const float* row_scale) {
    const int mi = (L.ctid & 31) >> 3, row = 16 * L.w + 8 * (mi & 1) + (L.ctid & 7);
    const float f0 = row_scale ? row_scale[L.r[0]] : 1.f, f1 = row_scale ? row_scale[L.r[1]] : 1.f;
#pragma unroll
    for (int i = 0; i < 16; i += 2) {
      const u32 f[4] = {f2bf_pair(f0 * d[4 * i], f0 * d[4 * i + 1]), f2bf_pair(f1 * d[4 * i + 2], f1 * d[4 * i + 3]),
                        f2bf_pair(f0 * d[4 * i + 4], f0 * d[4 * i + 5]),
                        f2bf_pair(f1 * d[4 * i + 6], f1 * d[4 * i + 7])};
      wg::stsm_x4(tile + sw128::offset(row, 8 * i + 8 * (mi >> 1), C), f);
    }
    wg::fence_smem_for_async();
    local_sync(role);
    if (L.ctid == 0) {
#pragma unroll
      for (int b = 0; b < 2; ++b)
        pipe::tma_store_2d(&maps.map[map], col + 64 * b, static_cast<int>(t0), tile + b * C * 128);
      pipe::bulk_commit();
    }
  }

  /// Row sums of d .* X (X a 64 x 128 bf16 tile at off, rows 64) over the columns of 16-column
  /// group i0 .. i0 + ni; both rows' sums of the thread (complete across the quad).
  template <int R>
  __device__ __forceinline__ static void row_dot(const unsigned char* smem, u32 off, const float (&d)[R], int i0,
                                                 int ni, const Lane& L, float (&out)[2]) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      // The row's offsets are recomputed per call: shared between calls they stay live across
      // the products in between and spill.
      int r = L.r[hh];
      asm volatile("" : "+r"(r));
      float s = 0.f;
#pragma unroll
      for (int i = 0; i < ni; ++i) {
        const u32 x = lds_u32(smem, off + swz(r, 8 * (i0 + i) + L.tq, 64));
        s += d[4 * i + 2 * hh] * lo_f(x) + d[4 * i + 2 * hh + 1] * hi_f(x);
      }
      out[hh] += s;
    }
  }

  /// dTm = tril1((dW K^T) diag(b Gam) + (dV' V^T) diag(b)), rows < m, from its two products T1 and
  /// T2, as bf16 hi and lo pairs of (row L.r[h], columns 8 i + tq, + 1) at [2 i + h].
  __device__ __forceinline__ static void split_dtm(const float (&T1)[32], const float (&T2)[32], const float* g,
                                                   const float* b, int m, const Lane& L, u32 (&hi2)[16],
                                                   u32 (&lo2)[16]) {
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        float v[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int r = L.r[hh], c = 8 * i + L.tq + e;
          const float gate = exp2f(fminf(g[c], 0.f));  // selected, not branched on (dS~'s comment)
          v[e] = select_f32(r > c && r < m, b[c] * (gate * T1[4 * i + 2 * hh + e] + T2[4 * i + 2 * hh + e]), 0.f);
        }
        split_bf16_pair(v[0], v[1], hi2[2 * i + hh], lo2[2 * i + hh]);
      }
  }

  /// Eb + Eb^T (Eb = diag(b) E, E in the accumulator layout, zero on and above the diagonal) as hi
  /// + lo SW128 tiles at eh_tile and el_tile.
  __device__ __forceinline__ static void store_e(u32 eh_tile, u32 el_tile, const float (&X)[32], const float* b,
                                                 const Lane& L) {
    {
      // By 8 x 8 blocks with stmatrix (the tile's bits as element-wise stores would give): warp
      // w holds rows 16 w .. 16 w + 15, row blocks 2 w + hh. A block (2 w + hh, i) below the
      // diagonal goes to its place and, transposed, to (i, 2 w + hh); a diagonal block is its
      // strictly lower part OR its transpose (the other triangle of each is +0); the blocks right
      // of the diagonal are the transposes other warps store. Four predicated two-byte stores
      // per element (256 per thread) became 2 to 15 stmatrix per tile and warp.
      const int lane = L.ctid & 31, w = L.w, arow = lane & 7, amat = (lane >> 3) & 1;
      const u32 eh = eh_tile, el = el_tile;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        u32 hp[2], lp[2];  // block (2 w + hh, i): this thread's pair of its row g, columns tq, tq + 1
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          float v[2];
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int r = L.r[hh], c = 8 * i + L.tq + e;
            v[e] = select_f32(r > c, b[r] * X[4 * i + 2 * hh + e], 0.f);
          }
          split_bf16_pair(v[0], v[1], hp[hh], lp[hh]);
        }
        const u32 direct = swz(16 * w + 8 * amat + arow, 8 * i, C);  // rows of blocks (2w, i), (2w + 1, i)
        if (i < 2 * w) {
          const u32 mirror = swz(8 * i + arow, 16 * w + 8 * amat, C);  // rows of blocks (i, 2w), (i, 2w + 1)
          wg::stsm_x2(eh + direct, hp[0], hp[1]);
          wg::stsm_x2(el + direct, lp[0], lp[1]);
          wg::stsm_x2_trans(eh + mirror, hp[0], hp[1]);
          wg::stsm_x2_trans(el + mirror, lp[0], lp[1]);
        } else if (i == 2 * w) {  // (2w, 2w) diagonal; (2w + 1, 2w) below it, mirrored to (2w, 2w + 1)
          const u32 mirror = swz(8 * i + arow, 16 * w + 8, C);
          wg::stsm_x2(eh + direct, hp[0] | wg::movmatrix_trans(hp[0]), hp[1]);
          wg::stsm_x2(el + direct, lp[0] | wg::movmatrix_trans(lp[0]), lp[1]);
          wg::stsm_x1_trans(eh + mirror, hp[1]);
          wg::stsm_x1_trans(el + mirror, lp[1]);
        } else if (i == 2 * w + 1) {  // (2w + 1, 2w + 1) diagonal
          const u32 diag = swz(16 * w + 8 + arow, 8 * i, C);
          wg::stsm_x1(eh + diag, hp[1] | wg::movmatrix_trans(hp[1]));
          wg::stsm_x1(el + diag, lp[1] | wg::movmatrix_trans(lp[1]));
        }
      }
    }
  }

  /// Warpgroup 0: dS~, the scores' gate terms, K K^T and the inverse's backward Tm^T Y -> E.
  __device__ static void scores_and_inverse(const ChunkBwdParams& p, unsigned char* smem, float* sc, const Lane& L,
                                            int m, unsigned long long* bars) {
    const u32 s0 = wg::smem_u32(smem);
    const float* g = sc + sG;
    const float* b = sc + sB;
    float A[32], QK[32];
    sets_landed(m, bars, kSetOVn);
    issue<64, 0, 0>(A, s0 + kOffO, C, s0 + kOffVn, C, V / 16, false);
    wg::commit();
    second_group_landed(m, bars, kSetKVT, kSetQZ);
    issue<64, 0, 0>(QK, s0 + kOffQ, C, s0 + kOffK, C, K / 16, false);
    wg::commit();
    wait<1>(A);
    u32 ds[16];  // bf16 dS~ of (row L.r[hh], columns 8 i + tq, + 1) at [2 i + hh], also read back below
    {            // dS~ = scale * tril0((dO V'^T) .* Dec), rows < m.
      const float scale = p.scale;
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int r = L.r[hh];
        const float gr = g[r];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const int c = 8 * i + L.tq;
          // Every gate is computed and then selected (select_f32): a gate inside `?:` made each
          // element a branch of its own, which serialized the epilogue of the chain's warpgroup.
          const float e0 = exp2f(fminf(gr - g[c], 0.f)), e1 = exp2f(fminf(gr - g[c + 1], 0.f));
          const float v0 = select_f32(r >= c && r < m, scale * A[4 * i + 2 * hh] * e0, 0.f);
          const float v1 = select_f32(r >= c + 1 && r < m, scale * A[4 * i + 2 * hh + 1] * e1, 0.f);
          ds[2 * i + hh] = f2bf_pair(v0, v1);
        }
      }
#pragma unroll
      for (int i = 0; i < 8; i += 2)
        stsm_pairs(s0 + kOffDS, i, L, ds[2 * i], ds[2 * i + 1], ds[2 * i + 2], ds[2 * i + 3]);
    }
    wg::fence_smem_for_async();
    pipe::named_arrive_roles(kBarDS, 384);
    wait<0>(QK);
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
          const float m0 = r > c ? QK[4 * i + 2 * hh] * lo_f(ds[2 * i + hh]) : 0.f;
          const float m1 = r > c + 1 ? QK[4 * i + 2 * hh + 1] * hi_f(ds[2 * i + hh]) : 0.f;
          rs[hh] += m0 + m1;
          cs[2 * i] += m0;
          cs[2 * i + 1] += m1;
        }
      }
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const float s = quad_sum(rs[hh]);
        if ((L.ctid & 3) == 0) sc[sAttR + L.r[hh]] = s;
      }
#pragma unroll
      for (int q = 0; q < 16; ++q) {
        const float s = octet_sum(cs[q]);
        if (L.g == 0) sc[sAttC + 64 * L.w + 8 * (q >> 1) + L.tq + (q & 1)] = s;
      }
    }
    float KK[32], X[32];
    issue<64, 0, 0>(KK, s0 + kOffK, C, s0 + kOffK, C, K / 16, false);
    wg::commit();
    pipe::named_sync_roles(kBarY, 256);
    issue<64, 1, 1>(X, s0 + kOffT, C, s0 + kOffYh, C, C / 16, false);
    issue<64, 1, 1>(X, s0 + kOffT, C, s0 + kOffYl, C, C / 16, true);
    wg::commit();
    wait<0>(KK, X);
    // E = tril1(-Tm^T Y) .* Dec (rows < m); Eb + Eb^T (Eb = diag(b) E) as hi + lo tiles over Z.
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int r = L.r[hh], c = 8 * i + L.tq + e;
          float& v = X[4 * i + 2 * hh + e];
          const float gate = exp2f(fminf(g[r] - g[c], 0.f));  // selected, not branched on (dS~'s comment)
          v = select_f32(r > c && r < m, -v * gate, 0.f);
        }
    pipe::named_sync_roles(kBarZFree, 256);
    store_e(s0 + kOffEh, s0 + kOffEl, X, b, L);
    wg::fence_smem_for_async();
    pipe::named_arrive_roles(kBarE, 256);
    {  // rowsum(E .* KK) -> dbeta and dgam, colsum(diag(b) E .* KK) -> dgam.
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
        const float s = quad_sum(rs[hh]);
        if ((L.ctid & 3) == 0) sc[sR2 + L.r[hh]] = s;
      }
#pragma unroll
      for (int q = 0; q < 16; ++q) {
        const float s = octet_sum(cs[q]);
        if (L.g == 0) sc[sCs + 64 * L.w + 8 * (q >> 1) + L.tq + (q & 1)] = s;
      }
    }
  }

  /// Warpgroup 1: dQ = scale diag(exp2(gc)) dO S^T + dS~ K (its state part's gate term), then
  /// dvb = Tm^T dV': dv = diag(b) dvb and dbeta's rowsum(dvb .* V).
  __device__ static void query_side(const ChunkBwdParams& p, const TensorMaps& maps, unsigned char* smem, float* sc,
                                    const Lane& L, int m, long long t0, int j, unsigned long long* bars) {
    const u32 s0 = wg::smem_u32(smem);
    const float* g = sc + sG;
    float D[64];
    sets_landed(m, bars, kSetSDv, kSetOVn);
    issue<128, 0, 0>(D, s0 + kOffO, C, s0 + kOffS, K, V / 16, false);
    wg::commit();
    second_group_landed(m, bars, kSetKVT, kSetQZ);
    wait<0>(D);
    {
      float f[2], rs[2] = {0.f, 0.f};
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) f[hh] = L.r[hh] < m ? p.scale * exp2f(fminf(g[L.r[hh]], 0.f)) : 0.f;
#pragma unroll
      for (int i = 0; i < 16; ++i)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          D[4 * i + 2 * hh] *= f[hh];
          D[4 * i + 2 * hh + 1] *= f[hh];
        }
      row_dot(smem, kOffQ, D, 0, 16, L, rs);
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const float s = quad_sum(rs[hh]);
        if ((L.ctid & 3) == 0) sc[sGq + L.r[hh]] = s;
      }
    }
    pipe::named_sync_roles(kBarDS, 384);
    issue<128, 0, 1>(D, s0 + kOffDS, C, s0 + kOffK, C, C / 16, true);
    wg::commit();
    wait<0>(D);
    // A whole chunk's dQ and dv leave by TMA from the dO and V' tiles: their readers (WG0's dS~,
    // this warpgroup's dO S^T, WG3's V' Z^T) arrived at kBarDS after their products completed.
    const bool whole = m == C;
    if (whole)
      stage_and_store(1, maps, kMapDq, j * K, t0, s0 + kOffO, D, L, nullptr);
    else
      store_rows(p.dq_v + (t0 * HV + j) * K, (long long)HV * K, D, L, m);
    float X[64];
    issue<128, 1, 1>(X, s0 + kOffT, C, s0 + kOffDV, C, C / 16, false);
    wg::commit();
    wait<0>(X);
    if (whole)
      stage_and_store(1, maps, kMapDv, j * V, t0, s0 + kOffVn, X, L, sc + sB);
    else
      store_rows(p.dv + (t0 * HV + j) * V, (long long)HV * V, X, L, m, sc + sB);
    float rs[2] = {0.f, 0.f};
    row_dot(smem, kOffV, X, 0, 16, L, rs);
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const float s = quad_sum(rs[hh]);
      if ((L.ctid & 3) == 0) sc[sDbv + L.r[hh]] = s;
    }
  }

  /// Warpgroup 2: dW = -dV' S^T (bf16 tile), dTm = tril1((dW K^T) diag(b Gam) + (dV' V^T) diag(b))
  /// in hi + lo registers, Y = dTm Tm^T as hi + lo tiles of their own.
  __device__ static void chain_side(unsigned char* smem, float* sc, const Lane& L, int m, unsigned long long* bars) {
    const u32 s0 = wg::smem_u32(smem);
    const float* g = sc + sG;
    const float* b = sc + sB;
    // dV' V^T needs only the loads: it runs while dW's epilogue does, so the chain's next step
    // after dW is the one product that needs it.
    float T2[32];
    {
      float W[64];
      sets_landed(m, bars, kSetSDv);
      issue<128, 0, 0>(W, s0 + kOffDV, C, s0 + kOffS, K, V / 16, false);
      wg::commit();
      second_group_landed(m, bars, kSetKVT);
      issue<64, 0, 0>(T2, s0 + kOffDV, C, s0 + kOffV, C, V / 16, false);
      wg::commit();
      wait<1>(W);
#pragma unroll
      for (int i = 0; i < 16; i += 2) {
        auto pair = [&](int k) { return f2bf_pair(-W[k], -W[k + 1]); };
        stsm_pairs(s0 + kOffDW, i, L, pair(4 * i), pair(4 * i + 2), pair(4 * i + 4), pair(4 * i + 6));
      }
    }
    wg::fence_smem_for_async();
    pipe::named_arrive_roles(kBarDW, 256);
    local_sync(2);
    float T1[32];
    issue<64, 0, 0>(T1, s0 + kOffDW, C, s0 + kOffK, C, K / 16, false);
    wg::commit();
    wait<0>(T1, T2);
    u32 hi2[16], lo2[16];  // dTm's hi and lo pairs of (row h, columns 8i + tq, + 1) at [2i + h]
    split_dtm(T1, T2, g, b, m, L, hi2, lo2);
    // Y = dTm Tm^T with dTm's hi and lo halves from the registers (no shared copy of dTm).
    float Y[32];
    issue_rs<64, 0>(Y, hi2, s0 + kOffT, C, false);
    issue_rs<64, 0>(Y, lo2, s0 + kOffT, C, true);
    wg::commit();
    wait<0>(Y);
    {
      u32 yh[16], yl[16];  // as hi2 / lo2
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          split_bf16_pair(Y[4 * i + 2 * hh], Y[4 * i + 2 * hh + 1], yh[2 * i + hh], yl[2 * i + hh]);
        }
#pragma unroll
      for (int i = 0; i < 8; i += 2) {
        stsm_pairs(s0 + kOffYh, i, L, yh[2 * i], yh[2 * i + 1], yh[2 * i + 2], yh[2 * i + 3]);
        stsm_pairs(s0 + kOffYl, i, L, yl[2 * i], yl[2 * i + 1], yl[2 * i + 2], yl[2 * i + 3]);
      }
    }
    wg::fence_smem_for_async();
    pipe::named_arrive_roles(kBarY, 256);
  }

  /// Warpgroup 3: dK = diag(exp2(gcL - gc)) V' Z^T + dS~^T Q + diag(b Gam) Tm^T dW + (Eb + Eb^T) K,
  /// the state term's and R1's row sums, and <S, Z>.
  __device__ static void key_side(const ChunkBwdParams& p, const TensorMaps& maps, unsigned char* smem, float* sc,
                                  const Lane& L, int m, long long t0, int j, unsigned long long* bars) {
    const u32 s0 = wg::smem_u32(smem);
    const float* g = sc + sG;
    const float* b = sc + sB;
    second_group_landed(m, bars, kSetOVn, kSetQZ, kSetSDv, kSetKVT);
    float D[64];
    issue<128, 0, 0>(D, s0 + kOffVn, C, s0 + kOffZ, K, V / 16, false);
    wg::commit();
    {  // <S, Z> over the two tiles' bytes in the same order (their layouts are the same).
      float sz = 0.f;
      const uint4* S = reinterpret_cast<const uint4*>(smem + kOffS);
      const uint4* Z = reinterpret_cast<const uint4*>(smem + kOffZ);
#pragma unroll 2
      for (int i = 0; i < kSq / 16 / 128; ++i) {
        const uint4 a = S[i * 128 + L.ctid], z = Z[i * 128 + L.ctid];
        sz += lo_f(a.x) * lo_f(z.x) + hi_f(a.x) * hi_f(z.x);
        sz += lo_f(a.y) * lo_f(z.y) + hi_f(a.y) * hi_f(z.y);
        sz += lo_f(a.z) * lo_f(z.z) + hi_f(a.z) * hi_f(z.z);
        sz += lo_f(a.w) * lo_f(z.w) + hi_f(a.w) * hi_f(z.w);
      }
      sz = warp_sum(sz);
      if ((L.ctid & 31) == 0) sc[sSz + L.w] = sz;
    }
    wait<0>(D);
    pipe::named_arrive_roles(kBarZFree, 256);
    const float gL = g[m - 1];
    {  // dKst's rows scaled by exp2(gcL - gc); rowsum(dKst .* K) -> dgam (the shifted terms).
      float f[2], rs[2] = {0.f, 0.f};
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) f[hh] = L.r[hh] < m ? gate_exp2(gL - g[L.r[hh]], true) : 0.f;
#pragma unroll
      for (int i = 0; i < 16; ++i)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          D[4 * i + 2 * hh] *= f[hh];
          D[4 * i + 2 * hh + 1] *= f[hh];
        }
      row_dot(smem, kOffK, D, 0, 16, L, rs);
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const float s = quad_sum(rs[hh]);
        if ((L.ctid & 3) == 0) sc[sKst + L.r[hh]] = s;
      }
    }
    pipe::named_sync_roles(kBarDS, 384);
    issue<128, 1, 1>(D, s0 + kOffDS, C, s0 + kOffQ, C, C / 16, true);
    wg::commit();
    wait<0>(D);
    pipe::named_sync_roles(kBarDW, 256);
    {  // dkbg = Tm^T dW in two 64-column halves: dK += diag(b Gam) dkbg, R1 = rowsum(dkbg .* K).
      float f[2], rs[2] = {0.f, 0.f};
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) f[hh] = L.r[hh] < m ? b[L.r[hh]] * exp2f(fminf(g[L.r[hh]], 0.f)) : 0.f;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float X[32];
        issue<64, 1, 1>(X, s0 + kOffT, C, s0 + kOffDW + half * C * 128, C, C / 16, false);
        wg::commit();
        wait<0>(X);
        row_dot(smem, kOffK, X, 8 * half, 8, L, rs);
#pragma unroll
        for (int i = 0; i < 8; ++i)
#pragma unroll
          for (int hh = 0; hh < 2; ++hh)
#pragma unroll
            for (int e = 0; e < 2; ++e) D[4 * (i + 8 * half) + 2 * hh + e] += f[hh] * X[4 * i + 2 * hh + e];
      }
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const float s = quad_sum(rs[hh]);
        if ((L.ctid & 3) == 0) sc[sR1 + L.r[hh]] = s;
      }
    }
    pipe::named_arrive_roles(kBarTerms, 256);  // sKst, sSz and sR1 are written
    pipe::named_sync_roles(kBarE, 256);
    issue<128, 0, 1>(D, s0 + kOffEh, C, s0 + kOffK, C, C / 16, true);
    issue<128, 0, 1>(D, s0 + kOffEl, C, s0 + kOffK, C, C / 16, true);
    wg::commit();
    wait<0>(D);
    if (m < C) return store_rows(p.dk_v + (t0 * HV + j) * K, (long long)HV * K, D, L, m);
    // A whole chunk's dK by TMA from the dW tile: every reader of dW (WG2's dTm, this warpgroup's
    // Tm^T dW) finished before E, which this warpgroup waited for at kBarE.
    stage_and_store(3, maps, kMapDk, j * K, t0, s0 + kOffDW, D, L, nullptr);
  }
};

}  // namespace gdn

#endif  // GDN_HAS_WGMMA
