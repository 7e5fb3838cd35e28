/**
 * @file cp_partition.cpp
 * @brief The token partition of context parallelism (see cp_partition.hpp).
 */
#include "runtime/cp_partition.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace gdn {

namespace {

/// The checks both views share; returns T.
int64_t check_batch(const std::vector<int64_t>& cu, int world) {
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
  return T;
}

}  // namespace

std::vector<CpRankPart> cp_partition(const std::vector<int64_t>& cu, int world) {
  const int64_t T = check_batch(cu, world);
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

CpFragments cp_fragments(const std::vector<int64_t>& cu, int world) {
  const int64_t T = check_batch(cu, world);
  const int64_t P = T / world;
  CpFragments out;
  out.cuts = {0};
  for (size_t d = 0; d + 1 < cu.size(); ++d) {
    const int64_t b = cu[d], e = cu[d + 1];
    const int doc = static_cast<int>(d);
    if (b == e) {  // an empty document: one empty fragment, so that its ht = h0 has an owner
      out.fragments.push_back({b, e, doc, static_cast<int>(std::min<int64_t>(b / P, world - 1)), -1, true});
      out.cuts.push_back(e);
      continue;
    }
    int prev = -1;
    for (int64_t f = b; f < e;) {
      const int rank = static_cast<int>(f / P);
      const int64_t g = std::min(e, (rank + 1) * P);  // the fragment ends at the document or the rank
      out.fragments.push_back({f, g, doc, rank, prev, g == e});
      prev = static_cast<int>(out.fragments.size()) - 1;
      out.cuts.push_back(g);
      f = g;
    }
  }
  return out;
}

}  // namespace gdn
