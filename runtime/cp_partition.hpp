/**
 * @file cp_partition.hpp
 * @brief Context parallelism's token partition (docs/algorithm.md 4.1): which tokens and documents a
 *        rank owns, and how many ranks before and after it its boundary documents span.
 *
 * Host-only and device-free: the part of KCP that every rank computes from the global cu_seqlens
 * before any kernel runs, and the fragment table of the single-rank proxy (the host oracle of
 * the device-built one: chunk_table's pieces under cp.ranks > 1). One rank's phases run through
 * runtime/kcp.hpp; tests/test_cp_reference.cpp runs the whole protocol of docs/algorithm.md 4.3
 * and 4.4 in fp64 on top of this partition.
 */
#pragma once

#include "compiler/spec.hpp"

#include <cstdint>
#include <type_traits>
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

/// One piece of a document between two cuts: the document's bounds and every rank boundary
/// r * T / world strictly inside it. Each fragment is chunked from its own first token.
struct CpFragment {
  int64_t begin = 0;  ///< global tokens [begin, end); an empty document is one empty fragment
  int64_t end = 0;
  int doc = 0;        ///< the global document
  int rank = 0;       ///< the rank holding it (an empty document at token r P: rank r, at T: the last)
  int prev = -1;      ///< the same document's fragment before it (the carry comes from there), or -1
  bool last = false;  ///< the document ends in it: its final state is the document's ht
  int64_t chunks() const { return (end - begin + 63) / 64; }
};

/// The single-rank proxy's view of a partition (docs/design_kcp.md 2): the fragments in token
/// order and the augmented cut list, cu_seqlens plus every rank boundary inside a document
/// (`cuts[i]`, `cuts[i + 1]` bound fragment i). A fragment's entry state is its document's h0 (or
/// zero) carried through the document's earlier fragments in order, S = M_f S + S_ext_f in fp32:
/// the chain rank r's merge repeats over the gathered summaries of ranks r - pre .. r - 1.
struct CpFragments {
  std::vector<int64_t> cuts;
  std::vector<CpFragment> fragments;
};

/// The fragments of `cu_seqlens` split over `world` ranks; the same checks and errors as
/// cp_partition.
CpFragments cp_fragments(const std::vector<int64_t>& cu_seqlens, int world);

/// One rank of a context-parallel run as its phases see it (docs/design_kcp.md 3.1): its fragments
/// as local documents, each chunked from its own first token, and how many pieces of its boundary
/// documents the other ranks hold. Unlike CpRankPart, an empty document is kept (on the rank
/// cp_fragments gives it), so that its ht = h0 and dh0 = dht have an owner.
struct CpRankView {
  int rank = 0;
  int world = 1;
  int64_t token_begin = 0;          ///< global tokens [token_begin, token_begin + tokens)
  int64_t tokens = 0;               ///< P = T / world
  std::vector<int64_t> cu_seqlens;  ///< local offsets 0 .. tokens, one document per fragment here
  std::vector<int> docs;            ///< the global document of each local one
  int pieces_before = 0;            ///< the first local document's pieces on earlier ranks
  int pieces_after = 0;             ///< the last local document's pieces on later ranks
  int documents() const { return static_cast<int>(docs.size()); }
};

/// Rank `rank`'s view of `cu_seqlens` split over `world` ranks; the checks and errors of
/// cp_partition, and std::invalid_argument for a rank outside 0 .. world - 1.
CpRankView cp_rank_view(const std::vector<int64_t>& cu_seqlens, int world, int rank);

/// One rank's summary record of a layer, all-gathered between the phases: (S_ext, M) of every
/// value head, [HV, K, V + K] fp32 (the backward's (dZ_ext, A) has the same shape).
size_t kcp_record_bytes(const Spec&);

/// What the ranks of a KCP context must agree on before any step. Gathered once, when the
/// context is built (a host sync is fine there, never in a step), and compared field by field so
/// that the error names the field; it travels through the all-gather as plain bytes.
struct CpAgreement {
  int64_t rank = 0;       ///< the rank that made the record: record r of a gather must say r
  int64_t world = 0;      ///< the communicator's size
  int64_t tokens = 0;     ///< T of the global packed batch
  int64_t documents = 0;  ///< N
  int64_t heads_qk = 0, heads_v = 0, head_dim_k = 0, head_dim_v = 0;
  char cu_seqlens_sha256[65] = {};  ///< hex SHA-256 of the global offsets as int64
  char layer_sha256[65] = {};       ///< hex SHA-256 of the layer spec's JSON (code options included)
};

static_assert(std::is_trivially_copyable_v<CpAgreement>, "CpAgreement is all-gathered as bytes");
/// Rank `rank`'s record.
CpAgreement cp_agreement(const std::vector<int64_t>& cu_seqlens, int world, int rank, const Spec& spec);

/// Throws InputError naming the first rank and field that differ from rank 0's, with both values:
/// "rank 1 disagrees with rank 0 on heads_v (32 against 48)"; or a record at place r made by
/// another rank (two processes that claim one rank, or a gather out of rank order).
void cp_check_agreement(const std::vector<CpAgreement>& per_rank);

/// Throws InputError unless a communicator of `ranks` fits the spec and the batch: the spec's
/// cp.ranks, and at least one 64-token chunk per rank.
void cp_check_world(int ranks, const Spec& spec, int64_t tokens);

}  // namespace gdn
