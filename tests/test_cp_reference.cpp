/**
 * @file test_cp_reference.cpp
 * @brief The segment summaries of context parallelism against the single-pass fp64 reference:
 *        forward carry, outputs re-run from the carry, the backward map M^T, and the whole rank
 *        protocol (partition, pre-processes, gathers, merges) over simulated ranks.
 */
#include "runtime/check/cp_reference.hpp"

#include "runtime/cp_partition.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <stdexcept>

using namespace gdn::ref;

namespace {

/// One document of 150 tokens split at 64 and 128, two more documents around it, GVA 1:3.
Problem problem() {
  Problem p;
  p.H = 1;
  p.HV = 3;
  p.K = 8;
  p.V = 6;
  p.cu_seqlens = {0, 20, 170, 200};
  p.T = 200;
  p.has_h0 = true;
  return p;
}

/// Gates close to 0, so the carried state and M stay far from zero over ~100 tokens and the
/// checks below have something to compare (with strong decay M underflows to ~1e-60).
Inputs weak_decay(Inputs in) {
  for (double& g : in.g) g *= 0.02;
  return in;
}

double max_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return a.size() == b.size() ? m : INFINITY;
}

/// The sub-problem of tokens [begin, end) of `in`, as one document starting from state `h0`.
std::pair<Problem, Inputs> segment(const Problem& p, const Inputs& in, int64_t begin, int64_t end,
                                   const std::vector<double>& h0) {
  Problem s = p;
  s.T = end - begin;
  s.cu_seqlens = {0, s.T};
  Inputs x;
  auto cut = [&](const std::vector<double>& v, int64_t per) {
    return std::vector<double>(v.begin() + begin * per, v.begin() + end * per);
  };
  x.q = cut(in.q, p.H * p.K);
  x.k = cut(in.k, p.H * p.K);
  x.v = cut(in.v, p.HV * p.V);
  x.g = cut(in.g, p.HV);
  x.beta = cut(in.beta, p.HV);
  x.h0 = h0;
  return {s, x};
}

}  // namespace

TEST_SUITE("reference") {
  TEST_CASE("segment summaries carry the state exactly and reproduce the single pass") {
    const Problem p = problem();
    const Inputs in = weak_decay(random_inputs(p, 9));
    const Outputs full = forward(p, in);
    const int K = p.K, V = p.V, doc = 1;
    const int64_t cuts[] = {20, 84, 148, 170};  // chunk boundaries of document 1, then its end
    for (int j = 0; j < p.HV; ++j) {
      CAPTURE(j);
      std::vector<double> S(in.h0.begin() + (static_cast<size_t>(doc) * p.HV + j) * K * V,
                            in.h0.begin() + (static_cast<size_t>(doc) * p.HV + j + 1) * K * V);
      for (int s = 0; s < 3; ++s) {
        // The segment re-run from the carried state gives the single pass's outputs there.
        std::vector<double> h0(static_cast<size_t>(p.HV) * K * V, 0.0);
        std::copy(S.begin(), S.end(), h0.begin() + static_cast<long>(j) * K * V);
        auto [sp, sx] = segment(p, in, cuts[s], cuts[s + 1], h0);
        const Outputs part = forward(sp, sx);
        for (int64_t t = 0; t < sp.T; ++t)
          for (int c = 0; c < V; ++c)
            CHECK(std::abs(part.o[(static_cast<size_t>(t) * p.HV + j) * V + c] -
                           full.o[(static_cast<size_t>(cuts[s] + t) * p.HV + j) * V + c]) < 1e-12);
        S = apply_summary(summarize_segment(p, in, doc, j, cuts[s], cuts[s + 1]), S, K, V);
      }
      const std::vector<double> ht(full.ht.begin() + (static_cast<size_t>(doc) * p.HV + j) * K * V,
                                   full.ht.begin() + (static_cast<size_t>(doc) * p.HV + j + 1) * K * V);
      CHECK(max_diff(S, ht) < 1e-12);
    }
  }

  TEST_CASE("the backward of a segment maps the end-state gradient through M^T") {
    const Problem p = problem();
    const Inputs in = weak_decay(random_inputs(p, 10));
    const int K = p.K, V = p.V, j = 2;
    const int64_t begin = 84, end = 170;
    const SegmentSummary s = summarize_segment(p, in, 1, j, begin, end);
    auto [sp, sx] = segment(p, in, begin, end, random_normal(static_cast<size_t>(p.HV) * K * V, 3));
    const std::vector<double> d_o = random_normal(static_cast<size_t>(sp.T) * p.HV * V, 4);
    const std::vector<double> dS_end = random_normal(static_cast<size_t>(p.HV) * K * V, 5);
    const Grads with = backward(sp, sx, d_o, dS_end);
    const Grads without = backward(sp, sx, d_o, {});
    // dh0(dS_end) - dh0(0) = M^T dS_end for head j.
    double worst = 0;
    for (int a = 0; a < K; ++a)
      for (int c = 0; c < V; ++c) {
        double want = 0;
        for (int b = 0; b < K; ++b)
          want += s.M[static_cast<size_t>(b) * K + a] * dS_end[(static_cast<size_t>(j) * K + b) * V + c];
        const size_t at = (static_cast<size_t>(j) * K + a) * V + c;
        worst = std::max(worst, std::abs(with.dh0[at] - without.dh0[at] - want));
      }
    double m_norm = 0;
    for (double x : s.M) m_norm = std::max(m_norm, std::abs(x));
    CHECK(m_norm > 1e-3);  // the map is not trivially zero (it is ~4e-3 here)
    CHECK(worst < 1e-11);
  }

  TEST_CASE("the rank protocol of docs/algorithm.md 4.3 and 4.4 over simulated ranks reproduces the single pass") {
    // 4 ranks of 60 tokens: doc 0 [0, 20) on rank 0, doc 1 [20, 170) across ranks 0..2 (rank 1
    // holds nothing else), doc 2 [170, 180) on rank 2 alone and ending on its boundary, doc 3
    // empty, doc 4 [180, 240) on rank 3. Rank boundaries are not chunk boundaries of the
    // documents: each rank chunks its local sequences from their local start.
    Problem p;
    p.H = 1;
    p.HV = 3;
    p.K = 8;
    p.V = 6;
    p.cu_seqlens = {0, 20, 170, 180, 180, 240};
    p.T = 240;
    const int world = 4, K = p.K, V = p.V, HV = p.HV;
    const size_t KV = static_cast<size_t>(K) * V;
    const Inputs in = weak_decay(random_inputs(p, 21));
    const std::vector<double> d_o = random_normal(static_cast<size_t>(p.T) * HV * V, 22);
    const Outputs full = forward(p, in);
    const Grads want = backward(p, in, d_o, {});
    const auto parts = gdn::cp_partition(p.cu_seqlens, world);
    REQUIRE(parts[1].docs == std::vector<int>{1});
    REQUIRE(parts[2].pre_num_ranks == 2);
    REQUIRE(parts[2].docs == std::vector<int>{1, 2});
    REQUIRE(parts[2].is_last_rank());
    REQUIRE(parts[3].docs == std::vector<int>{4});

    // A rank's local problem: its tokens, its local cu_seqlens, zero initial states to fill in.
    struct Local {
      Problem p;
      Inputs x;
      std::vector<double> d_o;
    };
    std::vector<Local> ranks;
    for (const gdn::CpRankPart& r : parts) {
      Local l;
      l.p = p;
      l.p.T = r.token_end - r.token_begin;
      l.p.cu_seqlens = r.cu_seqlens;
      l.p.has_h0 = true;
      auto cut = [&](const std::vector<double>& v, int64_t per) {
        return std::vector<double>(v.begin() + r.token_begin * per, v.begin() + r.token_end * per);
      };
      l.x.q = cut(in.q, p.H * K);
      l.x.k = cut(in.k, p.H * K);
      l.x.v = cut(in.v, HV * V);
      l.x.g = cut(in.g, HV);
      l.x.beta = cut(in.beta, HV);
      l.x.h0.assign(r.docs.size() * HV * KV, 0.0);
      l.d_o = cut(d_o, HV * V);
      ranks.push_back(std::move(l));
    }
    auto last_doc = [&](int r) { return static_cast<int>(parts[static_cast<size_t>(r)].docs.size()) - 1; };
    auto doc_range = [&](int r, int i) {
      const auto& cu = parts[static_cast<size_t>(r)].cu_seqlens;
      return std::pair<int64_t, int64_t>{cu[static_cast<size_t>(i)], cu[static_cast<size_t>(i) + 1]};
    };
    auto slice = [&](const std::vector<double>& v, size_t i) {
      return std::vector<double>(v.begin() + static_cast<long>(i * KV), v.begin() + static_cast<long>((i + 1) * KV));
    };

    // Forward pre-process (4.3 step 2) and the all-gather: (M, S_ext) of every rank's last local
    // sequence. Merge (step 4): the carry into each rank's first local sequence.
    std::vector<std::vector<SegmentSummary>> last(world), first(world);
    for (int r = 0; r < world; ++r)
      for (int j = 0; j < HV; ++j) {
        const auto [lb, le] = doc_range(r, last_doc(r));
        last[r].push_back(summarize_segment(ranks[r].p, ranks[r].x, last_doc(r), j, lb, le));
        const auto [fb, fe] = doc_range(r, 0);
        first[r].push_back(summarize_segment(ranks[r].p, ranks[r].x, 0, j, fb, fe));
      }
    for (int r = 0; r < world; ++r) {
      const gdn::CpRankPart& part = parts[static_cast<size_t>(r)];
      for (int j = 0; j < HV; ++j) {
        std::vector<double> S(KV, 0.0);
        for (int rr = r - part.pre_num_ranks; rr < r; ++rr) S = apply_summary(last[rr][j], S, K, V);
        std::copy(S.begin(), S.end(), ranks[r].x.h0.begin() + static_cast<long>(j * KV));
      }
    }
    double worst = 0;
    auto compare = [&](const std::vector<double>& got, const std::vector<double>& ref, size_t ref_offset) {
      for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - ref[ref_offset + i]));
    };
    // Every rank's forward from its carry gives the single pass's outputs, and the final state
    // of each document where that document ends.
    for (int r = 0; r < world; ++r) {
      const gdn::CpRankPart& part = parts[static_cast<size_t>(r)];
      const Outputs out = forward(ranks[r].p, ranks[r].x);
      compare(out.o, full.o, static_cast<size_t>(part.token_begin) * HV * V);
      for (int i = 0; i <= last_doc(r); ++i)
        if (i < last_doc(r) || part.is_last_rank())
          for (int j = 0; j < HV; ++j)
            compare(slice(out.ht, static_cast<size_t>(i) * HV + j), full.ht,
                    (static_cast<size_t>(part.docs[static_cast<size_t>(i)]) * HV + j) * KV);
    }
    CHECK(worst < 1e-11);

    // Backward pre-process (4.4 step 2) and the all-gather: dS_ext of every rank's first local
    // sequence (the reverse walk from a zero end gradient: dh0 with dht = 0) and its M^T. Merge
    // (step 4): the end gradient of each rank's last local sequence.
    std::vector<std::vector<double>> ds_ext(world);
    for (int r = 0; r < world; ++r) ds_ext[r] = backward(ranks[r].p, ranks[r].x, ranks[r].d_o, {}).dh0;
    worst = 0;
    for (int r = 0; r < world; ++r) {
      const gdn::CpRankPart& part = parts[static_cast<size_t>(r)];
      std::vector<double> dht(parts[static_cast<size_t>(r)].docs.size() * HV * KV, 0.0);
      for (int j = 0; j < HV; ++j) {
        std::vector<double> Z(KV, 0.0);
        for (int rr = r + part.post_num_ranks; rr > r; --rr) {
          std::vector<double> next = slice(ds_ext[rr], static_cast<size_t>(j));  // dS_ext + M^T Z
          const std::vector<double>& M = first[rr][j].M;
          for (int a = 0; a < K; ++a)
            for (int c = 0; c < V; ++c)
              for (int b = 0; b < K; ++b)
                next[static_cast<size_t>(a) * V + c] +=
                    M[static_cast<size_t>(b) * K + a] * Z[static_cast<size_t>(b) * V + c];
          Z = std::move(next);
        }
        std::copy(Z.begin(), Z.end(),
                  dht.begin() + static_cast<long>((static_cast<size_t>(last_doc(r)) * HV + j) * KV));
      }
      const Grads got = backward(ranks[r].p, ranks[r].x, ranks[r].d_o, dht);
      const size_t tb = static_cast<size_t>(part.token_begin);
      compare(got.dq, want.dq, tb * p.H * K);
      compare(got.dk, want.dk, tb * p.H * K);
      compare(got.dv, want.dv, tb * HV * V);
      compare(got.dg, want.dg, tb * HV);
      compare(got.dbeta, want.dbeta, tb * HV);
    }
    CHECK(worst < 1e-11);
    // Not vacuous: the carries and end gradients that crossed ranks are far from zero.
    double carry = 0;
    for (double x : ranks[2].x.h0) carry = std::max(carry, std::abs(x));
    CHECK(carry > 1e-2);
  }

  TEST_CASE("summaries refuse segments that are not chunk-aligned") {
    const Problem p = problem();
    const Inputs in = random_inputs(p, 11);
    CHECK_THROWS_WITH_AS(summarize_segment(p, in, 1, 0, 21, 84), doctest::Contains("not a chunk-aligned part"),
                         std::invalid_argument);
  }
}
