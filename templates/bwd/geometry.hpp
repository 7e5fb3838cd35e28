/**
 * @file geometry.hpp
 * @brief Launch geometry of the backward programs (B2 dv_local, B3 reverse state walk,
 *        B4-B6 chunk backward, B7 finalize), shared by the host build and the templates.
 *        Plain C++17: no device code and no includes, so both compilers read it.
 *
 * Shared-memory tiles keep a padding of 8 bf16 (16 bytes) per row: the tensor-core operand
 * reads then walk different banks for consecutive rows, and 16-byte cp.async stays aligned.
 */
#pragma once

namespace gdn {

/// Row pitch in bf16 elements of a shared tile holding `cols` columns.
constexpr int bwd_pitch(int cols) { return cols + 8; }

/// B2: one block per (chunk, value head). Holds Q, K, dO and the bf16 P tile.
struct DvLocalGeometry {
  static constexpr int kThreads = 256;
  static constexpr int smem_bytes(int K, int V, int chunk) {
    return 2 * (2 * chunk * bwd_pitch(K) + chunk * bwd_pitch(V) + chunk * bwd_pitch(chunk)) + 4 * chunk;
  }
};

/// B3: one block per (V slab of bv(V) columns, value head, document). One stage of chunk
/// inputs, refilled piece by piece as each piece is consumed (the next chunk's loads overlap
/// this chunk's products); two blocks per SM hide what remains.
struct StateWalkBwdGeometry {
  /// The default slab width of the portable body (the spec's walk_bwd_slab can pick 64 or 128).
  static constexpr int bv(int V) { return V >= 32 ? 32 : V; }
  /// The spec's walk_bwd_slab "auto": 128 where the warp-specialized sm_90a body applies (K = V =
  /// 128, chunk 64, tensor_cores "auto") and a document alone gives 16 or more of its blocks
  /// (HV >= 16), else bv(V). On the H200 the sm_90a body took the walk at M (HV 48, 5 documents)
  /// from 1.914 to 0.879 ms, and made N (HV 6, 3 documents: 18 blocks for 132 SMs) 5 % slower
  /// (docs/PERF.md). The threshold lies between the two measured points.
  static constexpr int auto_bv(int K, int V, int chunk, int HV, bool wgmma) {
    return sm90_body(K, V, chunk, 128, wgmma) && HV * (V / 128) >= 16 ? 128 : bv(V);
  }
  /// Whether sm_90a runs the warp-specialized body (state_walk_bwd_sm90.cuh): 128-wide slabs at
  /// K = V = 128, chunk 64, with wgmma allowed (tensor_cores "auto").
  static constexpr bool sm90_body(int K, int V, int chunk, int bvw, bool wgmma) {
    return wgmma && K == 128 && V == 128 && chunk == 64 && bvw == 128;
  }
  /// 32-wide slabs: 8 warps, two blocks per SM; 64- and 128-wide: 16 warps, one block per SM (the
  /// same warps per SM, fewer blocks re-reading Q, K and W).
  static constexpr int threads(int bvw) { return bvw >= 64 ? 512 : 256; }
  static constexpr int min_blocks_per_sm(int bvw) { return bvw >= 64 ? 1 : 2; }  ///< caps registers at 128
  /// One pipeline stage: K, Q, W tiles, the dO and dv_local slabs, and gc twice (gc is still
  /// read while the next chunk's gc arrives).
  static constexpr int stage_bytes_bv(int K, int chunk, int bvw) {
    return 2 * (3 * chunk * bwd_pitch(K) + 2 * chunk * bwd_pitch(bvw)) + 2 * 4 * chunk;
  }
  static constexpr int portable_smem_bytes_bv(int K, int chunk, int bvw) {
    return stage_bytes_bv(K, chunk, bvw)
           // the gated dO slab split into hi and lo bf16 parts, bf16(Z) and -bf16(dV')
           + 2 * (2 * chunk * bwd_pitch(bvw) + K * bwd_pitch(bvw) + chunk * bwd_pitch(bvw));
  }
  /// 128-wide slabs may run the sm_90a body (StateWalkBwdSm90Layout): the larger of the two.
  static constexpr int smem_bytes_bv(int K, int chunk, int bvw);
  static constexpr int smem_bytes(int K, int V, int chunk) { return smem_bytes_bv(K, chunk, bv(V)); }
  /// The prescan adds the lo parts of Z and dV'.
  static constexpr int prescan_smem_bytes_bv(int K, int chunk, int bvw) {
    return portable_smem_bytes_bv(K, chunk, bvw) + 2 * (K * bwd_pitch(bvw) + chunk * bwd_pitch(bvw));
  }
};

/// The sm_90a body of the reverse walk (bwd/state_walk_bwd_sm90.cuh), 512 threads, 128 columns:
/// two stages of SW128 tiles (K, Q, W [chunk][K], the dO slab [chunk][128] as two 64-column
/// blocks, gc), each walking warpgroup's two SW128 staging tiles [K][64] (by chunk parity: the
/// dh tape and D's A operand in one, dv_new in the other), two tiles of dv_local's gated scores
/// [chunk][chunk], the mbarriers and each walk's two buffers of column factors. The tiles start
/// 1024-byte aligned and the window gets 1 KB of slack to align its base: 218,240 bytes at K = 128.
struct StateWalkBwdSm90Layout {
  static constexpr int align1k(int x) { return (x + 1023) / 1024 * 1024; }
  static constexpr int kThreads = 512;
  static constexpr int kStages = 2;
  static constexpr int kPTiles = 2;
  static constexpr int kSlab = 64;  ///< V columns per walking warpgroup
  static constexpr int off_k(int, int) { return 0; }
  static constexpr int off_q(int K, int chunk) { return chunk * K * 2; }
  static constexpr int off_w(int K, int chunk) { return 2 * chunk * K * 2; }
  static constexpr int off_o(int K, int chunk) { return 3 * chunk * K * 2; }
  static constexpr int off_g(int K, int chunk) { return off_o(K, chunk) + chunk * 2 * kSlab * 2; }
  static constexpr int stage_bytes(int K, int chunk) { return align1k(off_g(K, chunk) + chunk * 4); }
  static constexpr int staging_bytes(int K) { return K * kSlab * 2; }
  static constexpr int off_staging(int K, int chunk) { return kStages * stage_bytes(K, chunk); }
  static constexpr int off_p(int K, int chunk) { return off_staging(K, chunk) + 2 * 2 * staging_bytes(K); }
  static constexpr int off_bar(int K, int chunk) { return off_p(K, chunk) + kPTiles * chunk * chunk * 2; }
  static constexpr int kBarriers = 2 * kStages + 2 * kPTiles;  ///< full[s], empty[s], pfull[b], pempty[b]
  /// One buffer: scale exp2(min(gc_t, 0)) for dO, exp2(gcL - gc_t) for dV'.
  static constexpr int vec_bytes(int chunk) { return 2 * chunk * 4; }
  static constexpr int off_vec(int K, int chunk) { return off_bar(K, chunk) + 128; }
  static constexpr int smem_bytes(int K, int chunk) { return off_vec(K, chunk) + 2 * 2 * vec_bytes(chunk) + 1024; }
  static_assert(kBarriers * 8 <= 128, "the mbarriers must fit before the vectors");

  /// With W formed in the walk (WALK_FUSES_W): a stage holds K, Q, Tm, the dO slab, gc and beta,
  /// and one W tile after the P tiles has its own full / empty barriers; the same total.
  static constexpr int fw_off_t(int K, int chunk) { return 2 * chunk * K * 2; }
  static constexpr int fw_off_o(int K, int chunk) { return fw_off_t(K, chunk) + chunk * chunk * 2; }
  static constexpr int fw_off_g(int K, int chunk) { return fw_off_o(K, chunk) + chunk * 2 * kSlab * 2; }
  static constexpr int fw_off_b(int K, int chunk) { return fw_off_g(K, chunk) + chunk * 4; }
  static constexpr int fw_stage_bytes(int K, int chunk) { return align1k(fw_off_b(K, chunk) + chunk * 4); }
  static constexpr int fw_off_staging(int K, int chunk) { return kStages * fw_stage_bytes(K, chunk); }
  static constexpr int fw_off_p(int K, int chunk) { return fw_off_staging(K, chunk) + 2 * 2 * staging_bytes(K); }
  static constexpr int fw_off_w(int K, int chunk) { return fw_off_p(K, chunk) + kPTiles * chunk * chunk * 2; }
  static constexpr int fw_off_bar(int K, int chunk) { return fw_off_w(K, chunk) + chunk * K * 2; }
  static constexpr int kFwBarriers = kBarriers + 2;  ///< and wfull, wempty
  static constexpr int fw_off_vec(int K, int chunk) { return fw_off_bar(K, chunk) + 128; }
  static constexpr int fw_smem_bytes(int K, int chunk) {
    return fw_off_vec(K, chunk) + 2 * 2 * vec_bytes(chunk) + 1024;
  }
  static_assert(kFwBarriers * 8 <= 128, "the mbarriers must fit before the vectors");

  /// The fused layout (walk_bwd_layout "fused": the reverse walk with chunk_bwd's body,
  /// docs/design_fused_bwd_sm90.md 3.9 and 3.16): one slot per tile but K's two (by chunk parity,
  /// so the next chunk's K arrives while this chunk's last readers work). Eight 64 x K token
  /// tiles (q, k, v then W_f, dO then dOs, V', dV', X, k's second buffer), the h tape and bf16(Z)
  /// (K x K), Tm, P~ then dS~, and dTm then Y then E (64 x 64); then two buffers (by chunk parity)
  /// of the scalars that are written ahead (gc, beta, <S, Zb>: fu_gate_floats each) and one of
  /// the rest (the row terms of dgam and dbeta, the walk's two gate vectors: fu_row_floats), and
  /// the mbarriers.
  enum FusedSlot : int { fu_q, fu_k, fu_v, fu_o, fu_vn, fu_dv, fu_w, fu_k1, kFuTokenTiles };
  static constexpr int fu_off_tok(int slot, int K, int chunk) { return slot * chunk * K * 2; }
  static constexpr int fu_off_s(int K, int chunk) { return kFuTokenTiles * chunk * K * 2; }
  static constexpr int fu_off_zb(int K, int chunk) { return fu_off_s(K, chunk) + K * K * 2; }
  static constexpr int fu_off_t(int K, int chunk) { return fu_off_zb(K, chunk) + K * K * 2; }
  static constexpr int fu_off_p(int K, int chunk) { return fu_off_t(K, chunk) + chunk * chunk * 2; }
  static constexpr int fu_off_lo(int K, int chunk) { return fu_off_p(K, chunk) + chunk * chunk * 2; }
  static constexpr int fu_off_sc(int K, int chunk) { return fu_off_lo(K, chunk) + chunk * chunk * 2; }
  static constexpr int fu_gate_floats(int chunk) { return 5 * chunk + 8; }
  static constexpr int fu_row_floats(int chunk) { return 20 * chunk + 8; }
  static constexpr int fu_sc_bytes(int chunk) { return (2 * fu_gate_floats(chunk) + fu_row_floats(chunk)) * 4; }
  static constexpr int fu_off_bar(int K, int chunk) { return fu_off_sc(K, chunk) + fu_sc_bytes(chunk); }
  enum : int { kFuBarriers = 32 };  // an enumerator: no constant bytes in the other programs
  static constexpr int fu_smem_bytes(int K, int chunk) { return fu_off_bar(K, chunk) + kFuBarriers * 8 + 1024; }
};
static_assert(StateWalkBwdSm90Layout::fu_smem_bytes(128, 64) <= 232448,
              "the fused layout must fit an sm_90a block's shared memory");
static_assert(StateWalkBwdSm90Layout::fw_smem_bytes(128, 64) <= StateWalkBwdSm90Layout::smem_bytes(128, 64),
              "W in the walk must fit the block's shared memory");

constexpr int StateWalkBwdGeometry::smem_bytes_bv(int K, int chunk, int bvw) {
  return bvw == 128 && portable_smem_bytes_bv(K, chunk, bvw) < StateWalkBwdSm90Layout::smem_bytes(K, chunk)
             ? StateWalkBwdSm90Layout::smem_bytes(K, chunk)
             : portable_smem_bytes_bv(K, chunk, bvw);
}

/// B4 + B5 + B6: one block per (chunk, value head).
struct ChunkBwdGeometry {
  static constexpr int kThreads = 512;
  /// Tiles alive for the whole block: Q, K, V, dV' and Tm.
  static constexpr int persist_bytes(int K, int V, int chunk) {
    return 2 * (2 * chunk * bwd_pitch(K) + 2 * chunk * bwd_pitch(V) + chunk * bwd_pitch(chunk));
  }
  /// Tiles of the B4 phase (S, Z, dO, V', dS~), reused by the B5 phase (dW, dTm, Y, E).
  static constexpr int phase_bytes(int K, int V, int chunk) {
    return 2 * (2 * K * bwd_pitch(V) + 2 * chunk * bwd_pitch(V) + chunk * bwd_pitch(chunk));
  }
  /// fp32 scratch: gc, beta, dgam, dbeta, a row temp, the reduction partials, block sums.
  static constexpr int scalar_bytes(int K, int V, int chunk) {
    return 4 * (5 * chunk + chunk * ((K > V ? K : V) / 8) + 64);
  }
  static constexpr int smem_bytes(int K, int V, int chunk) {
    return persist_bytes(K, V, chunk) + phase_bytes(K, V, chunk) + scalar_bytes(K, V, chunk);
  }
  /// The sm_90a kernel with one product per warpgroup (chunk_bwd_sm90.cuh): Q, K, V, dV', dO,
  /// V' and dW, S and Z, Tm, dS~ and Y's hi and lo halves as unpadded SW128 tiles, 1156 fp32
  /// scalars and the four mbarriers of its TMA load sets.
  static constexpr int smem_bytes_ws(int K, int V, int chunk) {
    return 2 * (7 * chunk * K + 2 * K * V + 4 * chunk * chunk) + 4 * 1156 + 32;
  }
};

/// B7: one warp per (token, q/k head) row.
struct FinalizeGeometry {
  static constexpr int kThreads = 256;
  static constexpr int kRowsPerBlock = kThreads / 32;
  static constexpr long long grid_x(long long T, int H) { return (T * H + kRowsPerBlock - 1) / kRowsPerBlock; }
  static constexpr int smem_bytes(int K, int V, int chunk) { return 0 * (K + V + chunk); }
};

}  // namespace gdn
