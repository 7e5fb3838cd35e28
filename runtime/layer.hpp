/**
 * @file layer.hpp
 * @brief The layer API: create a GDN layer from a spec (JIT through the disk cache), ask for
 *        the bytes it needs, run the forward and the backward on caller-held memory.
 *
 * Memory contract. The caller owns three regions: `saved` (lives from a forward to its backward:
 * chunk table, gate cumsum, Tm, rstd and, with full saves, the walk's tapes), and a `workspace`
 * per call (scratch, free after the call returns on its stream). Their sizes come from
 * saved_bytes() and workspace_bytes(); a smaller region is an error, never an overrun.
 * No call synchronizes with the host: cu_seqlens and g are checked on the device, and the verdict
 * is read by check_device_status() at a sync point of the caller's choosing.
 */
#pragma once

#include "cache/cache.hpp"
#include "common/error.hpp"
#include "compiler/ir.hpp"
#include "runtime/cp_partition.hpp"
#include "runtime/driver.hpp"
#include "runtime/graph.hpp"
#include "runtime/launcher.hpp"
#include "runtime/plan.hpp"
#include "runtime/stub.hpp"

#include <functional>
#include <optional>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace gdn {

enum class IndexType { int32, int64 };

struct ProblemShape {
  long long T = 0;  ///< packed tokens
  int N = 0;        ///< documents (cu_seqlens has N + 1 entries)
  /// The caller's bound on every document's tokens, like flash-attn's max_seqlen (0: none). A
  /// forward or recompute checks it on the device (chunk_table; check_device_status() reports a
  /// longer document and the call leaves its outputs unwritten) and, under `cp.segments: "auto"`, launches
  /// its walks with the segment rows such a document needs: none of the segment programs where no
  /// document of the bound can split. The backward reads the forward's chunk table and cannot
  /// check a bound of its own, so it does not use this field: its rows follow T, or, when it binds
  /// a recompute's tapes, the bound that recompute checked on the same saved region. Sizes do not
  /// depend on it.
  long long max_doc_tokens = 0;
};

/// Device pointers. bf16 tensors are raw 16-bit data; all must be 16-byte aligned.
struct LayerInputs {
  const void* q = nullptr;           ///< [T, H, K] bf16
  const void* k = nullptr;           ///< [T, H, K] bf16
  const void* v = nullptr;           ///< [T, HV, V] bf16
  const float* g = nullptr;          ///< [T, HV]
  const float* beta = nullptr;       ///< [T, HV]
  const void* cu_seqlens = nullptr;  ///< [N + 1]
  IndexType cu_type = IndexType::int32;
  const float* h0 = nullptr;  ///< [N, HV, K, V]; required iff the spec has initial_state
  float scale = 0;            ///< 0: the spec's scale (1/sqrt(K) by default)
};

struct LayerOutputs {
  void* o = nullptr;    ///< [T, HV, V] bf16
  float* ht = nullptr;  ///< [N, HV, K, V]; required iff the spec has final_state
};

struct LayerGrads {
  const void* d_o = nullptr;   ///< [T, HV, V] bf16
  const float* dht = nullptr;  ///< [N, HV, K, V] or null (zero)
  void* dq = nullptr;          ///< [T, H, K] bf16
  void* dk = nullptr;
  void* dv = nullptr;   ///< [T, HV, V] bf16
  float* dg = nullptr;  ///< [T, HV]
  float* dbeta = nullptr;
  float* dh0 = nullptr;  ///< [N, HV, K, V]; required iff the spec has initial_state
};

/// How a layer turns a call into launches: a JIT-compiled LLVM host stub per call form, or the
/// interpreter over the same call plan (builds without LLVM, and for comparison).
enum class HostPath { llvm_stub, interpreted };
std::string_view to_string(HostPath);
/// $GDNC_HOST_PATH ("llvm" or "interpreted"; the older GDN_HOST_PATH too) if set, else llvm_stub where LLVM is built
/// in. Throws InputError for any other value of the variable.
HostPath default_host_path();

/// The hand-off rule of a checkpointed step: rows = tokens x value heads on this rank; "auto"
/// hands the recompute's tapes to the backward when rows reach the target's threshold.
long long handoff_threshold_rows(Target);
bool decide_handoff(ReuseTapes, Target, long long rows);

class Layer;

/// The device check's verdict as an error message, or nothing when the inputs were valid. The
/// status block's fields are {code, index, value, expected} (params.cuh: DeviceStatus); passed
/// one by one so this header needs no kernel header. value_heads decodes a gate's t x HV + head.
std::optional<std::string> device_status_error(int code, int index, long long value, long long expected,
                                               int value_heads);

/// A caller-held workspace and its host-side stamp. A recompute that hands off stamps it with
/// the layer, the call count, the stream, the shape and the saved region; the next backward binds
/// the tapes only if all of them still match, i.e. nothing else ran on this workspace in between,
/// no forward or recompute wrote the saved region since (on any workspace), and the backward is
/// on the same stream and saved region. Not thread-safe: one workspace per stream of calls.
class Workspace {
 public:
  Workspace(void* data, size_t bytes) : data_(data), bytes_(bytes) {}
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  uint64_t calls() const { return calls_; }

 private:
  friend class Layer;
  struct Stamp {
    uint64_t layer = 0;  ///< Layer::serial(): unlike an address, never reused by a later layer
    uint64_t call = 0;
    CUstream stream = nullptr;
    ProblemShape shape;  ///< with the bound the recompute's chunk_table checked
    const void* saved = nullptr;
    /// The recompute's record of its saved region: a later forward or recompute into the region,
    /// on any workspace, makes the hand-off stale (layer.cpp: PendingHandoffs).
    uint64_t region = 0;
  };
  void* data_;
  size_t bytes_;
  uint64_t calls_ = 0;
  bool has_handoff_ = false;
  Stamp handoff_;
};

enum class OutputNeeded { yes, no };
enum class HandOff { taken, not_taken };

/// Byte offsets of the named slots of one region (256-byte aligned), and each buffer's own bytes
/// (a buffer living in another slot's bytes is listed at that slot's offset).
struct RegionLayout {
  std::map<std::string, size_t> offset;
  std::map<std::string, size_t> size;
  size_t bytes = 0;
};

/// The saved region (CallForm::forward) or a call form's workspace of a lowered layer for one
/// problem shape: a function of the IR alone, so it needs no GPU. On a target, that target's
/// layout (a loaded layer's, without the buffers unused there); without one, a layout that serves
/// the layer on any of its targets. Throws InputError for an invalid shape.
RegionLayout region_layout(const LayerIR&, BufferRole, CallForm, ProblemShape, std::optional<Target> = std::nullopt);

class Layer {
 public:
  /// Lowers the spec, compiles its programs for the context's device (through `cache`) and
  /// loads them. Throws SpecError, CompileError, CudaError, or InputError if the device's
  /// target is not in the spec's targets.
  static std::unique_ptr<Layer> create(const Spec&, const rt::Context&, cache::DiskCache&, int jobs = 4,
                                       HostPath = default_host_path());
  /// A layer whose launches go to `launcher` and that compiles and loads nothing: no GPU needed.
  /// For tests of launch sequences and for planning (sizes, IR).
  static std::unique_ptr<Layer> with_launcher(const Spec&, std::shared_ptr<Launcher> launcher,
                                              HostPath = default_host_path(),
                                              std::shared_ptr<GraphBackend> graphs = nullptr);

  /// Graph mode (graph: "replay"): bounds of this layer's graph cache (resets it).
  void set_graph_cache_limits(GraphCache::Limits);
  struct GraphStats {
    size_t entries, bytes;
    uint64_t captures, replays, evictions;
  };
  GraphStats graph_stats() const;

  /// Calls `observer(program, stream, after)` around every launch this layer makes from now on
  /// (eager launches only; replays of captured graphs are not observed). For per-program timing
  /// in the benchmark; not for production use: it adds host work to every launch.
  using LaunchObserver = std::function<void(const Program&, CUstream, bool after)>;
  void observe_launches(LaunchObserver observer);

  const LayerIR& ir() const { return ir_; }
  HostPath host_path() const { return host_path_; }
  /// Unique per layer object in this process (hand-off stamps name layers by it).
  uint64_t serial() const { return serial_; }
  Target target() const { return target_; }

  RegionLayout saved_layout(ProblemShape) const;
  RegionLayout workspace_layout(CallForm, ProblemShape) const;
  size_t saved_bytes(ProblemShape) const;
  size_t workspace_bytes(CallForm, ProblemShape) const;

  void forward(ProblemShape, const LayerInputs&, const LayerOutputs&, void* saved, size_t saved_size, void* workspace,
               size_t workspace_size, CUstream) const;
  /// `inputs` are the forward's inputs; `saved` is what that forward wrote.
  void backward(ProblemShape, const LayerInputs&, const LayerGrads&, const void* saved, size_t saved_size,
                void* workspace, size_t workspace_size, CUstream) const;

  /// The same calls on a stamped Workspace (every call counts; a forward clears any hand-off).
  void forward(ProblemShape, const LayerInputs&, const LayerOutputs&, void* saved, size_t saved_size, Workspace&,
               CUstream) const;
  /// The forward that a checkpointed step runs in its backward phase. With OutputNeeded::no the
  /// output program is not launched (out.o may be null). Stamps `ws` for the next backward when
  /// decide_handoff() says so and the save mode is light (full saves need no hand-off).
  HandOff recompute(ProblemShape, const LayerInputs&, const LayerOutputs&, OutputNeeded, void* saved, size_t saved_size,
                    Workspace&, CUstream) const;
  /// Binds the recompute's tapes when the stamp is fresh, else re-runs the prep program and the
  /// walk: the same bits either way.
  HandOff backward(ProblemShape, const LayerInputs&, const LayerGrads&, const void* saved, size_t saved_size,
                   Workspace&, CUstream) const;

  /// \name One rank of a context-parallel run (cp.ranks > 1; docs/design_kcp.md 3.1)
  /// The rank's tensors are its own tokens (CpRankView::tokens of them, documents cut as
  /// CpRankView::cu_seqlens, which `inputs.cu_seqlens` must hold on the device); h0, ht, dht and
  /// dh0 have a row per local document, the global document's. Between a summaries phase and its
  /// walk phase the caller all-gathers every rank's record (kcp_record_bytes() each, in rank order)
  /// and leaves the workspace alone. ht is written for the documents that end on this rank and
  /// dh0 for those that start on it; the other rows are left as they are. The results are the
  /// single-GPU proxy's bits (cp.ranks R in one call over the whole batch) for the same partition.
  /// @{
  size_t kcp_record_bytes() const;
  /// Everything before the forward's all-gather: writes this rank's record to `send`.
  void kcp_forward_summaries(const CpRankView&, const LayerInputs&, void* saved, size_t saved_size, void* workspace,
                             size_t workspace_size, void* send, CUstream) const;
  /// The merge over the gathered records, the walk and the output; keeps the entry state in
  /// `saved` for a recompute and the backward.
  void kcp_forward_walk(const CpRankView&, const LayerInputs&, const LayerOutputs&, void* saved, size_t saved_size,
                        void* workspace, size_t workspace_size, const void* gathered, CUstream) const;
  /// A checkpointed step's recompute: no all-gather (the forward kept the entry state).
  HandOff kcp_recompute(const CpRankView&, const LayerInputs&, const LayerOutputs&, OutputNeeded, void* saved,
                        size_t saved_size, Workspace&, CUstream) const;
  /// Everything before the backward's all-gather: writes this rank's record to `send`.
  HandOff kcp_backward_summaries(const CpRankView&, const LayerInputs&, const LayerGrads&, const void* saved,
                                 size_t saved_size, Workspace&, void* send, CUstream) const;
  void kcp_backward_walk(const CpRankView&, const LayerInputs&, const LayerGrads&, const void* saved, size_t saved_size,
                         Workspace&, const void* gathered, CUstream) const;
  /// @}

  /// Synchronizes `stream` and throws InputError if the last forward on `saved` found invalid
  /// cu_seqlens (e.g. "cu_seqlens[3]: 100 < cu_seqlens[2] (200): must be non-decreasing") or a
  /// g that is not a finite log decay (device_status_error says how each is worded).
  void check_device_status(const void* saved, ProblemShape, CUstream stream) const;

 private:
  Layer() = default;
  void make_plans(HostPath);
  struct Compiled {
    CallPlan plan;
    StubFn stub = nullptr;
    uint64_t graph_id = 0;      ///< (layer serial, plan) for graph keys
    bool writes_tapes = false;  ///< the plan runs the forward walk that leaves the backward's tapes
  };
  Compiled compile_plan(CallPlan plan, int id, int index) const;
  /// `possible`, or its DocSplits::none twin when the frame's segment rows are 1.
  const Compiled& for_frame(const Compiled& possible, const Compiled& unsplit, const CallFrame&) const;
  /// A recompute (one rank's too) on its frame: the plan for its output and the hand-off
  /// decision, then the workspace's stamp if the tapes are handed over.
  HandOff recompute_frame(const CallFrame&, ProblemShape, OutputNeeded, void* saved, Workspace&, CUstream) const;
  void run_eager(const Compiled&, const CallFrame&) const;
  void run(const Compiled&, const CallFrame&) const;
  CallFrame forward_frame(ProblemShape, const LayerInputs&, const LayerOutputs&, void* saved, size_t saved_size,
                          void* ws, size_t ws_size, CUstream, OutputNeeded, const CpRankView* = nullptr) const;
  CallFrame backward_frame(ProblemShape, const LayerInputs&, const LayerGrads&, const void* saved, size_t saved_size,
                           void* ws, size_t ws_size, CUstream, const CpRankView* = nullptr) const;
  ProblemShape kcp_shape(const CpRankView&) const;
  void kcp_frame(CallFrame&, const CpRankView&, int entry_mode, const void* send, const void* gathered) const;
  bool handoff_is_fresh(const Workspace&, ProblemShape, CUstream, const void* saved) const;
  RegionLayout region_layout(BufferRole, CallForm, ProblemShape) const;
  CallFrame frame_of(ProblemShape, const LayerInputs&, void* saved, void* ws, CUstream) const;
  void check_common(ProblemShape, const LayerInputs&, size_t saved_size, size_t ws_size, CallForm,
                    const CpRankView*) const;

  LayerIR ir_;
  Target target_ = Target::sm_90a;
  std::shared_ptr<Launcher> launcher_;
  HostPath host_path_ = HostPath::interpreted;
  uint64_t serial_ = 0;
  Compiled forward_;
  Compiled forward_without_output_;
  Compiled recompute_with_output_;  ///< LayerIR::recompute_output_tapes only
  Compiled backward_;
  Compiled backward_with_handoff_;  ///< light saves only
  /// The same without the segment programs, for the calls where no document can take two segments
  /// (has_unsplit_plans: `cp.segments: "auto"` on one rank).
  Compiled forward_unsplit_, forward_without_output_unsplit_, backward_unsplit_, backward_with_handoff_unsplit_;
  Compiled recompute_with_output_unsplit_;
  Compiled kcp_forward_summaries_, kcp_forward_walk_;  ///< cp.ranks > 1
  Compiled kcp_backward_summaries_, kcp_backward_summaries_with_handoff_, kcp_backward_walk_;
  std::shared_ptr<GraphBackend> graph_backend_;  ///< set in graph mode
  mutable std::mutex graph_mutex_;
  mutable std::unique_ptr<GraphCache> graphs_;
  mutable uint64_t captures_ = 0, replays_ = 0;
};

}  // namespace gdn
