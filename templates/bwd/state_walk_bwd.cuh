/**
 * @file state_walk_bwd.cuh
 * @brief Stage B3: the reverse state walk. Per (V slab, value head, document) the K x BV fp32
 *        gradient Z lives in registers across the document's chunks, walked last to first.
 *
 * Per chunk c (m valid rows, gcL = gc of the last valid row):
 *   dh_tape[c] = bf16(Z)
 *   dV'_c      = exp2(gcL - gc_i) .* (Kc bf16(Z)) + dv_local_c     -> bf16, rows >= m are 0
 *   Z          = exp2(gcL) Z + (scale exp2(gc) .* Qc)^T dO_c - W_c^T bf16(dV'_c)
 * The serial dependency is Z -> Kc Z -> dV' -> W^T dV' -> Z; everything else (the next chunk's
 * loads, the Q-side product) is issued off that path. The row gate scale*exp2(gc) is applied to
 * the dO slab (C x BV) rather than to Q (C x K): Q^T diag(s) dO is the same product, the scaled
 * slab enters the tensor cores as bf16 hi + lo parts (FLA uses tf32 there), and the per-chunk
 * conversion touches BV/K as many elements.
 *
 * Intra-card segments (Cfg::SEGMENTS > 1, docs/algorithm.md 4.4 and 4.6): the reverse walk is affine
 * in the gradient at a segment's end, Z_start = A Z_end + dZ_ext with A = M^T. StateWalkBwdPrescan
 * walks every segment but each document's first from Z = 0 (dZ_ext, V columns) and, with dO and
 * dv_local taken as zero, from Z = I (A, K columns), with Z and dV' as bf16 hi + lo pairs; on one
 * rank A is the forward's saved M^T and the prescan walks dZ_ext alone, with the walk's bf16
 * operands. WalkMergeBwd chains them in fp32 from dht; then every segment walks from its merged
 * end gradient.
 *
 * The verified carry (Cfg::VERIFIED_CARRY, docs/algorithm.md 4.7) in reverse: StateWalkBwdSpeculate
 * walks a document's last segment from dht and every other from Z = 0, with the tapes, the fp32
 * gradient after each of the first kCarryCheckpoints chunks it walks (a segment's last) and each
 * segment's start gradient as its predecessor's end (seg_dz); StateWalkBwdVerify re-walks every
 * earlier segment from that end until its gradient equals the checkpoint bit for bit, and marks the
 * chains that never do. The prescan, the merge and the full walk then run for the marked chains
 * only. A verified document's backward walk has one unsegmented walk's bits. Chains whose gates
 * decay too slowly to verify (reverse_chain_mark, common/segments.cuh) are marked before either
 * walk and skip both. A chain the forward marked (its gate test or its verification failed; the
 * marks are saved) is marked at once too: the forward's prescan saved its maps and the backward
 * takes A = M^T from them (the merge carry's programs and bits: slow-decay heads cost what the
 * merge costs). For the other marked chains the prescan walks A itself (dZ_ext and A in hi + lo).
 */
#pragma once

#include "bwd/dv_local.cuh"
#include "bwd/state_walk_bwd_sm90.cuh"
#include "common/segments.cuh"

namespace gdn {

template <class Cfg>
struct StateWalkBwdMmaSync {
  static constexpr int K = Cfg::K, V = Cfg::V, C = Cfg::CHUNK;
  static constexpr int BV = Cfg::BV;  // the spec's walk_bwd_slab, else StateWalkBwdGeometry::bv(V)
  static constexpr int kThreads = StateWalkBwdGeometry::threads(BV), kWarps = kThreads / 32;
  static constexpr int PK = bwd_pitch(K), PB = bwd_pitch(BV);
  static_assert(C == 64, "StateWalkBwd: only chunk size 64 is supported");
  static_assert((BV == 32 || BV == 64 || BV == 128) && V % BV == 0,
                "StateWalkBwd: V must be a multiple of the 32-, 64- or 128-column slab");
  static_assert(K % 16 == 0 && K <= 256, "StateWalkBwd: K must be a multiple of 16 and at most 256");
  static_assert(Cfg::HV == Cfg::H * Cfg::G, "StateWalkBwd: HV must equal H * G");

  /// Element offsets of one pipeline stage (bf16 units; the two gc buffers follow as floats).
  static constexpr int kOffK = 0, kOffQ = C * PK, kOffW = 2 * C * PK, kOffO = 3 * C * PK;
  static constexpr int kOffL = kOffO + C * PB, kOffG = kOffL + C * PB;
  static constexpr int kStageBytes = StateWalkBwdGeometry::stage_bytes_bv(K, C, BV);
  static_assert(kStageBytes % 16 == 0, "StateWalkBwd: stages must stay 16-byte aligned");

  // The stage is refilled in three cp.async groups, each issued as soon as this chunk has read
  // what it replaces, in the order the next chunk needs them:
  //   OG: the dO slab and gc (into the gc buffer this chunk does not read),
  //   KL: the K tile and the dv_local slab,
  //   QW: the Q and W tiles.
  static constexpr int SEG = Cfg::SEGMENTS;
  static_assert(SEG >= 1, "Cfg::SEGMENTS must be at least 1");

  // `inputs` false (the prescan's transition columns): the dO and dv_local slabs load as zeros.
  __device__ static void load_og(unsigned char* st, float* g, const StateWalkBwdParams& p, const ChunkInfo& ci, int j,
                                 int v0, bool inputs) {
    bf16_t* b = reinterpret_cast<bf16_t*>(st);
    const long long t0 = ci.start;
    const int m = ci.len;
    bwd::load_tile_async<C, BV, kThreads>(b + kOffO, PB, p.d_o + (t0 * Cfg::HV + j) * V + v0, (long long)Cfg::HV * V,
                                          inputs ? m : 0);
    if (threadIdx.x < C) {
      const bool ok = threadIdx.x < m;
      bwd::cp_async4(g + threadIdx.x, ok ? p.gc + (t0 + threadIdx.x) * Cfg::HV + j : p.gc, ok);
    }
  }
  __device__ static void load_kl(unsigned char* st, const StateWalkBwdParams& p, const ChunkInfo& ci, int j, int v0,
                                 bool inputs) {
    bf16_t* b = reinterpret_cast<bf16_t*>(st);
    const long long t0 = ci.start;
    const int h = j / Cfg::G, m = ci.len;
    bwd::load_tile_async<C, K, kThreads>(b + kOffK, PK, p.k + (t0 * Cfg::H + h) * K, (long long)Cfg::H * K, m);
    bwd::load_tile_async<C, BV, kThreads>(b + kOffL, PB, p.dv_local + (t0 * Cfg::HV + j) * V + v0,
                                          (long long)Cfg::HV * V, inputs ? m : 0);
  }
  __device__ static void load_qw(unsigned char* st, const StateWalkBwdParams& p, const ChunkInfo& ci, int j,
                                 bool inputs) {
    bf16_t* b = reinterpret_cast<bf16_t*>(st);
    const long long t0 = ci.start;
    const int h = j / Cfg::G, m = ci.len;
    if (inputs)  // the transition columns never read Q
      bwd::load_tile_async<C, K, kThreads>(b + kOffQ, PK, p.q + (t0 * Cfg::H + h) * K, (long long)Cfg::H * K, m);
    bwd::load_tile_async<C, K, kThreads>(b + kOffW, PK, p.w + (t0 * Cfg::HV + j) * K, (long long)Cfg::HV * K, m);
  }

  enum class Mode { walk, prescan, speculate, verify };

  /// The program's walk: CarryWalkOf<Cfg> (StateWalkBwdSpeculate, StateWalkBwdVerify), else the plain one.
  static constexpr Mode kProgramMode = CarryWalkOf<Cfg>::value == CarryWalk::speculate ? Mode::speculate
                                       : CarryWalkOf<Cfg>::value == CarryWalk::verify  ? Mode::verify
                                                                                       : Mode::walk;
  __device__ static void run(const StateWalkBwdParams& p) { walk<kProgramMode>(p); }
  /// The entry of a layer whose sm_90a body loads by TMA (the maps are for that body only).
  __device__ static void run(const StateWalkBwdParams& p, const TensorMaps&) { walk<kProgramMode>(p); }

  /// Mode::prescan: blockIdx.x < V / BV walks slab x from Z = 0 (dZ_ext); the K / BV blocks after
  /// it walk columns of A from the identity with no dO and dv_local. No tapes; the result goes to
  /// seg_dzm. Segment 0 of a document is skipped: the merge never needs its transition.
  /// Mode::speculate and Mode::verify: the verified carry's two walks (the file's comment).
  template <Mode kMode>
  __device__ static void walk(const StateWalkBwdParams& p) {
    constexpr bool kPrescan = kMode == Mode::prescan, kSpeculate = kMode == Mode::speculate,
                   kVerify = kMode == Mode::verify;
    constexpr bool kVerified = VerifiedCarry<Cfg>::value;
    static_assert(kVerified || !(kSpeculate || kVerify), "walk_bwd_speculate and walk_bwd_verify need VERIFIED_CARRY");
    const int j = walk_head<Cfg>();
    const GridSegment at = grid_segment<SEG, Cfg::HV>(p.doc_order);
    const int n = at.n, seg = at.seg;
    const bool transition = kPrescan && blockIdx.x >= V / BV;
    const int v0 = (transition ? blockIdx.x - V / BV : blockIdx.x) * BV;
    const bool inputs = !transition;
    const DocSegments<Cfg> ds(p.doc_chunk_offset, p.chunks, n);
    if (!ds.local(seg)) return;  // past this document's segments ("auto"), or a remote piece
    const int c_first = ds.begin(seg), c_last = ds.begin(seg + 1) - 1;
    const long long slot = ds.slot0 + seg;
    if (kPrescan && seg == 0) return;
    // The verified carry: seg_fail marks the chains that did not verify (written by
    // walk_bwd_speculate and walk_bwd_verify; null otherwise). Only they need the prescan, the merge
    // and the full walk.
    int* const fail = kVerified && p.seg_fail != nullptr ? p.seg_fail + (long long)n * Cfg::HV + j : nullptr;
    if constexpr ((kMode == Mode::walk || kPrescan) && kVerified) {
      if (fail != nullptr && (!ds.split() || *fail == 0)) return;
    }
    // The prescan's A = M^T comes from the forward's saved maps: under the verified carry for the
    // chains marked kChainSavedMaps, else wherever they are saved.
    const bool saved_maps =
        kPrescan && SavedMaps<Cfg>::value && (!kVerified || (fail != nullptr && *fail == kChainSavedMaps));
    if (kPrescan && transition && saved_maps) return;
    if constexpr (kVerify) {
      if (!ds.split() || seg == ds.count - 1) return;  // the last segment walked from dht in speculate
    }
    if constexpr (kSpeculate || kVerify) {
      // A chain whose gates decay too slowly to verify is marked at once: the merge walks it.
      if (ds.split()) {
        const int mark = reverse_chain_mark<Cfg>(ds, p.chunks, p.gc, j, p.fwd_fail[(long long)n * Cfg::HV + j]);
        if (mark != 0) {
          if (kSpeculate && seg == ds.count - 1 && blockIdx.x == 0 && threadIdx.x == 0) *fail = mark;
          return;
        }
      }
    }
    // speculate: the last segment (and an unsplit document) from dht, the others from 0.
    const bool from_zero = kSpeculate && ds.split() && seg < ds.count - 1;
    extern __shared__ __align__(16) unsigned char smem[];
    unsigned char* const stage = smem;
    float* const gbuf = reinterpret_cast<float*>(reinterpret_cast<bf16_t*>(stage) + kOffG);
    bf16_t* sOh = reinterpret_cast<bf16_t*>(smem + kStageBytes);
    bf16_t* sOl = sOh + C * PB;
    bf16_t* sZ = sOl + C * PB;
    bf16_t* sD = sZ + K * PB;  // holds -bf16(dV') so the W^T product subtracts through an add
    // The prescan carries Z and dV' as bf16 hi + lo pairs where it walks A: (dZ_ext, A) then hold
    // the segment's affine map to about fp32 accuracy, and the merged end gradients carry no
    // rounding of their own (with bf16 alone, A's roundings added to the walk's: dg 11 % worse with
    // 8 segments at g = 0). Where A is the forward's saved M^T (in hi + lo there), dZ_ext is a walk
    // from zero like any segment's and takes the walk's own bf16 operands: a third fewer products.
    const bool split = kPrescan && !saved_maps;
    bf16_t* sZl = sD + C * PB;
    bf16_t* sDl = sZl + K * PB;
    const bf16_t* sK = reinterpret_cast<const bf16_t*>(stage) + kOffK;
    const bf16_t* sQ = reinterpret_cast<const bf16_t*>(stage) + kOffQ;
    const bf16_t* sW = reinterpret_cast<const bf16_t*>(stage) + kOffW;
    const bf16_t* sO = reinterpret_cast<const bf16_t*>(stage) + kOffO;
    const bf16_t* sL = reinterpret_cast<const bf16_t*>(stage) + kOffL;

    Acc<K, BV, kWarps> z;
    z.zero();
    if (kPrescan) {
      if (transition)
        bwd::for_pairs(z, [&](int r, int c, float& a, float& b) {
          a = r == v0 + c ? 1.f : 0.f;
          b = r == v0 + c + 1 ? 1.f : 0.f;
        });
    } else if (from_zero) {
    } else if (SEG > 1 && ds.split() && !(kSpeculate && seg == ds.count - 1)) {
      const float* src = p.seg_dz + (slot * Cfg::HV + j) * K * V + v0;
      bwd::for_pairs(z, [&](int r, int c, float& a, float& b) {
        const float2 x = *reinterpret_cast<const float2*>(src + (long long)r * V + c);
        a = x.x;
        b = x.y;
      });
    } else if (Cfg::HAS_HT && p.dht != nullptr) {
      const float* src = p.dht + ((long long)n * Cfg::HV + j) * K * V + v0;
      bwd::for_pairs(z, [&](int r, int c, float& a, float& b) {
        const float2 x = *reinterpret_cast<const float2*>(src + (long long)r * V + c);
        a = x.x;
        b = x.y;
      });
    }

    if constexpr (kSpeculate) {  // the chain starts out verified
      if (ds.split() && seg == ds.count - 1 && blockIdx.x == 0 && threadIdx.x == 0) *fail = 0;
    }
    // The checkpoints of this segment: the gradient after each of its last chunks, walked first.
    float* const ckpt =
        (kSpeculate || kVerify) ? p.seg_ckpt + (slot * Cfg::HV + j) * kCarryCheckpoints * K * V + v0 : nullptr;
    // verify re-walks at most the checkpointed chunks.
    const int c_stop = kVerify ? max(c_first, c_last - (kCarryCheckpoints - 1)) : c_first;
    bool verified = false;

    // Prologue: all three groups of the last chunk. Every iteration then commits exactly three
    // groups (empty ones on the first chunk), so the wait counts below stay fixed.
    if (c_last >= c_first) {
      const ChunkInfo ci = p.chunks[c_last];
      load_og(stage, gbuf, p, ci, j, v0, inputs);
      bwd::cp_async_commit();
      load_kl(stage, p, ci, j, v0, inputs);
      bwd::cp_async_commit();
      load_qw(stage, p, ci, j, inputs);
      bwd::cp_async_commit();
    }

    const float scale = p.scale;
    constexpr int kSlabPieces = BV / 8;  // 16-byte pieces per slab row
    for (int c = c_last, parity = 0; c >= c_stop; --c, parity ^= 1) {
      const bool has_prev = c > c_stop;
      const ChunkInfo ci = p.chunks[c];
      const ChunkInfo prev = p.chunks[has_prev ? c - 1 : c];
      const int m = ci.len;
      const float* sg = gbuf + parity * C;

      bwd::cp_async_wait<2>();  // OG of this chunk
      __syncthreads();          // B0: OG visible; the previous chunk is done with sZ, sOh/sOl, sD
      const float gL = sg[m - 1];

      bwd::for_pairs(z, [&](int r, int cc, float& a, float& b) {
        if (split) {
          bf16_t h0, l0, h1, l1;
          bwd::split_bf16(a, h0, l0);
          bwd::split_bf16(b, h1, l1);
          *reinterpret_cast<u32*>(sZ + r * PB + cc) = pack_bf16x2(h0, h1);
          *reinterpret_cast<u32*>(sZl + r * PB + cc) = pack_bf16x2(l0, l1);
        } else {
          *reinterpret_cast<u32*>(sZ + r * PB + cc) = pack_bf16x2(f2bf(a), f2bf(b));
        }
      });
      for (unsigned i = threadIdx.x; inputs && i < C * BV; i += kThreads) {  // no dO in the transition columns
        const int r = static_cast<int>(i / BV), cc = static_cast<int>(i % BV);
        // Rows >= m hold dO = 0 (zero-filled), so the gate value there is irrelevant.
        const float x = scale * exp2f(fminf(sg[r], 0.f)) * bf2f(sO[r * PB + cc]);
        bf16_t hi, lo;
        bwd::split_bf16(x, hi, lo);
        sOh[r * PB + cc] = hi;
        sOl[r * PB + cc] = lo;
      }
      bwd::cp_async_wait<1>();  // KL of this chunk
      __syncthreads();          // B1: sZ, sOh/sOl, K and dv_local visible; the dO slab is free
      if (has_prev) load_og(stage, gbuf + (parity ^ 1) * C, p, prev, j, v0, inputs);
      bwd::cp_async_commit();

      if (!kPrescan) {  // dh_tape[c] = bf16(Z), from sZ in 16-byte row pieces (coalesced).
        bf16_t* tape = p.dh_tape + (((long long)c * Cfg::HV + j) * K) * V + v0;
        for (unsigned i = threadIdx.x; i < K * kSlabPieces; i += kThreads) {
          const int r = static_cast<int>(i / kSlabPieces), cc = static_cast<int>(i % kSlabPieces) * 8;
          *reinterpret_cast<uint4*>(tape + (long long)r * V + cc) = *reinterpret_cast<const uint4*>(sZ + r * PB + cc);
        }
      }
      Acc<C, BV, kWarps> d;
      d.zero();
      bwd::mma(d, MatRef{sK, PK, 1}, MatRef{sZ, PB, 1}, K);
      if (split) bwd::mma(d, MatRef{sK, PK, 1}, MatRef{sZl, PB, 1}, K);
      bwd::for_pairs(d, [&](int r, int cc, float& a, float& b) {
        float x0 = 0.f, x1 = 0.f;
        if (r < m) {
          const float e = gate_exp2(gL - sg[r], true);
          x0 = e * a + bf2f(sL[r * PB + cc]);
          x1 = e * b + bf2f(sL[r * PB + cc + 1]);
        }
        // Negating a bf16 is exact: flip the sign bit.
        if (split) {
          bf16_t h0, l0, h1, l1;
          bwd::split_bf16(x0, h0, l0);
          bwd::split_bf16(x1, h1, l1);
          *reinterpret_cast<u32*>(sD + r * PB + cc) = pack_bf16x2(h0 ^ 0x8000u, h1 ^ 0x8000u);
          *reinterpret_cast<u32*>(sDl + r * PB + cc) = pack_bf16x2(l0 ^ 0x8000u, l1 ^ 0x8000u);
        } else {
          *reinterpret_cast<u32*>(sD + r * PB + cc) = pack_bf16x2(f2bf(x0) ^ 0x8000u, f2bf(x1) ^ 0x8000u);
        }
      });
      bwd::cp_async_wait<1>();  // QW of this chunk
      __syncthreads();          // B2: -bf16(dV'), Q and W visible; K and dv_local are free
      if (has_prev) load_kl(stage, p, prev, j, v0, inputs);
      bwd::cp_async_commit();

      if (!kPrescan) {  // dv_new = bf16(dV') from sD (sign flipped back), valid rows, 16-byte row pieces.
        bf16_t* dvn = p.dv_new + ((long long)ci.start * Cfg::HV + j) * V + v0;
        for (unsigned i = threadIdx.x; i < static_cast<unsigned>(m * kSlabPieces); i += kThreads) {
          const int r = static_cast<int>(i / kSlabPieces), cc = static_cast<int>(i % kSlabPieces) * 8;
          uint4 x = *reinterpret_cast<const uint4*>(sD + r * PB + cc);
          x.x ^= 0x80008000u;
          x.y ^= 0x80008000u;
          x.z ^= 0x80008000u;
          x.w ^= 0x80008000u;
          bwd::st_global_v4(dvn + (long long)r * Cfg::HV * V + cc, x);
        }
      }
      const float eL = gate_exp2(gL, true);
      z.for_each([&](int, int, float& v) { v *= eL; });
      if (inputs) {  // the transition columns have dO = 0: Q^T adds nothing
        bwd::mma(z, transposed(MatRef{sQ, PK, 1}), MatRef{sOh, PB, 1}, C);
        bwd::mma(z, transposed(MatRef{sQ, PK, 1}), MatRef{sOl, PB, 1}, C);
      }
      bwd::mma(z, transposed(MatRef{sW, PK, 1}), MatRef{sD, PB, 1}, C);
      if (split) bwd::mma(z, transposed(MatRef{sW, PK, 1}), MatRef{sDl, PB, 1}, C);
      __syncthreads();  // B3: Q, W, sZ, sOh/sOl and sD are free
      if (has_prev) load_qw(stage, p, prev, j, inputs);
      bwd::cp_async_commit();
      if constexpr (kSpeculate || kVerify) {
        float* const at = ckpt + (long long)(c_last - c) * K * V;
        if (kSpeculate && from_zero && c_last - c < kCarryCheckpoints) {
          bwd::for_pairs(z, [&](int r, int cc, float& a, float& b) {
            *reinterpret_cast<float2*>(at + (long long)r * V + cc) = make_float2(a, b);
          });
        }
        if (kVerify) {
          // Bit for bit (a -0 against +0 counts as a difference, which only costs another chunk).
          bool same = true;
          bwd::for_pairs(z, [&](int r, int cc, float& a, float& b) {
            const float2 x = *reinterpret_cast<const float2*>(at + (long long)r * V + cc);
            same = same && __float_as_uint(x.x) == __float_as_uint(a) && __float_as_uint(x.y) == __float_as_uint(b);
          });
          if (__syncthreads_and(same)) {
            verified = true;
            break;
          }
        }
      }
    }
    // An empty segment walks no chunk and never verifies: its zero start gradient must not pass for
    // its predecessor's end, so its chain is always marked.
    bwd::cp_async_wait<0>();
    if constexpr (kVerify) {
      // Not equal within the checkpoints: this document's chain runs the merge and the full walk.
      if (!verified && threadIdx.x == 0) atomicExch(fail, kChainOwnMaps);
      return;
    }
    if constexpr (kSpeculate) {
      if (ds.split() && seg > 0) {  // the gradient at the previous segment's end (verified by its re-walk)
        float* dst = const_cast<float*>(p.seg_dz) + ((slot - 1) * Cfg::HV + j) * K * V + v0;
        bwd::for_pairs(z, [&](int r, int c, float& a, float& b) {
          *reinterpret_cast<float2*>(dst + (long long)r * V + c) = make_float2(a, b);
        });
        return;
      }
    }

    if (kPrescan) {
      // seg_dzm row r: dZ_ext in columns 0 .. V-1, A in V .. V+K-1.
      float* dst = p.seg_dzm + (slot * Cfg::HV + j) * K * (V + K) + (transition ? V : 0) + v0;
      bwd::for_pairs(z, [&](int r, int c, float& a, float& b) {
        *reinterpret_cast<float2*>(dst + (long long)r * (V + K) + c) = make_float2(a, b);
      });
      return;
    }
    // A document's dh0 is its first segment's.
    if (Cfg::HAS_H0 && p.dh0 != nullptr && seg == 0) {
      float* dst = p.dh0 + ((long long)n * Cfg::HV + j) * K * V + v0;
      bwd::for_pairs(z, [&](int r, int c, float& a, float& b) {
        *reinterpret_cast<float2*>(dst + (long long)r * V + c) = make_float2(a, b);
      });
    }
  }
};

/// The backward's intra-card prescan: (dZ_ext, A) of every segment but each document's first;
/// grid ((V + K) / BV, HV * SEGMENTS, N).
template <class Cfg>
struct StateWalkBwdPrescan {
  static_assert(Cfg::K == Cfg::V, "the prescan walks A's K columns as V-wide slabs: K must equal V");
  __device__ static void run(const StateWalkBwdParams& p) {
    StateWalkBwdMmaSync<Cfg>::template walk<StateWalkBwdMmaSync<Cfg>::Mode::prescan>(p);
  }
};

/// The program's class: the warp-specialized body (state_walk_bwd_sm90.cuh) on sm_90a when the
/// spec's tensor_cores is "auto" (Cfg::WGMMA) and the block walks 128 columns at K = V = 128,
/// chunk 64; the mma.sync one otherwise and on every other target.
template <class Cfg, bool kSm90>
struct StateWalkBwdPick {
  using type = StateWalkBwdMmaSync<Cfg>;
};
#if GDN_HAS_WGMMA
/// walk_bwd_layout "fused" picks the reverse walk with chunk_bwd's body: its program's source is
/// walk_bwd_fused_sm90.cuh, which includes this file and specializes the pick for `true` (the
/// other programs' sources, and so their machine code, do not include chunk_bwd's body).
template <class Cfg, bool kFused = WalkFused<Cfg>::value != 0>
struct StateWalkBwdSm90Pick {
  using type = StateWalkBwdSm90<Cfg>;
};
template <class Cfg>
struct StateWalkBwdPick<Cfg, true> {
  using type = typename StateWalkBwdSm90Pick<Cfg>::type;
};
#endif
/// Cfg::WGMMA where the program has it (state_walk_bwd always; its speculative and verify walks
/// where the layer runs the sm_90a body, so the portable ones keep their sources), else false.
template <class Cfg, class = int>
struct ReverseWalkWgmma {
  static constexpr bool value = false;
};
template <class Cfg>
struct ReverseWalkWgmma<Cfg, decltype((void)Cfg::WGMMA, 0)> {
  static constexpr bool value = Cfg::WGMMA;
};
template <class Cfg>
using StateWalkBwd =
    typename StateWalkBwdPick<Cfg, StateWalkBwdGeometry::sm90_body(Cfg::K, Cfg::V, Cfg::CHUNK, Cfg::BV,
                                                                   ReverseWalkWgmma<Cfg>::value)>::type;
/// The verified carry's first reverse walk (the file's comment; ReverseCarry, common/segments.cuh):
/// every segment at once, a document's last from dht and the others from 0, with the tapes,
/// checkpoints and start gradients.
template <class Cfg>
using StateWalkBwdSpeculate = StateWalkBwd<WithCarryWalk<Cfg, CarryWalk::speculate>>;
/// The verified carry's second reverse walk: each earlier segment from its successor's start
/// gradient until it matches a checkpoint (the sm_90a body: over its checkpointed chunks); marks
/// the chains that do not.
template <class Cfg>
using StateWalkBwdVerify = StateWalkBwd<WithCarryWalk<Cfg, CarryWalk::verify>>;

}  // namespace gdn
