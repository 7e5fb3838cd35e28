/**
 * @file plan.cpp
 * @brief Building the call plans of a layer, and the interpreted executor.
 */
#include "runtime/plan.hpp"

#include "bwd/geometry.hpp"
#include "cp/geometry.hpp"
#include "fwd/geometry.hpp"
#include "params.cuh"
#include "prep/geometry.hpp"
#include "runtime/launcher.hpp"

#include <fmt/format.h>

#include <cstddef>
#include <algorithm>
#include <cstring>
#include <tuple>
#include <stdexcept>

namespace gdn {

int64_t Lin::eval(int64_t T, int64_t N, int chunk, int64_t seg_rows) const {
  const int64_t nt = T / chunk + N;
  return (t * T + n * N + nt * this->nt + rows * seg_rows + c + div - 1) / div;
}

bool has_unsplit_plans(const LayerIR& ir) {
  return ir.segments_auto && ir.spec.cp_segments > 1 && ir.spec.cp_ranks <= 1 && ir.seg_min_chunks > 0;
}

int64_t segment_rows(const LayerIR& ir, int64_t T, int64_t max_doc_tokens) {
  const int64_t most = std::max(1, ir.spec.cp_segments);
  if (!has_unsplit_plans(ir)) return most;
  const int64_t longest = max_doc_tokens > 0 ? std::min(T, max_doc_tokens) : T;
  const int64_t chunks = (longest + ir.spec.chunk - 1) / ir.spec.chunk;
  return std::clamp<int64_t>(chunks / ir.seg_min_chunks, 1, most);
}

void check_problem_size(int64_t T, int64_t N) {
  if (T < 1 || T > (1LL << 31) - 1) throw InputError(fmt::format("T: {} is out of range (1 to 2^31-1)", T));
  if (N < 1 || N > 65535) throw InputError(fmt::format("N: {} documents is out of range (1 to 65535)", N));
}

std::vector<uint64_t> slot_offsets(const std::vector<ByteFormula>& slots, int64_t T, int64_t N, int chunk) {
  check_problem_size(T, N);
  std::vector<uint64_t> out;
  uint64_t at = 0;
  for (const ByteFormula& b : slots) {
    out.push_back(at);
    at += (static_cast<uint64_t>(b.eval(T, N, chunk)) + 255) / 256 * 256;
  }
  out.push_back(at);  // the region's total size
  return out;
}

std::vector<std::pair<std::string, ByteFormula>> region_slots(const LayerIR& ir, BufferRole role, CallForm form,
                                                              std::optional<Target> target) {
  std::vector<std::pair<std::string, ByteFormula>> out;
  for (const Buffer& b : ir.buffers) {
    if (b.role != role) continue;
    if (role == BufferRole::workspace && std::find(b.forms.begin(), b.forms.end(), form) == b.forms.end()) continue;
    if (!b.lives_in.empty()) continue;  // its bytes are its host's
    if (target && b.unused_for(*target)) continue;
    out.emplace_back(b.name, b.bytes);
  }
  return out;
}

size_t region_bytes(const LayerIR& ir, BufferRole role, CallForm form, int64_t T, int64_t N,
                    std::optional<Target> target) {
  std::vector<ByteFormula> formulas;
  for (const auto& slot : region_slots(ir, role, form, target)) formulas.push_back(slot.second);
  return slot_offsets(formulas, T, N, ir.spec.chunk).back();
}

namespace {

std::string home_of(const LayerIR& ir, std::string name) {
  for (int hops = 0; hops < 8; ++hops) {
    const Buffer& b = ir.buffer(name);
    if (b.lives_in.empty()) return name;
    name = b.lives_in;
  }
  throw std::logic_error(fmt::format("layer '{}': lives_in chain of '{}' does not end", ir.spec.name, name));
}

std::vector<std::string> slot_names(const LayerIR& ir, BufferRole role, CallForm form, std::vector<ByteFormula>& out) {
  std::vector<std::string> names;
  for (auto& [name, bytes] : region_slots(ir, role, form)) {
    names.push_back(name);
    out.push_back(bytes);
  }
  return names;
}

int program_index(const LayerIR& ir, const std::string& name) {
  for (size_t i = 0; i < ir.programs.size(); ++i)
    if (ir.programs[i].name == name) return static_cast<int>(i);
  throw std::logic_error(fmt::format("plan: layer '{}' has no program '{}'", ir.spec.name, name));
}

std::array<Lin, 3> grid_of(const LayerIR& ir, const Program& p) {
  const Spec& s = ir.spec;
  const Lin one{0, 0, 0, 1, 1};
  const Lin heads{0, 0, 0, s.heads_v, 1};
  const Lin chunks{0, 0, 1, ir.extra_chunks, 1};
  switch (p.grid) {
    case GridKind::single: return {one, one, one};
    case GridKind::rows_qk: return {Lin{s.heads_qk, 0, 0, 0, L2NormGeometry::kRowsPerBlock}, one, one};
    case GridKind::chunk_heads: return {chunks, heads, one};
    case GridKind::chunk_head_groups: return {chunks, Lin{0, 0, 0, GateCumsumGeometry::grid_y(s.heads_v), 1}, one};
    case GridKind::walk:
    case GridKind::walk_segments:
    case GridKind::walk_prescan: {
      int bv = 0;
      for (const auto& [k, v] : p.constants)
        if (k == "BV") bv = std::stoi(v);
      const int slabs = (s.head_dim_v + (p.grid == GridKind::walk_prescan ? s.head_dim_k : 0)) / bv;
      // Segmented: y = segment row position * HV + head, z = the document row (seg::grid_position),
      // with the call's segment rows (Frame::seg_rows).
      const Lin y = p.grid == GridKind::walk || s.cp_segments <= 1 ? heads : Lin{0, 0, 0, 0, 1, s.heads_v};
      return {Lin{0, 0, 0, slabs, 1}, y, Lin{0, 1, 0, 0, 1}};
    }
    case GridKind::walk_merge:
      return {Lin{0, 0, 0, s.head_dim_v / WalkMergeGeometry::kColumns, 1}, heads, Lin{0, 1, 0, 0, 1}};
    case GridKind::finalize: return {Lin{s.heads_qk, 0, 0, 0, FinalizeGeometry::kRowsPerBlock}, one, one};
    case GridKind::exchange: return {Lin{0, 0, 0, KcpExchangeGeometry::kBlocks, 1}, one, one};
  }
  throw std::logic_error("plan: unknown grid kind");
}

/// Builds one plan; slot() resolves a buffer name to the saved or workspace region.
class Builder {
 public:
  Builder(const LayerIR& ir, CallPlan& plan, CallForm form) : ir_(ir), plan_(plan) {
    plan.chunk = ir.spec.chunk;
    plan.saved_slot_names = slot_names(ir, BufferRole::saved, form, plan.saved_slots);
    plan.ws_slot_names = slot_names(ir, BufferRole::workspace, form, plan.ws_slots);
  }
  ValueSource slot(const std::string& name) const {
    ValueSource v = home_slot(home_of(ir_, name));
    v.buffer = name;
    return v;
  }
  ValueSource home_slot(const std::string& name) const {
    for (const auto& [region, names] :
         {std::pair{RegionKind::saved, &plan_.saved_slot_names}, std::pair{RegionKind::ws, &plan_.ws_slot_names}})
      for (size_t i = 0; i < names->size(); ++i)
        if ((*names)[i] == name) return {ValueSource::from_slot, Frame::T, region, static_cast<int>(i), {}, 0};
    throw std::logic_error(fmt::format("plan '{}': no slot '{}' in layer '{}'", plan_.name, name, ir_.spec.name));
  }
  static ValueSource frame(Frame f) { return {ValueSource::from_frame, f, RegionKind::saved, 0, {}, 0}; }
  static ValueSource lin(Lin l) { return {ValueSource::from_formula, Frame::T, RegionKind::saved, 0, l, 0}; }
  static ValueSource constant(int64_t v) { return {ValueSource::from_constant, Frame::T, RegionKind::saved, 0, {}, v}; }
  ValueSource nt_max() const { return lin(Lin{0, 0, 1, ir_.extra_chunks, 1}); }
  const LayerIR& ir() const { return ir_; }
  /// A rank's phases (plan_kcp_*): the exchange launches go in, and the walk phase starts at `split`.
  bool kcp = false;
  /// The segment programs run (DocSplits::possible on a segmented layer): a document may take two or
  /// more segments, whose entry states the prescans and merges make.
  bool segment_programs = false;
  size_t split = 0;
  size_t size() const { return plan_.launches.size(); }

  PlannedLaunch& launch(const char* program, size_t params_size) {
    if (params_size > kMaxParamsBytes)
      throw std::logic_error(fmt::format("plan: {}'s parameters take {} bytes, more than the launch buffers' {}",
                                         program, params_size, kMaxParamsBytes));
    const int idx = program_index(ir_, program);
    plan_.launches.push_back({idx, static_cast<uint32_t>(params_size), grid_of(ir_, ir_.programs[idx]), {}});
    return plan_.launches.back();
  }
  PlannedLaunch& last() { return plan_.launches.back(); }

 private:
  const LayerIR& ir_;
  CallPlan& plan_;
};

#define GDN_BIND(L, P, field, src) \
  (L).fields.push_back(Field{static_cast<uint32_t>(offsetof(P, field)), sizeof(P::field), (src)})

/// Rows of x L2-normalized into y and their rstd; either output may be the constant 0 (not written).
void bind_l2norm(Builder& b, Frame x, const ValueSource& y, const ValueSource& rstd, const char* program = "l2norm") {
  auto& l = b.launch(program, sizeof(L2NormParams));
  using P = L2NormParams;
  GDN_BIND(l, P, x, b.frame(x));
  GDN_BIND(l, P, y, y);
  GDN_BIND(l, P, rstd, rstd);
  GDN_BIND(l, P, rows, b.lin(Lin{b.ir().spec.heads_qk, 0, 0, 0, 1}));
}

/// Tm = (I + L)^-1 per (chunk, value head), the forward's solve; rstd_k is bound (with raw k) when
/// the program folds the norm (FOLD_RSTD), else the constant 0.
void bind_chunk_solve(Builder& b, const ValueSource& k, const ValueSource& rstd_k) {
  auto& l = b.launch("chunk_solve", sizeof(ChunkSolveParams));
  using P = ChunkSolveParams;
  GDN_BIND(l, P, k, k);
  GDN_BIND(l, P, beta, b.frame(Frame::beta));
  GDN_BIND(l, P, gc, b.slot("gc"));
  GDN_BIND(l, P, chunks, b.slot("chunks"));
  GDN_BIND(l, P, tm, b.slot("tm"));
  GDN_BIND(l, P, rstd_k, rstd_k);
}

/// W and U from chunk_solve's Tm (in the forward, and again in the backward of light saves).
PlannedLaunch& bind_chunk_prep(Builder& b, const ValueSource& k, const char* program = "chunk_prep",
                               bool writes_u = true) {
  auto& l = b.launch(program, sizeof(ChunkPrepParams));
  using P = ChunkPrepParams;
  GDN_BIND(l, P, k, k);
  GDN_BIND(l, P, v, b.frame(Frame::v));
  GDN_BIND(l, P, beta, b.frame(Frame::beta));
  GDN_BIND(l, P, gc, b.slot("gc"));
  GDN_BIND(l, P, chunks, b.slot("chunks"));
  GDN_BIND(l, P, tm, b.slot("tm"));
  GDN_BIND(l, P, w, b.slot("w"));
  GDN_BIND(l, P, u, writes_u ? b.slot("u") : b.constant(0));
  return l;
}

/// chunk_prep_marked / chunk_prep_fwd_marked: chunk_prep for the chains marked in `marks` (the
/// backward's seg_fail or the forward's fwd_fail) only.
void bind_marked_chunk_prep(Builder& b, const ValueSource& k, const char* program, const char* marks, bool writes_u) {
  auto& l = bind_chunk_prep(b, k, program, writes_u);
  GDN_BIND(l, ChunkPrepParams, doc_chunk_offset, b.slot("doc_chunk_offset"));
  GDN_BIND(l, ChunkPrepParams, seg_fail, b.slot(marks));
}

/// A forward walk's parameters: the prescan writes seg_hm, the segmented walk reads seg_h0.
void bind_walk_params(PlannedLaunch& l, Builder& b, const ValueSource& k, const ValueSource& ht, bool segments,
                      bool prescan = false) {
  using P = StateWalkParams;
  GDN_BIND(l, P, k, k);
  GDN_BIND(l, P, w, b.slot("w"));
  GDN_BIND(l, P, u, b.slot("u"));
  GDN_BIND(l, P, gc, b.slot("gc"));
  GDN_BIND(l, P, chunks, b.slot("chunks"));
  GDN_BIND(l, P, doc_chunk_offset, b.slot("doc_chunk_offset"));
  GDN_BIND(l, P, N, b.frame(Frame::N));
  GDN_BIND(l, P, h0, b.frame(Frame::h0));
  GDN_BIND(l, P, ht, ht);
  GDN_BIND(l, P, h_tape, b.slot("h_tape"));
  GDN_BIND(l, P, v_new, b.slot("v_new"));
  GDN_BIND(l, P, seg_hm, prescan ? b.slot("seg_hm") : b.constant(0));
  GDN_BIND(l, P, seg_h0, segments && !prescan ? b.slot("seg_h0") : b.constant(0));
  GDN_BIND(l, P, doc_order, b.slot("doc_order"));
}

/// A segment merge (forward: seg_hm, h0 -> seg_h0; backward: seg_dzm, dht -> seg_dz).
void bind_walk_merge(Builder& b, const char* program, const char* maps, const ValueSource& start, const char* out) {
  auto& l = b.launch(program, sizeof(WalkMergeParams));
  using P = WalkMergeParams;
  GDN_BIND(l, P, doc_chunk_offset, b.slot("doc_chunk_offset"));
  GDN_BIND(l, P, chunks, b.slot("chunks"));
  GDN_BIND(l, P, seg_hm, b.slot(maps));
  GDN_BIND(l, P, h0, start);
  GDN_BIND(l, P, seg_h0, b.slot(out));
  if (b.ir().spec.cp_ranks > 1 && std::string(program) == "walk_merge") {
    GDN_BIND(l, P, kcp_entry, b.slot("kcp_entry"));
    GDN_BIND(l, P, kcp_entry_mode, b.frame(Frame::kcp_entry_mode));
  }
  // The backward's transitions on one rank: A = M^T from the forward's saved maps.
  if (b.ir().saved_segment_maps && std::string(program) == "walk_merge_bwd") GDN_BIND(l, P, fwd_maps, b.slot("seg_hm"));
}

/// A rank's exchange (kcp_exchange) on the segment slots `slots`; a receive starts the walk phase.
void bind_kcp_exchange(Builder& b, const char* slots, KcpExchangeMode mode) {
  if (mode == kKcpForwardReceive || mode == kKcpBackwardReceive) b.split = b.size();
  auto& l = b.launch("kcp_exchange", sizeof(KcpExchangeParams));
  using P = KcpExchangeParams;
  GDN_BIND(l, P, doc_chunk_offset, b.slot("doc_chunk_offset"));
  GDN_BIND(l, P, chunks, b.slot("chunks"));
  GDN_BIND(l, P, slots, b.slot(slots));
  const bool send = mode == kKcpForwardSend || mode == kKcpBackwardSend;
  GDN_BIND(l, P, send, send ? b.frame(Frame::kcp_send) : b.constant(0));
  GDN_BIND(l, P, gathered, send ? b.constant(0) : b.frame(Frame::kcp_gathered));
  GDN_BIND(l, P, N, b.frame(Frame::N));
  GDN_BIND(l, P, rank, b.frame(Frame::kcp_rank));
  GDN_BIND(l, P, mode, b.constant(mode));
}

/// The state entering every segment (seg_h0): the prescan on W and U, then the merge. A rank's
/// forward (`exchange`) sends its summary and receives the gathered ones in between.
void bind_segment_entry_states(Builder& b, const ValueSource& k, bool exchange = false) {
  bind_walk_params(b.launch("walk_prescan", sizeof(StateWalkParams)), b, k, b.constant(0), true, true);
  if (exchange) {
    bind_kcp_exchange(b, "seg_hm", kKcpForwardSend);
    bind_kcp_exchange(b, "seg_hm", kKcpForwardReceive);
  }
  bind_walk_merge(b, "walk_merge", "seg_hm", b.frame(Frame::h0), "seg_h0");
}

/// The verified carry's prescan and merge: they work only for the chains the forward marked
/// (fwd_fail, saved for the backward), on W and U.
void bind_marked_entry_states(Builder& b, const ValueSource& k) {
  auto& l = b.launch("walk_prescan", sizeof(StateWalkParams));
  GDN_BIND(l, StateWalkParams, seg_fail, b.slot("fwd_fail"));
  bind_walk_params(l, b, k, b.constant(0), true, true);
  bind_walk_merge(b, "walk_merge", "seg_hm", b.frame(Frame::h0), "seg_h0");
  GDN_BIND(b.last(), WalkMergeParams, seg_fail, b.slot("fwd_fail"));
}

/// The verified carry (docs/algorithm.md 4.7): the walk from zero and the re-walks that verify it,
/// then the prescan, the merge and the full walk, which work only for the chains marked in seg_fail.
void bind_verified_walk(Builder& b, const ValueSource& k, const ValueSource& ht) {
  using P = StateWalkParams;
  auto carry = [&](PlannedLaunch& l, bool checkpoints) -> PlannedLaunch& {
    if (checkpoints) GDN_BIND(l, P, seg_ckpt, b.slot("seg_ckpt"));
    GDN_BIND(l, P, seg_fail, b.slot("fwd_fail"));  // the forward's marks are saved for the backward
    return l;
  };
  bind_walk_params(carry(b.launch("walk_speculate", sizeof(P)), true), b, k, ht, true);
  bind_walk_params(carry(b.launch("walk_verify", sizeof(P)), true), b, k, ht, true);
  bind_marked_entry_states(b, k);
  bind_walk_params(carry(b.launch("state_walk", sizeof(P)), false), b, k, ht, true);
}

/// The forward walk; with intra-card segments the prescan and the merge first, unless the
/// segments' entry states are the saved ones (`entry_states` false: the backward's re-run, which
/// walks every segment, whatever the carry).
void bind_state_walk(Builder& b, const LayerIR& ir, const ValueSource& k, const ValueSource& ht, bool exchange = false,
                     bool entry_states = true) {
  const bool segments = ir.spec.cp_segments > 1;
  if (b.segment_programs && entry_states && ir.verified_carry) return bind_verified_walk(b, k, ht);
  if (b.segment_programs && entry_states) bind_segment_entry_states(b, k, exchange);
  bind_walk_params(b.launch("state_walk", sizeof(StateWalkParams)), b, k, ht, segments);
}

/// Which of the verified carry's files a fused walk binds: none (no carry, or the backward's
/// re-run, which walks every segment), the forward's marks (the merge path: the marked chains
/// only), or the marks and the checkpoints (the speculative and the verify walks).
enum class FusedCarryFiles { none, marks, checkpoints };

/// The fused walk: `fused_walk` (o and ht, with full saves the tapes too) or `walk_tape` (the
/// tapes alone), and the verified carry's `fused_speculate` / `fused_verify` / `tape_speculate` /
/// `tape_verify`. Raw q and k with the rows' rstd when the norm is on (the fused path folds it).
void bind_fused_walk(Builder& b, const char* program, bool output, bool tapes,
                     FusedCarryFiles carry = FusedCarryFiles::none) {
  const bool norm = b.ir().spec.norm == Norm::l2_in_kernel;
  const bool segments = b.ir().spec.cp_segments > 1;
  using F = Frame;
  auto& l = b.launch(program, sizeof(FusedWalkParams));
  using P = FusedWalkParams;
  GDN_BIND(l, P, q, output ? b.frame(F::q) : b.constant(0));
  GDN_BIND(l, P, k, b.frame(F::k));
  GDN_BIND(l, P, rstd_q, norm && output ? b.slot("rstd_q") : b.constant(0));
  GDN_BIND(l, P, rstd_k, norm ? b.slot("rstd_k") : b.constant(0));
  GDN_BIND(l, P, v, b.frame(F::v));
  GDN_BIND(l, P, beta, b.frame(F::beta));
  GDN_BIND(l, P, gc, b.slot("gc"));
  GDN_BIND(l, P, tm, b.slot("tm"));
  GDN_BIND(l, P, chunks, b.slot("chunks"));
  GDN_BIND(l, P, doc_chunk_offset, b.slot("doc_chunk_offset"));
  GDN_BIND(l, P, N, b.frame(F::N));
  GDN_BIND(l, P, scale, b.frame(F::scale_bits));
  GDN_BIND(l, P, h0, b.frame(F::h0));
  GDN_BIND(l, P, ht, output ? b.frame(F::ht) : b.constant(0));
  GDN_BIND(l, P, o, output ? b.frame(F::o) : b.constant(0));
  GDN_BIND(l, P, seg_h0, segments ? b.slot("seg_h0") : b.constant(0));
  GDN_BIND(l, P, h_tape, tapes ? b.slot("h_tape") : b.constant(0));
  GDN_BIND(l, P, v_new, tapes ? b.slot("v_new") : b.constant(0));
  GDN_BIND(l, P, T, b.frame(Frame::T));
  GDN_BIND(l, P, nt_max, b.nt_max());
  GDN_BIND(l, P, doc_order, b.slot("doc_order"));
  if (carry == FusedCarryFiles::checkpoints) GDN_BIND(l, P, seg_ckpt, b.slot("seg_ckpt"));
  if (carry != FusedCarryFiles::none) GDN_BIND(l, P, seg_fail, b.slot("fwd_fail"));
}

/// The verified carry on the fused path (docs/design_fused_fwd_sm90.md 3.11.1): the speculative
/// walk and the verify walk (with o, or the tapes alone), then for the chains they mark the
/// prescan and the merge on W and U, then `walk` over those chains.
void bind_fused_verified(Builder& b, const ValueSource& k, bool output, bool tapes, const char* walk) {
  const FusedCarryFiles files = FusedCarryFiles::checkpoints;
  const bool handoff = output && tapes && b.ir().spec.save_mode == SaveMode::light;  // recompute_output_tapes
  bind_fused_walk(b,
                  handoff  ? "fused_speculate_tapes"
                  : output ? "fused_speculate"
                           : "tape_speculate",
                  output, tapes, files);
  bind_fused_walk(b, output ? "fused_verify" : "tape_verify", output, tapes, files);
  // On sm_90a, kn of the marked chains (a recompute that hands its tapes over made every row).
  if (output && !handoff && b.ir().has_program("l2norm_k_marked")) {
    auto& l = b.launch("l2norm_k_marked", sizeof(L2NormMarkedParams));
    using P = L2NormMarkedParams;
    GDN_BIND(l, P, x, b.frame(Frame::k));
    GDN_BIND(l, P, y, k);
    GDN_BIND(l, P, chunks, b.slot("chunks"));
    GDN_BIND(l, P, doc_chunk_offset, b.slot("doc_chunk_offset"));
    GDN_BIND(l, P, seg_fail, b.slot("fwd_fail"));
  }
  if (b.ir().has_program("chunk_prep_fwd_marked"))  // on sm_90a, W and U of the marked chains
    bind_marked_chunk_prep(b, k, "chunk_prep_fwd_marked", "fwd_fail", true);
  bind_marked_entry_states(b, k);
  bind_fused_walk(b, walk, output, tapes, FusedCarryFiles::marks);
}

}  // namespace

namespace {

/// Checks a DocSplits::none request and gives the builder's segment_programs.
bool segment_programs_of(const LayerIR& ir, DocSplits splits) {
  if (splits == DocSplits::none && !has_unsplit_plans(ir))
    throw std::logic_error(fmt::format("plan: layer '{}' has no plans without its segment programs", ir.spec.name));
  return ir.spec.cp_segments > 1 && splits == DocSplits::possible;
}

const char* unsplit_suffix(DocSplits splits) { return splits == DocSplits::none ? "_unsplit" : ""; }

/// `handoff_tapes`: a recompute whose output is needed, writing the tapes beside o to hand them
/// over (LayerIR::recompute_output_tapes).
CallPlan forward_plan(const LayerIR& ir, OutputLaunch output, bool kcp, size_t& split,
                      DocSplits splits = DocSplits::possible, bool handoff_tapes = false) {
  CallPlan plan;
  plan.name = fmt::format("{}{}",
                          handoff_tapes                 ? "recompute_with_output"
                          : output == OutputLaunch::yes ? "forward"
                                                        : "forward_without_output",
                          unsplit_suffix(splits));
  Builder b(ir, plan, CallForm::forward);
  b.kcp = kcp;
  b.segment_programs = segment_programs_of(ir, splits);
  const bool norm = ir.spec.norm == Norm::l2_in_kernel;
  using F = Frame;
  {
    auto& l = b.launch("chunk_table", sizeof(ChunkTableParams));
    using P = ChunkTableParams;
    GDN_BIND(l, P, cu_seqlens, b.frame(F::cu_seqlens));
    GDN_BIND(l, P, cu_is_int64, b.frame(F::cu_is_int64));
    GDN_BIND(l, P, T, b.frame(F::T));
    GDN_BIND(l, P, N, b.frame(F::N));
    GDN_BIND(l, P, nt_max, b.nt_max());
    GDN_BIND(l, P, chunks, b.slot("chunks"));
    GDN_BIND(l, P, doc_chunk_offset, b.slot("doc_chunk_offset"));
    GDN_BIND(l, P, doc_order, b.slot("doc_order"));
    GDN_BIND(l, P, num_chunks, b.slot("num_chunks"));
    GDN_BIND(l, P, status, b.slot("status"));
    GDN_BIND(l, P, max_doc_tokens, b.frame(F::max_doc_tokens));
    if (ir.spec.cp_ranks > 1) {
      GDN_BIND(l, P, rank_local, b.frame(F::kcp_local));
      GDN_BIND(l, P, pieces_before, b.frame(F::kcp_pieces_before));
      GDN_BIND(l, P, pieces_after, b.frame(F::kcp_pieces_after));
    }
  }
  const bool fused = ir.spec.forward == ForwardPath::fused;
  const bool segments = b.segment_programs;
  // The fused forward folds the norm into its products and needs only the rows' rstd (k's from
  // chunk_solve, which has K K^T's diagonal); kn only for chunk_prep's W (the prescan's, and the
  // reverse walk's under full saves or from a recompute's hand-off).
  const bool full = ir.spec.save_mode == SaveMode::full;
  const bool fold = norm && fused;
  const bool tapes = full || output == OutputLaunch::no || handoff_tapes;  // the fused path's
  const bool kn_needed = !fold || segments || tapes;
  if (norm) {
    bind_l2norm(b, F::q, fold ? b.constant(0) : b.slot("qn"), b.slot("rstd_q"));
    // The forward's plan (output launched) makes kn on sm_90a for the verified carry's marked
    // chains only, after the verify walks (l2norm_k idles there, l2norm_k_marked runs).
    const bool marked_kn =
        segments && output == OutputLaunch::yes && !handoff_tapes && ir.has_program("l2norm_k_marked");
    // backward_norm "in_walk": a light recompute's kn serves chunk_prep and the hand-off, neither
    // of which reads it on sm_90a (l2norm_rows idles there).
    const bool rows_idle_on_sm90a = ir.spec.backward_norm == BackwardNorm::in_walk && !full;
    if (kn_needed)
      bind_l2norm(b, F::k, b.slot("kn"), fold ? b.constant(0) : b.slot("rstd_k"),
                  marked_kn            ? "l2norm_k"
                  : rows_idle_on_sm90a ? "l2norm_rows"
                                       : "l2norm");
  }
  const ValueSource q = norm && !fold ? b.slot("qn") : b.frame(F::q);
  const ValueSource k = norm && kn_needed ? b.slot("kn") : b.frame(F::k);
  {
    auto& l = b.launch("gate_cumsum", sizeof(GateCumsumParams));
    using P = GateCumsumParams;
    GDN_BIND(l, P, g, b.frame(F::g));
    GDN_BIND(l, P, gc, b.slot("gc"));
    GDN_BIND(l, P, chunks, b.slot("chunks"));
    GDN_BIND(l, P, status, b.slot("status"));
    GDN_BIND(l, P, nt_max, b.nt_max());
  }
  bind_chunk_solve(b, fold ? b.frame(F::k) : k, fold ? b.slot("rstd_k") : b.constant(0));
  if (fused) {
    // W for the backward's reverse walk (saved, or handed over) and, with segments, W and U for
    // the prescan.
    if (segments || tapes) bind_chunk_prep(b, k);
    plan.leaves_tapes = tapes;
    if (segments && ir.verified_carry) {
      if (output == OutputLaunch::no)
        bind_fused_verified(b, k, false, true, "walk_tape");
      else
        bind_fused_verified(b, k, true, full || handoff_tapes, "fused_walk");
      split = b.split;
      return plan;
    }
    if (segments) bind_segment_entry_states(b, k, b.kcp);
    if (output == OutputLaunch::no)  // the tapes for a hand-off or the saves; ht stays the forward's
      bind_fused_walk(b, "walk_tape", false, true);
    else
      bind_fused_walk(b, "fused_walk", true, full || handoff_tapes);
    split = b.split;
    return plan;
  }
  bind_chunk_prep(b, k);
  bind_state_walk(b, ir, k, b.frame(F::ht), b.kcp);
  plan.leaves_tapes = true;
  if (output == OutputLaunch::yes) {
    auto& l = b.launch("output", sizeof(OutputParams));
    using P = OutputParams;
    GDN_BIND(l, P, q, q);
    GDN_BIND(l, P, k, k);
    GDN_BIND(l, P, v_new, b.slot("v_new"));
    GDN_BIND(l, P, h_tape, b.slot("h_tape"));
    GDN_BIND(l, P, gc, b.slot("gc"));
    GDN_BIND(l, P, chunks, b.slot("chunks"));
    GDN_BIND(l, P, nt_max, b.nt_max());
    GDN_BIND(l, P, scale, b.frame(F::scale_bits));
    GDN_BIND(l, P, o, b.frame(F::o));
  }
  split = b.split;
  return plan;
}

CallPlan backward_plan(const LayerIR& ir, PrepRerun rerun, bool kcp, size_t& split,
                       DocSplits splits = DocSplits::possible) {
  CallPlan plan;
  const bool full = ir.spec.save_mode == SaveMode::full;
  const bool norm = ir.spec.norm == Norm::l2_in_kernel;
  plan.name = fmt::format("{}{}",
                          full                      ? "backward"
                          : rerun == PrepRerun::yes ? "backward"
                                                    : "backward_with_handoff",
                          unsplit_suffix(splits));
  Builder b(ir, plan, CallForm::backward);
  b.kcp = kcp;
  b.segment_programs = segment_programs_of(ir, splits);
  using F = Frame;
  const ValueSource q = norm ? b.slot("qn") : b.frame(F::q);
  const ValueSource k = norm ? b.slot("kn") : b.frame(F::k);
  // backward_norm "in_walk": on sm_90a the fused reverse walk and finalize read the raw rows.
  const bool norm_in_walk = ir.spec.backward_norm == BackwardNorm::in_walk;
  if (norm && ir.spec.forward == ForwardPath::fused) {  // the forward folded the norm: no qn saved
    const char* rows = norm_in_walk ? "l2norm_rows" : "l2norm";
    bind_l2norm(b, F::q, q, b.constant(0), rows);
    // kn: a hand-off brings it, and full saves keep the forward's
    if (!full && rerun == PrepRerun::yes) bind_l2norm(b, F::k, k, b.constant(0), rows);
  }
  // Where the sm_90a walks form W under segments (the verified carry), the re-run is a program of
  // its own that idles there, and chunk_prep_marked makes the marked chains' W after the walks.
  const bool marked_prep = ir.has_program("chunk_prep_marked");
  if (!full && rerun == PrepRerun::yes) {
    bind_chunk_prep(b, k, marked_prep ? "chunk_prep_rerun" : "chunk_prep");  // Tm read back
    // The segments' entry states are the forward's where the IR saves them (one rank, light
    // saves); a rank of a context-parallel run chains them again from its kcp_entry.
    const bool entry_states = !ir.segment_entries_saved;
    if (ir.spec.forward == ForwardPath::fused) {  // the tapes in the fused walk's roundings
      if (b.segment_programs && entry_states) bind_segment_entry_states(b, k);
      bind_fused_walk(b, "walk_tape", false, true);
    } else {
      bind_state_walk(b, ir, k, b.constant(0), false, entry_states);
    }
  }
  auto bind_dv_local = [&](PlannedLaunch& l) {
    using P = DvLocalParams;
    GDN_BIND(l, P, q, q);
    GDN_BIND(l, P, k, k);
    GDN_BIND(l, P, gc, b.slot("gc"));
    GDN_BIND(l, P, d_o, b.frame(F::d_o));
    GDN_BIND(l, P, chunks, b.slot("chunks"));
    GDN_BIND(l, P, nt_max, b.nt_max());
    GDN_BIND(l, P, scale, b.frame(F::scale_bits));
    GDN_BIND(l, P, dv_local, b.slot("dv_local"));
  };
  bind_dv_local(b.launch("dv_local", sizeof(DvLocalParams)));
  {
    const bool segments = ir.spec.cp_segments > 1;
    auto bind_walk_bwd = [&](PlannedLaunch& l) {
      using P = StateWalkBwdParams;
      GDN_BIND(l, P, q, q);
      GDN_BIND(l, P, k, k);
      GDN_BIND(l, P, w, b.slot("w"));
      GDN_BIND(l, P, gc, b.slot("gc"));
      GDN_BIND(l, P, d_o, b.frame(F::d_o));
      GDN_BIND(l, P, dv_local, b.slot("dv_local"));
      GDN_BIND(l, P, chunks, b.slot("chunks"));
      GDN_BIND(l, P, doc_chunk_offset, b.slot("doc_chunk_offset"));
      GDN_BIND(l, P, N, b.frame(F::N));
      GDN_BIND(l, P, scale, b.frame(F::scale_bits));
      GDN_BIND(l, P, dht, b.frame(F::dht));
      GDN_BIND(l, P, dh0, b.frame(F::dh0));
      GDN_BIND(l, P, dh_tape, b.slot("dh_tape"));
      GDN_BIND(l, P, dv_new, b.slot("dv_new"));
      GDN_BIND(l, P, seg_dzm, segments ? b.slot("seg_dzm") : b.constant(0));
      GDN_BIND(l, P, seg_dz, segments ? b.slot("seg_dz") : b.constant(0));
      GDN_BIND(l, P, T, b.frame(F::T));
      GDN_BIND(l, P, nt_max, b.nt_max());
      GDN_BIND(l, P, doc_order, b.slot("doc_order"));
    };
    using P = StateWalkBwdParams;
    // The verified carry (docs/algorithm.md 4.7): the reverse walk from zero and the re-walks that
    // verify it, then the prescan, the merge and the full walk for the chains marked in seg_fail.
    // backward_w "walk": on sm_90a the walks form W from Tm and beta (tm in w's place); the other
    // targets' portable walk reads chunk_prep's W. The prescan always reads chunk_prep's.
    auto walk_forms_w = [&](PlannedLaunch& l) {
      if (b.ir().spec.backward_w != BackwardW::walk) return;
      l.target_fields.push_back({Target::sm_90a, Field{offsetof(P, tm), sizeof(P::tm), b.slot("tm")}});
      GDN_BIND(l, P, beta, b.frame(F::beta));
    };
    // walk_bwd_layout "fused": on sm_90a every reverse walk is chunk_bwd too (which idles there):
    // its inputs in the bytes of the walk's fields it does not read (StateWalkBwdParams' unions),
    // its outputs after the walk's fields (StateWalkBwdFusedParams).
    const bool walk_fused = ir.spec.walk_bwd_layout == WalkBwdLayout::fused;
    const uint32_t walk_params = walk_fused ? sizeof(StateWalkBwdFusedParams) : sizeof(P);
    auto fused_fields = [&](PlannedLaunch& l) {
      if (!walk_fused) return;
      // The outputs' block follows the walk's fields (params.cuh pins the sizes that say so).
      constexpr uint32_t out = sizeof(P);
      using FP = WalkBwdFusedOutputs;
      auto on_sm90a = [&](uint32_t offset, uint32_t size, ValueSource source) {
        l.target_fields.push_back({Target::sm_90a, Field{offset, size, std::move(source)}});
      };
      on_sm90a(offsetof(P, v), sizeof(P::v), b.frame(F::v));
      on_sm90a(offsetof(P, h_tape), sizeof(P::h_tape), b.slot("h_tape"));
      on_sm90a(offsetof(P, v_new), sizeof(P::v_new), b.slot("v_new"));
      on_sm90a(out + offsetof(FP, dq_v), sizeof(FP::dq_v), b.slot("dq_v"));
      on_sm90a(out + offsetof(FP, dk_v), sizeof(FP::dk_v), b.slot("dk_v"));
      on_sm90a(out + offsetof(FP, dv), sizeof(FP::dv), b.frame(F::dv));
      on_sm90a(out + offsetof(FP, dg), sizeof(FP::dg), b.frame(F::dg));
      on_sm90a(out + offsetof(FP, dbeta), sizeof(FP::dbeta), b.frame(F::dbeta));
      if (norm_in_walk) {  // the raw rows, and their saved rstd in the segment fields' bytes
        on_sm90a(offsetof(P, q), sizeof(P::q), b.frame(F::q));
        on_sm90a(offsetof(P, k), sizeof(P::k), b.frame(F::k));
        on_sm90a(offsetof(P, rstd_q), sizeof(P::rstd_q), b.slot("rstd_q"));
        on_sm90a(offsetof(P, rstd_k), sizeof(P::rstd_k), b.slot("rstd_k"));
      }
    };
    // What every reverse walk (not the prescan) binds on sm_90a beyond the walk's fields.
    auto reverse_walk = [&](PlannedLaunch& l) {
      walk_forms_w(l);
      fused_fields(l);
    };
    auto carry = [&](PlannedLaunch& l, bool checkpoints) {
      bind_walk_bwd(l);
      if (checkpoints) GDN_BIND(l, P, seg_ckpt, b.slot("seg_ckpt"));
      GDN_BIND(l, P, seg_fail, b.slot("seg_fail"));
      GDN_BIND(l, P, fwd_fail, b.slot("fwd_fail"));
    };
    const bool verified = ir.verified_carry && b.segment_programs;
    if (verified) {
      carry(b.launch("walk_bwd_speculate", walk_params), true);
      reverse_walk(b.last());
      carry(b.launch("walk_bwd_verify", walk_params), true);
      reverse_walk(b.last());
      // On sm_90a, what the marked chains' prescan reads and the walks made for themselves.
      if (ir.has_program("dv_local_marked")) {
        auto& l = b.launch("dv_local_marked", sizeof(DvLocalParams));
        bind_dv_local(l);
        GDN_BIND(l, DvLocalParams, doc_chunk_offset, b.slot("doc_chunk_offset"));
        GDN_BIND(l, DvLocalParams, seg_fail, b.slot("seg_fail"));
      }
      // With a hand-off too: the recompute made W on sm_90a for the chains the forward marked only.
      if (marked_prep && !full) {
        bind_marked_chunk_prep(b, k, "chunk_prep_marked", "seg_fail", false);
      }
      carry(b.launch("walk_bwd_prescan", sizeof(P)), false);
      if (walk_fused) {  // the prescan writes no tapes; on sm_90a their slots are not there
        for (const uint32_t offset : {uint32_t{offsetof(P, dh_tape)}, uint32_t{offsetof(P, dv_new)}})
          b.last().target_fields.push_back({Target::sm_90a, Field{offset, 8, b.constant(0)}});
      }
      bind_walk_merge(b, "walk_merge_bwd", "seg_dzm", b.frame(F::dht), "seg_dz");
      GDN_BIND(b.last(), WalkMergeParams, seg_fail, b.slot("seg_fail"));
      carry(b.launch("state_walk_bwd", walk_params), false);
      reverse_walk(b.last());
    } else if (b.segment_programs) {
      bind_walk_bwd(b.launch("walk_bwd_prescan", sizeof(StateWalkBwdParams)));
      if (b.kcp) {
        bind_kcp_exchange(b, "seg_dzm", kKcpBackwardSend);
        bind_kcp_exchange(b, "seg_dzm", kKcpBackwardReceive);
      }
      bind_walk_merge(b, "walk_merge_bwd", "seg_dzm", b.frame(F::dht), "seg_dz");
    }
    if (!verified) {
      bind_walk_bwd(b.launch("state_walk_bwd", walk_params));
      reverse_walk(b.last());
    }
  }
  {
    auto& l = b.launch("chunk_bwd", sizeof(ChunkBwdParams));
    using P = ChunkBwdParams;
    GDN_BIND(l, P, q, q);
    GDN_BIND(l, P, k, k);
    GDN_BIND(l, P, v, b.frame(F::v));
    GDN_BIND(l, P, beta, b.frame(F::beta));
    GDN_BIND(l, P, gc, b.slot("gc"));
    GDN_BIND(l, P, tm, b.slot("tm"));
    GDN_BIND(l, P, h_tape, b.slot("h_tape"));
    GDN_BIND(l, P, dh_tape, b.slot("dh_tape"));
    GDN_BIND(l, P, v_new, b.slot("v_new"));
    GDN_BIND(l, P, dv_new, b.slot("dv_new"));
    GDN_BIND(l, P, d_o, b.frame(F::d_o));
    GDN_BIND(l, P, chunks, b.slot("chunks"));
    GDN_BIND(l, P, nt_max, b.nt_max());
    GDN_BIND(l, P, scale, b.frame(F::scale_bits));
    GDN_BIND(l, P, dq_v, b.slot("dq_v"));
    GDN_BIND(l, P, dk_v, b.slot("dk_v"));
    GDN_BIND(l, P, dv, b.frame(F::dv));
    GDN_BIND(l, P, dbeta, b.frame(F::dbeta));
    GDN_BIND(l, P, dg, b.frame(F::dg));
    GDN_BIND(l, P, T, b.frame(F::T));
  }
  {
    auto& l = b.launch("finalize", sizeof(FinalizeParams));
    using P = FinalizeParams;
    GDN_BIND(l, P, dq_v, b.slot("dq_v"));
    GDN_BIND(l, P, dk_v, b.slot("dk_v"));
    // backward_norm "in_walk": the raw rows on every target (finalize's code is the targets' one).
    GDN_BIND(l, P, qn, norm_in_walk ? b.frame(F::q) : q);
    GDN_BIND(l, P, kn, norm_in_walk ? b.frame(F::k) : k);
    GDN_BIND(l, P, rstd_q, norm ? b.slot("rstd_q") : b.constant(0));
    GDN_BIND(l, P, rstd_k, norm ? b.slot("rstd_k") : b.constant(0));
    GDN_BIND(l, P, dq, b.frame(F::dq));
    GDN_BIND(l, P, dk, b.frame(F::dk));
    GDN_BIND(l, P, T, b.frame(F::T));
  }
  split = b.split;
  return plan;
}

/// The launches of one phase of a rank's plan cut at its all-gather.
CallPlan phase_of(CallPlan plan, size_t split, KcpPhase phase, const LayerIR& ir) {
  if (ir.spec.cp_ranks <= 1 || ir.spec.cp_segments <= 1 || split == 0)
    throw std::logic_error(fmt::format("plan: layer '{}' has no context-parallel phases", ir.spec.name));
  if (phase == KcpPhase::summaries)
    plan.launches.erase(plan.launches.begin() + static_cast<std::ptrdiff_t>(split), plan.launches.end());
  else
    plan.launches.erase(plan.launches.begin(), plan.launches.begin() + static_cast<std::ptrdiff_t>(split));
  plan.name = fmt::format("kcp_{}_{}", plan.name, phase == KcpPhase::summaries ? "summaries" : "walk");
  return plan;
}

}  // namespace

CallPlan plan_forward(const LayerIR& ir, OutputLaunch output, DocSplits splits) {
  size_t split = 0;
  return forward_plan(ir, output, false, split, splits);
}

CallPlan plan_recompute(const LayerIR& ir, OutputLaunch output, DocSplits splits) {
  size_t split = 0;
  const bool handoff_tapes = output == OutputLaunch::yes && ir.recompute_output_tapes;
  return forward_plan(ir, output, false, split, splits, handoff_tapes);
}

CallPlan plan_backward(const LayerIR& ir, PrepRerun rerun, DocSplits splits) {
  size_t split = 0;
  return backward_plan(ir, rerun, false, split, splits);
}

CallPlan plan_kcp_forward(const LayerIR& ir, KcpPhase phase) {
  size_t split = 0;
  CallPlan plan = forward_plan(ir, OutputLaunch::yes, true, split);
  return phase_of(std::move(plan), split, phase, ir);
}

CallPlan plan_kcp_backward(const LayerIR& ir, PrepRerun rerun, KcpPhase phase) {
  size_t split = 0;
  CallPlan plan = backward_plan(ir, rerun, true, split);
  return phase_of(std::move(plan), split, phase, ir);
}

void specialize_for_target(CallPlan& plan, const LayerIR& ir, Target target) {
  plan.launches.erase(std::remove_if(plan.launches.begin(), plan.launches.end(),
                                     [&](const PlannedLaunch& l) {
                                       return ir.programs.at(static_cast<size_t>(l.program)).idle_for(target);
                                     }),
                      plan.launches.end());
  for (PlannedLaunch& l : plan.launches)
    for (const auto& [t, field] : l.target_fields) {
      if (t != target) continue;
      bool replaced = false;
      for (Field& f : l.fields)
        if (f.offset == field.offset) f = field, replaced = true;
      if (!replaced) l.fields.push_back(field);
    }
  // The slots of buffers unused on this target go, in both regions; the slots after them move up.
  auto drop_unused = [&](RegionKind region, std::vector<ByteFormula>& slots, std::vector<std::string>& names) {
    std::vector<int> moved(names.size(), -1);
    std::vector<ByteFormula> kept_slots;
    std::vector<std::string> kept_names;
    for (size_t i = 0; i < names.size(); ++i) {
      if (ir.buffer(names[i]).unused_for(target)) continue;
      moved[i] = static_cast<int>(kept_slots.size());
      kept_slots.push_back(slots[i]);
      kept_names.push_back(names[i]);
    }
    if (kept_slots.size() == slots.size()) return;
    for (PlannedLaunch& l : plan.launches)
      for (Field& f : l.fields) {
        if (f.source.kind != ValueSource::from_slot || f.source.region != region) continue;
        const int to = moved.at(static_cast<size_t>(f.source.slot));
        // A program that runs here and binds a buffer the IR says nothing here touches: the IR and
        // the plan disagree, and the body would write through a slot that has no bytes.
        if (to < 0)
          throw std::logic_error(fmt::format("plan: layer '{}': {} binds '{}', which is unused on {}", ir.spec.name,
                                             ir.programs.at(static_cast<size_t>(l.program)).name, f.source.buffer,
                                             to_string(target)));
        f.source.slot = to;
      }
    slots = std::move(kept_slots);
    names = std::move(kept_names);
  };
  drop_unused(RegionKind::saved, plan.saved_slots, plan.saved_slot_names);
  drop_unused(RegionKind::ws, plan.ws_slots, plan.ws_slot_names);
}

void run_plan(const CallPlan& plan, const LayerIR& ir, const CallFrame& frame, Launcher& launcher) {
  const int64_t T = static_cast<int64_t>(frame[Frame::T]), N = static_cast<int64_t>(frame[Frame::N]);
  const int64_t rows = static_cast<int64_t>(frame[Frame::seg_rows]);
  const auto saved = slot_offsets(plan.saved_slots, T, N, plan.chunk);
  const auto ws = slot_offsets(plan.ws_slots, T, N, plan.chunk);
  const CUstream stream = reinterpret_cast<CUstream>(frame[Frame::stream]);
  for (const PlannedLaunch& l : plan.launches) {
    // Only the block's own bytes are passed, so only they need zeroing (launch path).
    alignas(16) unsigned char params[kMaxParamsBytes];
    std::memset(params, 0, l.params_size);
    for (const Field& f : l.fields) {
      uint64_t v = 0;
      const ValueSource& s = f.source;
      switch (s.kind) {
        case ValueSource::from_frame: v = frame[s.frame_word]; break;
        case ValueSource::from_slot:
          v = s.region == RegionKind::saved ? frame[Frame::saved] + saved[static_cast<size_t>(s.slot)]
                                            : frame[Frame::ws] + ws[static_cast<size_t>(s.slot)];
          break;
        case ValueSource::from_formula: v = static_cast<uint64_t>(s.formula.eval(T, N, plan.chunk, rows)); break;
        case ValueSource::from_constant: v = static_cast<uint64_t>(s.value); break;
      }
      std::memcpy(params + f.offset, &v, f.size);  // little-endian: the low bytes
    }
    const rt::dim3_t grid{static_cast<unsigned>(l.grid[0].eval(T, N, plan.chunk, rows)),
                          static_cast<unsigned>(l.grid[1].eval(T, N, plan.chunk, rows)),
                          static_cast<unsigned>(l.grid[2].eval(T, N, plan.chunk, rows))};
    launcher.launch(ir.programs[static_cast<size_t>(l.program)], grid, params, l.params_size, stream);
  }
}

}  // namespace gdn
