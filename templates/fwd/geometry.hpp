/**
 * @file geometry.hpp
 * @brief Launch geometry of the chunked forward programs (ChunkSolve, ChunkPrep, StateWalk, Output,
 *        FusedWalk): block sizes and dynamic shared-memory layouts.
 *
 * Plain C++17 without includes, so the host build (g++) and the device templates (NVRTC) read the
 * same numbers: the host sizes the dynamic shared memory with smem_bytes(), the kernels carve it
 * with the off_*() offsets below, and both therefore agree by construction.
 * Most bf16 tile rows are padded by 8 elements (16 B): the row stride stays 16 B aligned for
 * ldmatrix/cp.async and consecutive rows land on different bank groups (conflict-free ldmatrix);
 * the swizzled tiles (ChunkSolve's K, FusedWalkSm90Layout) reach the same without padding.
 */
#pragma once

namespace gdn {

/// Chunk-local products (F3, ChunkPrep): one block per (chunk, value head).
struct ChunkPrepGeometry {
  /// 8 warps: the two products are latency chains, so the more warps an SM holds the better.
  static constexpr int kThreads = 256;
  static constexpr int kMinBlocks = 4;                 ///< __launch_bounds__: 64 registers (4 blocks, 32 warps per SM)
  static constexpr int ld_bf(int d) { return d + 8; }  ///< bf16 row stride (elements)
  // Layout: K tile, Tm (bf16), V tile, gc, beta.
  static constexpr int off_k(int, int, int) { return 0; }
  static constexpr int off_tb(int K, int V, int chunk) { return off_k(K, V, chunk) + chunk * ld_bf(K) * 2; }
  static constexpr int off_v(int K, int V, int chunk) { return off_tb(K, V, chunk) + chunk * ld_bf(chunk) * 2; }
  static constexpr int off_g(int K, int V, int chunk) { return off_v(K, V, chunk) + chunk * ld_bf(V) * 2; }
  static constexpr int off_beta(int K, int V, int chunk) { return off_g(K, V, chunk) + chunk * 4; }
  static constexpr int smem_bytes(int K, int V, int chunk) { return off_beta(K, V, chunk) + chunk * 4; }
};

/// The forward's solve (ChunkSolve, F2): one block per (chunk, value head). 4 warps and 27,296 bytes, so
/// 8 blocks (32 warps) share an SM and hide each other's load and FMA-chain latencies.
struct ChunkSolveGeometry {
  static constexpr int kThreads = 128;
  static constexpr int kMinBlocks = 8;  ///< __launch_bounds__: 64 registers
  static constexpr int kK = 128;        ///< the key width the swizzled K tile is sized for
  static constexpr int kChunk = 64;
  /// A stored 16 x 16 fp32 block of L, Tm or the merge scratch: 256 floats and 4 more, so the
  /// diagonal blocks a warp reads together start on different banks.
  static constexpr int kBlockFloats = 16 * 16 + 4;
  /// The K tile [64][128] bf16, 16-byte pieces XOR-swizzled by row (no padding); once K K^T is in
  /// registers, L's ten lower blocks and the merge scratch (3 blocks) take its bytes.
  static constexpr int kOffK = 0;
  static constexpr int kOffL = 0;
  static constexpr int kOffP = 10 * kBlockFloats * 4;
  static constexpr int kOffT = kChunk * kK * 2;  ///< Tm's ten lower blocks
  static constexpr int kOffG = kOffT + 10 * kBlockFloats * 4;
  static constexpr int kOffBeta = kOffG + kChunk * 4;
  static constexpr int kOffRstd = kOffBeta + kChunk * 4;  ///< the rows' rstd (FOLD_RSTD)
  static constexpr int kSmemBytes = kOffRstd + kChunk * 4;
  static_assert(kOffP + 3 * kBlockFloats * 4 <= kOffT, "L and the merge scratch must fit in the K tile's bytes");
};

/// Forward state walk (F4): one block per (V slab, value head, document).
struct StateWalkGeometry {
  static constexpr int kThreads = 128;
  /// 32-wide slabs give 4x more independent walks than V-wide ones; the walk is latency bound.
  static constexpr int bv(int V) { return V % 32 == 0 ? 32 : 64; }
  /// The spec's walk_slab "auto": 64-wide slabs once one document alone gives 32 or more of them
  /// (HV * V / 64 >= 32), else bv(V). A 64-wide slab re-reads W and K through L2 half as often
  /// but gives half the blocks: on the H200 it took the walk at M (HV 48, 5 documents, 480 blocks)
  /// from 1.038 to 0.762 ms, and the whole forward at N (HV 6, 3 documents, 36 blocks) from 0.190
  /// to 0.221 ms (docs/PERF.md). The threshold lies between the two measured points.
  static constexpr int auto_bv(int V, int HV) { return V % 64 == 0 && HV * (V / 64) >= 32 ? 64 : bv(V); }
  static constexpr int ld_bf(int d) { return d + 8; }
  // One pipeline stage holds W and K (all K columns), the U slab and gc of one chunk.
  static constexpr int stage_w(int, int) { return 0; }
  static constexpr int stage_k(int K, int chunk) { return chunk * ld_bf(K) * 2; }
  static constexpr int stage_u(int K, int chunk) { return 2 * chunk * ld_bf(K) * 2; }
  static constexpr int stage_g(int K, int chunk, int bvw) { return stage_u(K, chunk) + chunk * ld_bf(bvw) * 2; }
  static constexpr int stage_bytes(int K, int chunk, int bvw) { return stage_g(K, chunk, bvw) + chunk * 4; }
  // After the stage: bf16(S) [K][bv], then the gated V' and v_new staging [chunk][bv]. One stage,
  // not two: at about 60 KB three blocks share an SM and hide each other's loads.
  static constexpr int off_s(int K, int chunk, int bvw) { return stage_bytes(K, chunk, bvw); }
  static constexpr int off_vg(int K, int chunk, int bvw) { return off_s(K, chunk, bvw) + K * ld_bf(bvw) * 2; }
  static constexpr int off_vn(int K, int chunk, int bvw) { return off_vg(K, chunk, bvw) + chunk * ld_bf(bvw) * 2; }
  static constexpr int smem_bytes_bv(int K, int chunk, int bvw) {
    return off_vn(K, chunk, bvw) + chunk * ld_bf(bvw) * 2;
  }
  /// The default slab width's shared memory (the spec's walk_slab can pick another: smem_bytes_bv).
  static constexpr int smem_bytes(int K, int V, int chunk) { return smem_bytes_bv(K, chunk, bv(V)); }
  /// The prescan adds the lo part of bf16(S) after the walk's tiles.
  static constexpr int prescan_smem_bytes_bv(int K, int chunk, int bvw) {
    return smem_bytes_bv(K, chunk, bvw) + K * ld_bf(bvw) * 2;
  }
};

/// The fused forward walk (FusedWalk): one block per (128 V columns, value head, document), 16 warps.
/// The portable body runs two independent halves of 8 warps, one per 64-column slab (4 row blocks
/// x 2 column halves for the chunk's products, 16 state rows each for the state update), each with
/// its own 97.5 KB of shared memory and its own named barrier; the sm_90a body runs four
/// warpgroups that share each chunk's loads and gated scores (FusedWalkSm90Layout).
struct FusedWalkGeometry {
  static constexpr int kThreads = 512;
  static constexpr int kMinBlocks = 1;
  static constexpr int kBV = 128;   ///< V columns per block
  static constexpr int kSlab = 64;  ///< V columns per portable half or walking warpgroup
  static constexpr int kHalfThreads = 256;
  static constexpr int ld_bf(int d) { return d + 8; }
  // Per portable half: Q and K [chunk][K] (Q's bytes stage O once Q is consumed), the V slab, Tm
  // [chunk][chunk], bf16(S) [K][bv], Wf, Vn and Vg [chunk][bv], gc, beta, the rows' rstd of q and k.
  static constexpr int off_q(int, int, int) { return 0; }
  static constexpr int off_k(int K, int chunk, int bv) { return off_q(K, chunk, bv) + chunk * ld_bf(K) * 2; }
  static constexpr int off_v(int K, int chunk, int bv) { return off_k(K, chunk, bv) + chunk * ld_bf(K) * 2; }
  static constexpr int off_t(int K, int chunk, int bv) { return off_v(K, chunk, bv) + chunk * ld_bf(bv) * 2; }
  static constexpr int off_s(int K, int chunk, int bv) { return off_t(K, chunk, bv) + chunk * ld_bf(chunk) * 2; }
  static constexpr int off_wf(int K, int chunk, int bv) { return off_s(K, chunk, bv) + K * ld_bf(bv) * 2; }
  static constexpr int off_vn(int K, int chunk, int bv) { return off_wf(K, chunk, bv) + chunk * ld_bf(bv) * 2; }
  static constexpr int off_vg(int K, int chunk, int bv) { return off_vn(K, chunk, bv) + chunk * ld_bf(bv) * 2; }
  static constexpr int off_g(int K, int chunk, int bv) { return off_vg(K, chunk, bv) + chunk * ld_bf(bv) * 2; }
  static constexpr int off_b(int K, int chunk, int bv) { return off_g(K, chunk, bv) + chunk * 4; }
  static constexpr int off_rq(int K, int chunk, int bv) { return off_b(K, chunk, bv) + chunk * 4; }
  static constexpr int off_rk(int K, int chunk, int bv) { return off_rq(K, chunk, bv) + chunk * 4; }
  static constexpr int portable_half_bytes(int K, int chunk) {
    return (off_rk(K, chunk, kSlab) + chunk * 4 + 127) / 128 * 128;
  }
  static constexpr int portable_smem_bytes(int K, int chunk) { return 2 * portable_half_bytes(K, chunk); }
  static constexpr int smem_bytes(int K, int chunk);
};

/// The sm_90a body of the fused walk (fwd/fused_walk_sm90.cuh), 512 threads: warpgroup 0 loads
/// the chunks into a ring of three stages of SW128 tiles (Q and K [chunk][K], V [chunk][128] as
/// two 64-column blocks, Tm [chunk][chunk], then gc, beta and the rows' rstd), warpgroup 1 computes the gated
/// Q K^T into two P tiles, warpgroups 2 and 3 walk 64 columns each with their own O staging
/// tile and column-factor vectors; then the ring's mbarriers. The tiles start 1024-byte aligned
/// and the dynamic shared window gets 1 KB of slack to align its base: 214,144 bytes at K = 128.
struct FusedWalkSm90Layout {
  static constexpr int align1k(int x) { return (x + 1023) / 1024 * 1024; }
  static constexpr int kStages = 3;
  static constexpr int kOutBuffers = 2;  ///< O staging tiles per walk: chunk parity
  static constexpr int off_q(int, int) { return 0; }
  static constexpr int off_k(int K, int chunk) { return chunk * K * 2; }
  static constexpr int off_v(int K, int chunk) { return 2 * chunk * K * 2; }
  static constexpr int off_t(int K, int chunk) { return off_v(K, chunk) + chunk * FusedWalkGeometry::kBV * 2; }
  static constexpr int off_g(int K, int chunk) { return off_t(K, chunk) + chunk * chunk * 2; }
  static constexpr int off_b(int K, int chunk) { return off_g(K, chunk) + chunk * 4; }
  static constexpr int off_rq(int K, int chunk) { return off_b(K, chunk) + chunk * 4; }  ///< rstd of q's rows
  static constexpr int off_rk(int K, int chunk) { return off_rq(K, chunk) + chunk * 4; }
  static constexpr int stage_bytes(int K, int chunk) { return align1k(off_rk(K, chunk) + chunk * 4); }
  static constexpr int off_p(int K, int chunk) { return kStages * stage_bytes(K, chunk); }  ///< 2 P tiles
  static constexpr int off_o(int K, int chunk) { return off_p(K, chunk) + 2 * chunk * chunk * 2; }
  /// Each walk's O staging: kOutBuffers SW128 tiles of chunk x kSlab (the TMA store's boxes).
  static constexpr int off_bar(int K, int chunk) {
    return off_o(K, chunk) + 2 * kOutBuffers * chunk * FusedWalkGeometry::kSlab * 2;
  }
  /// full[s], empty[s], then pfull[2], pempty[2] or, without the output, tfull[4], tempty[4]
  static constexpr int kBarriers = 2 * kStages + 8;
  /// Each walking warpgroup's per-chunk column factors (fp32), in two buffers (chunks alternate):
  /// exp2(gc_t) for X, exp2(gcL - gc_t) for Vg, exp2(gc_t) for O; each times the row's rstd of k,
  /// k and q when the products take raw q and k (FOLD_RSTD).
  static constexpr int off_vec(int K, int chunk) { return off_bar(K, chunk) + 128; }
  static constexpr int vec_bytes(int chunk) { return 3 * chunk * 4; }  ///< one buffer: the three factors
  static constexpr int smem_bytes(int K, int chunk) { return off_vec(K, chunk) + 2 * 2 * vec_bytes(chunk) + 1024; }
  static_assert(kBarriers * 8 <= 128, "the mbarriers must fit before the vectors");
};

constexpr int FusedWalkGeometry::smem_bytes(int K, int chunk) {
  return portable_smem_bytes(K, chunk) > FusedWalkSm90Layout::smem_bytes(K, chunk)
             ? portable_smem_bytes(K, chunk)
             : FusedWalkSm90Layout::smem_bytes(K, chunk);
}

/// Intra-card segments: the fp32 chain of the segments' transitions (WalkMerge), one block per
/// (kColumns state columns, value head, document); static shared memory only.
struct WalkMergeGeometry {
  static constexpr int kThreads = 256;
  /// Columns per block: the merge is a latency chain, so fewer columns mean more blocks and
  /// fewer multiply-adds per link (32 took 11 us per link at 24 blocks on the H200).
  static constexpr int kColumns = 8;
};

/// Forward output (F5): one block per (chunk, value head).
struct OutputGeometry {
  /// 8 warps (4 row blocks x 2 column halves of V) and 3 blocks per SM: 24 warps to hide the
  /// latency chains of the three products, where 4 warps and 2 blocks (87 KB each) gave 8.
  static constexpr int kThreads = 256;
  static constexpr int kMinBlocks = 3;
  static constexpr int ld_bf(int d) { return d + 8; }
  // Q, K (bf16 [chunk][K]; v_new [chunk][V] takes K's bytes after Q K^T), h (bf16 [K][V]), gc.
  static constexpr int off_q(int, int, int) { return 0; }
  static constexpr int off_k(int K, int /*V*/, int chunk) { return chunk * ld_bf(K) * 2; }
  static constexpr int off_vn(int K, int V, int chunk) { return off_k(K, V, chunk); }
  static constexpr int k_or_vn_bytes(int K, int V, int chunk) {
    return chunk * ld_bf(K) * 2 > chunk * ld_bf(V) * 2 ? chunk * ld_bf(K) * 2 : chunk * ld_bf(V) * 2;
  }
  static constexpr int off_h(int K, int V, int chunk) { return off_k(K, V, chunk) + k_or_vn_bytes(K, V, chunk); }
  static constexpr int off_g(int K, int V, int chunk) { return off_h(K, V, chunk) + K * ld_bf(V) * 2; }
  static constexpr int smem_bytes(int K, int V, int chunk) { return off_g(K, V, chunk) + chunk * 4; }
};

}  // namespace gdn
