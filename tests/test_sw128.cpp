/**
 * @file test_sw128.cpp
 * @brief The SW128 tile layout and the wgmma descriptor fields of templates/common/sw128.hpp,
 *        checked against a model of the hardware's address generation: the canonical layouts
 *        of the PTX ISA (as CUTLASS writes them: K-major ((8,m),(8,2)):((128 B, SBO),(2 B, 16 B)),
 *        M/N-major ((8,8,m),(8,k)):((2 B, 16 B, LBO),(128 B, SBO))), then the 128-byte swizzle
 *        on absolute address bits (bits 4-6 ^= bits 7-9). Every operand form the wgmma probe and
 *        chunk_bwd use must read back exactly the logical sub-matrix. The GPU suite gpu_wgmma
 *        checks the same forms, and with them this model, on the hardware.
 */
#include "common/sw128.hpp"

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace {

using gdn::sw128::DescFields;

/// Shared memory as element ids (one per bf16 slot).
struct Smem {
  std::vector<int32_t> slot;
  explicit Smem(std::size_t bytes) : slot(bytes / 2, -1) {}
  void write(unsigned byte, int32_t id) { slot.at(byte / 2) = id; }
  /// What the hardware reads at the canonical (unswizzled) address `a`.
  int32_t read(unsigned a) const { return slot.at((a ^ (((a >> 7) & 7u) << 4)) / 2); }
};

/// Stores a logical rows x cols matrix of ids (id = base + r * cols + c) as an SW128 tile.
void store(Smem& s, unsigned tile, int rows, int cols, int32_t base) {
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) s.write(tile + gdn::sw128::offset(r, c, rows), base + r * cols + c);
}

/// K-major operand of one k-step: element (mn, k), mn < MN, k < 16.
int32_t read_k_major(const Smem& s, const DescFields& d, int mn, int k) {
  return s.read(d.start + (mn / 8) * d.sbo + (mn % 8) * 128 + (k / 8) * 16 + (k % 8) * 2);
}
/// M/N-major operand of one k-step: element (k, mn).
int32_t read_mn_major(const Smem& s, const DescFields& d, int k, int mn) {
  return s.read(d.start + (k / 8) * d.sbo + (k % 8) * 128 + (mn / 64) * d.lbo + ((mn % 64) / 8) * 16 + (mn % 8) * 2);
}

}  // namespace

TEST_SUITE("sw128") {
  TEST_CASE("the layout is a permutation inside 1024-byte atoms") {
    for (int rows : {8, 64, 128}) {
      std::vector<int> seen(rows * 128, 0);
      for (int r = 0; r < rows; ++r)
        for (int c = 0; c < 128; ++c) {
          const unsigned off = gdn::sw128::offset(r, c, rows);
          REQUIRE(off % 2 == 0);
          REQUIRE(off / 2 < seen.size());
          ++seen[off / 2];
          // The swizzle only moves 16-byte chunks inside the element's own 8-row, 128-byte atom.
          CHECK(off / 1024 == (c / 64) * (rows / 8) + r / 8);
        }
      for (int n : seen) CHECK(n == 1);
    }
  }

  TEST_CASE("every wgmma operand form reads back its logical sub-matrix") {
    // A: 64 x depth; B: depth x N; one warpgroup (col0 = 0, width N) or four (N / 4 each).
    int forms = 0;
    for (int n : {64, 128})
      for (int depth : {64, 128})
        for (int a_m_major : {0, 1})
          for (int b_n_major : {0, 1})
            for (int split : {0, 1}) {
              CAPTURE(n);
              CAPTURE(depth);
              CAPTURE(a_m_major);
              CAPTURE(b_n_major);
              CAPTURE(split);
              const unsigned tile_a = 0, tile_b = 64u * depth * 2;
              REQUIRE(tile_b % 1024 == 0);
              Smem s(tile_b + depth * n * 2);
              const int32_t base_b = 1 << 20;
              // Logical A[m][k] = m * depth + k, B[k][c] = base_b + k * n + c, stored transposed as asked.
              if (a_m_major) {
                for (int k = 0; k < depth; ++k)
                  for (int m = 0; m < 64; ++m) s.write(tile_a + gdn::sw128::offset(k, m, depth), m * depth + k);
              } else {
                store(s, tile_a, 64, depth, 0);
              }
              if (b_n_major) {
                store(s, tile_b, depth, n, base_b);
              } else {
                for (int c = 0; c < n; ++c)
                  for (int k = 0; k < depth; ++k) s.write(tile_b + gdn::sw128::offset(c, k, n), base_b + k * n + c);
              }
              const int width = split ? n / 4 : n;
              int bad = 0;
              for (int g = 0; g < (split ? 4 : 1); ++g) {
                const int col0 = g * width;
                for (int ks = 0; ks < depth / 16; ++ks) {
                  const DescFields da =
                      a_m_major ? gdn::sw128::mn_major(tile_a, depth, ks) : gdn::sw128::k_major(tile_a, 64, ks);
                  const DescFields db = b_n_major ? gdn::sw128::mn_major_cols(tile_b, depth, col0, ks)
                                                  : gdn::sw128::k_major_rows(tile_b, n, col0, ks);
                  for (int m = 0; m < 64; ++m)
                    for (int k = 0; k < 16; ++k) {
                      const int32_t got = a_m_major ? read_mn_major(s, da, k, m) : read_k_major(s, da, m, k);
                      bad += got != m * depth + ks * 16 + k;
                    }
                  for (int k = 0; k < 16; ++k)
                    for (int c = 0; c < width; ++c) {
                      const int32_t got = b_n_major ? read_mn_major(s, db, k, c) : read_k_major(s, db, c, k);
                      bad += got != base_b + (ks * 16 + k) * n + col0 + c;
                    }
                }
              }
              CHECK(bad == 0);
              ++forms;
            }
    CHECK(forms == 32);
  }

  TEST_CASE("the descriptor byte fields fit their 14-bit (>> 4) encodings") {
    for (int rows : {64, 128}) {
      const DescFields f = gdn::sw128::mn_major(0, rows, 0);
      CHECK(f.lbo % 16 == 0);
      CHECK((f.lbo >> 4) < (1u << 14));
      CHECK(f.sbo == 1024);
    }
  }
}
