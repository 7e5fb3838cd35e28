/**
 * @file spec.hpp
 * @brief The layer spec: the C++ struct, its JSON form, and the validation shared by both.
 *
 * A spec describes one Gated DeltaNet layer as the user wants it compiled. Every error names the
 * offending field with a JSON pointer and the value, e.g. `/heads/v: 50 is not a multiple of
 * /heads/qk (16)`. The JSON front end and the C++ struct run the same checks (validate()).
 */
#pragma once

#include "common/error.hpp"
#include "common/json_input.hpp"

#include <nlohmann/json.hpp>

#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <iterator>
#include <vector>

namespace gdn {

enum class Norm { l2_in_kernel, none };
enum class SaveMode { light, full };
enum class ReuseTapes { yes, no, automatic };
enum class GraphMode { off, replay };
/// Which tensor-core instructions the programs that have a choice use: "auto" picks the fastest
/// per target (today: chunk_bwd on wgmma on sm_90a), "mma_sync" keeps mma.sync everywhere.
enum class TensorCores { automatic, mma_sync };
/// How the forward is built: "programs" = the walk writes the state tapes and a separate output
/// program reads them back; "fused" = one program walks the chunks and writes o directly, from
/// chunk_solve's Tm (no W, U or tapes in the forward; the backward re-runs the pair that makes them);
/// "auto" = lower() picks one from the layer alone (LayerIR::forward_auto, `gdnc ir` prints the rule).
enum class ForwardPath { programs, fused, automatic };
/// Where the reverse walk's W comes from: chunk_prep's re-run, or (sm_90a) the walk itself; "auto"
/// = the walk wherever it can (LayerIR::backward_w_auto; the same bits either way).
enum class BackwardW { chunk_prep, walk, automatic };
/// How the reverse walk's sm_90a body shares out its warpgroups: "split" = two walking warpgroups
/// of 64 columns, each with its half of the gradient and all of its products; "fused" = one
/// warpgroup owns the whole gradient (docs/design_fused_bwd_sm90.md 3.7) and two more run
/// chunk_bwd's body (3.9): one program walks the chunks in
/// reverse and produces dq, dk, dv, dg and dbeta; chunk_bwd idles on sm_90a. Its own bits (the
/// update takes K^T X without forming W; dTm, Y and E rounded once), held to the same fp64 bounds.
/// "auto" = "fused" wherever the layer can take it, "split" elsewhere (LayerIR::walk_bwd_layout_auto;
/// `gdnc ir` prints the rule).
enum class WalkBwdLayout { split, fused, automatic };
/// Where the backward normalizes q and k for the fused reverse walk (docs/design_fused_bwd_sm90.md
/// 3.26): "launches" = two l2norm launches write qn and kn, which the walk and finalize read;
/// "in_walk" = on sm_90a the walk loads the raw rows and normalizes them in its shared tiles from
/// the saved rstd (l2norm's arithmetic: qn's bits; k by chunk_solve's rstd, the forward's), and
/// finalize normalizes its rows itself, so the backward launches no l2norm there. "auto" =
/// "launches" until "in_walk" is measured faster on the GPU.
enum class BackwardNorm { launches, in_walk, automatic };
/// How the state entering each intra-card segment is found (docs/algorithm.md 4.6, 4.7): "merge" =
/// the prescan's per-segment maps chained in fp32; "verified" = every segment walked from zero at
/// once and re-walked from its predecessor's end until the two agree bit for bit (a document's
/// bits are then those of one unsegmented walk), the merge only for chains that never agree;
/// "auto" = "verified" where the layer can take it (one rank, the programs forward, the portable
/// backward walk), "merge" elsewhere (LayerIR::carry_auto says which and why).
enum class SegmentCarry { merge, verified, automatic };
enum class Determinism { deterministic, nondeterministic };
enum class Target { sm_90a, sm_100a, sm_103a };
/// Every target gdnc generates code for (a spec's default `targets`).
inline constexpr Target kTargets[] = {Target::sm_90a, Target::sm_100a, Target::sm_103a};
enum class StateFlag { absent, present };

std::string_view to_string(Norm);
std::string_view to_string(SaveMode);
std::string_view to_string(ReuseTapes);
std::string_view to_string(GraphMode);
std::string_view to_string(TensorCores);
std::string_view to_string(ForwardPath);
std::string_view to_string(BackwardW);
std::string_view to_string(WalkBwdLayout);
std::string_view to_string(BackwardNorm);
std::string_view to_string(SegmentCarry);
std::string_view to_string(Target);
/// Parses "sm_90a" etc.; returns nullopt for anything gdnc does not support.
std::optional<Target> parse_target(std::string_view);
/// The compute capability as an integer, e.g. 90 for sm_90a.
int target_cc(Target);
/// Every target gdnc supports, in a fixed order.
const std::vector<Target>& supported_targets();

/// Thrown for an invalid spec; what() is "<json pointer>: <problem>", or "<problem>" alone when
/// no single field is at fault (a file that is not JSON, not a regular file, too large).
class SpecError : public Error {
 public:
  SpecError(std::string pointer, std::string problem);
  const std::string& pointer() const noexcept { return pointer_; }
  const std::string& problem() const noexcept { return problem_; }

 private:
  std::string pointer_;
  std::string problem_;
};

/// One GDN layer. Defaults match the benchmark shapes (K = V = 128, chunk 64, light saves).
struct Spec {
  std::string name;
  int heads_qk = 0;      ///< H: q/k heads
  int heads_v = 0;       ///< HV: value heads (a multiple of H)
  int head_dim_k = 128;  ///< K
  int head_dim_v = 128;  ///< V
  std::string dtype_qkv = "bf16";
  std::string dtype_gate = "fp32";
  std::string dtype_beta = "fp32";
  std::string dtype_state = "fp32";
  std::string dtype_output = "bf16";
  Norm norm = Norm::l2_in_kernel;
  std::optional<double> scale;  ///< nullopt: 1/sqrt(K)
  int chunk = 64;
  SaveMode save_mode = SaveMode::light;
  ReuseTapes reuse_recompute_tapes = ReuseTapes::automatic;
  Determinism determinism = Determinism::deterministic;
  GraphMode graph = GraphMode::off;
  TensorCores tensor_cores = TensorCores::automatic;
  /// V-slab width of the forward state walk (one block per slab): 0 = "auto" (the measured choice,
  /// StateWalkGeometry::auto_bv(V, HV)), else 32 or 64. Same bits either way; wider slabs re-read W and K
  /// less, narrower ones give more independent walks.
  int walk_slab = 0;
  /// The same for the backward walk: 0 = "auto" (StateWalkBwdGeometry::bv(V)), 32 (8 warps, two
  /// blocks per SM) or 64 (16 warps, one block per SM: half the Q, K and W re-reads).
  int walk_bwd_slab = 0;
  ForwardPath forward = ForwardPath::automatic;
  /// "walk": the reverse walk's sm_90a body forms W from Tm (no chunk_prep re-run on sm_90a). Every
  /// program that forms W rounds it the walk's way, so the choice moves work, not bits.
  BackwardW backward_w = BackwardW::automatic;
  /// "auto" (the default): "fused" wherever the layer can take it (W from the walk, one rank, one
  /// segment or the verified carry), "split" elsewhere.
  WalkBwdLayout walk_bwd_layout = WalkBwdLayout::automatic;
  /// "auto" (the default): "launches". "in_walk" needs the fused reverse-walk layout, one segment,
  /// and the in-kernel L2 norm.
  BackwardNorm backward_norm = BackwardNorm::automatic;
  StateFlag initial_state = StateFlag::present;
  StateFlag final_state = StateFlag::present;
  std::vector<Target> targets{std::begin(kTargets), std::end(kTargets)};
  int cp_ranks = 1;
  /// Intra-card segments per document: 1 to 64 pins that many for every document; 0 is "auto" (the
  /// default): lower() picks the most per document from the layer (few value heads: the walks alone
  /// cannot fill the GPU) and each document takes as many as its own length supports.
  int cp_segments = 0;
  /// "verified": the programs forward on one rank only (lower() refuses the fused forward and
  /// cp.ranks > 1); "auto" takes it where those hold.
  SegmentCarry cp_carry = SegmentCarry::automatic;

  int group() const { return heads_v / heads_qk; }
  double effective_scale() const;
};

/// What a spec may be: specs are a few hundred bytes, three levels deep; anything far beyond
/// is a mistake or an attack, refused before it costs memory or stack.
inline constexpr JsonLimits kSpecJsonLimits{1 << 20, 16};

/// Checks every field; throws SpecError naming the first bad field.
void validate(const Spec&);
/// Parses and validates; unknown fields and wrong types are errors.
Spec spec_from_json(const nlohmann::json&);
/// Parses JSON text with the limits of kSpecJsonLimits (size, depth, duplicate keys, number
/// ranges), then spec_from_json(); every problem is a SpecError.
Spec spec_from_text(std::string_view text);
/// Reads a regular file of at most kSpecJsonLimits.max_bytes and parses it like spec_from_text();
/// every problem, a FIFO or device or a file that cannot be read included, is a SpecError that
/// names the file.
Spec spec_from_file(const std::string& path);
/// The canonical form: every field, defaults filled in.
nlohmann::json to_json(const Spec&);

}  // namespace gdn
