/**
 * @file cp_reference.cpp
 * @brief Segment summaries (M, S_ext) in fp64, chunk by chunk as docs/algorithm.md 4.2 writes them.
 */
#include "runtime/check/cp_reference.hpp"

#include <cmath>
#include <stdexcept>
#include <string>

namespace gdn::ref {

namespace {

/// Row-major dense helpers, small and obvious on purpose (a reference, not a kernel).
std::vector<double> matmul(const std::vector<double>& a, const std::vector<double>& b, int n, int k, int m) {
  std::vector<double> c(static_cast<size_t>(n) * m, 0.0);
  for (int i = 0; i < n; ++i)
    for (int p = 0; p < k; ++p) {
      const double x = a[static_cast<size_t>(i) * k + p];
      for (int j = 0; j < m; ++j) c[static_cast<size_t>(i) * m + j] += x * b[static_cast<size_t>(p) * m + j];
    }
  return c;
}

}  // namespace

SegmentSummary summarize_segment(const Problem& p, const Inputs& in, int doc, int j, int64_t begin, int64_t end,
                                 int chunk) {
  validate(p);
  if (p.l2norm) throw std::invalid_argument("summarize_segment: pass normalized q/k with l2norm = false");
  const int64_t d0 = p.cu_seqlens.at(static_cast<size_t>(doc)), d1 = p.cu_seqlens.at(static_cast<size_t>(doc) + 1);
  if (begin < d0 || end > d1 || begin >= end || (begin - d0) % chunk != 0 || ((end - d0) % chunk != 0 && end != d1))
    throw std::invalid_argument("summarize_segment: [" + std::to_string(begin) + ", " + std::to_string(end) +
                                ") is not a chunk-aligned part of document " + std::to_string(doc));
  const int K = p.K, V = p.V, H = p.H, HV = p.HV, h = j / (HV / H);
  SegmentSummary s;
  s.M.assign(static_cast<size_t>(K) * K, 0.0);
  for (int i = 0; i < K; ++i) s.M[static_cast<size_t>(i) * K + i] = 1.0;
  s.S_ext.assign(static_cast<size_t>(K) * V, 0.0);
  for (int64_t cs = begin; cs < end; cs += chunk) {
    const int m = static_cast<int>(std::min<int64_t>(chunk, end - cs));
    auto kk = [&](int i, int c) { return in.k[(static_cast<size_t>(cs + i) * H + h) * K + c]; };
    auto vv = [&](int i, int c) { return in.v[(static_cast<size_t>(cs + i) * HV + j) * V + c]; };
    auto bb = [&](int i) { return in.beta[static_cast<size_t>(cs + i) * HV + j]; };
    std::vector<double> gam(static_cast<size_t>(m));
    double acc = 0;
    for (int i = 0; i < m; ++i) gam[static_cast<size_t>(i)] = acc += in.g[static_cast<size_t>(cs + i) * HV + j];
    const double gL = gam[static_cast<size_t>(m) - 1];
    // Tm = (I + L)^-1 by forward substitution, L_ij = b_i (k_i.k_j) exp(gam_i - gam_j), i > j.
    std::vector<double> Tm(static_cast<size_t>(m) * m, 0.0);
    for (int i = 0; i < m; ++i) {
      Tm[static_cast<size_t>(i) * m + i] = 1.0;
      for (int c = 0; c < i; ++c) {
        double x = 0;
        for (int r = c; r < i; ++r) {
          double dot = 0;
          for (int e = 0; e < K; ++e) dot += kk(i, e) * kk(r, e);
          x -= bb(i) * dot * std::exp(gam[static_cast<size_t>(i)] - gam[static_cast<size_t>(r)]) *
               Tm[static_cast<size_t>(r) * m + c];
        }
        Tm[static_cast<size_t>(i) * m + c] = x;
      }
    }
    std::vector<double> bv(static_cast<size_t>(m) * V), bgk(static_cast<size_t>(m) * K), dk(static_cast<size_t>(m) * K);
    for (int i = 0; i < m; ++i) {
      for (int c = 0; c < V; ++c) bv[static_cast<size_t>(i) * V + c] = bb(i) * vv(i, c);
      for (int c = 0; c < K; ++c) {
        bgk[static_cast<size_t>(i) * K + c] = bb(i) * std::exp(gam[static_cast<size_t>(i)]) * kk(i, c);
        dk[static_cast<size_t>(i) * K + c] = std::exp(gL - gam[static_cast<size_t>(i)]) * kk(i, c);
      }
    }
    const auto U = matmul(Tm, bv, m, m, V), W = matmul(Tm, bgk, m, m, K);
    // M_c = exp(gL) I - dk^T W; X_c = dk^T U.
    std::vector<double> dkT(static_cast<size_t>(K) * m);
    for (int i = 0; i < m; ++i)
      for (int c = 0; c < K; ++c) dkT[static_cast<size_t>(c) * m + i] = dk[static_cast<size_t>(i) * K + c];
    auto Mc = matmul(dkT, W, K, m, K);
    for (auto& x : Mc) x = -x;
    for (int i = 0; i < K; ++i) Mc[static_cast<size_t>(i) * K + i] += std::exp(gL);
    const auto Xc = matmul(dkT, U, K, m, V);
    s.M = matmul(Mc, s.M, K, K, K);
    s.S_ext = matmul(Mc, s.S_ext, K, K, V);
    for (size_t i = 0; i < s.S_ext.size(); ++i) s.S_ext[i] += Xc[i];
  }
  return s;
}

std::vector<double> apply_summary(const SegmentSummary& s, const std::vector<double>& S, int K, int V) {
  auto out = matmul(s.M, S, K, K, V);
  for (size_t i = 0; i < out.size(); ++i) out[i] += s.S_ext[i];
  return out;
}

}  // namespace gdn::ref
