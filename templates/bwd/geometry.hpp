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
  /// The default slab width (the spec's walk_bwd_slab can pick 64).
  static constexpr int bv(int V) { return V >= 32 ? 32 : V; }
  /// 32-wide slabs: 8 warps, two blocks per SM; 64-wide: 16 warps, one block per SM (the same
  /// warps per SM and per-warp work, half the blocks re-reading Q, K and W).
  static constexpr int threads(int bvw) { return bvw == 64 ? 512 : 256; }
  static constexpr int min_blocks_per_sm(int bvw) { return bvw == 64 ? 1 : 2; }  ///< caps registers at 128
  /// One pipeline stage: K, Q, W tiles, the dO and dv_local slabs, and gc twice (gc is still
  /// read while the next chunk's gc arrives).
  static constexpr int stage_bytes_bv(int K, int chunk, int bvw) {
    return 2 * (3 * chunk * bwd_pitch(K) + 2 * chunk * bwd_pitch(bvw)) + 2 * 4 * chunk;
  }
  static constexpr int smem_bytes_bv(int K, int chunk, int bvw) {
    return stage_bytes_bv(K, chunk, bvw)
           // the gated dO slab split into hi and lo bf16 parts, bf16(Z) and -bf16(dV')
           + 2 * (2 * chunk * bwd_pitch(bvw) + K * bwd_pitch(bvw) + chunk * bwd_pitch(bvw));
  }
  static constexpr int smem_bytes(int K, int V, int chunk) { return smem_bytes_bv(K, chunk, bv(V)); }
  /// The prescan adds the lo parts of Z and dV'.
  static constexpr int prescan_smem_bytes_bv(int K, int chunk, int bvw) {
    return smem_bytes_bv(K, chunk, bvw) + 2 * (K * bwd_pitch(bvw) + chunk * bwd_pitch(bvw));
  }
};

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
  /// V' and dW, S and Z, Tm and dS~ as unpadded SW128 tiles, and 1156 fp32 scalars.
  static constexpr int smem_bytes_ws(int K, int V, int chunk) {
    return 2 * (7 * chunk * K + 2 * K * V + 2 * chunk * chunk) + 4 * 1156;
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
