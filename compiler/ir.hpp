/**
 * @file ir.hpp
 * @brief The kernel IR: what a spec lowers to before any source is generated.
 *
 * A LayerIR lists the programs (a template plus the specialization constants), the buffers (with
 * byte formulas in T tokens, N documents and NT chunks), the launch sequence of each call form and
 * the decisions. It is printable (to_text, golden-tested) and serializable (to_json).
 */
#pragma once

#include "compiler/spec.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>

#include <string>
#include <vector>

namespace gdn {

enum class CallForm { forward, recompute, backward };
std::string_view to_string(CallForm);

/// How a program's grid follows from the problem size.
enum class GridKind {
  single,             ///< (1, 1, 1)
  rows_qk,            ///< (ceil(T * H / rows per block), 1, 1)
  chunk_heads,        ///< (NT, HV, 1)
  chunk_head_groups,  ///< (NT, ceil(HV / heads per block), 1)
  walk,               ///< (V / BV, HV, N)
  walk_segments,      ///< (V / BV, HV * segments, N): y = segment row * HV + head (seg::grid_position)
  walk_prescan,       ///< ((V + K) / BV, HV * segments, N)
  walk_merge,         ///< (V / 32, HV, N)
  finalize,           ///< (FinalizeGeometry::grid_x(T, H), 1, 1)
  exchange,           ///< (KcpExchangeGeometry::kBlocks, 1, 1)
};

/// bytes = per_token * T + per_doc * N + per_chunk * NT + constant, with NT = T / chunk + N.
struct ByteFormula {
  long long per_token = 0;
  long long per_doc = 0;
  long long per_chunk = 0;
  long long constant = 0;
  long long eval(long long T, long long N, int chunk) const;
  std::string text() const;
};

enum class BufferRole { input, output, saved, workspace };
std::string_view to_string(BufferRole);

struct Buffer {
  std::string name;
  BufferRole role;
  std::string dtype;
  std::string shape;  ///< symbolic, e.g. "[T, HV, V]"
  ByteFormula bytes;
  std::vector<CallForm> forms;  ///< call forms that use it (workspace slots only)
  /// Workspace only: the earlier slot whose bytes this buffer reuses, because every access to
  /// that slot's value comes before this buffer's first access in every call sequence (empty:
  /// its own slot). tests/test_runtime.cpp proves it from the plans' launches.
  std::string lives_in;
  /// Workspace only: targets on which no program touches it (another body there keeps its values
  /// on chip), so a layer loaded for one of them gives it no bytes; a plan for that target that
  /// still binds it is refused (specialize_for_target). Never a slot that another buffer lives in.
  std::vector<Target> unused_on;
  bool unused_for(Target t) const;
};

/// An operand that a program's sm_90a body loads or stores through a TMA tensor map: a bf16
/// row-major matrix of `rows` x `row_elements`, whose base pointer and row count (an integer of
/// rows_field_bytes times rows_per_unit: T tokens, or nt_max chunks of HV x K state rows) the
/// parameter block holds at the given offsets, moved in boxes of 64 x box_rows elements to and from 128-byte-swizzled
/// tiles. The launcher encodes one map per operand and launch on sm_90a (in this order: the body
/// indexes them) and passes them as the entry's second argument, gdn::TensorMaps.
struct TensorMapOperand {
  std::string name;  ///< the parameter field, e.g. "k"
  uint32_t pointer_offset = 0;
  uint32_t rows_offset = 0;
  int64_t row_elements = 0;
  int64_t rows_per_unit = 1;
  uint32_t box_rows = 64;
  uint32_t rows_field_bytes = 8;  ///< 8: long long, 4: int
};

struct Program {
  std::string name;                                            ///< e.g. "chunk_prep"; the kernel entry is "gdn_" + name
  std::string template_path;                                   ///< relative to templates/, e.g. "fwd/chunk_prep.cuh"
  std::string class_name;                                      ///< e.g. "ChunkPrep"
  std::string params_type;                                     ///< e.g. "ChunkPrepParams"
  std::vector<std::pair<std::string, std::string>> constants;  ///< Cfg members, in order
  int threads = 0;
  int min_blocks_per_sm = 1;  ///< second __launch_bounds__ argument (caps registers) when > 1
  int smem_bytes = 0;
  GridKind grid = GridKind::single;
  /// > 0: the entry is declared __maxnreg__(max_registers) instead of __launch_bounds__, which pins
  /// the per-thread register count the block is launched with: what setmaxnreg's rebalancing
  /// between warpgroups needs. Exclusive with min_blocks_per_sm > 1.
  int max_registers = 0;
  /// Targets on which the program has nothing to do (another program's body there does its work):
  /// it is neither compiled nor launched for them.
  std::vector<Target> idle_on;
  /// Operands its sm_90a body loads by TMA (at most kMaxTensorMaps); when any, the entry takes
  /// gdn::TensorMaps after the parameter block on every target (zeros where no body reads them).
  std::vector<TensorMapOperand> tensor_maps;
  std::string entry() const { return "gdn_" + name; }
  bool idle_for(Target t) const;
};

struct Launch {
  std::string program;
  std::string note;  ///< why or on what, e.g. "q", "tm read back"
  std::string when;  ///< empty: always; else the runtime condition, e.g. "no fresh hand-off"
};

struct CallFormIR {
  CallForm form;
  std::vector<Launch> launches;
};

struct Decisions {
  SaveMode save_mode;
  ReuseTapes handoff;
  Determinism determinism;
  GraphMode graph;
  bool backward_reruns_prep;  ///< light saves: the backward re-runs chunk_prep and the walk
};

struct LayerIR {
  Spec spec;
  Decisions decisions;
  int walk_bv = 0;      ///< V-slab width of the forward state walk
  int walk_bwd_bv = 0;  ///< V-slab width of the backward state walk
  /// cp.segments "auto": spec.cp_segments holds the resolved most per document, and a document of
  /// nc chunks takes min(that, max(1, nc / seg_min_chunks)) (0: pinned, every document the same).
  bool segments_auto = false;
  /// cp.ranks - 1: the chunks the rank boundaries may add to NT = T / chunk + N (every per-chunk
  /// byte formula and grid counts them).
  int extra_chunks = 0;
  /// forward "auto": spec.forward holds the path lower() picked from the layer.
  bool forward_auto = false;
  /// backward_w "auto": spec.backward_w holds the choice lower() made (the walk wherever it can).
  bool backward_w_auto = false;
  /// walk_bwd_layout "auto": spec.walk_bwd_layout holds the choice lower() made ("fused" wherever
  /// the layer can take it).
  bool walk_bwd_layout_auto = false;
  int seg_min_chunks = 0;
  /// Intra-card segments on one rank: the forward's per-segment maps (S_ext | M, seg_hm) are in
  /// the saved region, and the backward takes each segment's transition from them (A = M^T).
  bool saved_segment_maps = false;
  /// cp.carry "verified" with segments (docs/algorithm.md 4.7): walk_speculate and walk_verify run
  /// before the prescan, the merge and the walk, which then work only for the chains that did not
  /// verify (seg_fail); the backward's walk_bwd_speculate and walk_bwd_verify likewise. The
  /// forward's prescan saves the maps of the chains it walks (saved_segment_maps); the backward
  /// takes A from them for the chains that failed the forward's gate test and walks its own
  /// transitions for the others it cannot verify.
  bool verified_carry = false;
  /// cp.carry was "auto": spec.cp_carry holds the choice ("verified" where the layer can take it).
  bool carry_auto = false;
  std::string carry_auto_facts;  ///< what decided it, for the IR's text
  /// Segments on one rank with light saves: the state entering each segment is saved (seg_h0), so
  /// the backward's re-run walk needs no prescan and no merge.
  bool segment_entries_saved = false;
  /// The fused forward with light saves, tapes reusable: a recompute whose output is
  /// needed (torch.utils.checkpoint's) writes the backward's tapes beside o and ht and hands them
  /// over like one without the output. The output walks carry the tape stores (TAPES), and only
  /// that call binds h_tape and v_new; the forward skips them.
  bool recompute_output_tapes = false;
  std::vector<Program> programs;
  std::vector<Buffer> buffers;
  std::vector<CallFormIR> call_forms;

  const Program& program(std::string_view name) const;
  bool has_program(std::string_view name) const;
  const Buffer& buffer(std::string_view name) const;
};

/// Lowers a validated spec. Throws SpecError if the spec is invalid.
LayerIR lower(const Spec&);
std::string to_text(const LayerIR&);
nlohmann::json to_json(const LayerIR&);

}  // namespace gdn
