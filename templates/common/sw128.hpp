/**
 * @file sw128.hpp
 * @brief The 128-byte-swizzled ("SW128") shared tile layout and the byte fields of the wgmma
 *        shared-memory descriptors that read it, as plain C++17 shared by the host build (the
 *        layout-model test, tests/test_sw128.cpp) and the templates (common/wgmma.cuh).
 *
 * Layout: a bf16 tile of R rows x C columns (C a multiple of 64, R a multiple of 8) is C / 64
 * column blocks of R rows x 128 bytes, contiguous; inside a block the 16-byte chunk c of row r
 * sits at chunk position c ^ (r % 8). Blocks start 1024-byte aligned (the hardware applies the
 * same XOR to address bits 4-6 from bits 7-9 of the absolute address).
 */
#pragma once

namespace gdn {
namespace sw128 {

/// Byte offset of element (row, col) of a bf16 SW128 tile with `rows` rows. `rows` must be a
/// multiple of 8 (every 64-column block stays 1024-byte aligned), and rows x 128 below 256 KB
/// (the descriptors' 14-bit byte-offset fields).
constexpr unsigned offset(int row, int col, int rows) {
  // Unsigned shifts and masks: with signed / and % the compiler adds sign fix-ups to every
  // element access of the epilogues (chunk_bwd_sm90 spent most of its instructions on them).
  const unsigned r = static_cast<unsigned>(row), c = static_cast<unsigned>(col);
  return (c >> 6) * static_cast<unsigned>(rows) * 128u + r * 128u + ((((c >> 3) & 7u) ^ (r & 7u)) << 4) +
         ((c & 7u) << 1);
}

/// Start address, leading and stride byte offsets of one wgmma k-step (16 deep) operand.
struct DescFields {
  unsigned start, lbo, sbo;
};

/// K-major operand (tile rows = M or N, columns = K): step `ks` starts 32 bytes further inside
/// the 128-byte rows, and in the next column block every 4 steps; 8-row groups are 1024 bytes
/// apart; LBO is unused (16).
constexpr DescFields k_major(unsigned tile, int rows, int ks) {
  return DescFields{tile + static_cast<unsigned>((ks / 4) * rows * 128 + (ks % 4) * 32), 16u, 1024u};
}

/// M/N-major operand (tile rows = K, columns = M or N): step `ks` starts 16 rows further; 8-row
/// (K) groups are 1024 bytes apart (SBO), 64-column blocks rows x 128 bytes apart (LBO).
constexpr DescFields mn_major(unsigned tile, int rows, int ks) {
  return DescFields{tile + static_cast<unsigned>(ks * 16 * 128), static_cast<unsigned>(rows * 128), 1024u};
}

/// K-major operand, rows row0.. (a multiple of 8): one warpgroup's columns of a split product.
constexpr DescFields k_major_rows(unsigned tile, int rows, int row0, int ks) {
  return k_major(tile + static_cast<unsigned>(row0 * 128), rows, ks);
}

/// M/N-major operand, columns col0.. (a multiple of 8, inside one 64-column block).
constexpr DescFields mn_major_cols(unsigned tile, int rows, int col0, int ks) {
  return mn_major(tile + static_cast<unsigned>((col0 / 64) * rows * 128 + (col0 % 64) * 2), rows, ks);
}

}  // namespace sw128
}  // namespace gdn
