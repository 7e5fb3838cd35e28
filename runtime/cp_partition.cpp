/**
 * @file cp_partition.cpp
 * @brief The token partition of context parallelism (see cp_partition.hpp).
 */
#include "runtime/cp_partition.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace gdn {

std::vector<CpRankPart> cp_partition(const std::vector<int64_t>& cu, int world) {
  if (world < 1) throw std::invalid_argument(fmt::format("cp.ranks: {} must be at least 1", world));
  if (cu.size() < 2) throw std::invalid_argument(fmt::format("cu_seqlens: {} offsets, need at least 2", cu.size()));
  if (cu.front() != 0) throw std::invalid_argument(fmt::format("cu_seqlens[0]: {} must be 0", cu.front()));
  for (size_t i = 1; i < cu.size(); ++i)
    if (cu[i] < cu[i - 1])
      throw std::invalid_argument(fmt::format("cu_seqlens[{}]: {} < cu_seqlens[{}] ({})", i, cu[i], i - 1, cu[i - 1]));
  const int64_t T = cu.back();
  if (T == 0) throw std::invalid_argument("cu_seqlens: the batch holds no tokens");
  if (T % world != 0)
    throw std::invalid_argument(fmt::format("cp.ranks: T = {} tokens is not divisible by {} ranks", T, world));
  const int64_t P = T / world;
  const int N = static_cast<int>(cu.size()) - 1;
  // The rank holding token t.
  auto owner = [&](int64_t t) { return static_cast<int>(t / P); };

  std::vector<CpRankPart> parts(static_cast<size_t>(world));
  int d = 0;  // first document that may still reach into this rank
  for (int r = 0; r < world; ++r) {
    CpRankPart& part = parts[static_cast<size_t>(r)];
    part.rank = r;
    part.token_begin = r * P;
    part.token_end = (r + 1) * P;
    part.cu_seqlens = {0};
    while (d < N && cu[static_cast<size_t>(d) + 1] <= part.token_begin) ++d;
    for (int e = d; e < N && cu[static_cast<size_t>(e)] < part.token_end; ++e) {
      const int64_t b = std::max(cu[static_cast<size_t>(e)], part.token_begin);
      const int64_t f = std::min(cu[static_cast<size_t>(e) + 1], part.token_end);
      if (f <= b) continue;  // an empty document, or none of it here
      part.cu_seqlens.push_back(f - part.token_begin);
      part.docs.push_back(e);
    }
    // Every token belongs to some document, so the rank is covered: P > 0 tokens, at least one.
    const int first = part.docs.front(), last = part.docs.back();
    part.pre_num_ranks = r - owner(cu[static_cast<size_t>(first)]);
    part.post_num_ranks = owner(cu[static_cast<size_t>(last) + 1] - 1) - r;
  }
  return parts;
}

}  // namespace gdn
