/**
 * @file layer_check.hpp
 * @brief Runs a layer on the GPU on fresh random inputs and measures it against the fp64
 *        reference: the engine of `gdnc check` and of the GPU tests.
 */
#pragma once

#include "runtime/layer.hpp"

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace gdn::check {

struct Case {
  std::vector<long long> doc_lens;  ///< document lengths; T is their sum
  uint64_t seed = 1;
  /// One seed per document: each document's inputs (q, k, v, g, beta, h0, dO, dht) come from its
  /// own seed whatever else is packed with it, so a document can be run alone, packed with others
  /// or in another order on the same values (batch invariance). Empty: all from `seed`.
  std::vector<uint64_t> doc_seeds;
  double gate_shift = 0;             ///< g = logsigmoid(x) - gate_shift
  std::optional<double> gate_value;  ///< every g equal to this (e.g. 0 or -20)
  std::optional<double> beta_value;  ///< every beta equal to this (e.g. 0 or 1)
  /// Value heads whose every g is 0 (after gate_value): no decay there, so under the verified carry
  /// their chains go to the merge beside heads that verify.
  std::vector<int> zero_gate_heads;
  bool backward = true;
  bool with_reference = true;  ///< false: run the GPU only (determinism, timing)
  IndexType cu_type = IndexType::int32;
  int repeats = 1;             ///< run the whole call sequence this many times on the same inputs
  bool legacy_stream = false;  ///< run on the legacy default stream (what torch uses by default)
  /// fwd_bwd: forward then backward. ckpt: a forward, then the recompute (output skipped) and the
  /// backward on one stamped Workspace, as a checkpointed step runs them. The stale variants make
  /// the hand-off stale on purpose: ckpt_intervening runs another forward (same inputs) on the
  /// workspace between the recompute and the backward; ckpt_other_stream runs the backward on a
  /// second stream (after the first is drained). ckpt_with_output: the recompute whose output is
  /// needed (torch.utils.checkpoint's), writing o and ht again over the forward's.
  enum class Step { fwd_bwd, ckpt, ckpt_intervening, ckpt_other_stream, ckpt_with_output } step = Step::fwd_bwd;
  /// A layer with cp.ranks R > 1: run its R ranks' phases in turn on one GPU, each on its own
  /// tokens and regions, every rank's record placed in one gathered buffer between the phases (what
  /// an all-gather does), instead of the single-GPU proxy's one call. The results land in the
  /// same global tensors, so they compare bit for bit with the proxy's.
  bool simulated_ranks = false;
  /// ProblemShape::max_doc_tokens of every call (0: none).
  long long max_doc_tokens = 0;
};

struct Report {
  std::map<std::string, double> rel_rms;     ///< per tensor: o, ht, dq, dk, dv, dg, dbeta, dh0
  std::map<std::string, std::string> bytes;  ///< raw device results of the first run, for bitwise comparisons
  std::vector<std::string> mismatches;       ///< "<tensor> run <i>" for every repeat that differed in any bit
  HandOff handoff = HandOff::not_taken;      ///< ckpt: whether the backward bound the recompute's tapes
};

/// FLA's bounds (docs/algorithm.md 7.2), the ones the GPU tests use.
double tolerance(const std::string& tensor);

/// Runs forward (and backward) of `layer` for `c`. Outputs are poisoned with NaN bits first.
Report run(const Layer& layer, const Case& c);

/// The bytes of document `doc` (of lengths `doc_lens`) in result `tensor` of `r` (a layer with
/// spec `spec`): its token rows, or its state for ht and dh0.
std::string document_bytes(const Report& r, const std::string& tensor, const Spec& spec,
                           const std::vector<long long>& doc_lens, size_t doc);

}  // namespace gdn::check
