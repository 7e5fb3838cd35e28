/**
 * @file ir.cpp
 * @brief Lowering of a spec into the kernel IR.
 */
#include "compiler/ir.hpp"

#include "bwd/geometry.hpp"
#include "cp/geometry.hpp"
#include "fwd/geometry.hpp"
#include "params.cuh"
#include "prep/geometry.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>

namespace gdn {

using nlohmann::json;

std::string_view to_string(CallForm f) {
  switch (f) {
    case CallForm::forward: return "forward";
    case CallForm::recompute: return "recompute";
    case CallForm::backward: return "backward";
  }
  return "?";
}

std::string_view to_string(BufferRole r) {
  switch (r) {
    case BufferRole::input: return "input";
    case BufferRole::output: return "output";
    case BufferRole::saved: return "saved";
    case BufferRole::workspace: return "workspace";
  }
  return "?";
}

static std::string to_string(GridKind g) {
  switch (g) {
    case GridKind::single: return "(1, 1, 1)";
    case GridKind::rows_qk: return fmt::format("(ceil(T*H / {}), 1, 1)", L2NormGeometry::kRowsPerBlock);
    case GridKind::chunk_heads: return "(NT, HV, 1)";
    case GridKind::chunk_head_groups: return fmt::format("(NT, ceil(HV / {}), 1)", GateCumsumGeometry::kHeadsPerBlock);
    case GridKind::walk: return "(V / BV, HV, N)";
    case GridKind::walk_segments: return "(V / BV, HV * segment rows, N)";
    case GridKind::walk_prescan: return "((V + K) / BV, HV * segment rows, N)";
    case GridKind::walk_merge: return fmt::format("(V / {}, HV, N)", WalkMergeGeometry::kColumns);
    case GridKind::finalize: return "(finalize_grid(T, H), 1, 1)";
    case GridKind::exchange: return fmt::format("({}, 1, 1)", KcpExchangeGeometry::kBlocks);
  }
  return "?";
}

long long ByteFormula::eval(long long T, long long N, int chunk) const {
  const long long nt = T / chunk + N;
  return per_token * T + per_doc * N + per_chunk * nt + constant;
}

std::string ByteFormula::text() const {
  std::string s;
  auto term = [&](long long c, const char* sym) {
    if (c == 0) return;
    if (!s.empty()) s += " + ";
    s += *sym ? fmt::format("{}*{}", c, sym) : fmt::format("{}", c);
  };
  term(per_token, "T");
  term(per_doc, "N");
  term(per_chunk, "NT");
  term(constant, "");
  return s.empty() ? "0" : s;
}

bool Program::idle_for(Target t) const { return std::find(idle_on.begin(), idle_on.end(), t) != idle_on.end(); }
bool Buffer::unused_for(Target t) const { return std::find(unused_on.begin(), unused_on.end(), t) != unused_on.end(); }

const Program& LayerIR::program(std::string_view name) const {
  for (const auto& p : programs)
    if (p.name == name) return p;
  throw std::out_of_range(fmt::format("IR of layer '{}' has no program '{}'", spec.name, name));
}

bool LayerIR::has_program(std::string_view name) const {
  return std::any_of(programs.begin(), programs.end(), [&](const Program& p) { return p.name == name; });
}

const Buffer& LayerIR::buffer(std::string_view name) const {
  for (const auto& b : buffers)
    if (b.name == name) return b;
  throw std::out_of_range(fmt::format("IR of layer '{}' has no buffer '{}'", spec.name, name));
}

namespace {

std::vector<std::pair<std::string, std::string>> layer_constants(const Spec& s, int bv) {
  auto b = [](bool v) { return std::string(v ? "true" : "false"); };
  return {
      {"K", std::to_string(s.head_dim_k)},
      {"V", std::to_string(s.head_dim_v)},
      {"H", std::to_string(s.heads_qk)},
      {"HV", std::to_string(s.heads_v)},
      {"G", std::to_string(s.group())},
      {"CHUNK", std::to_string(s.chunk)},
      {"BV", std::to_string(bv)},
      {"HAS_H0", b(s.initial_state == StateFlag::present)},
      {"HAS_HT", b(s.final_state == StateFlag::present)},
      {"NORM", b(s.norm == Norm::l2_in_kernel)},
  };
}

}  // namespace

namespace {

/// cp.segments "auto" on the programs forward. A document's walks are HV x (V / walk slab) blocks,
/// two per SM. Where they fill at most an eighth of the H200's slots, each document is split into
/// up to 16 segments, which shortens its chain for about 2.5x the walk's work (the prescan walks
/// the V and K columns of every segment but one): on the H200 one 32768-token document with 6
/// value heads went from 4.88 to 2.79 ms (fwd+bwd) with 8, 1.927 -> 1.772 ms with 16 (forward 0.688
/// / 0.672, ckpt 2.269 / 2.163), though its walks then take more blocks than the slots. Between an
/// eighth and a half of the slots nothing was measured, and a batch of several long documents fills
/// the GPU without segments while paying their work, so the layer keeps one segment there. Each
/// document then takes segments by its own length only (batch invariance): one per
/// kAutoSegmentMinChunks chunks.
constexpr int kWalkSlots = 2 * 132;
constexpr int kAutoSegmentMinChunks = 32;
constexpr int kAutoSegmentsPrograms = 16;
int auto_segments_programs(int heads_v, int slabs) {
  return kWalkSlots / (heads_v * slabs) >= 8 ? kAutoSegmentsPrograms : 1;
}

/// cp.segments "auto" on the fused forward, whose walks are HV x (V / 128) blocks, one per SM, and
/// whose segments take the verified carry (cp.carry "auto"): a segment whose chain verifies costs
/// the walks a 4-chunk window more, not the prescan's 2.5x. Where one document's walks fill at most a
/// quarter of the SMs, a document takes as many segments as its walks fit in one wave (at most 8),
/// one per kAutoSegmentMinChunksFused chunks: few enough that a batch which fills the GPU unsplit
/// pays little, and the saved maps stay small (24 bytes per token and value head). Measured on an
/// H100 with 4 pinned verified segments: one 32768-token document at heads 16/32 (its 32 walks fill
/// a quarter of the SMs) fwd 1.616 -> 0.820 ms, fwd+bwd 6.417 -> 3.785, ckpt 6.710 -> 4.151; eight
/// 4096-token documents pinned to 4 segments (16 chunks each) ran 36-125 % slower, which the
/// 128-chunk minimum leaves unsplit.
constexpr int kFusedWalkSlots = 132;
constexpr int kAutoSegmentMinChunksFused = 128;
constexpr int kAutoSegmentsFused = 8;
int auto_segments_fused(int heads_v, int slabs) {
  const int walks = heads_v * slabs;
  return walks * 4 <= kFusedWalkSlots ? std::min(kAutoSegmentsFused, kFusedWalkSlots / walks) : 1;
}

/// forward "auto". The fused walk is one chain per (document, value head, 128 columns) and runs one
/// block per SM; the programs path splits a document's walk into narrower slabs and runs the output
/// chunk-parallel. Measured on the H200 (docs/PERF.md): with 48 value heads the fused forward is about
/// twice as fast (M 1.25 against 2.47 ms), with 6 it is slower on short documents (N 0.225 against
/// 0.197 ms). The choice depends on the layer alone (it changes o's roundings, so it must not depend
/// on the batch): fused when one document's fused walks number kAutoFusedMinWalks or more.
constexpr int kAutoFusedMinWalks = 16;
int fused_walks_per_document(const Spec& s) { return s.heads_v * (s.head_dim_v / FusedWalkGeometry::kBV); }
ForwardPath auto_forward(const Spec& s) {
  return fused_walks_per_document(s) >= kAutoFusedMinWalks ? ForwardPath::fused : ForwardPath::programs;
}

}  // namespace

LayerIR lower(const Spec& spec_in) {
  validate(spec_in);
  LayerIR ir;
  ir.spec = spec_in;
  if (spec_in.forward == ForwardPath::automatic) {
    ir.forward_auto = true;
    ir.spec.forward = auto_forward(spec_in);
  }
  if (spec_in.cp_ranks > 1) {
    // The single-GPU proxy of context parallelism: the pieces between rank boundaries are the
    // segments (at most one per rank of a document), at pinned slots.
    ir.spec.cp_segments = spec_in.cp_ranks;
  } else if (spec_in.cp_segments == 0) {
    const int bv =
        spec_in.walk_slab != 0 ? spec_in.walk_slab : StateWalkGeometry::auto_bv(spec_in.head_dim_v, spec_in.heads_v);
    ir.segments_auto = true;
    const bool fused = ir.spec.forward == ForwardPath::fused;
    ir.spec.cp_segments = fused ? auto_segments_fused(spec_in.heads_v, spec_in.head_dim_v / FusedWalkGeometry::kBV)
                                : auto_segments_programs(spec_in.heads_v, spec_in.head_dim_v / bv);
    ir.seg_min_chunks = ir.spec.cp_segments == 1 ? 0 : fused ? kAutoSegmentMinChunksFused : kAutoSegmentMinChunks;
  }
  // A segmented walk's grid has value heads x segments on y (seg::grid_position); the proxy's
  // segments are its ranks.
  if (const int64_t rows = int64_t{ir.spec.heads_v} * ir.spec.cp_segments; ir.spec.cp_segments > 1 && rows > 65535) {
    const bool ranked = spec_in.cp_ranks > 1;
    throw SpecError(ranked ? "/cp/ranks" : "/cp/segments",
                    fmt::format("{} {} x {} value heads = {} exceeds the walk grid's y limit 65535",
                                ranked ? "cp.ranks" : "cp.segments", ir.spec.cp_segments, ir.spec.heads_v, rows));
  }
  const Spec& s = ir.spec;
  ir.decisions = {s.save_mode, s.reuse_recompute_tapes, s.determinism, s.graph, s.save_mode == SaveMode::light};
  const int K = s.head_dim_k, V = s.head_dim_v, C = s.chunk, H = s.heads_qk, HV = s.heads_v;
  const bool norm = s.norm == Norm::l2_in_kernel;
  ir.walk_bv = s.walk_slab != 0 ? s.walk_slab : StateWalkGeometry::auto_bv(V, HV);
  const bool wgmma = s.tensor_cores == TensorCores::automatic;
  ir.walk_bwd_bv = s.walk_bwd_slab != 0 ? s.walk_bwd_slab : StateWalkBwdGeometry::auto_bv(K, V, C, HV, wgmma);
  // The prescan keeps the portable body: 128-wide slabs would only halve its blocks.
  const int prescan_bwd_bv = ir.walk_bwd_bv == 128 ? StateWalkBwdGeometry::bv(V) : ir.walk_bwd_bv;

  auto add = [&](std::string name, std::string path, std::string cls, std::string params, int threads, int smem,
                 GridKind grid, int bv = 0, int min_blocks = 1) {
    ir.programs.push_back(Program{std::move(name), std::move(path), std::move(cls), std::move(params),
                                  layer_constants(s, bv), threads, min_blocks, smem, grid});
  };
  add("chunk_table", "prep/chunk_table.cuh", "ChunkTable", "ChunkTableParams", ChunkTableGeometry::kThreads,
      ChunkTableGeometry::smem_bytes(), GridKind::single);
  ir.programs.back().constants.emplace_back("RANKS", std::to_string(s.cp_ranks));
  if (norm)
    add("l2norm", "prep/l2norm.cuh", "L2Norm", "L2NormParams", L2NormGeometry::kThreads, L2NormGeometry::smem_bytes(),
        GridKind::rows_qk);
  add("gate_cumsum", "prep/gate_cumsum.cuh", "GateCumsum", "GateCumsumParams", GateCumsumGeometry::kThreads,
      GateCumsumGeometry::smem_bytes(), GridKind::chunk_head_groups);
  const bool fused = s.forward == ForwardPath::fused;
  // The fused forward folds the L2 norm into its products (raw q and k, their rows' rstd in fp32):
  // it writes no normalized copy, the backward makes its own.
  const bool fold_rstd = fused && norm;
  ir.recompute_output_tapes = fused && s.save_mode == SaveMode::light && s.reuse_recompute_tapes != ReuseTapes::no;
  const std::pair<std::string, std::string> fold_constant{"FOLD_RSTD", fold_rstd ? "true" : "false"};
  add("chunk_solve", "fwd/chunk_solve.cuh", "ChunkSolve", "ChunkSolveParams", ChunkSolveGeometry::kThreads,
      ChunkSolveGeometry::kSmemBytes, GridKind::chunk_heads, 0, ChunkSolveGeometry::kMinBlocks);
  ir.programs.back().constants.push_back(fold_constant);
  add("chunk_prep", "fwd/chunk_prep.cuh", "ChunkPrep", "ChunkPrepParams", ChunkPrepGeometry::kThreads,
      ChunkPrepGeometry::smem_bytes(K, V, C), GridKind::chunk_heads, 0, ChunkPrepGeometry::kMinBlocks);
  // U feeds state_walk and the segments' prescan; the fused walks take raw v, so without segments
  // the fused path's chunk_prep writes W alone (for the reverse walk).
  const bool writes_u = !fused || s.cp_segments > 1;
  ir.programs.back().constants.emplace_back("WRITES_U", writes_u ? "true" : "false");
  // backward_w "walk": the reverse walk's sm_90a body forms W from Tm itself, so chunk_prep, whose
  // only reader on that path is that walk, idles on sm_90a. chunk_prep forms W the same way on
  // every path (Tm's columns scaled in the A operand), so the portable walk, the prescans and the
  // programs forward read the walk's bits and the choice moves work only.
  // With segments the prescan reads chunk_prep's W; under the verified carry it walks only the
  // chains the reverse walks mark, so on sm_90a the walks form W there too and chunk_prep_marked
  // makes the marked chains' after them.
  const bool walk_bwd_sm90 = StateWalkBwdGeometry::sm90_body(K, V, C, ir.walk_bwd_bv, wgmma);
  // cp.carry "auto" (docs/algorithm.md 4.7) takes the verified carry on one rank where it was
  // measured: the programs forward with the portable reverse walk, and the fused forward (its
  // speculate and verify walks, docs/design_fused_fwd_sm90.md 3.11.1) with either reverse walk. On
  // the programs forward with the reverse walk's sm_90a body (ReverseCarry, common/segments.cuh) it
  // is opt-in until measured on a GPU. cp.ranks > 1 is refused with the spec. Decided before
  // backward_w, which it lets the sm_90a reverse walk take.
  if (s.cp_carry == SegmentCarry::automatic) {
    ir.carry_auto = true;
    ir.spec.cp_carry = s.cp_segments > 1 && s.cp_ranks == 1 && (fused || !walk_bwd_sm90) ? SegmentCarry::verified
                                                                                         : SegmentCarry::merge;
    ir.carry_auto_facts = fmt::format("{} segment{}, {} rank{}, the {} forward, the {} backward walk", s.cp_segments,
                                      s.cp_segments == 1 ? "" : "s", s.cp_ranks, s.cp_ranks == 1 ? "" : "s",
                                      fused ? "fused" : "programs", walk_bwd_sm90 ? "sm_90a" : "portable");
  }
  const bool verified_segments = s.cp_segments > 1 && s.cp_carry == SegmentCarry::verified;
  const bool walk_can_fuse_w = fused && (s.cp_segments == 1 || verified_segments) && s.cp_ranks == 1 && walk_bwd_sm90;
  if (s.backward_w == BackwardW::automatic) {
    ir.backward_w_auto = true;
    ir.spec.backward_w = walk_can_fuse_w ? BackwardW::walk : BackwardW::chunk_prep;
  }
  const bool walk_fuses_w = s.backward_w == BackwardW::walk;
  if (walk_fuses_w && !walk_can_fuse_w)
    throw SpecError(
        "/backward_w",
        fmt::format("\"walk\" needs the fused forward (here {}), one rank and either no segments or cp.carry "
                    "\"verified\" (cp.ranks {}, cp.segments {}, cp.carry {}) and the reverse walk's sm_90a body "
                    "(tensor_cores \"auto\", 128-wide slabs, K = V = 128; here {}, slab {})",
                    to_string(s.forward), s.cp_ranks, s.cp_segments, to_string(s.cp_carry), to_string(s.tensor_cores),
                    ir.walk_bwd_bv));
  // walk_bwd_layout "fused" runs every reverse walk of the verified carry in its body (speculate,
  // verify and the marked chains' walk), so it takes segments there; the merge carry's segmented
  // walk would need the reverse walk's transitions, which the fused body does not form.
  // "auto" takes "fused" exactly where a pinned "fused" would be accepted.
  const bool layout_can_fuse = walk_fuses_w && s.cp_ranks == 1 && (s.cp_segments == 1 || verified_segments);
  if (s.walk_bwd_layout == WalkBwdLayout::automatic) {
    ir.walk_bwd_layout_auto = true;
    ir.spec.walk_bwd_layout = layout_can_fuse ? WalkBwdLayout::fused : WalkBwdLayout::split;
  }
  const bool walk_fused = s.walk_bwd_layout == WalkBwdLayout::fused;
  if (walk_fused && !layout_can_fuse)
    throw SpecError("/walk_bwd_layout",
                    fmt::format("\"fused\" needs the reverse walk's sm_90a body forming W (backward_w \"walk\": "
                                "here {}), one rank (cp.ranks {}) and one segment or cp.carry \"verified\" "
                                "(cp.segments {}, cp.carry {})",
                                to_string(ir.spec.backward_w), s.cp_ranks, s.cp_segments, to_string(s.cp_carry)));
  // With segments the forward's prescan reads chunk_prep's W and U on every target.
  if (walk_fuses_w && s.cp_segments == 1) ir.programs.back().idle_on.push_back(Target::sm_90a);
  // Intra-card segments (cp.segments > 1): the prescan and the merge run before the walk, which
  // then walks every segment of every document as its own block.
  const int segments = s.cp_segments;
  const std::pair<std::string, std::string> seg_constant{"SEGMENTS", std::to_string(segments)};
  const std::pair<std::string, std::string> seg_min_constant{"SEG_MIN_CHUNKS", std::to_string(ir.seg_min_chunks)};
  // Every program that walks or merges segments reads the same two constants.
  const std::pair<std::string, std::string> ranks_constant{"RANKS", std::to_string(s.cp_ranks)};
  auto add_segment_constants = [&] {
    ir.programs.back().constants.push_back(seg_constant);
    ir.programs.back().constants.push_back(seg_min_constant);
    ir.programs.back().constants.push_back(ranks_constant);
  };
  // With intra-card segments on one rank the forward's per-segment maps (S_ext | M) are saved:
  // the backward's transition of a segment is the forward's transposed (A = M^T), so its prescan
  // walks dZ_ext alone and its merge reads M from the saved maps. The forward prescan then
  // computes M for a document's last segment too. A rank of a context-parallel run exchanges
  // its own backward records (dZ_ext | A) and keeps the old split. The verified carry
  // (docs/algorithm.md 4.7) saves the maps of the chains its forward merges and keeps the split
  // for the backward's other marked chains (common/segments.cuh, reverse_chain_mark).
  ir.verified_carry = segments > 1 && s.cp_carry == SegmentCarry::verified;
  ir.saved_segment_maps = segments > 1 && s.cp_ranks == 1;
  // Under the verified carry the backward prescan may walk a chain's transitions itself: its grid
  // and shared memory keep room for them.
  const bool prescan_bwd_walks_maps = !ir.saved_segment_maps || ir.verified_carry;
  const std::pair<std::string, std::string> saved_maps_constant{"SAVED_MAPS", ir.saved_segment_maps ? "true" : "false"};
  // The verified carry's programs and the walks, prescans and merges it gates read VERIFIED_CARRY
  // (common/segments.cuh).
  auto add_carry_constant = [&] {
    if (ir.verified_carry) ir.programs.back().constants.emplace_back("VERIFIED_CARRY", "true");
  };
  if (ir.verified_carry && !fused) {  // the fused path's own are below
    for (const char* name : {"walk_speculate", "walk_verify"}) {
      add(name, "fwd/state_walk.cuh", name == std::string("walk_speculate") ? "StateWalkSpeculate" : "StateWalkVerify",
          "StateWalkParams", StateWalkGeometry::kThreads, StateWalkGeometry::smem_bytes_bv(K, C, ir.walk_bv),
          GridKind::walk_segments, ir.walk_bv);
      add_segment_constants();
      add_carry_constant();
    }
  }
  if (segments > 1) {
    add("walk_prescan", "fwd/state_walk.cuh", "StateWalkPrescan", "StateWalkParams", StateWalkGeometry::kThreads,
        StateWalkGeometry::prescan_smem_bytes_bv(K, C, ir.walk_bv), GridKind::walk_prescan, ir.walk_bv);
    add_segment_constants();
    ir.programs.back().constants.push_back(saved_maps_constant);
    add_carry_constant();
    add("walk_merge", "fwd/walk_merge.cuh", "WalkMerge", "WalkMergeParams", WalkMergeGeometry::kThreads, 0,
        GridKind::walk_merge);
    add_segment_constants();
    add_carry_constant();
  }
  if (!fused) {
    add("state_walk", "fwd/state_walk.cuh", "StateWalk", "StateWalkParams", StateWalkGeometry::kThreads,
        StateWalkGeometry::smem_bytes_bv(K, C, ir.walk_bv), segments > 1 ? GridKind::walk_segments : GridKind::walk,
        ir.walk_bv);
    add_segment_constants();
    add_carry_constant();
  }
  if (fused) {
    // With wgmma (sm_90a) the walk is warp-specialized: setmaxnreg moves registers from the loading
    // and scoring warpgroups to the walking ones, which needs the entry's count pinned (128 = 512
    // threads, one block per SM). The same walk leaves the backward's tapes: with the output under
    // full saves, alone (walk_tape: no Q, no P, no O) for a recompute or a light backward, so the
    // tapes have one set of roundings in every call form.
    auto add_fused_walk = [&](const char* name, const char* cls, bool output, bool tapes) {
      add(name, "fwd/fused_walk.cuh", cls, "FusedWalkParams", FusedWalkGeometry::kThreads,
          FusedWalkGeometry::smem_bytes(K, C), segments > 1 ? GridKind::walk_segments : GridKind::walk,
          FusedWalkGeometry::kBV, FusedWalkGeometry::kMinBlocks);
      add_segment_constants();
      ir.programs.back().constants.emplace_back("WGMMA", wgmma ? "true" : "false");
      ir.programs.back().constants.push_back(fold_constant);
      ir.programs.back().constants.emplace_back("OUTPUT", output ? "true" : "false");
      ir.programs.back().constants.emplace_back("TAPES", tapes ? "true" : "false");
      add_carry_constant();
      if (wgmma) {
        ir.programs.back().max_registers = 65536 / (FusedWalkGeometry::kThreads * FusedWalkGeometry::kMinBlocks);
        // Whole chunks arrive by TMA (FusedWalkSm90Layout's operand order).
        using P = FusedWalkParams;
        auto& maps = ir.programs.back().tensor_maps;
        maps.push_back({"k", offsetof(P, k), offsetof(P, T), int64_t{H} * K});
        maps.push_back({"v", offsetof(P, v), offsetof(P, T), int64_t{HV} * V});
        maps.push_back({"tm", offsetof(P, tm), offsetof(P, T), int64_t{HV} * C});
        if (output) {
          maps.push_back({"q", offsetof(P, q), offsetof(P, T), int64_t{H} * K});
          maps.push_back({"o", offsetof(P, o), offsetof(P, T), int64_t{HV} * V});  // stored
        } else {  // walk_tape stores its tapes from the staging tiles (K x 64 boxes of the h tape)
          maps.push_back({"h_tape", offsetof(P, h_tape), offsetof(P, nt_max), V, int64_t{HV} * K, 128, 4});
          maps.push_back({"v_new", offsetof(P, v_new), offsetof(P, T), int64_t{HV} * V});
        }
      }
    };
    // The verified carry: the speculative walk and the verify walk of each, the output's (with
    // the saved tapes under full saves, or a recompute's to hand over) and the tapes' alone (a
    // recompute without the output). The output walks' tape stores run where the call binds the
    // tapes, except the speculative walk's: compiled in, they made the light forward's hottest
    // walk spill 68 bytes instead of 16 (sm_90a, heads 16/32), so a recompute that hands its tapes
    // over has a speculative walk of its own (fused_speculate_tapes).
    const bool full = s.save_mode == SaveMode::full;
    const bool output_tapes = full || ir.recompute_output_tapes;
    if (ir.verified_carry) {
      add_fused_walk("fused_speculate", "FusedWalkSpeculate", true, full);
      if (ir.recompute_output_tapes) add_fused_walk("fused_speculate_tapes", "FusedWalkSpeculate", true, true);
      add_fused_walk("fused_verify", "FusedWalkVerify", true, output_tapes);
      add_fused_walk("tape_speculate", "FusedWalkSpeculate", false, true);
      add_fused_walk("tape_verify", "FusedWalkVerify", false, true);
    }
    add_fused_walk("fused_walk", "FusedWalk", true, output_tapes);
    add_fused_walk("walk_tape", "FusedWalk", false, true);
  } else
    add("output", "fwd/output.cuh", "Output", "OutputParams", OutputGeometry::kThreads,
        OutputGeometry::smem_bytes(K, V, C), GridKind::chunk_heads, 0, OutputGeometry::kMinBlocks);
  add("dv_local", "bwd/dv_local.cuh", "DvLocal", "DvLocalParams", DvLocalGeometry::kThreads,
      DvLocalGeometry::smem_bytes(K, V, C), GridKind::chunk_heads);
  // The reverse walk's sm_90a body (128-wide slabs) computes dv_local itself; without segments
  // (whose prescan reads it) the program then has nothing to do on sm_90a, where it is neither
  // compiled nor launched (its empty blocks cost 0.018 ms at M). The other targets' walk reads
  // what it writes. Under the verified carry the prescan walks only the chains the reverse walks
  // mark: on sm_90a dv_local_marked makes theirs after those walks (0.44 ms of F1's backward when
  // every chain verifies), and dv_local idles there too.
  const bool marked_dv = walk_bwd_sm90 && ir.verified_carry;
  const bool walk_fuses_dv = walk_bwd_sm90 && (s.cp_segments == 1 || marked_dv);
  ir.programs.back().constants.emplace_back("WALK_FUSES_DV", walk_fuses_dv ? "true" : "false");
  if (walk_fuses_dv) ir.programs.back().idle_on.push_back(Target::sm_90a);
  // The marked-only programs run on sm_90a alone: elsewhere the portable reverse walk reads every
  // chain's dv_local and W, made in full before it.
  auto idle_off_sm90a = [](Program& p) {
    for (Target t : kTargets)
      if (t != Target::sm_90a) p.idle_on.push_back(t);
  };
  // The backward's chunk_prep where the sm_90a walks form W under segments (light saves): the
  // re-run before the walks for the other targets' portable walk (idle on sm_90a), and after the
  // reverse walks on sm_90a the marked chains' W for their prescan (no U: the fused path's
  // backward reads none).
  // The forward's chunk_prep (W and U for the prescan of the chains the forward marks) likewise:
  // on sm_90a chunk_prep_fwd_marked after the verify walks, and chunk_prep idles there (0.38 ms of
  // F1's forward when every chain verifies); the other targets keep the full one before the walks,
  // whose recompute hands every chain's W to the portable reverse walk. Under full saves W is a
  // saved tape: whole on every target.
  if (walk_fuses_w && segments > 1 && s.save_mode == SaveMode::light) {
    const Program prep = ir.program("chunk_prep");
    auto add_marked = [&](const char* name, bool writes_u) {
      ir.programs.push_back(prep);
      Program& marked = ir.programs.back();
      marked.name = name;
      for (auto& [constant, value] : marked.constants)
        if (constant == "WRITES_U") value = writes_u ? "true" : "false";
      add_segment_constants();
      marked.constants.emplace_back("MARKED_CHAINS", "true");
      idle_off_sm90a(marked);
    };
    ir.programs.push_back(prep);
    ir.programs.back().name = "chunk_prep_rerun";
    ir.programs.back().idle_on = {Target::sm_90a};
    add_marked("chunk_prep_marked", false);
    add_marked("chunk_prep_fwd_marked", true);
    for (Program& p : ir.programs)
      if (p.name == "chunk_prep") p.idle_on.push_back(Target::sm_90a);
    // kn likewise (0.09 ms at 32768 tokens and 16 q/k heads): the forward's k launch is a program
    // of its own (l2norm_k, the same code as l2norm) so that it can idle on sm_90a, where
    // l2norm_k_marked makes the marked chains' rows after the verify walks. A recompute that hands
    // its tapes over keeps the full l2norm (the backward reads every row of the handed kn); one
    // whose output is needed hands nothing over and takes the forward's plan.
    if (norm) {
      Program l2norm_k = ir.program("l2norm");
      l2norm_k.name = "l2norm_k";
      ir.programs.push_back(std::move(l2norm_k));
      ir.programs.back().idle_on = {Target::sm_90a};
      add("l2norm_k_marked", "prep/l2norm.cuh", "L2NormMarked", "L2NormMarkedParams", L2NormGeometry::kThreads,
          L2NormGeometry::smem_bytes(), GridKind::chunk_heads);
      add_segment_constants();
      idle_off_sm90a(ir.programs.back());
    }
  }
  if (marked_dv) {
    add("dv_local_marked", "bwd/dv_local.cuh", "DvLocal", "DvLocalParams", DvLocalGeometry::kThreads,
        DvLocalGeometry::smem_bytes(K, V, C), GridKind::chunk_heads);
    add_segment_constants();
    ir.programs.back().constants.emplace_back("WALK_FUSES_DV", "true");
    ir.programs.back().constants.emplace_back("MARKED_CHAINS", "true");
    idle_off_sm90a(ir.programs.back());
  }
  // With segments the backward walk is segmented too: its prescan and merge run before it (under
  // the verified carry, after its own walk from zero and the re-walks, for the marked chains).
  // The reverse walk's programs (state_walk_bwd and, under the verified carry, its speculative and
  // verify walks): 128-wide slabs at K = V = 128 with wgmma run the warp-specialized sm_90a body
  // (setmaxnreg: the entry's register count pinned, as for the fused walk); the other targets run
  // the portable body in the same 512-thread blocks.
  auto add_reverse_walk = [&](const std::string& name, std::string cls, GridKind grid) {
    add(name, "bwd/state_walk_bwd.cuh", std::move(cls), "StateWalkBwdParams",
        StateWalkBwdGeometry::threads(ir.walk_bwd_bv), StateWalkBwdGeometry::smem_bytes_bv(K, C, ir.walk_bwd_bv), grid,
        ir.walk_bwd_bv, StateWalkBwdGeometry::min_blocks_per_sm(ir.walk_bwd_bv));
    add_segment_constants();
    add_carry_constant();
    // The verified carry's walks on the portable body keep the constants (and sources) they had
    // before the sm_90a body ran them.
    if (!walk_bwd_sm90 && name != "state_walk_bwd") return;
    ir.programs.back().constants.emplace_back("WGMMA", wgmma ? "true" : "false");
    ir.programs.back().constants.emplace_back("WALK_FUSES_W", walk_fuses_w ? "true" : "false");
    if (!walk_bwd_sm90) return;
    ir.programs.back().max_registers = 65536 / StateWalkBwdSm90Layout::kThreads;
    // Every reverse walk of the fused layout (the verified carry's speculate and verify walks
    // too) runs the fused body on sm_90a: they write the outputs of the chunks they walk.
    if (walk_fused) {
      // Its source adds chunk_bwd's body to the walk's (the other layouts' sources stay as they are).
      ir.programs.back().template_path = "bwd/walk_bwd_fused_sm90.cuh";
      ir.programs.back().params_type = "StateWalkBwdFusedParams";
      ir.programs.back().constants.emplace_back("WALK_FUSED", "true");
      ir.programs.back().smem_bytes =
          std::max(ir.programs.back().smem_bytes, StateWalkBwdSm90Layout::fu_smem_bytes(K, C));
    }
    // Whole chunks arrive by TMA (StateWalkBwdSm90Layout's operand order); W's place holds Tm when
    // the walk forms W.
    using P = StateWalkBwdParams;
    auto& maps = ir.programs.back().tensor_maps;
    maps.push_back({"k", offsetof(P, k), offsetof(P, T), int64_t{H} * K});
    maps.push_back({"q", offsetof(P, q), offsetof(P, T), int64_t{H} * K});
    maps.push_back(walk_fuses_w ? TensorMapOperand{"tm", offsetof(P, tm), offsetof(P, T), int64_t{HV} * C}
                                : TensorMapOperand{"w", offsetof(P, w), offsetof(P, T), int64_t{HV} * K});
    maps.push_back({"d_o", offsetof(P, d_o), offsetof(P, T), int64_t{HV} * V});
    if (walk_fused) {
      // The fused walk reads the h tape and V' where the others store dh and dV' (the same
      // shapes), then chunk_bwd's V and its stores (WalkBwdFusedSm90's operand order).
      maps.push_back({"h_tape", offsetof(P, h_tape), offsetof(P, nt_max), V, int64_t{HV} * K, 128});
      maps.push_back({"v_new", offsetof(P, v_new), offsetof(P, T), int64_t{HV} * V});
      maps.push_back({"v", offsetof(P, v), offsetof(P, T), int64_t{HV} * V});
      // The outputs' block follows the walk's fields (StateWalkBwdFusedParams).
      using F = WalkBwdFusedOutputs;
      maps.push_back({"dq_v", sizeof(P) + offsetof(F, dq_v), offsetof(P, T), int64_t{HV} * K});
      maps.push_back({"dk_v", sizeof(P) + offsetof(F, dk_v), offsetof(P, T), int64_t{HV} * K});
      maps.push_back({"dv", sizeof(P) + offsetof(F, dv), offsetof(P, T), int64_t{HV} * V});
      return;
    }
    // The walks' stores of whole chunks: dh_tape[c] (K x 64 boxes, nt_max x HV x K rows of V) and
    // dv_new.
    maps.push_back({"dh_tape", offsetof(P, dh_tape), offsetof(P, nt_max), V, int64_t{HV} * K, 128});
    maps.push_back({"dv_new", offsetof(P, dv_new), offsetof(P, T), int64_t{HV} * V});
  };
  if (ir.verified_carry) {
    add_reverse_walk("walk_bwd_speculate", "StateWalkBwdSpeculate", GridKind::walk_segments);
    add_reverse_walk("walk_bwd_verify", "StateWalkBwdVerify", GridKind::walk_segments);
  }
  if (segments > 1) {
    add("walk_bwd_prescan", "bwd/state_walk_bwd.cuh", "StateWalkBwdPrescan", "StateWalkBwdParams",
        StateWalkBwdGeometry::threads(prescan_bwd_bv),
        // With the saved maps the prescan walks dZ_ext alone in the walk's operands: no lo tiles.
        prescan_bwd_walks_maps ? StateWalkBwdGeometry::prescan_smem_bytes_bv(K, C, prescan_bwd_bv)
                               : StateWalkBwdGeometry::portable_smem_bytes_bv(K, C, prescan_bwd_bv),
        prescan_bwd_walks_maps ? GridKind::walk_prescan : GridKind::walk_segments, prescan_bwd_bv,
        StateWalkBwdGeometry::min_blocks_per_sm(prescan_bwd_bv));
    add_segment_constants();
    ir.programs.back().constants.push_back(saved_maps_constant);
    add_carry_constant();
    add("walk_merge_bwd", "fwd/walk_merge.cuh", "WalkMergeBwd", "WalkMergeParams", WalkMergeGeometry::kThreads, 0,
        GridKind::walk_merge);
    add_segment_constants();
    ir.programs.back().constants.push_back(saved_maps_constant);
    add_carry_constant();
  }
  add_reverse_walk("state_walk_bwd", "StateWalkBwd", segments > 1 ? GridKind::walk_segments : GridKind::walk);
  // With wgmma the sm_90a kernel (one product per warpgroup) needs a little more shared memory;
  // the other targets' mma.sync kernel runs within it.
  add("chunk_bwd", "bwd/chunk_bwd.cuh", "ChunkBwd", "ChunkBwdParams", ChunkBwdGeometry::kThreads,
      wgmma ? std::max(ChunkBwdGeometry::smem_bytes(K, V, C), ChunkBwdGeometry::smem_bytes_ws(K, V, C))
            : ChunkBwdGeometry::smem_bytes(K, V, C),
      GridKind::chunk_heads);
  // The template uses wgmma where the target has it (sm_90a) unless the spec asks for mma.sync.
  ir.programs.back().constants.emplace_back("WGMMA", wgmma ? "true" : "false");
  // walk_bwd_layout "fused": the reverse walk runs this body on sm_90a.
  if (walk_fused) ir.programs.back().idle_on.push_back(Target::sm_90a);
  if (wgmma) {
    // Whole chunks arrive by TMA (ChunkBwdSm90's operand order), the state tapes as K x 64 boxes.
    using P = ChunkBwdParams;
    auto& maps = ir.programs.back().tensor_maps;
    maps.push_back({"q", offsetof(P, q), offsetof(P, T), int64_t{H} * K});
    maps.push_back({"k", offsetof(P, k), offsetof(P, T), int64_t{H} * K});
    maps.push_back({"v", offsetof(P, v), offsetof(P, T), int64_t{HV} * V});
    maps.push_back({"dv_new", offsetof(P, dv_new), offsetof(P, T), int64_t{HV} * V});
    maps.push_back({"d_o", offsetof(P, d_o), offsetof(P, T), int64_t{HV} * V});
    maps.push_back({"v_new", offsetof(P, v_new), offsetof(P, T), int64_t{HV} * V});
    maps.push_back({"h_tape", offsetof(P, h_tape), offsetof(P, nt_max), V, int64_t{HV} * K, 128, 4});
    maps.push_back({"dh_tape", offsetof(P, dh_tape), offsetof(P, nt_max), V, int64_t{HV} * K, 128, 4});
    maps.push_back({"tm", offsetof(P, tm), offsetof(P, T), int64_t{HV} * C});
    // Stored from SW128 tiles whose readers are done.
    maps.push_back({"dk_v", offsetof(P, dk_v), offsetof(P, T), int64_t{HV} * K});
    maps.push_back({"dq_v", offsetof(P, dq_v), offsetof(P, T), int64_t{HV} * K});
    maps.push_back({"dv", offsetof(P, dv), offsetof(P, T), int64_t{HV} * V});
  }
  add("finalize", "bwd/finalize.cuh", "Finalize", "FinalizeParams", FinalizeGeometry::kThreads,
      FinalizeGeometry::smem_bytes(K, V, C), GridKind::finalize);
  // backward_norm "in_walk": on sm_90a the fused reverse walk normalizes the raw q and k rows in
  // its shared tiles, so the backward's l2norm launches (qn, kn; and the recompute's kn for the
  // hand-off) are a program of their own that idles there. finalize normalizes its rows itself on
  // every target (its source is the targets' one; the rows it reads are the raw ones everywhere).
  // "auto" is "launches" and stays "auto" in the IR's spec (the default's IR is unchanged).
  if (s.backward_norm == BackwardNorm::in_walk) {
    if (!norm || !walk_fused || segments != 1)
      throw SpecError("/backward_norm",
                      fmt::format("\"in_walk\" needs the in-kernel L2 norm (norm {}), walk_bwd_layout \"fused\" "
                                  "(here {}) and one segment (cp.segments {})",
                                  to_string(s.norm), to_string(s.walk_bwd_layout), segments));
    for (Program& p : ir.programs)
      if (p.name == "state_walk_bwd" || p.name == "finalize") p.constants.emplace_back("RAW_QK", "true");
    Program rows = ir.program("l2norm");
    rows.name = "l2norm_rows";
    rows.idle_on = {Target::sm_90a};
    ir.programs.push_back(std::move(rows));
  }
  // One rank of a context-parallel run: its summary for the all-gather, the gathered ones into
  // the segment slots (docs/design_kcp.md 3.1). The proxy (one process) does not launch it.
  if (s.cp_ranks > 1) {
    add("kcp_exchange", "cp/kcp_exchange.cuh", "KcpExchange", "KcpExchangeParams", KcpExchangeGeometry::kThreads, 0,
        GridKind::exchange);
    add_segment_constants();
  }

  // Buffers. bf16 = 2 bytes; per-chunk state tapes are NT * HV * K * V.
  const long long qk = 1LL * H * K, hv = HV;
  const long long state = 1LL * HV * K * V * 4;
  auto buf = [&](std::string name, BufferRole role, std::string dtype, std::string shape, ByteFormula bytes,
                 std::vector<CallForm> forms = {}) {
    ir.buffers.push_back(Buffer{std::move(name), role, std::move(dtype), std::move(shape), bytes, std::move(forms)});
  };
  const bool h0 = s.initial_state == StateFlag::present, ht = s.final_state == StateFlag::present;
  buf("q", BufferRole::input, "bf16", "[T, H, K]", {qk * 2});
  buf("k", BufferRole::input, "bf16", "[T, H, K]", {qk * 2});
  buf("v", BufferRole::input, "bf16", "[T, HV, V]", {hv * V * 2});
  buf("g", BufferRole::input, "fp32", "[T, HV]", {hv * 4});
  buf("beta", BufferRole::input, "fp32", "[T, HV]", {hv * 4});
  buf("cu_seqlens", BufferRole::input, "int32|int64", "[N + 1]", {0, 8, 0, 8});
  if (h0) buf("h0", BufferRole::input, "fp32", "[N, HV, K, V]", {0, state});
  buf("do", BufferRole::input, "bf16", "[T, HV, V]", {hv * V * 2});
  if (ht) buf("dht", BufferRole::input, "fp32", "[N, HV, K, V]", {0, state});
  buf("o", BufferRole::output, "bf16", "[T, HV, V]", {hv * V * 2});
  if (ht) buf("ht", BufferRole::output, "fp32", "[N, HV, K, V]", {0, state});
  buf("dq", BufferRole::output, "bf16", "[T, H, K]", {qk * 2});
  buf("dk", BufferRole::output, "bf16", "[T, H, K]", {qk * 2});
  buf("dv", BufferRole::output, "bf16", "[T, HV, V]", {hv * V * 2});
  buf("dg", BufferRole::output, "fp32", "[T, HV]", {hv * 4});
  buf("dbeta", BufferRole::output, "fp32", "[T, HV]", {hv * 4});
  if (h0) buf("dh0", BufferRole::output, "fp32", "[N, HV, K, V]", {0, state});

  const bool full = s.save_mode == SaveMode::full;
  // Light saves keep the state entering each segment, so the backward's re-run walk skips the
  // prescan and the merge (NT / 32 state slots under "auto": a few MB per layer, against 0.3 ms of
  // the L shape's fwd+bwd); a rank of a context-parallel run keeps kcp_entry instead.
  const bool keep_seg_h0 = s.cp_segments > 1 && s.cp_ranks == 1 && !full;
  ir.segment_entries_saved = keep_seg_h0;
  buf("chunks", BufferRole::saved, "ChunkInfo", "[NT]", {0, 0, 16});
  buf("doc_chunk_offset", BufferRole::saved, "int32", "[N + 1]", {0, 4, 0, 4});
  buf("doc_order", BufferRole::saved, "int32", "[N]", {0, 4});
  buf("num_chunks", BufferRole::saved, "int32", "[1]", {0, 0, 0, 4});
  buf("status", BufferRole::saved, "DeviceStatus", "[1]", {0, 0, 0, 24});
  if (norm) {
    if (!fold_rstd) {  // else the backward's workspace holds them (below)
      buf("qn", BufferRole::saved, "bf16", "[T, H, K]", {qk * 2});
      buf("kn", BufferRole::saved, "bf16", "[T, H, K]", {qk * 2});
    }
    buf("rstd_q", BufferRole::saved, "fp32", "[T, H]", {1LL * H * 4});
    buf("rstd_k", BufferRole::saved, "fp32", "[T, H]", {1LL * H * 4});
  }
  buf("gc", BufferRole::saved, "fp32", "[T, HV]", {hv * 4});
  // A rank of a context-parallel run keeps the state entering its first document's local piece,
  // so a recompute or a backward's re-run needs no second all-gather.
  if (s.cp_ranks > 1) buf("kcp_entry", BufferRole::saved, "fp32", "[HV, K, V]", {0, 0, 0, state});
  buf("tm", BufferRole::saved, "bf16", "[T, HV, CHUNK]", {hv * C * 2});
  const BufferRole tape_role = full ? BufferRole::saved : BufferRole::workspace;
  const std::vector<CallForm> both = {CallForm::forward, CallForm::recompute, CallForm::backward};
  const std::vector<CallForm> fwd_only = {CallForm::forward, CallForm::recompute};
  const std::vector<CallForm> bwd_only = {CallForm::backward};
  const std::string seg_shape =
      ir.seg_min_chunks > 0 ? fmt::format("[NT / {}", ir.seg_min_chunks) : std::string("[N * segments");
  auto seg_bytes = [&](long long per_slot) {
    return ir.seg_min_chunks > 0 ? ByteFormula{0, 0, per_slot / ir.seg_min_chunks}
                                 : ByteFormula{0, segments * per_slot};
  };
  // With the folded norm, kn is made where programs of the separate forward read it: chunk_prep's W
  // in a recompute (handed over with the tapes), under full saves and for the prescan (segments),
  // and the backward. Before the tapes, so that a hand-off finds it in place. Full saves keep the
  // forward's (the same launch, so the same bits as the backward's own): the backward then makes
  // none (0.09 ms at M on an H100, for 4096 bytes a token saved).
  if (fold_rstd)
    buf("kn", full ? BufferRole::saved : BufferRole::workspace, "bf16", "[T, H, K]", {qk * 2},
        full ? std::vector<CallForm>{} : both);
  // The verified carry's walks from zero: the state (the backward's: the gradient) after each of a
  // segment's first chunks, for each call form's own walks. Before the tapes: a chain that does
  // not speculate writes none, and the forward's last slot is then one every call writes whole.
  if (ir.verified_carry)
    buf("seg_ckpt", BufferRole::workspace, "fp32", seg_shape + fmt::format(", HV, {}, K, V]", kCarryCheckpoints),
        seg_bytes(state * kCarryCheckpoints), both);
  buf("w", tape_role, "bf16", "[T, HV, K]", {hv * K * 2}, full ? std::vector<CallForm>{} : both);
  buf("h_tape", tape_role, "bf16", "[NT, HV, K, V]", {0, 0, 1LL * HV * K * V * 2},
      full ? std::vector<CallForm>{} : both);
  buf("v_new", tape_role, "bf16", "[T, HV, V]", {hv * V * 2}, full ? std::vector<CallForm>{} : both);
  buf("u", BufferRole::workspace, "bf16", "[T, HV, V]", {hv * V * 2}, full ? fwd_only : both);
  // Before the backward-only slots: a hand-off needs the forward's workspace slots to be a prefix
  // of the backward's.

  if (segments > 1) {
    // Every forward call form runs the prescan and the merge before its walk. A document's last
    // segment has no S_ext to store (nor an M unless the maps are saved), so one slot per
    // segment serves seg_hm and seg_h0: n * segments + segment when pinned; with "auto", only
    // documents of two or more segments take slots, first chunk / min chunks + segment
    // (distinct, below NT / min chunks: templates/common/segments.cuh). The backward's re-run
    // walk (light saves) reads the forward's seg_h0 from the saved region; a rank of a
    // context-parallel run re-runs the prescan and the merge from its saved kcp_entry instead.
    if (ir.saved_segment_maps)
      buf("seg_hm", BufferRole::saved, "fp32", seg_shape + ", HV, K, V + K]", seg_bytes(HV * K * (V + K) * 4));
    else
      buf("seg_hm", BufferRole::workspace, "fp32", seg_shape + ", HV, K, V + K]", seg_bytes(HV * K * (V + K) * 4),
          full ? fwd_only : both);
    if (keep_seg_h0)
      buf("seg_h0", BufferRole::saved, "fp32", seg_shape + ", HV, K, V]", seg_bytes(state));
    else
      buf("seg_h0", BufferRole::workspace, "fp32", seg_shape + ", HV, K, V]", seg_bytes(state), full ? fwd_only : both);
    // The verified carry's marks, per document and value head, whether its chain verified: the
    // forward's saved (the backward merges with the saved maps every chain the forward merged), the
    // backward's in its workspace (below).
    if (ir.verified_carry) buf("fwd_fail", BufferRole::saved, "int32", "[N, HV]", {0, 1LL * HV * 4});
  }
  if (fold_rstd) buf("qn", BufferRole::workspace, "bf16", "[T, H, K]", {qk * 2}, bwd_only);
  buf("dv_local", BufferRole::workspace, "bf16", "[T, HV, V]", {hv * V * 2}, bwd_only);
  buf("dh_tape", BufferRole::workspace, "bf16", "[NT, HV, K, V]", {0, 0, 1LL * HV * K * V * 2}, bwd_only);
  buf("dv_new", BufferRole::workspace, "bf16", "[T, HV, V]", {hv * V * 2}, bwd_only);
  buf("dq_v", BufferRole::workspace, "bf16", "[T, HV, K]", {hv * K * 2}, bwd_only);
  buf("dk_v", BufferRole::workspace, "bf16", "[T, HV, K]", {hv * K * 2}, bwd_only);
  if (segments > 1) {
    // The backward walk's segments: per segment dZ_ext | A = M^T, then the gradient at each
    // segment's end. A document's first segment has no transition to store.
    buf("seg_dzm", BufferRole::workspace, "fp32", seg_shape + ", HV, K, V + K]", seg_bytes(HV * K * (V + K) * 4),
        bwd_only);
    buf("seg_dz", BufferRole::workspace, "fp32", seg_shape + ", HV, K, V]", seg_bytes(state), bwd_only);
    if (ir.verified_carry) buf("seg_fail", BufferRole::workspace, "int32", "[N, HV]", {0, 1LL * HV * 4}, bwd_only);
  }
  // Reuse of dead workspace bytes in the backward (same byte formulas, K == V checked by the
  // spec): U is dead once the walk has formed V' (with a hand-off, the backward never reads
  // it), dv_local once the backward walk has run, W after the backward walk too. With full
  // saves W, h_tape and v_new are saved and U is not in the backward's workspace.
  auto share = [&](const char* name, const char* host) {
    for (Buffer& b : ir.buffers)
      if (b.name == name) b.lives_in = host;
  };
  // walk_bwd_layout "fused" writes dq_v and dk_v in its reverse walks; under the verified carry the
  // marked chains' chunk_prep_marked (W) and dv_local_marked (dv_local, in U) run after the first of
  // them, so there dq_v and dk_v keep slots of their own.
  const bool grads_from_walks = walk_fused && ir.verified_carry;
  if (K == V) {
    if (full) {
      if (!grads_from_walks) share("dq_v", "dv_local");
    } else {
      share("dv_local", "u");
      if (!grads_from_walks) {
        share("dq_v", "w");
        share("dk_v", "u");
      }
      // The re-run forward walk is done with seg_hm and seg_h0 before the backward prescan starts
      // (with a hand-off the backward never reads them). Saved maps and entry states are not the
      // backward's to overwrite: seg_dzm and seg_dz then take slots of their own.
      if (!ir.saved_segment_maps) {
        share("seg_dzm", "seg_hm");
        if (!keep_seg_h0) share("seg_dz", "seg_h0");
      }
    }
  }
  // walk_bwd_layout "fused": on sm_90a the fused reverse walk keeps the gradient's tape and dV' of
  // each chunk in shared memory, and chunk_bwd, their only reader, idles there; the other targets'
  // portable walk and chunk_bwd still pass them through these slots.
  // Full saves keep W for the portable reverse walk; on sm_90a, where the walk forms W itself and
  // chunk_prep idles (one segment), nothing writes or reads it (403 MB at M's 32768 tokens).
  const bool saved_w_idle_on_sm90 = full && walk_fuses_w && segments == 1 && s.cp_ranks == 1;
  // backward_norm "in_walk" with light saves: on sm_90a the workspace's qn and kn are made by
  // l2norm_rows only (it idles there) and read by nothing (the walk and finalize read the raw rows,
  // chunk_prep idles); full saves keep the forward's saved kn.
  const bool rows_idle_on_sm90 = s.backward_norm == BackwardNorm::in_walk && !full;
  for (Buffer& b : ir.buffers)
    if ((walk_fused && (b.name == "dh_tape" || b.name == "dv_new")) || (saved_w_idle_on_sm90 && b.name == "w") ||
        (rows_idle_on_sm90 && (b.name == "qn" || b.name == "kn")))
      b.unused_on.push_back(Target::sm_90a);
  for (const Buffer& b : ir.buffers)
    for (const Buffer& guest : ir.buffers)
      if (!b.unused_on.empty() && guest.lives_in == b.name)
        throw std::logic_error(
            fmt::format("layer '{}': '{}' lives in '{}', which some targets leave out", s.name, guest.name, b.name));
  // With cp.ranks R every rank boundary inside a document starts a piece chunked from its own first
  // token: at most R - 1 chunks more than T / chunk + N (ir.extra_chunks, which NT includes).
  ir.extra_chunks = s.cp_ranks - 1;
  for (Buffer& b : ir.buffers) b.bytes.constant += b.bytes.per_chunk * ir.extra_chunks;

  // Call forms. The recompute is the forward a checkpointed step runs in its backward phase: it
  // may skip the output, and with light saves it may hand its tapes to the backward, which then
  // skips the re-run (docs/runtime.md).
  std::vector<Launch> fwd = {{"chunk_table", "cu_seqlens -> chunks, checked on the device"}};
  if (norm && fold_rstd) {
    fwd.push_back({"l2norm", "q: the rows' rstd only (folded into the fused products)"});
    if (ir.has_program("l2norm_k_marked"))
      fwd.push_back({"l2norm_k", "k: kn for the prescan's W; nothing on sm_90a (l2norm_k_marked)"});
    else if (segments > 1 || full)
      fwd.push_back({"l2norm", full ? "k: kn saved, for W and the backward (the rows' rstd come from chunk_solve)"
                                    : "k: kn for the prescan's W (the rows' rstd come from chunk_solve)"});
  } else if (norm) {
    fwd.push_back({"l2norm", "q"});
    fwd.push_back({"l2norm", "k"});
  }
  fwd.push_back({"gate_cumsum", ""});
  // Under the verified carry (the fused path's: the programs path lists its own) they work for
  // the marked chains only.
  auto push_segment_programs = [&](std::vector<Launch>& launches, const std::string& when) {
    if (segments <= 1) return;
    launches.push_back({"walk_prescan",
                        ir.verified_carry ? "S_ext of every segment but a document's last and M of every one (saved "
                                            "for the backward), marked chains"
                        : ir.saved_segment_maps
                            ? "S_ext of every segment but a document's last, M of every one (saved for the backward)"
                            : "S_ext and M of every segment but a document's last",
                        when});
    launches.push_back({"walk_merge",
                        ir.verified_carry ? "the state entering every segment of a marked chain, fp32"
                                          : "the state entering every segment, fp32",
                        when});
  };
  fwd.push_back({"chunk_solve", fold_rstd ? "Tm, and the rows' rstd of k from K K^T's diagonal" : "Tm"});
  std::vector<Launch> rec = fwd;
  // A recompute that hands its tapes over makes every row of kn (the backward reads them all);
  // with recompute_output_tapes one whose output is needed hands them over too.
  const std::string tapes_when = ir.recompute_output_tapes ? "" : "the output is not needed";
  for (size_t i = 0; i < rec.size(); ++i)
    if (rec[i].program == "l2norm_k") {
      if (ir.recompute_output_tapes) {
        rec[i] = {"l2norm", "k: kn for the prescan's W and the hand-off"};
        break;
      }
      rec[i].when = "the output is needed";
      rec.insert(rec.begin() + static_cast<long>(i),
                 {"l2norm", "k: kn for the prescan's W and the hand-off", "the output is not needed"});
      break;
    }
  const bool norm_in_walk = s.backward_norm == BackwardNorm::in_walk;
  const std::string in_walk_note = "; nothing on sm_90a: the fused reverse walk and finalize normalize the raw rows";
  if (fold_rstd && segments <= 1 && !full)
    rec.insert(rec.begin() + 2, {norm_in_walk ? "l2norm_rows" : "l2norm",
                                 "k: kn for chunk_prep's W and the hand-off (the rows' rstd come from chunk_solve)" +
                                     (norm_in_walk ? in_walk_note : std::string()),
                                 tapes_when});
  if (fused) {
    // The fused forward of light saves leaves no tapes. A recompute whose output is not needed runs
    // the walk without it (walk_tape), so the backward can bind its tapes (the hand-off); it leaves
    // ht as the forward wrote it. One whose output is needed (torch.utils.checkpoint's, whose
    // recomputed o later operations of the region read) runs the fused forward with the tapes
    // beside o, the full saves' walks, and hands them over as well (recompute_output_tapes;
    // nothing with reuse_recompute_tapes false). With segments, the prescan (on W and U) and the
    // merge give the state entering each segment. With full saves the fused walk writes the saved
    // tapes beside o (the same roundings as walk_tape's), so full and light keep the same bits.
    // chunk_prep's W serves the backward's reverse walk.
    // The verified carry's speculative and verify walks, before the merge path of the chains
    // they mark (prescan, merge, the walk again), as on the programs path.
    auto push_verified = [&](std::vector<Launch>& launches, bool output, const std::string& when,
                             bool handoff = false) {
      if (!ir.verified_carry) return;
      const std::string what = output ? (full      ? "o and the saved tapes"
                                         : handoff ? "o and the tapes to hand over"
                                                   : "o")
                                      : "the tapes";
      launches.push_back({output ? (handoff ? "fused_speculate_tapes" : "fused_speculate") : "tape_speculate",
                          what +
                              " of every segment, a document's first from h0, the others from 0; the states "
                              "after their first chunks; each segment's end as the next one's entry (seg_h0)" +
                              std::string(output ? ", ht" : "") +
                              "; chains whose gates decay too slowly are marked (seg_fail) and skipped",
                          when});
      launches.push_back({output ? "fused_verify" : "tape_verify",
                          fmt::format("every later segment from its entry over its first {} chunks, {} again; a "
                                      "chain none of whose windows meets the walk from 0 bit for bit is marked",
                                      kCarryCheckpoints, what),
                          when});
      if (output && !handoff && ir.has_program("l2norm_k_marked"))
        launches.push_back({"l2norm_k_marked", "on sm_90a, kn of the marked chains (for their W and prescan)", when});
      if (ir.has_program("chunk_prep_fwd_marked"))
        launches.push_back(
            {"chunk_prep_fwd_marked", "on sm_90a, W and U of the marked chains (for their prescan)", when});
    };
    const char* prep_note = ir.has_program("chunk_prep_fwd_marked")
                                ? "W, U from Tm for the prescan; nothing on sm_90a (chunk_prep_fwd_marked)"
                                : "W, U from Tm for the prescan";
    const std::string marked = ir.verified_carry ? " of the marked chains" : "";
    if (segments > 1) {
      fwd.push_back({"chunk_prep", full ? "W, U from Tm for the prescan; W saved" : prep_note});
      push_verified(fwd, true, "");
      push_segment_programs(fwd, "");
    } else if (full) {
      fwd.push_back({"chunk_prep", "W from Tm, saved for the backward"});
    }
    const std::string from_entry = segments > 1 ? ", every segment from its entry state" : "";
    fwd.push_back({"fused_walk", full ? "o, ht and the saved tapes (h_tape, v_new)" + marked + from_entry
                                      : "o and ht" + marked + from_entry + "; no tapes"});
    const char* needed = "the output is needed";
    const char* not_needed = "the output is not needed";
    if (full) {  // the tapes alone when the output is not needed
      rec = fwd;
      for (auto& l : rec)
        if (l.program == "fused_walk" || l.program == "fused_speculate" || l.program == "fused_verify") l.when = needed;
      std::vector<Launch> tapes_only;
      push_verified(tapes_only, false, not_needed);
      // Before the prescan: the speculative walks come first, as in the forward.
      auto at = std::find_if(rec.begin(), rec.end(), [](const Launch& l) { return l.program == "walk_prescan"; });
      rec.insert(at, tapes_only.begin(), tapes_only.end());
      rec.push_back({"walk_tape", "h_tape, v_new saved" + marked + "; no o, no ht", not_needed});
    } else {
      if (segments > 1) {
        rec.push_back({"chunk_prep", prep_note});
        push_verified(rec, false, not_needed);
        push_verified(rec, true, needed, ir.recompute_output_tapes);
        push_segment_programs(rec, "");
      } else {
        rec.push_back({"chunk_prep", "W from Tm, handed to the backward if decided", tapes_when});
      }
      rec.push_back({"walk_tape",
                     "h_tape, v_new in the workspace" + marked + ", handed to the backward if decided; no o, no ht",
                     not_needed});
      rec.push_back({"fused_walk",
                     ir.recompute_output_tapes
                         ? "o, ht and h_tape, v_new in the workspace" + marked +
                               ", handed to the backward (where no hand-off will be taken, \"auto\" below the "
                               "target's threshold, the forward's launches instead)"
                         : "o and ht" + marked + "; no tapes, no hand-off",
                     needed});
    }
  } else if (ir.verified_carry) {
    fwd.push_back({"chunk_prep", "W, U from Tm"});
    const std::string tapes = full ? "h_tape, v_new saved" : "h_tape, v_new in the workspace";
    fwd.push_back({"walk_speculate", tapes + " of every segment, a document's first from h0, the others from 0; "
                                             "the states after their first chunks; each segment's end as the next "
                                             "one's entry (seg_h0), ht; chains whose gates decay too slowly are "
                                             "marked (seg_fail) and skipped"});
    fwd.push_back({"walk_verify", fmt::format("every later segment from its entry until its state equals the walk "
                                              "from 0 bit for bit (at most {} chunks, their tapes); else its "
                                              "document's chain is marked (seg_fail)",
                                              kCarryCheckpoints)});
    fwd.push_back(
        {"walk_prescan",
         "S_ext of every segment but a document's last and M of every one (saved for the backward), marked chains"});
    fwd.push_back({"walk_merge", "the state entering every segment of a marked chain, fp32"});
    fwd.push_back({"state_walk", tapes + " and ht of the marked chains, every segment from its merged entry"});
    fwd.push_back({"output", ""});
    rec = fwd;
    rec.back().when = "the output is needed";
    if (!full)
      for (auto& l : rec)
        if (l.program == "walk_speculate" || l.program == "walk_verify" || l.program == "state_walk")
          l.note = "the tapes in the workspace, handed to the backward if decided";
  } else {
    fwd.push_back({"chunk_prep", "W, U from Tm"});
    push_segment_programs(fwd, "");
    fwd.push_back({"state_walk", full ? "h_tape, v_new saved" : "h_tape, v_new in the workspace"});
    fwd.push_back({"output", ""});
    rec = fwd;
    rec.back().when = "the output is needed";
    if (!full) rec[rec.size() - 2].note = "h_tape, v_new in the workspace, handed to the backward if decided";
  }
  ir.call_forms.push_back({CallForm::forward, fwd});
  ir.call_forms.push_back({CallForm::recompute, rec});
  std::vector<Launch> bwd;
  if (fold_rstd) {
    const char* rows = norm_in_walk ? "l2norm_rows" : "l2norm";
    const std::string note = norm_in_walk ? in_walk_note : std::string();
    bwd.push_back({rows, "qn (the forward folded the norm)" + note});
    if (!full) bwd.push_back({rows, "kn (a hand-off brings it)" + note, "no fresh hand-off"});
  }
  const bool marked_prep = ir.has_program("chunk_prep_marked");
  if (!full) {
    if (marked_prep)
      bwd.push_back({"chunk_prep_rerun", "re-run: W, U from the saved Tm for the portable walk; nothing on sm_90a",
                     "no fresh hand-off"});
    else
      bwd.push_back({"chunk_prep",
                     fused ? "re-run: W (and U for a prescan) from the saved Tm" : "re-run: W and U from the saved Tm",
                     "no fresh hand-off"});
    if (!keep_seg_h0) push_segment_programs(bwd, "no fresh hand-off");
    if (fused)
      bwd.push_back({"walk_tape", "re-run: h_tape, v_new (the fused walk's roundings)", "no fresh hand-off"});
    else
      bwd.push_back({"state_walk", "re-run: h_tape, v_new", "no fresh hand-off"});
  }
  bwd.push_back({"dv_local", walk_fuses_dv ? "nothing on sm_90a: state_walk_bwd computes it there" : ""});
  if (ir.verified_carry) {
    // walk_bwd_layout "fused": the three reverse walks below are the fused body on sm_90a.
    const std::string fused_note =
        walk_fused ? "; on sm_90a the fused body, which writes dq_v, dk_v, dv, dg, dbeta of the chunks it walks" : "";
    bwd.push_back({"walk_bwd_speculate",
                   "dh_tape, dv_new of every segment, a document's last from dht, the "
                   "others from 0; the gradients after their last chunks; each segment's "
                   "start as the previous one's end (seg_dz), dh0; chains the forward marked "
                   "(fwd_fail) or whose gates decay too slowly are marked (seg_fail) and skipped" +
                       fused_note});
    bwd.push_back({"walk_bwd_verify", fmt::format("every earlier segment from its end until its gradient equals the "
                                                  "walk from 0 bit for bit (at most {} chunks, their tapes); else "
                                                  "its document's chain is marked (seg_fail){}",
                                                  kCarryCheckpoints, fused_note)});
    if (ir.has_program("dv_local_marked"))
      bwd.push_back({"dv_local_marked", "on sm_90a, the marked chains' dv_local (for their prescan)"});
    if (marked_prep) bwd.push_back({"chunk_prep_marked", "on sm_90a, the marked chains' W (for their prescan)"});
    bwd.push_back({"walk_bwd_prescan",
                   "dZ_ext of every segment but a document's first, marked chains; A = M^T too where the "
                   "forward saved no maps for the chain"});
    bwd.push_back({"walk_merge_bwd",
                   "the gradient at every segment's end of a marked chain, fp32, from dht; A from the "
                   "forward's saved maps for the chains the forward marked"});
    bwd.push_back({"state_walk_bwd", "the marked chains, every segment from its merged end gradient" + fused_note});
  } else if (segments > 1) {
    if (ir.saved_segment_maps) {
      bwd.push_back({"walk_bwd_prescan", "dZ_ext of every segment but a document's first"});
      bwd.push_back({"walk_merge_bwd",
                     "the gradient at every segment's end, fp32, from dht; A = M^T from the "
                     "forward's saved maps"});
    } else {
      bwd.push_back({"walk_bwd_prescan", "dZ_ext and A = M^T of every segment but a document's first"});
      bwd.push_back({"walk_merge_bwd", "the gradient at every segment's end, fp32, from dht"});
    }
  }
  if (!ir.verified_carry) bwd.push_back({"state_walk_bwd", ""});
  bwd.push_back({"chunk_bwd", walk_fused ? "dq/dk per value head (bf16); nothing on sm_90a: the fused reverse walk "
                                           "writes its outputs there"
                                         : "dq/dk per value head (bf16)"});
  bwd.push_back({"finalize", norm ? "group sum + l2norm backward" : "group sum"});
  ir.call_forms.push_back({CallForm::backward, bwd});
  return ir;
}

std::string to_text(const LayerIR& ir) {
  const Spec& s = ir.spec;
  std::string out;
  auto line = [&](std::string l) { out += l + "\n"; };
  line(fmt::format("layer {}: H={} HV={} K={} V={} chunk={} norm={} scale={}", s.name, s.heads_qk, s.heads_v,
                   s.head_dim_k, s.head_dim_v, s.chunk, to_string(s.norm),
                   s.scale ? fmt::format("{}", *s.scale) : std::string("1/sqrt(K)")));
  line(fmt::format("decisions: forward={} save_mode={} handoff={} determinism={} graph={} backward_reruns_prep={}",
                   to_string(s.forward), to_string(ir.decisions.save_mode), to_string(ir.decisions.handoff),
                   ir.decisions.determinism == Determinism::deterministic
                       ? "deterministic"
                       : "nondeterministic (runs the fixed-order kernels: the atomic variant measured slower)",
                   to_string(ir.decisions.graph), ir.decisions.backward_reruns_prep ? "yes" : "no"));
  std::string targets;
  for (Target t : s.targets) targets += (targets.empty() ? "" : ", ") + std::string(to_string(t));
  line(fmt::format("targets: {}", targets));
  if (ir.forward_auto)
    line(
        fmt::format("forward: auto -> {} (fused when one document has {} or more fused walks, value heads x V / "
                    "{}; here {})",
                    to_string(s.forward), kAutoFusedMinWalks, FusedWalkGeometry::kBV, fused_walks_per_document(s)));
  if (ir.backward_w_auto)
    line(fmt::format(
        "backward_w: auto -> {} (the reverse walk forms W where it runs its sm_90a body: fused "
        "forward, one rank, no segments or the verified carry, tensor_cores \"auto\", 128-wide backward slabs, "
        "K = V = 128)",
        to_string(s.backward_w)));
  if (ir.walk_bwd_layout_auto)
    line(fmt::format(
        "walk_bwd_layout: auto -> {} (the fused reverse walk where the reverse walk forms W in its "
        "sm_90a body (backward_w \"walk\"), on one rank, with one segment or the verified carry; "
        "here backward_w {}, {} rank{}, {} segment{}{})",
        to_string(s.walk_bwd_layout), to_string(s.backward_w), s.cp_ranks, s.cp_ranks == 1 ? "" : "s", s.cp_segments,
        s.cp_segments == 1 ? "" : "s", ir.verified_carry ? " under the verified carry" : ""));
  if (s.backward_norm == BackwardNorm::in_walk)
    line(
        "backward_norm: in_walk (on sm_90a the fused reverse walk and finalize read the raw q and k rows and "
        "normalize them from the saved rstd: the backward launches no l2norm there)");
  if (ir.segments_auto) {
    const bool fused = s.forward == ForwardPath::fused;
    const char* why = fused ? "one document's fused walks, value heads x V / 128, fill at most a quarter of the "
                              "132 SMs; as many segments as fit one wave, at most 8"
                            : "one document's walks fill at most an eighth of the GPU";
    line(ir.seg_min_chunks > 0
             ? fmt::format("segments: auto, at most {} per document ({}); a document of nc chunks takes min({}, "
                           "max(1, nc / {})); a call of T tokens launches the walks with min({}, max(1, ceil(T / "
                           "{}) / {})) segment rows, and with 1 (T < {} tokens) leaves out every segment program",
                           s.cp_segments, why, s.cp_segments, ir.seg_min_chunks, s.cp_segments, s.chunk,
                           ir.seg_min_chunks, 2LL * ir.seg_min_chunks * s.chunk - (s.chunk - 1))
             : fmt::format("segments: auto, 1 per document (documents split only where {})", why));
  } else if (s.cp_ranks > 1)
    line(
        fmt::format("ranks: {} on one GPU (the proxy of context parallelism): every document is cut at the rank "
                    "boundaries r T / {} inside it, each piece chunked from its own first token and walked as a "
                    "segment (the prescan and the fp32 merge in piece order, as the ranks would)",
                    s.cp_ranks, s.cp_ranks));
  else if (s.cp_segments > 1)
    line(fmt::format("segments: {} per document (pinned by the spec)", s.cp_segments));
  if (ir.carry_auto)
    line(
        fmt::format("carry: auto -> {} (verified with segments on one rank and either the fused forward or "
                    "the portable backward walk; here {})",
                    to_string(s.cp_carry), ir.carry_auto_facts));
  if (ir.verified_carry)
    line(
        fmt::format("carry: verified (every segment walked from its true entry or from 0 at once, then "
                    "re-walked from its neighbour's end until it equals its walk from 0 bit for bit, at most {} "
                    "chunks, forward and backward: a document whose chains verify has one unsegmented layer's "
                    "bits; the prescans, merges and full walks only for chains that do not, and at once for "
                    "chains whose gates decay a re-walked window by less than 2^{}; the backward merges the "
                    "chains the forward merged with its saved maps)",
                    kCarryCheckpoints, kCarryDecayLog2));
  else if (s.cp_carry == SegmentCarry::verified)
    line("carry: verified (no effect: one segment per document)");
  line("programs:");
  for (const auto& p : ir.programs) {
    std::string consts;
    for (const auto& [k, v] : p.constants) consts += fmt::format("{}{}={}", consts.empty() ? "" : " ", k, v);
    std::string idle;
    for (Target t : p.idle_on) idle += (idle.empty() ? " idle_on=" : ",") + std::string(to_string(t));
    std::string maps;
    for (const TensorMapOperand& m : p.tensor_maps) maps += (maps.empty() ? " tma(sm_90a)=" : ",") + m.name;
    line(fmt::format("  {:<15} {:<24} {}<{}>  threads={}{}{} smem={} grid={}{}{}", p.name, p.template_path,
                     p.class_name, consts, p.threads,
                     p.min_blocks_per_sm > 1 ? fmt::format(" min_blocks={}", p.min_blocks_per_sm) : "",
                     p.max_registers > 0 ? fmt::format(" max_registers={}", p.max_registers) : "", p.smem_bytes,
                     to_string(p.grid), idle, maps));
  }
  line(ir.extra_chunks > 0 ? fmt::format("buffers (bytes with NT = T/chunk + N + {}):", ir.extra_chunks)
                           : std::string("buffers (bytes with NT = T/chunk + N):"));
  for (const auto& b : ir.buffers) {
    std::string forms;
    for (CallForm f : b.forms) forms += (forms.empty() ? " forms=" : ",") + std::string(to_string(f));
    std::string unused;
    for (Target t : b.unused_on) unused += (unused.empty() ? " unused_on=" : ",") + std::string(to_string(t));
    line(fmt::format("  {:<9} {:<16} {:<12} {:<16} bytes={}{}{}{}", to_string(b.role), b.name, b.dtype, b.shape,
                     b.bytes.text(), forms, b.lives_in.empty() ? "" : " lives_in=" + b.lives_in, unused));
  }
  for (const auto& cf : ir.call_forms) {
    line(fmt::format("call {}:", to_string(cf.form)));
    for (const auto& l : cf.launches)
      line(fmt::format("  launch {}{}{}", l.program, l.when.empty() ? "" : " [when " + l.when + "]",
                       l.note.empty() ? "" : "  # " + l.note));
  }
  return out;
}

json to_json(const LayerIR& ir) {
  json progs = json::array();
  for (const auto& p : ir.programs) {
    json c = json::object();
    for (const auto& [k, v] : p.constants) c[k] = v;
    json idle = json::array();
    for (Target t : p.idle_on) idle.push_back(to_string(t));
    json maps = json::array();
    for (const TensorMapOperand& m : p.tensor_maps)
      maps.push_back({{"operand", m.name}, {"row_elements", m.row_elements}});
    progs.push_back({{"name", p.name},
                     {"template", p.template_path},
                     {"class", p.class_name},
                     {"params", p.params_type},
                     {"constants", c},
                     {"threads", p.threads},
                     {"min_blocks_per_sm", p.min_blocks_per_sm},
                     {"max_registers", p.max_registers},
                     {"smem_bytes", p.smem_bytes},
                     {"grid", to_string(p.grid)},
                     {"idle_on", idle},
                     {"tensor_maps_sm90a", maps},
                     {"entry", p.entry()}});
  }
  json bufs = json::array();
  for (const auto& b : ir.buffers) {
    json forms = json::array();
    for (CallForm f : b.forms) forms.push_back(to_string(f));
    bufs.push_back({{"name", b.name},
                    {"role", to_string(b.role)},
                    {"dtype", b.dtype},
                    {"shape", b.shape},
                    {"bytes",
                     {{"per_token", b.bytes.per_token},
                      {"per_doc", b.bytes.per_doc},
                      {"per_chunk", b.bytes.per_chunk},
                      {"constant", b.bytes.constant},
                      {"text", b.bytes.text()}}},
                    {"forms", forms}});
    if (!b.lives_in.empty()) bufs.back()["lives_in"] = b.lives_in;
    if (!b.unused_on.empty()) {
      json targets = json::array();
      for (Target t : b.unused_on) targets.push_back(to_string(t));
      bufs.back()["unused_on"] = targets;
    }
  }
  json forms = json::array();
  for (const auto& cf : ir.call_forms) {
    json ls = json::array();
    for (const auto& l : cf.launches) ls.push_back({{"program", l.program}, {"note", l.note}, {"when", l.when}});
    forms.push_back({{"form", to_string(cf.form)}, {"launches", ls}});
  }
  return {{"spec", to_json(ir.spec)},
          {"decisions",
           {{"forward", to_string(ir.spec.forward)},
            {"save_mode", to_string(ir.decisions.save_mode)},
            {"handoff", to_string(ir.decisions.handoff)},
            {"deterministic", ir.decisions.determinism == Determinism::deterministic},
            {"graph", to_string(ir.decisions.graph)},
            {"backward_reruns_prep", ir.decisions.backward_reruns_prep}}},
          {"walk_bv", ir.walk_bv},
          {"walk_bwd_bv", ir.walk_bwd_bv},
          {"programs", progs},
          {"buffers", bufs},
          {"call_forms", forms}};
}

}  // namespace gdn
