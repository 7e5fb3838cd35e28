/**
 * @file test_cp_reference.cpp
 * @brief The segment summaries of context parallelism against the single-pass fp64 reference:
 *        forward carry, outputs re-run from the carry, and the backward map M^T.
 */
#include "tests/reference/cp_reference.hpp"

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

  TEST_CASE("summaries refuse segments that are not chunk-aligned") {
    const Problem p = problem();
    const Inputs in = random_inputs(p, 11);
    CHECK_THROWS_WITH_AS(summarize_segment(p, in, 1, 0, 21, 84), doctest::Contains("not a chunk-aligned part"),
                         std::invalid_argument);
  }
}
