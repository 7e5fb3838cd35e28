/**
 * @file cp_partition.cpp
 * @brief The token partition of context parallelism (see cp_partition.hpp).
 */
#include "runtime/cp_partition.hpp"

#include "cache/cache.hpp"
#include "common/error.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string_view>

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

CpRankView cp_rank_view(const std::vector<int64_t>& cu, int world, int rank) {
  const CpFragments all = cp_fragments(cu, world);
  if (rank < 0 || rank >= world)
    throw std::invalid_argument(fmt::format("rank: {} is outside 0 .. {} (world {})", rank, world - 1, world));
  CpRankView v;
  v.rank = rank;
  v.world = world;
  v.tokens = cu.back() / world;
  v.token_begin = v.tokens * rank;
  v.cu_seqlens = {0};
  int first = -1, last = -1;
  for (size_t i = 0; i < all.fragments.size(); ++i) {
    const CpFragment& f = all.fragments[i];
    if (f.rank != rank) continue;
    if (first < 0) first = static_cast<int>(i);
    last = static_cast<int>(i);
    v.cu_seqlens.push_back(f.end - v.token_begin);
    v.docs.push_back(f.doc);
  }
  // Every rank holds P > 0 tokens, so at least one fragment.
  for (int f = all.fragments[static_cast<size_t>(first)].prev; f >= 0; f = all.fragments[static_cast<size_t>(f)].prev)
    ++v.pieces_before;
  for (size_t i = static_cast<size_t>(last) + 1;
       i < all.fragments.size() && all.fragments[i].doc == all.fragments[static_cast<size_t>(last)].doc; ++i)
    ++v.pieces_after;
  return v;
}

size_t kcp_record_bytes(const Spec& sp) {
  return static_cast<size_t>(sp.heads_v) * sp.head_dim_k * (sp.head_dim_v + sp.head_dim_k) * sizeof(float);
}

CpAgreement cp_agreement(const std::vector<int64_t>& cu, int world, int rank, const Spec& spec) {
  CpAgreement a;
  a.rank = rank;
  a.world = world;
  a.tokens = cu.empty() ? 0 : cu.back();
  a.documents = cu.empty() ? 0 : static_cast<int64_t>(cu.size()) - 1;
  a.heads_qk = spec.heads_qk;
  a.heads_v = spec.heads_v;
  a.head_dim_k = spec.head_dim_k;
  a.head_dim_v = spec.head_dim_v;
  const std::string cu_hex =
      cache::sha256_hex(std::string_view(reinterpret_cast<const char*>(cu.data()), cu.size() * sizeof(int64_t)));
  const std::string layer_hex = cache::sha256_hex(to_json(spec).dump());
  std::memcpy(a.cu_seqlens_sha256, cu_hex.c_str(), std::min<size_t>(64, cu_hex.size()));
  std::memcpy(a.layer_sha256, layer_hex.c_str(), std::min<size_t>(64, layer_hex.size()));
  return a;
}

void cp_check_agreement(const std::vector<CpAgreement>& per_rank) {
  if (per_rank.empty()) throw InputError("cp: no rank's record was gathered");
  for (size_t r = 0; r < per_rank.size(); ++r)
    if (per_rank[r].rank != static_cast<int64_t>(r))
      throw InputError(
          fmt::format("cp: the record gathered at place {} was made by rank {}: two processes claim one "
                      "rank, or the all-gather did not keep rank order",
                      r, per_rank[r].rank));
  const CpAgreement& a = per_rank.front();
  for (size_t r = 1; r < per_rank.size(); ++r) {
    const CpAgreement& b = per_rank[r];
    const auto differ = [&](const char* field, const std::string& mine, const std::string& first, const char* hint) {
      throw InputError(
          fmt::format("rank {} disagrees with rank 0 on {} ({} against {}){}", r, field, mine, first, hint));
    };
    const auto num = [&](const char* field, int64_t mine, int64_t first, const char* hint = "") {
      if (mine != first) differ(field, std::to_string(mine), std::to_string(first), hint);
    };
    num("the communicator's size", b.world, a.world);
    num("T", b.tokens, a.tokens, ": every rank passes the whole batch's cu_seqlens");
    num("N", b.documents, a.documents, ": every rank passes the whole batch's cu_seqlens");
    num("heads.qk", b.heads_qk, a.heads_qk);
    num("heads.v", b.heads_v, a.heads_v);
    num("head_dim.k", b.head_dim_k, a.head_dim_k);
    num("head_dim.v", b.head_dim_v, a.head_dim_v);
    const auto hex = [](const char(&d)[65]) { return std::string(d, strnlen(d, 64)).substr(0, 12); };
    if (std::memcmp(b.cu_seqlens_sha256, a.cu_seqlens_sha256, 64) != 0)
      differ("cu_seqlens", "sha256 " + hex(b.cu_seqlens_sha256), hex(a.cu_seqlens_sha256),
             ": every rank passes the whole batch's cu_seqlens");
    if (std::memcmp(b.layer_sha256, a.layer_sha256, 64) != 0)
      differ("the layer spec", "sha256 " + hex(b.layer_sha256), hex(a.layer_sha256),
             ": the code options (save_mode, deterministic, ...) must match too");
  }
}

void cp_check_world(int ranks, const Spec& spec, int64_t tokens) {
  if (ranks != spec.cp_ranks)
    throw InputError(
        fmt::format("cp.ranks: the communicator has {} ranks, the spec asks for {}", ranks, spec.cp_ranks));
  const int64_t chunks = tokens / spec.chunk;
  if (ranks > chunks)
    throw InputError(
        fmt::format("cp.ranks: {} ranks for {} tokens: each rank needs at least one {}-token chunk (at "
                    "most {} ranks)",
                    ranks, tokens, spec.chunk, chunks));
}

}  // namespace gdn
