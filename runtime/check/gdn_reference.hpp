/**
 * @file gdn_reference.hpp
 * @brief fp64 CPU reference for Gated DeltaNet: naive and chunked forward, hand-written backward.
 *
 * This is the ground truth that the GPU kernels are checked against (docs/algorithm.md sections 1 and
 * 5). The forward runs the per-token recurrence of section 1.1 literally; the backward runs the
 * reverse recurrence of section 5.2. Both work per (document, value head) and are parallelized over
 * those pairs; every pair writes disjoint outputs and the GVA reduction runs in a fixed head order,
 * so results are bitwise identical for any thread count.
 *
 * Layouts are token-major and contiguous, as in FLA: q/k `[T, H, K]`, v/o `[T, HV, V]`,
 * g/beta `[T, HV]`, states `[N, HV, K, V]`. Value head j reads q/k head `j / (HV / H)`.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace gdn::ref {

/// Shapes and options of one (varlen-packed) GDN call.
struct Problem {
  int64_t T = 0;                    ///< total packed tokens
  int H = 0;                        ///< q/k heads
  int HV = 0;                       ///< value heads (a multiple of H)
  int K = 0;                        ///< q/k head dim
  int V = 0;                        ///< v/o head dim
  std::vector<int64_t> cu_seqlens;  ///< N+1 document offsets, 0 .. T
  double scale = 0;                 ///< output scale; 0 means 1/sqrt(K)
  bool l2norm = false;              ///< in-kernel L2 norm of raw q and k before the recurrence
  bool has_h0 = false;              ///< an initial state is given
  /// N, the number of documents (0 while cu_seqlens is empty).
  int64_t num_docs() const;
};

/// Inputs, fp64, token-major contiguous.
struct Inputs {
  std::vector<double> q, k;     ///< [T, H, K], raw (before the optional L2 norm)
  std::vector<double> v;        ///< [T, HV, V]
  std::vector<double> g, beta;  ///< [T, HV]; g is a log-space decay, applied as exp(g)
  std::vector<double> h0;       ///< [N, HV, K, V]; empty unless has_h0
};

/// Forward results.
struct Outputs {
  std::vector<double> o;   ///< [T, HV, V]
  std::vector<double> ht;  ///< [N, HV, K, V]
};

/// Gradients of a scalar loss with respect to every input.
struct Grads {
  std::vector<double> dq, dk;     ///< [T, H, K], with respect to the RAW q and k
  std::vector<double> dv;         ///< [T, HV, V]
  std::vector<double> dg, dbeta;  ///< [T, HV]
  std::vector<double> dh0;        ///< [N, HV, K, V]; empty unless has_h0
};

/**
 * @brief Naive per-token forward (docs/algorithm.md 1.1) in fp64.
 * @param threads worker threads; 0 uses std::thread::hardware_concurrency(). Results do not depend
 *        on it.
 * @throws std::invalid_argument if the problem or the input sizes are invalid.
 */
Outputs forward(const Problem&, const Inputs&, unsigned threads = 0);

/**
 * @brief Chunked forward (docs/algorithm.md section 2, chunks cut per document) in fp64.
 *
 * An independent formulation of the same function as forward(); the two agree to rounding. It
 * exists to validate the chunked algorithm itself and to give stage-level tests a reference.
 * @param chunk chunk size C (any positive value; FLA uses 64).
 */
Outputs forward_chunked(const Problem&, const Inputs&, int chunk = 64, unsigned threads = 0);

/**
 * @brief Gradients of loss() by the reverse recurrence of docs/algorithm.md 5.2.
 *
 * States are checkpointed every 64 tokens and recomputed block by block during the reverse sweep,
 * so memory is O(T/64 * K * V) per worker rather than O(T * K * V).
 * @param dO  [T, HV, V] cotangent of o.
 * @param dht [N, HV, K, V] cotangent of the final states; empty means zero.
 */
Grads backward(const Problem&, const Inputs&, const std::vector<double>& dO, const std::vector<double>& dht,
               unsigned threads = 0);

/// The scalar whose gradient backward() returns: sum(o .* dO) + sum(ht .* dht); dht may be empty.
double loss(const Problem&, const Inputs&, const std::vector<double>& dO, const std::vector<double>& dht);

/**
 * @brief FLA's metric rms(ref - got) / (rms(ref) + 1e-8).
 * @return +inf if any element of got is NaN or infinite; 0 for two empty vectors.
 * @throws std::invalid_argument if the sizes differ.
 */
double rel_rms(const std::vector<double>& ref, const std::vector<double>& got);

/**
 * @brief max |ref - got|.
 * @return +inf if any element of got is NaN or infinite (a plain max would skip NaN).
 * @throws std::invalid_argument if the sizes differ.
 */
double max_abs(const std::vector<double>& ref, const std::vector<double>& got);

/**
 * @brief The standard random inputs, deterministic in seed.
 *
 * The generator is mt19937_64 with Box-Muller, not std::normal_distribution, whose output differs
 * between standard libraries.
 *
 * q, k ~ N(0,1), L2-normalized per token and head unless problem.l2norm (then the kernel normalizes
 * them); v ~ N(0,1); g = logsigmoid(N(0,1)) - gate_shift; beta = sigmoid(N(0,1));
 * h0 ~ N(0,1) if has_h0.
 * @throws std::invalid_argument if the problem is invalid.
 */
Inputs random_inputs(const Problem&, uint64_t seed, double gate_shift = 0.0);

/// n standard normal samples, deterministic in seed (for cotangents such as dO and dht).
std::vector<double> random_normal(std::size_t n, uint64_t seed);

/**
 * @brief Checks shapes and cu_seqlens.
 * @throws std::invalid_argument whose message starts with the offending field, e.g.
 *         "cu_seqlens[2]: 5 < cu_seqlens[1] (9)".
 */
void validate(const Problem&);

}  // namespace gdn::ref
