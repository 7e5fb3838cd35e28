/**
 * @file cp_partition.hpp
 * @brief Context parallelism's token partition (docs/algorithm.md 4.1): which tokens and documents a
 *        rank owns, and how many ranks before and after it its boundary documents span.
 *
 * Host-only and device-free: the part of KCP that every rank computes from the global cu_seqlens
 * before any kernel runs. The kernels, the collectives and the merges are not implemented yet (the
 * spec still rejects cp.ranks > 1); tests/test_cp_reference.cpp runs the whole protocol of
 * docs/algorithm.md 4.3 and 4.4 in fp64 on top of this partition.
 */
#pragma once

#include <cstdint>
#include <vector>

namespace gdn {

/// One rank's share of a packed varlen batch split over `world` ranks.
struct CpRankPart {
  int rank = 0;
  int64_t token_begin = 0;  ///< global tokens [token_begin, token_end): rank * P .. (rank + 1) * P
  int64_t token_end = 0;
  std::vector<int64_t> cu_seqlens;  ///< local document offsets 0 .. P: the global ones clamped, empty parts dropped
  std::vector<int> docs;            ///< the global document index of each local sequence
  int pre_num_ranks = 0;            ///< earlier ranks holding part of the first local sequence
  int post_num_ranks = 0;           ///< later ranks holding part of the last local sequence
  bool is_first_rank() const { return pre_num_ranks == 0; }
  bool is_last_rank() const { return post_num_ranks == 0; }
};

/**
 * @brief Splits the packed batch described by `cu_seqlens` (N + 1 offsets from 0 to T) over
 *        `world` ranks of P = T / world contiguous tokens each.
 * @throws std::invalid_argument naming the field and value: world < 1, T not divisible by world,
 *         cu_seqlens empty, not starting at 0, decreasing, or T = 0.
 */
std::vector<CpRankPart> cp_partition(const std::vector<int64_t>& cu_seqlens, int world);

}  // namespace gdn
