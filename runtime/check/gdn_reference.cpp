/**
 * @file gdn_reference.cpp
 * @brief Implementation of the fp64 GDN reference (see gdn_reference.hpp).
 */
#include "runtime/check/gdn_reference.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <limits>
#include <mutex>
#include <numbers>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>

namespace gdn::ref {

namespace {

/// Same epsilon as FLA's l2norm_fwd: added inside the sqrt.
constexpr double kL2Eps = 1e-6;
/// Tokens between two saved states in backward(): bounds memory while recomputing each state once.
constexpr int64_t kCheckpointEvery = 64;

[[noreturn]] void fail(const std::string& msg) { throw std::invalid_argument(msg); }

void check_size(const char* name, const std::vector<double>& x, int64_t want, const char* formula) {
  if (static_cast<int64_t>(x.size()) != want)
    fail(std::string(name) + ": size " + std::to_string(x.size()) + " != " + formula + " (" + std::to_string(want) +
         ")");
}

void check_inputs(const Problem& p, const Inputs& in) {
  validate(p);
  const int64_t T = p.T, N = p.num_docs();
  check_size("q", in.q, T * p.H * p.K, "T*H*K");
  check_size("k", in.k, T * p.H * p.K, "T*H*K");
  check_size("v", in.v, T * p.HV * p.V, "T*HV*V");
  check_size("g", in.g, T * p.HV, "T*HV");
  check_size("beta", in.beta, T * p.HV, "T*HV");
  check_size("h0", in.h0, p.has_h0 ? N * p.HV * p.K * p.V : 0, p.has_h0 ? "N*HV*K*V" : "0");
}

/**
 * Runs f(i) for i in [0, n) on up to `threads` workers. Work is handed out dynamically, which is
 * fine for determinism because each index writes only its own outputs.
 */
template <class F>
void parallel_for(int64_t n, unsigned threads, F&& f) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  const auto workers = static_cast<unsigned>(std::min<int64_t>(threads, n));
  if (workers <= 1) {
    for (int64_t i = 0; i < n; ++i) f(i);
    return;
  }
  std::atomic<int64_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto work = [&] {
    try {
      for (int64_t i; (i = next.fetch_add(1)) < n;) f(i);
    } catch (...) {
      std::lock_guard lock(error_mutex);
      if (!error) error = std::current_exception();
      next.store(n);  // stop handing out work
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(workers);
  for (unsigned w = 0; w < workers; ++w) pool.emplace_back(work);
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

/// The inputs as the recurrence sees them: q and k after the optional L2 norm, resolved scale.
struct Prepared {
  const Problem& p;
  const Inputs& in;
  std::vector<double> q_norm, k_norm, rstd_q, rstd_k;  // filled only when p.l2norm
  const double* q;
  const double* k;
  double scale;
  int G;

  Prepared(const Problem& prob, const Inputs& inputs) : p(prob), in(inputs) {
    check_inputs(p, in);
    scale = p.scale != 0 ? p.scale : 1.0 / std::sqrt(static_cast<double>(p.K));
    G = p.HV / p.H;
    if (p.l2norm) {
      normalize(in.q, q_norm, rstd_q);
      normalize(in.k, k_norm, rstd_k);
      q = q_norm.data();
      k = k_norm.data();
    } else {
      q = in.q.data();
      k = in.k.data();
    }
  }

  void normalize(const std::vector<double>& x, std::vector<double>& y, std::vector<double>& rstd) {
    const int64_t rows = p.T * p.H;
    y.resize(x.size());
    rstd.resize(rows);
    for (int64_t r = 0; r < rows; ++r) {
      const double* xr = x.data() + r * p.K;
      double ss = 0;
      for (int i = 0; i < p.K; ++i) ss += xr[i] * xr[i];
      rstd[r] = 1.0 / std::sqrt(ss + kL2Eps);
      for (int i = 0; i < p.K; ++i) y[r * p.K + i] = xr[i] * rstd[r];
    }
  }

  // Row pointers; t is a global token index, j a value head.
  const double* q_row(int64_t t, int j) const { return q + (t * p.H + j / G) * p.K; }
  const double* k_row(int64_t t, int j) const { return k + (t * p.H + j / G) * p.K; }
  const double* v_row(int64_t t, int j) const { return in.v.data() + (t * p.HV + j) * p.V; }
  double g(int64_t t, int j) const { return in.g[t * p.HV + j]; }
  double beta(int64_t t, int j) const { return in.beta[t * p.HV + j]; }
  int64_t state_offset(int64_t n, int j) const { return (n * p.HV + j) * p.K * p.V; }
  int64_t kv() const { return int64_t{p.K} * p.V; }

  /// The state before the first token of document n for value head j.
  void initial_state(int64_t n, int j, double* S) const {
    if (p.has_h0)
      std::copy_n(in.h0.data() + state_offset(n, j), kv(), S);
    else
      std::fill_n(S, kv(), 0.0);
  }

  /**
   * One token of the recurrence, in place: S <- P + beta k r^T with P = exp(g) S and
   * r = v - P^T k. The backward recomputes P and r with the same operation order, so recomputed
   * states are bitwise equal to the forward's.
   */
  void step(double* S, int64_t t, int j, double* r) const {
    const int K = p.K, V = p.V;
    const double a = std::exp(g(t, j)), b = beta(t, j);
    const double* kt = k_row(t, j);
    const double* vt = v_row(t, j);
    for (int64_t e = 0; e < kv(); ++e) S[e] *= a;
    std::copy_n(vt, V, r);
    for (int i = 0; i < K; ++i)
      for (int c = 0; c < V; ++c) r[c] -= S[i * V + c] * kt[i];
    for (int i = 0; i < K; ++i)
      for (int c = 0; c < V; ++c) S[i * V + c] += b * kt[i] * r[c];
  }

  /// o = scale * S^T q for token t.
  void output(const double* S, int64_t t, int j, double* o) const {
    const double* qt = q_row(t, j);
    std::fill_n(o, p.V, 0.0);
    for (int i = 0; i < p.K; ++i)
      for (int c = 0; c < p.V; ++c) o[c] += S[i * p.V + c] * qt[i];
    for (int c = 0; c < p.V; ++c) o[c] *= scale;
  }
};

Outputs allocate_outputs(const Problem& p) {
  Outputs out;
  out.o.assign(p.T * p.HV * p.V, 0.0);
  out.ht.assign(p.num_docs() * p.HV * p.K * p.V, 0.0);
  return out;
}

/// splitmix64's finalizer: decorrelates the seeds of neighbouring (seed, stream, block) triples.
uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// Standard normals by Box-Muller (both outputs) on mt19937_64, std::normal_distribution not being
/// portable. The values are cut into blocks of 65536, each from its own generator seeded by
/// (seed, stream, block), so blocks fill in parallel and the result depends on (seed, stream, n)
/// only, never on the thread count. At shape M the inputs are about 540 M values: one stream took
/// 26 s on this machine, which a GPU test paid per layer it built.
void fill_normal(double* x, std::size_t n, uint64_t seed, uint64_t stream) {
  constexpr std::size_t kBlock = std::size_t{1} << 16;
  const std::size_t blocks = (n + kBlock - 1) / kBlock;
  const auto fill_blocks = [&](std::size_t first, std::size_t step) {
    for (std::size_t b = first; b < blocks; b += step) {
      std::mt19937_64 gen(mix64(mix64(seed) ^ mix64((stream << 40) + b)));
      const auto uniform_open0 = [&] { return static_cast<double>((gen() >> 11) + 1) * 0x1.0p-53; };  // (0,1]
      const std::size_t end = std::min(n, (b + 1) * kBlock);
      for (std::size_t i = b * kBlock; i < end; i += 2) {
        const double r = std::sqrt(-2.0 * std::log(uniform_open0())), a = 2.0 * std::numbers::pi * uniform_open0();
        x[i] = r * std::cos(a);
        if (i + 1 < end) x[i + 1] = r * std::sin(a);
      }
    }
  };
  const std::size_t threads = std::min<std::size_t>({blocks, 16, std::max(1u, std::thread::hardware_concurrency())});
  if (threads <= 1) {
    fill_blocks(0, 1);
    return;
  }
  std::vector<std::thread> pool;
  for (std::size_t t = 0; t < threads; ++t) pool.emplace_back(fill_blocks, t, threads);
  for (auto& th : pool) th.join();
}

double logsigmoid(double x) { return x >= 0 ? -std::log1p(std::exp(-x)) : x - std::log1p(std::exp(x)); }

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

}  // namespace

int64_t Problem::num_docs() const { return cu_seqlens.empty() ? 0 : static_cast<int64_t>(cu_seqlens.size()) - 1; }

void validate(const Problem& p) {
  const auto s = [](auto x) { return std::to_string(x); };
  if (p.T < 0) fail("T: " + s(p.T) + " < 0");
  if (p.H <= 0) fail("H: " + s(p.H) + " <= 0");
  if (p.HV <= 0) fail("HV: " + s(p.HV) + " <= 0");
  if (p.HV % p.H != 0) fail("HV: " + s(p.HV) + " is not a multiple of H (" + s(p.H) + ")");
  if (p.K <= 0) fail("K: " + s(p.K) + " <= 0");
  if (p.V <= 0) fail("V: " + s(p.V) + " <= 0");
  if (!std::isfinite(p.scale)) fail("scale: not finite");
  const auto& cu = p.cu_seqlens;
  if (cu.size() < 2) fail("cu_seqlens: " + s(cu.size()) + " entries, need at least 2");
  if (cu[0] != 0) fail("cu_seqlens[0]: " + s(cu[0]) + " != 0");
  for (size_t n = 1; n < cu.size(); ++n)
    if (cu[n] < cu[n - 1])
      fail("cu_seqlens[" + s(n) + "]: " + s(cu[n]) + " < cu_seqlens[" + s(n - 1) + "] (" + s(cu[n - 1]) + ")");
  if (cu.back() != p.T) fail("cu_seqlens[" + s(cu.size() - 1) + "]: " + s(cu.back()) + " != T (" + s(p.T) + ")");
}

Outputs forward(const Problem& p, const Inputs& in, unsigned threads) {
  const Prepared pr(p, in);
  Outputs out = allocate_outputs(p);
  parallel_for(p.num_docs() * p.HV, threads, [&](int64_t task) {
    const int64_t n = task / p.HV;
    const int j = static_cast<int>(task % p.HV);
    double* S = out.ht.data() + pr.state_offset(n, j);  // the running state ends as ht
    std::vector<double> r(p.V);
    pr.initial_state(n, j, S);
    for (int64_t t = p.cu_seqlens[n]; t < p.cu_seqlens[n + 1]; ++t) {
      pr.step(S, t, j, r.data());
      pr.output(S, t, j, out.o.data() + (t * p.HV + j) * p.V);
    }
  });
  return out;
}

Outputs forward_chunked(const Problem& p, const Inputs& in, int chunk, unsigned threads) {
  if (chunk <= 0) fail("chunk: " + std::to_string(chunk) + " <= 0");
  const Prepared pr(p, in);
  Outputs out = allocate_outputs(p);
  const int K = p.K, V = p.V;
  parallel_for(p.num_docs() * p.HV, threads, [&](int64_t task) {
    const int64_t n = task / p.HV;
    const int j = static_cast<int>(task % p.HV);
    double* S = out.ht.data() + pr.state_offset(n, j);
    pr.initial_state(n, j, S);
    std::vector<double> gc(chunk), D(chunk * chunk), L(chunk * chunk), U(chunk * V), W(chunk * K), vn(chunk * V),
        Snext(int64_t{K} * V);
    for (int64_t s = p.cu_seqlens[n]; s < p.cu_seqlens[n + 1]; s += chunk) {
      const int m = static_cast<int>(std::min<int64_t>(chunk, p.cu_seqlens[n + 1] - s));
      const auto dot = [&](const double* x, const double* y) {
        double acc = 0;
        for (int i = 0; i < K; ++i) acc += x[i] * y[i];
        return acc;
      };
      // F0: in-chunk cumulative gate; D is the decay between positions (lower triangle only).
      for (int a = 0; a < m; ++a) gc[a] = (a ? gc[a - 1] : 0.0) + pr.g(s + a, j);
      for (int a = 0; a < m; ++a)
        for (int b = 0; b <= a; ++b) D[a * chunk + b] = std::exp(gc[a] - gc[b]);
      // F1: L = tril1(diag(beta) K K^T * D).
      for (int a = 0; a < m; ++a)
        for (int b = 0; b < a; ++b)
          L[a * chunk + b] = pr.beta(s + a, j) * dot(pr.k_row(s + a, j), pr.k_row(s + b, j)) * D[a * chunk + b];
      // F2+F3: U = (I+L)^{-1} diag(beta) V and W = (I+L)^{-1} diag(beta exp(gc)) K, by forward
      // substitution since I+L is unit lower triangular.
      for (int a = 0; a < m; ++a) {
        const double ba = pr.beta(s + a, j);
        for (int c = 0; c < V; ++c) U[a * V + c] = ba * pr.v_row(s + a, j)[c];
        for (int i = 0; i < K; ++i) W[a * K + i] = ba * std::exp(gc[a]) * pr.k_row(s + a, j)[i];
        for (int b = 0; b < a; ++b) {
          const double l = L[a * chunk + b];
          for (int c = 0; c < V; ++c) U[a * V + c] -= l * U[b * V + c];
          for (int i = 0; i < K; ++i) W[a * K + i] -= l * W[b * K + i];
        }
      }
      // F4 (part): v_new = U - W S.
      for (int a = 0; a < m; ++a)
        for (int c = 0; c < V; ++c) {
          double acc = U[a * V + c];
          for (int i = 0; i < K; ++i) acc -= W[a * K + i] * S[i * V + c];
          vn[a * V + c] = acc;
        }
      // F5: o = scale (exp(gc) Q S + tril0(Q K^T * D) v_new).
      for (int a = 0; a < m; ++a) {
        const double* qa = pr.q_row(s + a, j);
        double* o = out.o.data() + ((s + a) * p.HV + j) * V;
        for (int c = 0; c < V; ++c) {
          double acc = 0;
          for (int i = 0; i < K; ++i) acc += qa[i] * S[i * V + c];
          o[c] = std::exp(gc[a]) * acc;
        }
        for (int b = 0; b <= a; ++b) {
          const double w = dot(qa, pr.k_row(s + b, j)) * D[a * chunk + b];
          for (int c = 0; c < V; ++c) o[c] += w * vn[b * V + c];
        }
        for (int c = 0; c < V; ++c) o[c] *= pr.scale;
      }
      // F4: S <- exp(gc_last) S + K^T (exp(gc_last - gc) v_new).
      const double glast = gc[m - 1];
      for (int i = 0; i < K; ++i)
        for (int c = 0; c < V; ++c) Snext[i * V + c] = std::exp(glast) * S[i * V + c];
      for (int a = 0; a < m; ++a) {
        const double* ka = pr.k_row(s + a, j);
        const double w = std::exp(glast - gc[a]);
        for (int i = 0; i < K; ++i)
          for (int c = 0; c < V; ++c) Snext[i * V + c] += ka[i] * w * vn[a * V + c];
      }
      std::copy(Snext.begin(), Snext.end(), S);
    }
  });
  return out;
}

Grads backward(const Problem& p, const Inputs& in, const std::vector<double>& dO, const std::vector<double>& dht,
               unsigned threads) {
  const Prepared pr(p, in);
  const int K = p.K, V = p.V, H = p.H, HV = p.HV, G = pr.G;
  const int64_t T = p.T, N = p.num_docs(), KV = pr.kv();
  check_size("dO", dO, T * HV * V, "T*HV*V");
  if (!dht.empty()) check_size("dht", dht, N * HV * KV, "N*HV*K*V");

  Grads gr;
  gr.dv.assign(T * HV * V, 0.0);
  gr.dg.assign(T * HV, 0.0);
  gr.dbeta.assign(T * HV, 0.0);
  if (p.has_h0) gr.dh0.assign(N * HV * KV, 0.0);
  // Per value head dq/dk, so that tasks write disjoint memory; summed over the group below.
  std::vector<double> dq_v(T * HV * K, 0.0), dk_v(T * HV * K, 0.0);

  parallel_for(N * HV, threads, [&](int64_t task) {
    const int64_t n = task / HV;
    const int j = static_cast<int>(task % HV);
    const int64_t t0 = p.cu_seqlens[n], Tn = p.cu_seqlens[n + 1] - t0;
    const int64_t blocks = (Tn + kCheckpointEvery - 1) / kCheckpointEvery;
    std::vector<double> r(V), du(V), dr(V);

    // Forward sweep keeping the state before every kCheckpointEvery-th token.
    std::vector<double> ckpt(std::max<int64_t>(blocks, 1) * KV);
    std::vector<double> S(KV);
    pr.initial_state(n, j, S.data());
    for (int64_t t = 0; t < Tn; ++t) {
      if (t % kCheckpointEvery == 0) std::copy(S.begin(), S.end(), ckpt.begin() + (t / kCheckpointEvery) * KV);
      pr.step(S.data(), t0 + t, j, r.data());
    }

    // Z is dL/dS_t, swept from the final state backwards (docs/algorithm.md 5.2).
    std::vector<double> Z(KV, 0.0);
    if (!dht.empty()) std::copy_n(dht.data() + pr.state_offset(n, j), KV, Z.data());
    std::vector<double> states((kCheckpointEvery + 1) * KV);  // S_{ts-1} .. S_{te-1} of a block
    for (int64_t blk = blocks - 1; blk >= 0; --blk) {
      const int64_t ts = blk * kCheckpointEvery, te = std::min(ts + kCheckpointEvery, Tn);
      std::copy_n(ckpt.begin() + blk * KV, KV, states.begin());
      for (int64_t t = ts; t < te; ++t) {
        double* next = states.data() + (t - ts + 1) * KV;
        std::copy_n(next - KV, KV, next);
        pr.step(next, t0 + t, j, r.data());
      }
      for (int64_t t = te - 1; t >= ts; --t) {
        const int64_t tg = t0 + t;
        const double* Sprev = states.data() + (t - ts) * KV;
        const double* Scur = Sprev + KV;
        const double a = std::exp(pr.g(tg, j)), b = pr.beta(tg, j);
        const double* qt = pr.q_row(tg, j);
        const double* kt = pr.k_row(tg, j);
        const double* vt = pr.v_row(tg, j);
        const double* dot = dO.data() + (tg * HV + j) * V;
        double* dq = dq_v.data() + (tg * HV + j) * K;
        double* dk = dk_v.data() + (tg * HV + j) * K;

        // Recompute r with P = a * S_{t-1} (not stored, to keep one state per token).
        std::copy_n(vt, V, r.data());
        for (int i = 0; i < K; ++i)
          for (int c = 0; c < V; ++c) r[c] -= (a * Sprev[i * V + c]) * kt[i];
        // o_t = scale S_t^T q_t.
        for (int i = 0; i < K; ++i) {
          double acc = 0;
          for (int c = 0; c < V; ++c) {
            Z[i * V + c] += pr.scale * qt[i] * dot[c];
            acc += Scur[i * V + c] * dot[c];
          }
          dq[i] = pr.scale * acc;
        }
        // S_t = P + k u^T with u = beta r.
        std::fill(du.begin(), du.end(), 0.0);
        for (int i = 0; i < K; ++i) {
          double acc = 0;
          for (int c = 0; c < V; ++c) {
            du[c] += Z[i * V + c] * kt[i];
            acc += Z[i * V + c] * b * r[c];
          }
          dk[i] = acc;
        }
        double dbeta = 0;
        for (int c = 0; c < V; ++c) {
          dbeta += du[c] * r[c];
          dr[c] = b * du[c];
        }
        gr.dbeta[tg * HV + j] = dbeta;
        std::copy(dr.begin(), dr.end(), gr.dv.begin() + (tg * HV + j) * V);
        // r = v - P^T k: Z becomes dL/dP, and P = a S_{t-1} gives dg and the next Z.
        double dg = 0;
        for (int i = 0; i < K; ++i) {
          double acc = 0;
          for (int c = 0; c < V; ++c) {
            const double P = a * Sprev[i * V + c];
            Z[i * V + c] -= kt[i] * dr[c];
            acc += P * dr[c];
            dg += P * Z[i * V + c];
            Z[i * V + c] *= a;
          }
          dk[i] -= acc;
        }
        gr.dg[tg * HV + j] = dg;
      }
    }
    if (p.has_h0) std::copy(Z.begin(), Z.end(), gr.dh0.begin() + pr.state_offset(n, j));
  });

  // GVA: sum the group's value heads in ascending order, then undo the optional L2 norm.
  gr.dq.assign(T * H * K, 0.0);
  gr.dk.assign(T * H * K, 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h)
      for (int jj = h * G; jj < (h + 1) * G; ++jj)
        for (int i = 0; i < K; ++i) {
          gr.dq[(t * H + h) * K + i] += dq_v[(t * HV + jj) * K + i];
          gr.dk[(t * H + h) * K + i] += dk_v[(t * HV + jj) * K + i];
        }
  if (p.l2norm) {
    // y = x rstd  =>  dx = rstd (dy - (dy . y) y).
    const auto l2_backward = [&](std::vector<double>& d, const double* y, const std::vector<double>& rstd) {
      for (int64_t row = 0; row < T * H; ++row) {
        double* dr = d.data() + row * K;
        const double* yr = y + row * K;
        double dy_dot_y = 0;
        for (int i = 0; i < K; ++i) dy_dot_y += dr[i] * yr[i];
        for (int i = 0; i < K; ++i) dr[i] = rstd[row] * (dr[i] - dy_dot_y * yr[i]);
      }
    };
    l2_backward(gr.dq, pr.q, pr.rstd_q);
    l2_backward(gr.dk, pr.k, pr.rstd_k);
  }
  return gr;
}

double loss(const Problem& p, const Inputs& in, const std::vector<double>& dO, const std::vector<double>& dht) {
  const Outputs out = forward(p, in);
  check_size("dO", dO, static_cast<int64_t>(out.o.size()), "T*HV*V");
  if (!dht.empty()) check_size("dht", dht, static_cast<int64_t>(out.ht.size()), "N*HV*K*V");
  // Neumaier summation: finite differences divide this value's rounding error by the step.
  double sum = 0, comp = 0;
  const auto add = [&](double x) {
    const double t = sum + x;
    comp += std::abs(sum) >= std::abs(x) ? (sum - t) + x : (x - t) + sum;
    sum = t;
  };
  for (size_t e = 0; e < out.o.size(); ++e) add(out.o[e] * dO[e]);
  for (size_t e = 0; e < dht.size(); ++e) add(out.ht[e] * dht[e]);
  return sum + comp;
}

double rel_rms(const std::vector<double>& ref, const std::vector<double>& got) {
  if (ref.size() != got.size())
    fail("got: size " + std::to_string(got.size()) + " != ref size " + std::to_string(ref.size()));
  if (ref.empty()) return 0.0;
  double se = 0, sr = 0;
  for (size_t e = 0; e < ref.size(); ++e) {
    if (!std::isfinite(got[e])) return std::numeric_limits<double>::infinity();
    se += (ref[e] - got[e]) * (ref[e] - got[e]);
    sr += ref[e] * ref[e];
  }
  const double n = static_cast<double>(ref.size());
  return std::sqrt(se / n) / (std::sqrt(sr / n) + 1e-8);
}

double max_abs(const std::vector<double>& ref, const std::vector<double>& got) {
  if (ref.size() != got.size())
    fail("got: size " + std::to_string(got.size()) + " != ref size " + std::to_string(ref.size()));
  double m = 0;
  for (size_t e = 0; e < ref.size(); ++e) {
    if (!std::isfinite(got[e])) return std::numeric_limits<double>::infinity();
    m = std::max(m, std::abs(ref[e] - got[e]));
  }
  return m;
}

std::vector<double> random_normal(std::size_t n, uint64_t seed) {
  std::vector<double> x(n);
  fill_normal(x.data(), n, seed, 0);
  return x;
}

Inputs random_inputs(const Problem& p, uint64_t seed, double gate_shift) {
  validate(p);
  uint64_t stream = 0;  // one stream per tensor, in this order
  const auto fill = [&](std::vector<double>& x, int64_t n) {
    x.resize(static_cast<std::size_t>(n));
    fill_normal(x.data(), x.size(), seed, ++stream);
  };
  Inputs in;
  const int64_t T = p.T;
  fill(in.q, T * p.H * p.K);
  fill(in.k, T * p.H * p.K);
  if (!p.l2norm) {
    // The recurrence assumes unit q and k (docs/algorithm.md 1.1); without the in-kernel norm the
    // caller must supply them normalized. A Gaussian row is nonzero with probability 1.
    for (auto* x : {&in.q, &in.k})
      for (int64_t row = 0; row < T * p.H; ++row) {
        double* xr = x->data() + row * p.K;
        double ss = 0;
        for (int i = 0; i < p.K; ++i) ss += xr[i] * xr[i];
        const double inv = 1.0 / std::sqrt(ss);
        for (int i = 0; i < p.K; ++i) xr[i] *= inv;
      }
  }
  fill(in.v, T * p.HV * p.V);
  fill(in.g, T * p.HV);
  for (auto& e : in.g) e = logsigmoid(e) - gate_shift;
  fill(in.beta, T * p.HV);
  for (auto& e : in.beta) e = sigmoid(e);
  if (p.has_h0) fill(in.h0, p.num_docs() * p.HV * p.K * p.V);
  return in;
}

}  // namespace gdn::ref
