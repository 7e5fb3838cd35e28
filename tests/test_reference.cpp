/**
 * @file test_reference.cpp
 * @brief Tests of the fp64 GDN reference: gradients against finite differences, the chunked
 *        forward against the naive one, closed forms, validation messages and determinism.
 *
 * Everything else in gdnc is checked against this reference, so it is checked here against
 * sources that do not share its code paths: central differences of loss(), an independently
 * structured chunked algorithm, and hand-derived closed forms.
 */
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/check/gdn_reference.hpp"
#include "runtime/check/layer_check.hpp"

namespace {

using gdn::ref::Grads;
using gdn::ref::Inputs;
using gdn::ref::Outputs;
using gdn::ref::Problem;

Problem make_problem(std::vector<int64_t> cu, int H, int HV, int K, int V, bool l2norm, bool has_h0) {
  Problem p;
  p.T = cu.back();
  p.H = H;
  p.HV = HV;
  p.K = K;
  p.V = V;
  p.cu_seqlens = std::move(cu);
  p.l2norm = l2norm;
  p.has_h0 = has_h0;
  return p;
}

bool bitwise_equal(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0);
}

double max_magnitude(const std::vector<double>& x) {
  double m = 0;
  for (double e : x) m = std::max(m, std::abs(e));
  return m;
}

}  // namespace

TEST_SUITE("reference") {
  TEST_CASE("backward matches central finite differences of loss for every input") {
    // Two documents (87 = 64 + 23 and 63 tokens), so the 64-token checkpoint boundary, a partial
    // block and a document reset are all inside the checked loss; G = 3 exercises the GVA sum.
    constexpr double kStep = 1e-6;
    constexpr double kTol = 1e-7;
    double worst = 0;  // reported once, as the achieved margin below kTol
    for (const bool l2norm : {false, true}) {
      CAPTURE(l2norm);
      const Problem p = make_problem({0, 87, 150}, 2, 6, 8, 6, l2norm, true);
      const Inputs in = gdn::ref::random_inputs(p, l2norm ? 11 : 7, /*gate_shift=*/2.0);
      const auto dO = gdn::ref::random_normal(p.T * p.HV * p.V, 101);
      const auto dht = gdn::ref::random_normal(p.num_docs() * p.HV * p.K * p.V, 202);
      const Grads gr = gdn::ref::backward(p, in, dO, dht);

      struct Case {
        const char* name;
        std::vector<double> Inputs::*x;
        const std::vector<double>* grad;
        int64_t per_token;  // elements per token, 0 for h0
      };
      const Case cases[] = {
          {"q", &Inputs::q, &gr.dq, int64_t{p.H} * p.K},  {"k", &Inputs::k, &gr.dk, int64_t{p.H} * p.K},
          {"v", &Inputs::v, &gr.dv, int64_t{p.HV} * p.V}, {"g", &Inputs::g, &gr.dg, p.HV},
          {"beta", &Inputs::beta, &gr.dbeta, p.HV},       {"h0", &Inputs::h0, &gr.dh0, 0},
      };
      std::mt19937_64 pick(l2norm ? 3 : 5);
      for (const Case& c : cases) {
        const std::string name = c.name;
        CAPTURE(name);
        const std::vector<double>& grad = *c.grad;
        REQUIRE(grad.size() == (in.*c.x).size());
        // A gradient that is zero everywhere would match an input the loss ignores.
        CHECK(max_magnitude(grad) > 1e-3);
        std::vector<size_t> coords;
        for (int r = 0; r < 8; ++r) coords.push_back(pick() % grad.size());
        if (c.per_token) {  // last token of document 0 and first of document 1
          coords.push_back(86 * c.per_token + pick() % c.per_token);
          coords.push_back(87 * c.per_token + pick() % c.per_token);
        }
        for (const size_t e : coords) {
          Inputs plus = in, minus = in;
          (plus.*c.x)[e] += kStep;
          (minus.*c.x)[e] -= kStep;
          const double fd = (gdn::ref::loss(p, plus, dO, dht) - gdn::ref::loss(p, minus, dO, dht)) / (2 * kStep);
          const double err = std::abs(fd - grad[e]) / std::max(1.0, std::abs(grad[e]));
          CAPTURE(e);
          CAPTURE(fd);
          CAPTURE(grad[e]);
          CHECK(err <= kTol);
          worst = std::max(worst, err);
        }
      }
    }
    MESSAGE("max relative FD error over all inputs: " << worst);
  }

  TEST_CASE("chunked forward agrees with the naive forward") {
    // Documents of exactly one chunk, one and a third, a single token, and under one chunk.
    for (const bool l2norm : {false, true}) {
      for (const int chunk : {64, 16}) {
        CAPTURE(l2norm);
        CAPTURE(chunk);
        const Problem p = make_problem({0, 64, 151, 152, 215}, 2, 4, 16, 12, l2norm, true);
        const Inputs in = gdn::ref::random_inputs(p, 42);
        const Outputs naive = gdn::ref::forward(p, in);
        const Outputs chunked = gdn::ref::forward_chunked(p, in, chunk);
        CHECK(max_magnitude(naive.o) > 0.1);
        CHECK(gdn::ref::max_abs(naive.o, chunked.o) <= 1e-12);
        CHECK(gdn::ref::max_abs(naive.ht, chunked.ht) <= 1e-12);
      }
    }
  }

  TEST_CASE("forward matches the closed-form update on two tokens") {
    // S_t = a_t (I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T, o_t = scale S_t^T q_t (state after the
    // update), with the default scale 1/sqrt(K). K = V = 2 keeps the algebra explicit.
    const Problem p = make_problem({0, 2}, 1, 1, 2, 2, false, true);
    Inputs in;
    in.q = {0.6, 0.8, -0.8, 0.6};
    in.k = {1.0, 0.0, 0.28, 0.96};
    in.v = {0.5, -1.0, 2.0, 0.25};
    in.g = {-0.1, -0.7};
    in.beta = {0.9, 0.3};
    in.h0 = {1.0, 2.0, -0.5, 0.75};
    const Outputs out = gdn::ref::forward(p, in);

    using M2 = double[2][2];
    M2 S = {{1.0, 2.0}, {-0.5, 0.75}};
    std::vector<double> o_expected;
    for (int t = 0; t < 2; ++t) {
      const double a = std::exp(in.g[t]), b = in.beta[t];
      const double* k = &in.k[2 * t];
      M2 next;
      for (int i = 0; i < 2; ++i)
        for (int c = 0; c < 2; ++c) {
          double proj = 0;  // ((I - b k k^T) S)[i][c]
          for (int l = 0; l < 2; ++l) proj += ((i == l) - b * k[i] * k[l]) * S[l][c];
          next[i][c] = a * proj + b * k[i] * in.v[2 * t + c];
        }
      std::memcpy(S, next, sizeof S);
      for (int c = 0; c < 2; ++c)
        o_expected.push_back((S[0][c] * in.q[2 * t] + S[1][c] * in.q[2 * t + 1]) / std::sqrt(2.0));
    }
    CHECK(gdn::ref::max_abs(o_expected, out.o) <= 1e-14);
    CHECK(gdn::ref::max_abs({S[0][0], S[0][1], S[1][0], S[1][1]}, out.ht) <= 1e-14);
  }

  TEST_CASE("value head j reads q/k head j / (HV / H)") {
    // With q/k head 1 zeroed, value heads 2 and 3 (G = 2) must output exactly zero; a j % H or
    // j % G mapping would zero other heads instead.
    const Problem p = make_problem({0, 10}, 2, 4, 4, 3, false, true);
    Inputs in = gdn::ref::random_inputs(p, 9);
    for (int64_t t = 0; t < p.T; ++t)
      for (int i = 0; i < p.K; ++i) in.q[(t * p.H + 1) * p.K + i] = in.k[(t * p.H + 1) * p.K + i] = 0;
    const Outputs out = gdn::ref::forward(p, in);
    for (int j = 0; j < p.HV; ++j) {
      double m = 0;
      for (int64_t t = 0; t < p.T; ++t)
        for (int c = 0; c < p.V; ++c) m = std::max(m, std::abs(out.o[(t * p.HV + j) * p.V + c]));
      CAPTURE(j);
      if (j / 2 == 1)
        CHECK(m == 0.0);
      else
        CHECK(m > 1e-3);
    }
  }

  TEST_CASE("in-kernel l2norm uses rstd = 1/sqrt(sum x^2 + 1e-6)") {
    // Tiny raw q/k (sum x^2 ~ 1e-5) make a missing or misplaced epsilon visible.
    Problem p = make_problem({0, 30, 50}, 2, 4, 8, 5, true, true);
    Inputs raw = gdn::ref::random_inputs(p, 21);
    for (auto* x : {&raw.q, &raw.k})
      for (double& e : *x) e *= 1e-3;
    Inputs normalized = raw;
    for (auto* x : {&normalized.q, &normalized.k})
      for (int64_t row = 0; row < p.T * p.H; ++row) {
        double ss = 0;
        for (int i = 0; i < p.K; ++i) ss += (*x)[row * p.K + i] * (*x)[row * p.K + i];
        for (int i = 0; i < p.K; ++i) (*x)[row * p.K + i] /= std::sqrt(ss + 1e-6);
      }
    const Outputs with_norm = gdn::ref::forward(p, raw);
    p.l2norm = false;
    const Outputs pre_normalized = gdn::ref::forward(p, normalized);
    CHECK(max_magnitude(with_norm.o) > 1e-3);
    CHECK(gdn::ref::max_abs(pre_normalized.o, with_norm.o) <= 1e-13);
    CHECK(gdn::ref::max_abs(pre_normalized.ht, with_norm.ht) <= 1e-13);
  }

  TEST_CASE("an empty dht means a zero dht") {
    const Problem p = make_problem({0, 40, 70}, 1, 2, 4, 4, true, true);
    const Inputs in = gdn::ref::random_inputs(p, 5);
    const auto dO = gdn::ref::random_normal(p.T * p.HV * p.V, 6);
    const std::vector<double> zeros(p.num_docs() * p.HV * p.K * p.V, 0.0);
    const Grads a = gdn::ref::backward(p, in, dO, {});
    const Grads b = gdn::ref::backward(p, in, dO, zeros);
    CHECK(bitwise_equal(a.dh0, b.dh0));
    CHECK(bitwise_equal(a.dq, b.dq));
    CHECK(max_magnitude(a.dh0) > 1e-3);
  }

  TEST_CASE("validate names the offending field") {
    const Problem good = make_problem({0, 9, 20}, 2, 4, 8, 8, false, false);
    CHECK_NOTHROW(gdn::ref::validate(good));

    Problem p = good;
    p.cu_seqlens = {0, 9, 5, 20};
    CHECK_THROWS_WITH_AS(gdn::ref::validate(p), "cu_seqlens[2]: 5 < cu_seqlens[1] (9)", std::invalid_argument);
    p.cu_seqlens = {3, 9, 20};
    CHECK_THROWS_WITH_AS(gdn::ref::validate(p), "cu_seqlens[0]: 3 != 0", std::invalid_argument);
    p.cu_seqlens = {0, 9, 19};
    CHECK_THROWS_WITH_AS(gdn::ref::validate(p), "cu_seqlens[2]: 19 != T (20)", std::invalid_argument);
    p.cu_seqlens = {0};
    CHECK_THROWS_WITH_AS(gdn::ref::validate(p), doctest::Contains("cu_seqlens:"), std::invalid_argument);

    p = good;
    p.HV = 6;
    p.H = 4;
    CHECK_THROWS_WITH_AS(gdn::ref::validate(p), "HV: 6 is not a multiple of H (4)", std::invalid_argument);

    // forward() checks input sizes against the problem, naming the tensor.
    Inputs in = gdn::ref::random_inputs(good, 1);
    in.beta.pop_back();
    CHECK_THROWS_WITH_AS(gdn::ref::forward(good, in), doctest::Contains("beta: size"), std::invalid_argument);
  }

  TEST_CASE("rel_rms and max_abs flag non-finite values") {
    const std::vector<double> ref = {1.0, -2.0, 3.0};
    const double nan = std::numeric_limits<double>::quiet_NaN();
    const double inf = std::numeric_limits<double>::infinity();
    CHECK(gdn::ref::rel_rms(ref, {1.0, nan, 3.0}) == inf);
    CHECK(gdn::ref::rel_rms(ref, {1.0, -2.0, -inf}) == inf);
    CHECK(gdn::ref::max_abs(ref, {nan, -2.0, 3.0}) == inf);
    CHECK(gdn::ref::rel_rms(ref, ref) == 0.0);
    // rms(ref - got) = rms(ref) here, so the metric is 1 up to the 1e-8 guard.
    CHECK(gdn::ref::rel_rms(ref, {0.0, 0.0, 0.0}) == doctest::Approx(1.0).epsilon(1e-7));
    CHECK(gdn::ref::max_abs(ref, {1.0, -2.5, 3.0}) == 0.5);
  }

  TEST_CASE("random_inputs is deterministic and follows the documented distribution") {
    const Problem p = make_problem({0, 100}, 2, 4, 8, 8, false, true);
    const Inputs a = gdn::ref::random_inputs(p, 77, 2.0);
    const Inputs b = gdn::ref::random_inputs(p, 77, 2.0);
    const Inputs c = gdn::ref::random_inputs(p, 78, 2.0);
    CHECK(bitwise_equal(a.v, b.v));
    CHECK(bitwise_equal(a.h0, b.h0));
    CHECK_FALSE(bitwise_equal(a.v, c.v));
    // Unit q rows when the kernel does not normalize; g <= -2 with gate_shift 2; beta in (0, 1).
    for (int64_t row = 0; row < p.T * p.H; ++row) {
      double ss = 0;
      for (int i = 0; i < p.K; ++i) ss += a.q[row * p.K + i] * a.q[row * p.K + i];
      REQUIRE(std::abs(ss - 1.0) < 1e-14);
    }
    CHECK(*std::max_element(a.g.begin(), a.g.end()) < -2.0);
    CHECK(*std::min_element(a.beta.begin(), a.beta.end()) > 0.0);
    CHECK(*std::max_element(a.beta.begin(), a.beta.end()) < 1.0);
  }

  TEST_CASE("random_normal is standard normal, block-parallel and a function of (seed, n) alone") {
    const std::vector<double> x = gdn::ref::random_normal(1 << 20, 5);
    double mean = 0, var = 0;
    for (double e : x) mean += e;
    mean /= static_cast<double>(x.size());
    for (double e : x) var += (e - mean) * (e - mean);
    var /= static_cast<double>(x.size());
    CHECK(std::abs(mean) < 5e-3);  // 5 standard errors at 2^20 samples
    CHECK(std::abs(var - 1.0) < 7e-3);
    // A shorter draw is a prefix of a longer one (blocks of 65536 have their own generators), and
    // the values do not depend on how many threads filled them.
    const std::vector<double> prefix = gdn::ref::random_normal(65536 + 3, 5);
    CHECK(std::equal(prefix.begin(), prefix.end(), x.begin()));
    CHECK_FALSE(std::equal(prefix.begin(), prefix.end(), gdn::ref::random_normal(65536 + 3, 6).begin()));
  }

  TEST_CASE("results are bitwise independent of the thread count") {
    // More (document, head) tasks than threads, uneven documents, GVA and the l2norm backward.
    const Problem p = make_problem({0, 50, 190, 191, 300}, 2, 6, 16, 8, true, true);
    const Inputs in = gdn::ref::random_inputs(p, 31, 1.0);
    const auto dO = gdn::ref::random_normal(p.T * p.HV * p.V, 32);
    const auto dht = gdn::ref::random_normal(p.num_docs() * p.HV * p.K * p.V, 33);
    const Outputs f1 = gdn::ref::forward(p, in, 1), f7 = gdn::ref::forward(p, in, 7);
    CHECK(bitwise_equal(f1.o, f7.o));
    CHECK(bitwise_equal(f1.ht, f7.ht));
    const Outputs c1 = gdn::ref::forward_chunked(p, in, 64, 1), c7 = gdn::ref::forward_chunked(p, in, 64, 7);
    CHECK(bitwise_equal(c1.o, c7.o));
    const Grads g1 = gdn::ref::backward(p, in, dO, dht, 1), g7 = gdn::ref::backward(p, in, dO, dht, 7);
    CHECK(bitwise_equal(g1.dq, g7.dq));
    CHECK(bitwise_equal(g1.dk, g7.dk));
    CHECK(bitwise_equal(g1.dv, g7.dv));
    CHECK(bitwise_equal(g1.dg, g7.dg));
    CHECK(bitwise_equal(g1.dbeta, g7.dbeta));
    CHECK(bitwise_equal(g1.dh0, g7.dh0));
  }

  // The per-document slices the GPU batch-invariance test compares: each result's layout
  // ([T, HV, V] bf16, [T, H, K] bf16, [T, HV] fp32, [N, HV, K, V] fp32) cut at the documents.
  TEST_CASE("check::document_bytes cuts every result at its documents") {
    gdn::Spec spec;
    spec.heads_qk = 1;
    spec.heads_v = 2;
    const std::vector<long long> lens = {3, 1, 2};
    const size_t T = 6, N = 3, H = 1, HV = 2, K = 128, V = 128;
    gdn::check::Report r;
    const auto fill = [&](const std::string& name, size_t bytes, size_t unit) {
      std::string b(bytes, '\0');
      for (size_t i = 0; i < bytes; ++i) b[i] = static_cast<char>(i / unit);  // byte = index of its row or state
      r.bytes[name] = b;
    };
    fill("o", T * HV * V * 2, HV * V * 2);
    fill("dq", T * H * K * 2, H * K * 2);
    fill("dg", T * HV * 4, HV * 4);
    fill("ht", N * HV * K * V * 4, HV * K * V * 4);
    for (const auto& [tensor, per_row] :
         {std::pair{std::string("o"), HV * V * 2}, std::pair{std::string("dq"), H * K * 2},
          std::pair{std::string("dg"), HV * 4}}) {
      const std::string second = gdn::check::document_bytes(r, tensor, spec, lens, 1);  // token 3 only
      CHECK(second.size() == per_row);
      CHECK(second == std::string(per_row, static_cast<char>(3)));
      const std::string third = gdn::check::document_bytes(r, tensor, spec, lens, 2);  // tokens 4 and 5
      CHECK(third == std::string(per_row, static_cast<char>(4)) + std::string(per_row, static_cast<char>(5)));
    }
    CHECK(gdn::check::document_bytes(r, "ht", spec, lens, 2) == std::string(HV * K * V * 4, static_cast<char>(2)));
    CHECK_THROWS_AS(gdn::check::document_bytes(r, "o", spec, {3, 1}, 0), std::invalid_argument);  // 4 of 6 tokens
    CHECK_THROWS_AS(gdn::check::document_bytes(r, "o", spec, lens, 3), std::invalid_argument);
    CHECK_THROWS_AS(gdn::check::document_bytes(r, "beta", spec, lens, 0), std::invalid_argument);
  }

}  // TEST_SUITE("reference")
