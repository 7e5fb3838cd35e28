/**
 * @file plan.hpp
 * @brief Call plans: a call form's launches as data. Each launch names its program, its grid as
 *        formulas in T, N and NT, and every field of its parameter block as a source (a word of
 *        the call frame, a slot of the saved or workspace region, a formula, a constant).
 *
 * Two executors run a plan: the interpreter below, and the LLVM ORC host stub (runtime/stub.hpp)
 * that compiles the same plan into one function. Both must produce byte-identical launches;
 * tests/test_launches.cpp checks that against goldens recorded from the GPU-verified code.
 */
#pragma once

#include "common/error.hpp"
#include "compiler/ir.hpp"
#include "runtime/driver.hpp"

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace gdn {

class Launcher;

/// The 64-bit words of a call frame. Sizes, flags and the scale occupy the low bytes.
enum class Frame : uint8_t {
  T,
  N,
  saved,
  ws,
  q,
  k,
  v,
  g,
  beta,
  cu_seqlens,
  cu_is_int64,
  h0,
  o,
  ht,
  d_o,
  dht,
  dq,
  dk,
  dv,
  dg,
  dbeta,
  dh0,
  scale_bits,
  stream,
  // One rank of a context-parallel run (zero otherwise): docs/design_kcp.md 3.1.
  kcp_rank,
  kcp_local,          ///< 1: T and cu_seqlens are the rank's own tokens
  kcp_pieces_before,  ///< the first document's pieces on earlier ranks
  kcp_pieces_after,   ///< the last document's pieces on later ranks
  kcp_entry_mode,     ///< KcpEntryMode of the forward merge
  kcp_send,           ///< this rank's summary record
  kcp_gathered,       ///< every rank's record, in rank order
  /// The segment rows of this call's segmented walk grids (segment_rows()): as many segments as
  /// its longest possible document can take, so a call of short documents launches no block
  /// that would only exit.
  seg_rows,
  max_doc_tokens,  ///< the caller's bound checked by chunk_table (0: none), at most T
  count
};
inline constexpr int kFrameWords = static_cast<int>(Frame::count);

struct CallFrame {
  std::array<uint64_t, kFrameWords> word{};
  uint64_t& operator[](Frame f) { return word[static_cast<size_t>(f)]; }
  uint64_t operator[](Frame f) const { return word[static_cast<size_t>(f)]; }
};

/// ceil((t*T + n*N + nt*NT + rows*R + c) / div), NT = T / chunk + N, R = Frame::seg_rows. All
/// terms are non-negative.
struct Lin {
  int64_t t = 0, n = 0, nt = 0, c = 0, div = 1, rows = 0;
  int64_t eval(int64_t T, int64_t N, int chunk, int64_t seg_rows = 1) const;
};

enum class RegionKind : uint8_t { saved, ws };

struct ValueSource {
  enum Kind : uint8_t { from_frame, from_slot, from_formula, from_constant } kind = from_constant;
  Frame frame_word = Frame::T;
  RegionKind region = RegionKind::saved;
  int slot = 0;
  Lin formula;
  int64_t value = 0;
  std::string buffer;  ///< from_slot: the buffer bound (its slot may be another buffer's home)
};

struct Field {
  uint32_t offset;
  uint32_t size;  ///< 4 or 8 bytes, little-endian low part of the value
  ValueSource source;
};

/// The largest parameter block of any program: the interpreter and the LLVM host stubs build each
/// launch's block in a buffer of this size (the driver takes up to 4 KB).
inline constexpr uint32_t kMaxParamsBytes = 512;

struct PlannedLaunch {
  int program;           ///< index into LayerIR::programs
  uint32_t params_size;  ///< at most kMaxParamsBytes
  std::array<Lin, 3> grid;
  std::vector<Field> fields;  ///< unlisted bytes are zero
  /// Fields bound otherwise on one target, whose body reads other inputs through the same
  /// parameter bytes (the layer applies them for its own target: specialize_for_target).
  std::vector<std::pair<Target, Field>> target_fields;
};

struct CallPlan {
  std::string name;
  int chunk = 64;
  std::vector<ByteFormula> saved_slots;       ///< in region order (256-byte aligned each)
  std::vector<std::string> saved_slot_names;  ///< the buffer whose home each saved slot is
  std::vector<ByteFormula> ws_slots;
  std::vector<std::string> ws_slot_names;  ///< the buffer whose home each workspace slot is
  std::vector<PlannedLaunch> launches;
  /// A forward's: its walk writes the backward's tapes (state_walk; walk_tape; the fused output
  /// walks where they bind h_tape and v_new), so a recompute running it can hand them over.
  bool leaves_tapes = false;
};

/// The plan as it runs on `target`: the launches of programs idle there (not compiled for it)
/// dropped, the fields the target binds otherwise (PlannedLaunch::target_fields) applied, and the
/// saved and workspace slots of buffers unused there (Buffer::unused_on) taken out (a launch that
/// still binds one is a std::logic_error).
void specialize_for_target(CallPlan& plan, const LayerIR& ir, Target target);

/// Which launches a plan contains.
enum class OutputLaunch { yes, no };  ///< a recompute may skip the output program
enum class PrepRerun { yes, no };     ///< a backward binds handed-off tapes instead
/// DocSplits::none: no document of the call can take two segments (segment_rows() is 1), so the
/// segment programs (prescans, merges, the verified carry's speculate and verify passes) are left
/// out and every walk reads h0 or dht itself. Only for layers with `cp.segments: "auto"` on one
/// rank; the other layers have one plan per call form.
enum class DocSplits { possible, none };

CallPlan plan_forward(const LayerIR&, OutputLaunch, DocSplits = DocSplits::possible);
/// A checkpointed step's recompute: the forward's plan, except that where the IR says so
/// (recompute_output_tapes) one whose output is needed also writes the tapes to hand over.
CallPlan plan_recompute(const LayerIR&, OutputLaunch, DocSplits = DocSplits::possible);
CallPlan plan_backward(const LayerIR&, PrepRerun, DocSplits = DocSplits::possible);

/// Whether a layer has the DocSplits::none plans: `cp.segments: "auto"` (more than one segment at
/// most) on one rank.
bool has_unsplit_plans(const LayerIR&);

/// The segment rows of the segmented walk grids for a call of T tokens whose documents are at
/// most `max_doc_tokens` long (0: unknown, T bounds them): under `cp.segments: "auto"` on one rank
/// min(S, max(1, floor(ceil(L / chunk) / m))) for L = min(T, max_doc_tokens), S the most segments
/// and m seg_min_chunks, which no document of the call can exceed; otherwise every document takes
/// S (1 without segments). Batch invariance holds: the rows only decide which blocks are launched,
/// never what a launched block computes.
int64_t segment_rows(const LayerIR&, int64_t T, int64_t max_doc_tokens = 0);

/// One rank of a context-parallel run (cp.ranks > 1): the forward and the backward cut at their
/// all-gather. `summaries` ends with this rank's record in Frame::kcp_send; `walk` starts by copying
/// the gathered records (Frame::kcp_gathered) into the segment slots, then merges and walks.
enum class KcpPhase { summaries, walk };
CallPlan plan_kcp_forward(const LayerIR&, KcpPhase);
CallPlan plan_kcp_backward(const LayerIR&, PrepRerun, KcpPhase);

/// The slots of the saved region, or of the workspace of one call form, in region order: on one
/// target (a loaded layer's) without the buffers unused there, without a target the layer's slots
/// on any of its targets.
std::vector<std::pair<std::string, ByteFormula>> region_slots(const LayerIR&, BufferRole, CallForm,
                                                              std::optional<Target> = std::nullopt);

/// Bytes of the saved region, or of the workspace of one call form, for a problem size; no GPU
/// needed. A checkpointed step on one workspace needs max(forward, backward). Without a target,
/// enough for the layer on any of its targets. Throws InputError for sizes check_problem_size()
/// refuses.
size_t region_bytes(const LayerIR&, BufferRole, CallForm, int64_t T, int64_t N, std::optional<Target> = std::nullopt);

/// The problem sizes every layer call and size query accepts: T in 1 to 2^31-1 packed tokens,
/// N in 1 to 65535 documents. Inside them no region size can overflow 64 bits. Throws
/// InputError naming T or N.
void check_problem_size(int64_t T, int64_t N);

/// Byte offsets of the slots of one region for this problem size, then the region's total size.
/// Throws InputError for sizes check_problem_size() refuses.
std::vector<uint64_t> slot_offsets(const std::vector<ByteFormula>& slots, int64_t T, int64_t N, int chunk);

/// The interpreted executor: fills each parameter block and hands it to `launcher`.
void run_plan(const CallPlan&, const LayerIR&, const CallFrame&, Launcher& launcher);

}  // namespace gdn
