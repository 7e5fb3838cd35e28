/**
 * @file cp_reference.hpp
 * @brief fp64 reference of the affine state transition of a segment (docs/algorithm.md section 4),
 *        the math of context parallelism and intra-card segments: S_end = M S_start + S_ext.
 */
#pragma once

#include "runtime/check/gdn_reference.hpp"

#include <vector>

namespace gdn::ref {

/// The summary of one segment of one document for one value head.
struct SegmentSummary {
  std::vector<double> M;      ///< [K, K] row-major
  std::vector<double> S_ext;  ///< [K, V]: the segment's walk started from a zero state
};

/**
 * Summarizes tokens [begin, end) of document `doc` for value head `j`. `begin` must sit on a
 * chunk boundary of the document (chunks of `chunk` tokens from the document's first token) and
 * `end` on one too or at the document's end. q/k are used as given (no L2 norm): pass
 * normalized inputs with Problem::l2norm = false. Throws std::invalid_argument otherwise.
 */
SegmentSummary summarize_segment(const Problem&, const Inputs&, int doc, int j, int64_t begin, int64_t end,
                                 int chunk = 64);

/// S = M S + S_ext, [K, V].
std::vector<double> apply_summary(const SegmentSummary&, const std::vector<double>& S, int K, int V);

}  // namespace gdn::ref
