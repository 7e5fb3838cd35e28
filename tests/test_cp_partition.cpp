/**
 * @file test_cp_partition.cpp
 * @brief Context parallelism's token partition (docs/algorithm.md 4.1) and the single-rank proxy's
 *        fragments: hand-checked cases, the properties that must hold for any batch, and the errors.
 */
#include "runtime/cp_partition.hpp"
#include "common/error.hpp"
#include "common/segments.hpp"

#include <doctest/doctest.h>

#include <random>
#include <set>
#include <tuple>
#include <stdexcept>

using gdn::cp_partition;
using gdn::CpRankPart;

namespace {

struct RandomBatch {
  int world;
  int64_t P;                ///< tokens per rank
  std::vector<int64_t> cu;  ///< documents of 0 to max_doc - 1 tokens (empty ones too) filling world * P
};

RandomBatch random_batch(std::mt19937_64& rng, int max_world, int64_t max_P, int64_t max_doc) {
  RandomBatch b;
  b.world = 1 + static_cast<int>(rng() % static_cast<uint64_t>(max_world));
  b.P = 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(max_P));
  const int64_t T = b.P * b.world;
  b.cu = {0};
  while (b.cu.back() < T)
    b.cu.push_back(std::min<int64_t>(T, b.cu.back() + static_cast<int64_t>(rng() % static_cast<uint64_t>(max_doc))));
  return b;
}

}  // namespace

TEST_SUITE("cp") {
  TEST_CASE("a document across three ranks, one ending on a rank boundary, an empty one") {
    // T = 120 over 4 ranks of 30: doc 0 [0, 10), doc 1 [10, 75) spans ranks 0..2, doc 2 empty,
    // doc 3 [75, 90) ends on the boundary, doc 4 [90, 120) is rank 3 alone.
    const auto parts = cp_partition({0, 10, 75, 75, 90, 120}, 4);
    REQUIRE(parts.size() == 4);
    CHECK(parts[0].cu_seqlens == std::vector<int64_t>{0, 10, 30});
    CHECK(parts[0].docs == std::vector<int>{0, 1});
    CHECK(parts[0].pre_num_ranks == 0);
    CHECK(parts[0].post_num_ranks == 2);
    CHECK(parts[1].cu_seqlens == std::vector<int64_t>{0, 30});
    CHECK(parts[1].docs == std::vector<int>{1});
    CHECK(parts[1].pre_num_ranks == 1);
    CHECK(parts[1].post_num_ranks == 1);
    CHECK(parts[2].cu_seqlens == std::vector<int64_t>{0, 15, 30});
    CHECK(parts[2].docs == std::vector<int>{1, 3});
    CHECK(parts[2].pre_num_ranks == 2);
    CHECK(parts[2].post_num_ranks == 0);
    CHECK(parts[3].cu_seqlens == std::vector<int64_t>{0, 30});
    CHECK(parts[3].docs == std::vector<int>{4});
    CHECK(parts[3].is_first_rank());
    CHECK(parts[3].is_last_rank());
    CHECK(parts[3].token_begin == 90);
    CHECK(parts[3].token_end == 120);
  }

  TEST_CASE("one rank is the batch itself") {
    const auto parts = cp_partition({0, 7, 7, 20}, 1);
    REQUIRE(parts.size() == 1);
    CHECK(parts[0].cu_seqlens == std::vector<int64_t>{0, 7, 20});
    CHECK(parts[0].docs == std::vector<int>{0, 2});
    CHECK(parts[0].is_first_rank());
    CHECK(parts[0].is_last_rank());
  }

  TEST_CASE("random batches: the ranks tile the tokens and the documents, and pre/post agree") {
    std::mt19937_64 rng(5);
    for (int trial = 0; trial < 300; ++trial) {
      const RandomBatch batch = random_batch(rng, 6, 40, 50);
      const int world = batch.world;
      const int64_t P = batch.P;
      const std::vector<int64_t>& cu = batch.cu;
      CAPTURE(trial);
      const auto parts = cp_partition(cu, world);
      REQUIRE(parts.size() == static_cast<size_t>(world));
      CHECK(parts.front().pre_num_ranks == 0);
      CHECK(parts.back().post_num_ranks == 0);
      std::vector<int64_t> covered(cu.size() - 1, 0);  // tokens of each global document seen
      for (const CpRankPart& r : parts) {
        CHECK(r.token_end - r.token_begin == P);
        REQUIRE(r.cu_seqlens.size() == r.docs.size() + 1);
        CHECK(r.cu_seqlens.front() == 0);
        CHECK(r.cu_seqlens.back() == P);
        for (size_t i = 0; i < r.docs.size(); ++i) {
          CHECK(r.cu_seqlens[i + 1] > r.cu_seqlens[i]);  // no empty local sequences
          covered[static_cast<size_t>(r.docs[i])] += r.cu_seqlens[i + 1] - r.cu_seqlens[i];
          if (i > 0) CHECK(r.docs[i] > r.docs[i - 1]);
        }
        // Only the first local sequence continues from earlier ranks, only the last onto later ones.
        if (r.rank > 0) {
          const CpRankPart& prev = parts[static_cast<size_t>(r.rank) - 1];
          const bool shared = prev.docs.back() == r.docs.front();
          CHECK((r.pre_num_ranks > 0) == shared);
          CHECK((prev.post_num_ranks > 0) == shared);
          // A shared document started one rank earlier, or further back when the previous rank
          // holds nothing else; likewise forwards.
          if (shared) CHECK(r.pre_num_ranks == (prev.docs.size() == 1 ? prev.pre_num_ranks + 1 : 1));
          if (shared) CHECK(prev.post_num_ranks == (r.docs.size() == 1 ? r.post_num_ranks + 1 : 1));
        }
      }
      for (size_t d = 0; d + 1 < cu.size(); ++d) CHECK(covered[d] == cu[d + 1] - cu[d]);
    }
  }

  // The single-rank proxy's fragments (docs/design_kcp.md 2) of the batch above: the cut at 30
  // is inside doc 1 and off a chunk boundary, the one at 60 too; 90 is a document boundary.
  TEST_CASE("fragments: the augmented cut list and the carries of a document across three ranks") {
    const gdn::CpFragments f = gdn::cp_fragments({0, 10, 75, 75, 90, 120}, 4);
    CHECK(f.cuts == std::vector<int64_t>{0, 10, 30, 60, 75, 75, 90, 120});
    REQUIRE(f.fragments.size() == 7);
    const auto at = [&](size_t i) {
      const gdn::CpFragment& x = f.fragments[i];
      return std::vector<int64_t>{x.begin, x.end, x.doc, x.rank, x.prev, x.last ? 1 : 0};
    };
    CHECK(at(0) == std::vector<int64_t>{0, 10, 0, 0, -1, 1});
    CHECK(at(1) == std::vector<int64_t>{10, 30, 1, 0, -1, 0});
    CHECK(at(2) == std::vector<int64_t>{30, 60, 1, 1, 1, 0});  // carries from fragment 1
    CHECK(at(3) == std::vector<int64_t>{60, 75, 1, 2, 2, 1});
    CHECK(at(4) == std::vector<int64_t>{75, 75, 2, 2, -1, 1});  // the empty document
    CHECK(at(5) == std::vector<int64_t>{75, 90, 3, 2, -1, 1});
    CHECK(at(6) == std::vector<int64_t>{90, 120, 4, 3, -1, 1});
    CHECK(f.fragments[2].chunks() == 1);
    // A cut on a chunk boundary and an empty document on a rank boundary (rank 1 holds it), one at T.
    const gdn::CpFragments g = gdn::cp_fragments({0, 128, 128, 256, 256}, 2);
    CHECK(g.cuts == std::vector<int64_t>{0, 128, 128, 256, 256});
    REQUIRE(g.fragments.size() == 4);
    CHECK(g.fragments[1].rank == 1);
    CHECK(g.fragments[3].rank == 1);
    CHECK(g.fragments[0].chunks() == 2);
  }

  // chunk_table builds the proxy's pieces on the device with seg::next_rank_boundary; walked the
  // same way here, the pieces must be cp_fragments' (the host oracle), chunk for chunk.
  TEST_CASE("the device rule for the proxy's pieces gives cp_fragments' cut list and chunk count") {
    std::mt19937_64 rng(13);
    for (int trial = 0; trial < 300; ++trial) {
      const RandomBatch batch = random_batch(rng, 8, 300, 400);
      INFO("trial " << trial << ", world " << batch.world << ", P " << batch.P);
      const gdn::CpFragments f = gdn::cp_fragments(batch.cu, batch.world);
      const unsigned per_rank = static_cast<unsigned>(batch.P);
      std::vector<int64_t> cuts = {0};
      int64_t chunks = 0, expected_chunks = 0;
      int most_pieces = 0;
      for (size_t d = 0; d + 1 < batch.cu.size(); ++d) {
        const unsigned e = static_cast<unsigned>(batch.cu[d + 1]);
        unsigned a = static_cast<unsigned>(batch.cu[d]);
        if (a == e) cuts.push_back(e);  // an empty document is one empty fragment
        int pieces = 0;
        while (a < e) {
          const unsigned b = std::min(e, gdn::seg::next_rank_boundary(a, per_rank));
          chunks += (b - a + 63) / 64;
          cuts.push_back(b);
          a = b;
          ++pieces;
        }
        most_pieces = std::max(most_pieces, pieces);
      }
      for (const gdn::CpFragment& x : f.fragments) expected_chunks += x.chunks();
      CHECK(cuts == f.cuts);
      CHECK(chunks == expected_chunks);
      // The walks' grid has cp.ranks segments per document and the buffers NT + ranks - 1 chunks.
      CHECK(most_pieces <= batch.world);
      CHECK(chunks <= batch.cu.back() / 64 + static_cast<int64_t>(batch.cu.size()) - 1 + batch.world - 1);
    }
  }

  TEST_CASE("fragments agree with the partition and chain every document's pieces in order") {
    std::mt19937_64 rng(11);
    for (int trial = 0; trial < 300; ++trial) {
      const RandomBatch batch = random_batch(rng, 8, 200, 300);
      const int world = batch.world;
      const int64_t P = batch.P;
      const std::vector<int64_t>& cu = batch.cu;
      INFO("trial " << trial << ", world " << world << ", P " << P);
      const gdn::CpFragments f = gdn::cp_fragments(cu, world);
      const auto parts = cp_partition(cu, world);
      REQUIRE(f.cuts.size() == f.fragments.size() + 1);
      // Each rank's non-empty fragments are its local sequences, in order.
      std::vector<std::vector<size_t>> of_rank(static_cast<size_t>(world));
      for (size_t i = 0; i < f.fragments.size(); ++i) {
        const gdn::CpFragment& x = f.fragments[i];
        CHECK(f.cuts[i] == x.begin);
        CHECK(f.cuts[i + 1] == x.end);
        CHECK(x.end - x.begin <= P);  // never wider than a rank
        if (x.end > x.begin) {
          CHECK(x.rank == x.begin / P);
          CHECK(x.rank == (x.end - 1) / P);
          of_rank[static_cast<size_t>(x.rank)].push_back(i);
        }
      }
      for (int r = 0; r < world; ++r) {
        const CpRankPart& part = parts[static_cast<size_t>(r)];
        const auto& mine = of_rank[static_cast<size_t>(r)];
        REQUIRE(mine.size() == part.docs.size());
        for (size_t l = 0; l < mine.size(); ++l) {
          const gdn::CpFragment& x = f.fragments[mine[l]];
          CHECK(x.doc == part.docs[l]);
          CHECK(x.end - x.begin == part.cu_seqlens[l + 1] - part.cu_seqlens[l]);
        }
        // A carry enters the rank's first sequence iff it started earlier; one leaves the last iff
        // the document goes on.
        CHECK((f.fragments[mine.front()].prev >= 0) == (part.pre_num_ranks > 0));
        CHECK(!f.fragments[mine.back()].last == (part.post_num_ranks > 0));
      }
      // Every document: one last fragment, reached from its first through `prev` links back.
      const int N = static_cast<int>(cu.size()) - 1;
      std::vector<int> last(static_cast<size_t>(N), -1);
      for (size_t i = 0; i < f.fragments.size(); ++i)
        if (f.fragments[i].last) {
          CHECK(last[static_cast<size_t>(f.fragments[i].doc)] == -1);
          last[static_cast<size_t>(f.fragments[i].doc)] = static_cast<int>(i);
        }
      for (int d = 0; d < N; ++d) {
        int i = last[static_cast<size_t>(d)];
        REQUIRE(i >= 0);
        int64_t end = cu[static_cast<size_t>(d) + 1];
        while (i >= 0) {
          const gdn::CpFragment& x = f.fragments[static_cast<size_t>(i)];
          CHECK(x.doc == d);
          CHECK(x.end == end);
          end = x.begin;
          i = x.prev;
        }
        CHECK(end == cu[static_cast<size_t>(d)]);
      }
    }
  }

  // The record every rank gathers once when a KCP context is built: equal records pass, and the
  // first difference is named with both values.
  TEST_CASE("ranks that disagree on the batch, the heads or the layer are refused by name") {
    gdn::Spec spec;
    spec.name = "kcp";
    spec.heads_qk = 16;
    spec.heads_v = 48;
    const std::vector<int64_t> cu = {0, 100, 4096};
    std::vector<gdn::CpAgreement> all;
    for (int r = 0; r < 3; ++r) all.push_back(gdn::cp_agreement(cu, 3, r, spec));
    CHECK_NOTHROW(gdn::cp_check_agreement(all));
    CHECK(std::string(all[0].cu_seqlens_sha256).size() == 64);
    gdn::Spec other = spec;
    other.heads_v = 32;
    other.heads_qk = 16;
    all[2] = gdn::cp_agreement(cu, 3, 2, other);
    CHECK_THROWS_WITH_AS(gdn::cp_check_agreement(all), "rank 2 disagrees with rank 0 on heads.v (32 against 48)",
                         gdn::InputError);
    all[2] = gdn::cp_agreement({0, 101, 4096}, 3, 2, spec);  // same T and N, other offsets
    try {
      gdn::cp_check_agreement(all);
      FAIL("different cu_seqlens passed");
    } catch (const gdn::InputError& e) {
      const std::string m = e.what();
      CHECK(m.rfind("rank 2 disagrees with rank 0 on cu_seqlens (sha256 ", 0) == 0);
      CHECK(m.find("every rank passes the whole batch's cu_seqlens") != std::string::npos);
    }
    all[2] = gdn::cp_agreement({0, 4000}, 3, 2, spec);
    CHECK_THROWS_WITH_AS(gdn::cp_check_agreement(all),
                         "rank 2 disagrees with rank 0 on T (4000 against 4096): every rank passes the whole batch's "
                         "cu_seqlens",
                         gdn::InputError);
    other = spec;
    other.save_mode = gdn::SaveMode::full;
    all[2] = gdn::cp_agreement(cu, 3, 2, other);
    all[1] = gdn::cp_agreement(cu, 2, 1, spec);
    CHECK_THROWS_WITH_AS(gdn::cp_check_agreement(all),
                         "rank 1 disagrees with rank 0 on the communicator's size (2 against 3)", gdn::InputError);
    all[1] = gdn::cp_agreement(cu, 3, 1, spec);
    try {
      gdn::cp_check_agreement(all);
      FAIL("a different save_mode passed");
    } catch (const gdn::InputError& e) {
      CHECK(std::string(e.what()).rfind("rank 2 disagrees with rank 0 on the layer spec (sha256 ", 0) == 0);
    }
    // Two processes that both say rank 0, and a gather out of rank order.
    all = {gdn::cp_agreement(cu, 3, 0, spec), gdn::cp_agreement(cu, 3, 0, spec), gdn::cp_agreement(cu, 3, 2, spec)};
    CHECK_THROWS_WITH_AS(gdn::cp_check_agreement(all),
                         "cp: the record gathered at place 1 was made by rank 0: two processes claim one rank, or the "
                         "all-gather did not keep rank order",
                         gdn::InputError);
    std::swap(all[0], all[2]);
    CHECK_THROWS_WITH_AS(gdn::cp_check_agreement(all),
                         "cp: the record gathered at place 0 was made by rank 2: two processes claim one rank, or the "
                         "all-gather did not keep rank order",
                         gdn::InputError);
    CHECK_THROWS_WITH_AS(gdn::cp_check_agreement({}), "cp: no rank's record was gathered", gdn::InputError);
  }

  TEST_CASE("a communicator must match the spec's ranks and leave each rank a chunk") {
    gdn::Spec spec;
    spec.name = "kcp";
    spec.heads_qk = spec.heads_v = 1;
    CHECK_NOTHROW(gdn::cp_check_world(1, spec, 64));
    CHECK_THROWS_WITH_AS(gdn::cp_check_world(2, spec, 4096),
                         "cp.ranks: the communicator has 2 ranks, the spec asks for 1", gdn::InputError);
    spec.cp_ranks = 8;
    CHECK_THROWS_WITH_AS(gdn::cp_check_world(8, spec, 320),
                         "cp.ranks: 8 ranks for 320 tokens: each rank needs at least one 64-token chunk (at most 5 "
                         "ranks)",
                         gdn::InputError);
    CHECK_NOTHROW(gdn::cp_check_world(8, spec, 512));
  }

  TEST_CASE("bad input names the field and the value") {
    CHECK_THROWS_WITH_AS(gdn::cp_fragments({0, 10, 25}, 2), "cp.ranks: T = 25 tokens is not divisible by 2 ranks",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(gdn::cp_fragments({0, 10, 8, 12}, 2), "cu_seqlens[2]: 8 < cu_seqlens[1] (10)",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(cp_partition({0, 10, 25}, 2), "cp.ranks: T = 25 tokens is not divisible by 2 ranks",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(cp_partition({0, 10}, 0), "cp.ranks: 0 must be at least 1", std::invalid_argument);
    CHECK_THROWS_WITH_AS(cp_partition({0, 10, 8, 12}, 2), "cu_seqlens[2]: 8 < cu_seqlens[1] (10)",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(cp_partition({3, 10}, 1), "cu_seqlens[0]: 3 must be 0", std::invalid_argument);
    CHECK_THROWS_WITH_AS(cp_partition({0}, 1), "cu_seqlens: 1 offsets, need at least 2", std::invalid_argument);
    CHECK_THROWS_WITH_AS(cp_partition({0, 0}, 1), "cu_seqlens: the batch holds no tokens", std::invalid_argument);
  }

  // The walks' grids: z in [0, N * most) names every (document, segment) once, and the blocks of
  // every document's first segment are the first N in launch order.
  TEST_CASE("segments: the segment-major grid visits every document's segments once, first segments first") {
    for (int most : {1, 2, 8, 64})
      for (int docs : {1, 3, 17, 1000}) {
        std::set<std::pair<int, int>> seen;
        for (int z = 0; z < docs * most; ++z) {
          const auto [n, segment] = gdn::seg::grid_index(z, docs, most);
          CAPTURE(most);
          CAPTURE(docs);
          CAPTURE(z);
          REQUIRE(n >= 0);
          REQUIRE(n < docs);
          REQUIRE(segment >= 0);
          REQUIRE(segment < most);
          CHECK(seen.insert({n, segment}).second);
          CHECK((segment == 0) == (z < docs));
        }
        CHECK(seen.size() == static_cast<size_t>(docs * most));
      }
  }

  // The segmented walk grid (x slabs, y = value heads x segments, z = documents) in launch order
  // (x fastest, then y, then z) runs the same (head, position) sequence as the grid of value
  // heads on y and N x segments positions on z: the same blocks, in the same order.
  TEST_CASE("segments: the grid of value heads x segments on y launches as positions on z did") {
    for (int most : {1, 2, 16, 64})
      for (int heads : {1, 2, 6, 48})
        for (int docs : {1, 3, 17}) {
          CAPTURE(most);
          CAPTURE(heads);
          CAPTURE(docs);
          const int rows = most == 1 ? heads : heads * most;
          long long linear = 0;
          for (int z = 0; z < docs; ++z)
            for (int y = 0; y < rows; ++y, ++linear) {
              const int head = gdn::seg::grid_head(y, heads, most);
              const int position = gdn::seg::grid_position(y, z, heads, most);
              // The earlier grid's linear index of (head, position): head fastest, then position.
              REQUIRE(head >= 0);
              REQUIRE(head < heads);
              REQUIRE(position >= 0);
              REQUIRE(position < docs * most);
              CHECK(static_cast<long long>(position) * heads + head == linear);
            }
        }
  }

  // A call launches its segmented walks with R segment rows (the host's segment_rows(), at most
  // SEGMENTS): y = HV x R. The kernels' grid_segment() maps blocks by seg::block_position (R from
  // gridDim.y) and grid_head (from SEGMENTS). Every (document, segment < R, head) is one block,
  // first segments first.
  TEST_CASE("segments: a grid of R segment rows, R at most SEGMENTS, visits every segment below R once") {
    for (int most : {2, 16})
      for (int rows : {1, 2, 5, most})
        for (int heads : {1, 6})
          for (int docs : {1, 3, 17}) {
            CAPTURE(most);
            CAPTURE(rows);
            CAPTURE(heads);
            CAPTURE(docs);
            if (rows > most) continue;
            std::set<std::tuple<int, int, int>> seen;
            long long launched = 0;
            for (int z = 0; z < docs; ++z)
              for (int y = 0; y < heads * rows; ++y, ++launched) {
                const int head = gdn::seg::grid_head(y, heads, most);
                const auto [n, segment] = gdn::seg::block_position(y, z, heads * rows, docs, heads, most);
                REQUIRE(segment < rows);
                REQUIRE(n < docs);
                CHECK(seen.insert({n, segment, head}).second);
                // The blocks of every first segment come first in launch order.
                CHECK((segment == 0) == (launched < static_cast<long long>(docs) * heads));
              }
            CHECK(seen.size() == static_cast<size_t>(docs * rows * heads));
          }
  }

  // The walks' document order (chunk_table sorts by this key, longest first): 0 for an empty
  // document, non-decreasing in the chunk count, and equal only within a quarter octave.
  TEST_CASE("segments: the document order's key is monotone, in range, and a quarter octave wide") {
    CHECK(gdn::seg::doc_order_key(0) == 0);
    CHECK(gdn::seg::doc_order_key(1) == 1);
    int prev = 0;
    for (long long c = 1; c < (1LL << 31); c = c < 4096 ? c + 1 : c * 9 / 8 + 1) {
      const int key = gdn::seg::doc_order_key(static_cast<int>(c));
      CAPTURE(c);
      REQUIRE(key >= prev);
      REQUIRE(key < gdn::seg::kDocOrderKeys);
      prev = key;
    }
    CHECK(gdn::seg::doc_order_key(0x7fffffff) < gdn::seg::kDocOrderKeys);
    // 4 .. 7 are four keys; 8 and 9 share one, 10 and 11 the next; 188 and 141 chunks differ.
    CHECK(gdn::seg::doc_order_key(4) < gdn::seg::doc_order_key(5));
    CHECK(gdn::seg::doc_order_key(8) == gdn::seg::doc_order_key(9));
    CHECK(gdn::seg::doc_order_key(9) < gdn::seg::doc_order_key(10));
    CHECK(gdn::seg::doc_order_key(141) < gdn::seg::doc_order_key(188));
    for (int e = 2; e < 30; ++e)
      for (int q = 0; q < 4; ++q) {
        const int lo = (4 + q) << (e - 2), hi = ((5 + q) << (e - 2)) - 1;
        CAPTURE(e);
        CAPTURE(q);
        CHECK(gdn::seg::doc_order_key(lo) == gdn::seg::doc_order_key(hi));
        CHECK(gdn::seg::doc_order_key(lo - 1) < gdn::seg::doc_order_key(lo));
      }
  }

  // seg::begin splits the product chunks x s to stay in 32-bit divisions: it must give the floor of
  // the exact quotient for every count up to the grid's 64 segments, up to the largest documents.
  TEST_CASE("segments: a segment's first chunk is first + floor(chunks s / segments)") {
    std::mt19937 rng(11);
    for (int trial = 0; trial < 200000; ++trial) {
      const int chunks = trial % 4 == 0 ? static_cast<int>(rng() % (1u << 25)) : static_cast<int>(rng() % 5000);
      const int segments = 1 + static_cast<int>(rng() % 64), s = static_cast<int>(rng() % (segments + 1));
      const int first = static_cast<int>(rng() % (1u << 20));
      const long long want = first + static_cast<long long>(chunks) * s / segments;
      if (gdn::seg::begin(first, chunks, segments, s) != want)
        FAIL("chunks " << chunks << ", segments " << segments << ", s " << s << ": "
                       << gdn::seg::begin(first, chunks, segments, s) << " != " << want);
    }
    CHECK(gdn::seg::begin(0, (1 << 25) - 1, 64, 63) == static_cast<int>((((1LL << 25) - 1) * 63) / 64));
  }

  // Intra-card segments (templates/common/segments.hpp, the kernels' arithmetic): on random
  // batches every document's segments tile its chunks in order, "auto" gives each document
  // min(most, max(1, chunks / m)) by its length alone (m = 32 on the programs forward, 128 on the
  // fused one), and the storage slots are distinct and fit the workspace the IR sizes (NT / m slots
  // with "auto", where only documents of two or more segments take slots; N * segments pinned).
  TEST_CASE("segments: counts, bounds and storage slots over random batches") {
    std::mt19937 rng(7);
    for (int trial = 0; trial < 2000; ++trial) {
      const int N = 1 + static_cast<int>(rng() % 40);
      std::vector<int> chunks(N);
      long long T = 0;
      for (int n = 0; n < N; ++n) {
        // Mostly short documents, some long ones and some empty ones.
        const long long len = rng() % 5 == 0 ? 0 : (rng() % 7 == 0 ? rng() % 40000 : rng() % 3000);
        T += len;
        chunks[n] = static_cast<int>((len + 63) / 64);
      }
      const long long nt_bound = T / 64 + N;  // the IR's NT
      for (const auto& [most, min_chunks] : {std::pair{16, 32}, std::pair{8, 32}, std::pair{8, 128}, std::pair{4, 128},
                                             std::pair{3, 0}, std::pair{1, 0}}) {
        INFO("trial " << trial << ", most " << most << ", min_chunks " << min_chunks);
        std::set<long long> slots;
        int first = 0;
        for (int n = 0; n < N; ++n) {
          const int count = gdn::seg::count(chunks[n], most, min_chunks);
          CHECK(count == (min_chunks ? std::max(1, std::min(most, chunks[n] / min_chunks)) : most));
          REQUIRE(gdn::seg::begin(first, chunks[n], count, 0) == first);
          REQUIRE(gdn::seg::begin(first, chunks[n], count, count) == first + chunks[n]);
          for (int s = 0; s < count; ++s) {
            const int b = gdn::seg::begin(first, chunks[n], count, s),
                      e = gdn::seg::begin(first, chunks[n], count, s + 1);
            CHECK(b <= e);
            if (min_chunks && count > 1) CHECK(e - b >= min_chunks);
            if (min_chunks && count == 1) continue;  // "auto": an unsplit document has no slot
            const long long slot = gdn::seg::slot0(n, first, most, min_chunks) + s;
            CHECK(slots.insert(slot).second);
            if (min_chunks)
              CHECK(slot * min_chunks < nt_bound);  // slot < NT / min_chunks
            else
              CHECK(slot < static_cast<long long>(N) * most);
          }
          first += chunks[n];
        }
      }
    }
  }
}
