/**
 * @file layer.cpp
 * @brief Layer creation, region layouts, argument checks, the checkpointed step's hand-off, and
 *        running the call plans (stub or interpreter).
 */
#include "runtime/layer.hpp"

#include "common/env.hpp"
#include "common/json_input.hpp"
#include "compiler/compiler.hpp"
#include "params.cuh"
#include "runtime/cp_partition.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

namespace gdn {

namespace {

template <class T = void>
const T* at(const void* base, const RegionLayout& l, const char* name) {
  return reinterpret_cast<const T*>(static_cast<const char*>(base) + l.offset.at(name));
}

void require_aligned(const void* p, const char* name) {
  if (!p) throw InputError(fmt::format("{}: is null", name));
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0)
    throw InputError(fmt::format("{}: address {} is not 16-byte aligned", name, p));
}

/// Launches on the device through the layer's loaded modules.
class DeviceLauncher final : public Launcher {
 public:
  explicit DeviceLauncher(Target target) : target_(target) {}
  std::map<std::string, rt::Module> modules;
  void launch(const Program& program, rt::dim3_t grid, const void* params, size_t size, CUstream stream) override {
    const rt::Module& module = modules.at(program.name);
    if (program.tensor_maps.empty()) return module.launch_params(grid, stream, params);
    // Only the sm_90a bodies read the maps; the other targets' entries take zeros.
    const TensorMaps maps = target_ == Target::sm_90a ? encode_tensor_maps(program, params, size) : TensorMaps{};
    module.launch_params(grid, stream, params, &maps);
  }

 private:
  Target target_;
};

/// Wraps a launcher and reports each launch to an observer before and after it.
class ObservedLauncher final : public Launcher {
 public:
  ObservedLauncher(std::shared_ptr<Launcher> inner, Layer::LaunchObserver observer)
      : inner_(std::move(inner)), observer_(std::move(observer)) {}
  void launch(const Program& program, rt::dim3_t grid, const void* params, size_t size, CUstream stream) override {
    observer_(program, stream, false);
    inner_->launch(program, grid, params, size, stream);
    observer_(program, stream, true);
  }

 private:
  std::shared_ptr<Launcher> inner_;
  Layer::LaunchObserver observer_;
};

/// The hand-offs pending on each saved region, for the whole process. A recompute that hands off
/// records a fresh serial for its saved region. Any later forward or recompute into that region,
/// of any layer and on any workspace, rewrites its chunk table and drops the record. A backward
/// binds the tapes only while the record is still its stamp's. Host-side only: nothing waits for
/// the device. A record whose backward never comes stays until its region is written again. Past
/// kMaxPending records everything is dropped: those hand-offs fall back to the re-run, with the
/// same bits.
class PendingHandoffs {
 public:
  static PendingHandoffs& instance() {
    static PendingHandoffs p;
    return p;
  }
  void written(const void* saved) {
    std::lock_guard<std::mutex> lock(m_);
    pending_.erase(saved);
  }
  uint64_t handed_off(const void* saved) {
    std::lock_guard<std::mutex> lock(m_);
    if (pending_.size() >= kMaxPending) pending_.clear();
    return pending_[saved] = ++serial_;
  }
  bool pending(const void* saved, uint64_t serial) const {
    std::lock_guard<std::mutex> lock(m_);
    const auto it = pending_.find(saved);
    return it != pending_.end() && it->second == serial;
  }
  void taken(const void* saved) { written(saved); }

 private:
  static constexpr size_t kMaxPending = 1 << 16;
  mutable std::mutex m_;
  std::unordered_map<const void*, uint64_t> pending_;
  uint64_t serial_ = 0;
};

/// One JIT for the process: stubs of every layer live in it (they are a few hundred bytes each).
StubCompiler& stub_compiler() {
  static std::mutex m;
  static std::unique_ptr<StubCompiler> compiler;
  std::lock_guard<std::mutex> lock(m);
  if (!compiler) compiler = StubCompiler::create();
  return *compiler;
}

}  // namespace

std::string_view to_string(HostPath p) { return p == HostPath::llvm_stub ? "llvm" : "interpreted"; }

HostPath default_host_path() {
  std::string var;
  if (const char* e = env_value("HOST_PATH", &var)) {
    const std::string v = e;
    if (v == "interpreted") return HostPath::interpreted;
    if (v == "llvm") {
      if (!stubs_available()) throw InputError(fmt::format("{}: \"llvm\", but this gdnc was built without LLVM", var));
      return HostPath::llvm_stub;
    }
    throw InputError(fmt::format("{}: {} is not supported (supported: \"llvm\", \"interpreted\")", var,
                                 value_excerpt(nlohmann::json(v))));
  }
  return stubs_available() ? HostPath::llvm_stub : HostPath::interpreted;
}

std::unique_ptr<Layer> Layer::with_launcher(const Spec& spec, std::shared_ptr<Launcher> launcher, HostPath path,
                                            std::shared_ptr<GraphBackend> graphs) {
  if (spec.graph == GraphMode::replay && !graphs)
    throw InputError(fmt::format("/graph: \"replay\" needs a graph backend (layer '{}')", spec.name));
  std::unique_ptr<Layer> layer(new Layer());
  if (spec.graph == GraphMode::replay) layer->graph_backend_ = std::move(graphs);
  layer->ir_ = lower(spec);
  layer->target_ = spec.targets.front();
  layer->launcher_ = std::move(launcher);
  layer->make_plans(path);
  return layer;
}

std::unique_ptr<Layer> Layer::create(const Spec& spec, const rt::Context& ctx, cache::DiskCache& cache, int jobs,
                                     HostPath path) {
  std::unique_ptr<Layer> layer(new Layer());
  if (spec.graph == GraphMode::replay) layer->graph_backend_ = device_graph_backend();
  layer->ir_ = lower(spec);
  const int cc = ctx.compute_capability();
  Target target{};
  bool found = false;
  for (Target t : spec.targets)
    if (target_cc(t) == cc) target = t, found = true;
  if (!found)
    throw InputError(fmt::format("device {} is sm_{}, which is not among the targets of layer '{}' (/targets)",
                                 ctx.name(), cc, spec.name));
  layer->target_ = target;
  ctx.make_current();
  auto device = std::make_shared<DeviceLauncher>(target);
  for (const CompiledEntry& e : compile_layer(layer->ir_, {target}, cache, jobs)) {
    const Program& p = layer->ir_.program(e.program);
    device->modules.emplace(p.name,
                            rt::Module::load(e.entry.read_file(kCubinFile), p.entry(), p.threads, p.smem_bytes));
  }
  layer->launcher_ = std::move(device);
  layer->make_plans(path);
  return layer;
}

long long handoff_threshold_rows(Target t) {
  switch (t) {
    // Our light recompute writes its tapes into the workspace in any case, so binding them costs
    // no memory and saves the prep program and the walk: the crossover is at 0 rows. To be
    // confirmed with the ckpt benchmark on the H200 (docs/runtime.md).
    case Target::sm_90a: return 0;
    case Target::sm_100a: return 61440;  // FlashInfer's GDN package's value, until measured here
    case Target::sm_103a: return 0;      // FlashInfer's GDN package's value
  }
  return 0;
}

bool decide_handoff(ReuseTapes r, Target t, long long rows) {
  switch (r) {
    case ReuseTapes::yes: return true;
    case ReuseTapes::no: return false;
    case ReuseTapes::automatic: return rows >= handoff_threshold_rows(t);
  }
  return false;
}

Layer::Compiled Layer::compile_plan(CallPlan plan, int id, int index) const {
  specialize_for_target(plan, ir_, target_);
  Compiled c;
  c.graph_id = (serial_ << 4) | static_cast<uint64_t>(index);
  if (host_path_ == HostPath::llvm_stub)
    c.stub = stub_compiler().compile(plan, fmt::format("gdn_stub_{}_{}_{}", id, ir_.spec.name, plan.name));
  c.plan = std::move(plan);
  c.writes_tapes = c.plan.leaves_tapes;
  return c;
}

void Layer::make_plans(HostPath path) {
  host_path_ = path;
  static std::atomic<uint64_t> serial{1};
  serial_ = serial.fetch_add(1);
  const int id = static_cast<int>(serial_);
  forward_ = compile_plan(plan_forward(ir_, OutputLaunch::yes), id, 0);
  forward_without_output_ = compile_plan(plan_forward(ir_, OutputLaunch::no), id, 1);
  if (ir_.recompute_output_tapes) recompute_with_output_ = compile_plan(plan_recompute(ir_, OutputLaunch::yes), id, 13);
  backward_ = compile_plan(plan_backward(ir_, PrepRerun::yes), id, 2);
  if (graph_backend_) graphs_ = std::make_unique<GraphCache>(GraphCache::Limits{});
  if (ir_.spec.cp_ranks > 1) {
    kcp_forward_summaries_ = compile_plan(plan_kcp_forward(ir_, KcpPhase::summaries), id, 4);
    kcp_forward_walk_ = compile_plan(plan_kcp_forward(ir_, KcpPhase::walk), id, 5);
    kcp_backward_summaries_ = compile_plan(plan_kcp_backward(ir_, PrepRerun::yes, KcpPhase::summaries), id, 6);
    kcp_backward_walk_ = compile_plan(plan_kcp_backward(ir_, PrepRerun::yes, KcpPhase::walk), id, 7);
    if (ir_.spec.save_mode == SaveMode::light)
      kcp_backward_summaries_with_handoff_ =
          compile_plan(plan_kcp_backward(ir_, PrepRerun::no, KcpPhase::summaries), id, 8);
  }
  if (has_unsplit_plans(ir_)) {
    forward_unsplit_ = compile_plan(plan_forward(ir_, OutputLaunch::yes, DocSplits::none), id, 9);
    forward_without_output_unsplit_ = compile_plan(plan_forward(ir_, OutputLaunch::no, DocSplits::none), id, 10);
    if (ir_.recompute_output_tapes)
      recompute_with_output_unsplit_ = compile_plan(plan_recompute(ir_, OutputLaunch::yes, DocSplits::none), id, 14);
    backward_unsplit_ = compile_plan(plan_backward(ir_, PrepRerun::yes, DocSplits::none), id, 11);
    if (ir_.spec.save_mode == SaveMode::light)
      backward_with_handoff_unsplit_ = compile_plan(plan_backward(ir_, PrepRerun::no, DocSplits::none), id, 12);
  }
  if (ir_.spec.save_mode == SaveMode::light) {
    backward_with_handoff_ = compile_plan(plan_backward(ir_, PrepRerun::no), id, 3);
    // A hand-off works because the recompute's tapes sit where the backward looks for them.
    const auto& f = forward_.plan.ws_slot_names;
    const auto& b = backward_.plan.ws_slot_names;
    for (size_t i = 0; i < f.size(); ++i)
      if (i >= b.size() || f[i] != b[i])
        throw std::logic_error(fmt::format("layer '{}': workspace slot {} of the forward ({}) is not the backward's",
                                           ir_.spec.name, i, f[i]));
  }
}

const Layer::Compiled& Layer::for_frame(const Compiled& possible, const Compiled& unsplit, const CallFrame& f) const {
  return has_unsplit_plans(ir_) && f[Frame::seg_rows] == 1 ? unsplit : possible;
}

void Layer::observe_launches(LaunchObserver observer) {
  if (!observer) throw std::invalid_argument("Layer::observe_launches: empty observer");
  launcher_ = std::make_shared<ObservedLauncher>(std::move(launcher_), std::move(observer));
}

void Layer::run_eager(const Compiled& c, const CallFrame& f) const {
  if (host_path_ == HostPath::llvm_stub)
    run_stub(c.stub, ir_, f, *launcher_);
  else
    run_plan(c.plan, ir_, f, *launcher_);
}

void Layer::run(const Compiled& c, const CallFrame& f) const {
  if (!graph_backend_) return run_eager(c, f);
  const CUstream stream = reinterpret_cast<CUstream>(f[Frame::stream]);
  if (stream != nullptr && graph_backend_->capturing(stream)) return run_eager(c, f);  // the outer graph holds it
  const GraphKey key{c.graph_id, f};
  std::lock_guard<std::mutex> lock(graph_mutex_);
  CapturedGraph* g = graphs_->find(key);
  if (!g) {
    // Capture records the launches without running them; the replay below runs them on `stream`.
    g = graphs_->insert(key, graph_backend_->capture([&](CUstream capture_stream) {
      CallFrame on_capture_stream = f;
      on_capture_stream[Frame::stream] = reinterpret_cast<uint64_t>(capture_stream);
      run_eager(c, on_capture_stream);
    }));
    ++captures_;
  }
  g->replay(stream);
  ++replays_;
}

void Layer::set_graph_cache_limits(GraphCache::Limits limits) {
  std::lock_guard<std::mutex> lock(graph_mutex_);
  if (!graph_backend_) throw InputError(fmt::format("layer '{}' is not in graph mode (/graph)", ir_.spec.name));
  graphs_ = std::make_unique<GraphCache>(limits);
}

Layer::GraphStats Layer::graph_stats() const {
  std::lock_guard<std::mutex> lock(graph_mutex_);
  if (!graphs_) return {0, 0, 0, 0, 0};
  return {graphs_->entries(), graphs_->bytes(), captures_, replays_, graphs_->evictions()};
}

RegionLayout region_layout(const LayerIR& ir, BufferRole role, CallForm form, ProblemShape s,
                           std::optional<Target> target) {
  check_problem_size(s.T, s.N);
  RegionLayout l;
  const auto slots = region_slots(ir, role, form, target);
  std::vector<ByteFormula> formulas;
  for (const auto& sl : slots) formulas.push_back(sl.second);
  const auto offsets = slot_offsets(formulas, s.T, s.N, ir.spec.chunk);
  for (size_t i = 0; i < slots.size(); ++i) {
    l.offset[slots[i].first] = offsets[i];
    l.size[slots[i].first] = static_cast<size_t>(slots[i].second.eval(s.T, s.N, ir.spec.chunk));
  }
  // Buffers living in another slot's bytes are listed at their host's offset.
  for (const Buffer& b : ir.buffers) {
    if (b.role != role || b.lives_in.empty()) continue;
    if (std::find(b.forms.begin(), b.forms.end(), form) == b.forms.end()) continue;
    if (target && b.unused_for(*target)) continue;
    std::string host = b.lives_in;
    while (!ir.buffer(host).lives_in.empty()) host = ir.buffer(host).lives_in;
    l.offset[b.name] = l.offset.at(host);
    l.size[b.name] = static_cast<size_t>(b.bytes.eval(s.T, s.N, ir.spec.chunk));
  }
  l.bytes = offsets.back();
  return l;
}

RegionLayout Layer::region_layout(BufferRole role, CallForm form, ProblemShape s) const {
  return gdn::region_layout(ir_, role, form, s, target_);
}

namespace {

/// A region's size without building its name map: the per-call argument check uses it.
size_t total_bytes(const std::vector<ByteFormula>& slots, ProblemShape s, int chunk) {
  check_problem_size(s.T, s.N);
  size_t total = 0;
  for (const ByteFormula& b : slots) total += (static_cast<size_t>(b.eval(s.T, s.N, chunk)) + 255) / 256 * 256;
  return total;
}

}  // namespace

size_t Layer::saved_bytes(ProblemShape s) const { return total_bytes(forward_.plan.saved_slots, s, ir_.spec.chunk); }

size_t Layer::workspace_bytes(CallForm f, ProblemShape s) const {
  const CallPlan& plan = f == CallForm::backward ? backward_.plan : forward_.plan;
  return total_bytes(plan.ws_slots, s, ir_.spec.chunk);
}

RegionLayout Layer::saved_layout(ProblemShape s) const {
  return region_layout(BufferRole::saved, CallForm::forward, s);
}

RegionLayout Layer::workspace_layout(CallForm f, ProblemShape s) const {
  return region_layout(BufferRole::workspace, f, s);
}

void Layer::check_common(ProblemShape s, const LayerInputs& in, size_t saved_size, size_t ws_size, CallForm form,
                         const CpRankView* rank) const {
  const Spec& sp = ir_.spec;
  check_problem_size(s.T, s.N);
  // The proxy cuts the packed tokens into cp.ranks equal parts, as a communicator of that size would.
  if (rank) {
    if (sp.cp_ranks <= 1)
      throw InputError(fmt::format("cp.ranks: layer '{}' has 1 rank, so it has no context-parallel phases", sp.name));
    if (rank->world != sp.cp_ranks)
      throw InputError(
          fmt::format("rank view: {} ranks, but layer '{}' has cp.ranks {}", rank->world, sp.name, sp.cp_ranks));
    if (s.T != rank->tokens || s.N != rank->documents())
      throw InputError(fmt::format("rank view: rank {} holds {} tokens in {} documents, not T={}, N={}", rank->rank,
                                   rank->tokens, rank->documents(), s.T, s.N));
  } else if (sp.cp_ranks > 1) {
    if (s.T % sp.cp_ranks != 0)
      throw InputError(fmt::format("T: {} tokens do not split into cp.ranks {} equal parts ({} left over)", s.T,
                                   sp.cp_ranks, s.T % sp.cp_ranks));
    cp_check_world(sp.cp_ranks, sp, s.T);
  }
  if (s.max_doc_tokens < 0)
    throw InputError(fmt::format("max_doc_tokens: {} is negative (0: no bound)", s.max_doc_tokens));
  if (s.max_doc_tokens > 0 && s.max_doc_tokens < s.T && s.max_doc_tokens * s.N < s.T)
    throw InputError(fmt::format("max_doc_tokens: {} documents of at most {} tokens cannot hold T={} tokens", s.N,
                                 s.max_doc_tokens, s.T));
  require_aligned(in.q, "q");
  require_aligned(in.k, "k");
  require_aligned(in.v, "v");
  require_aligned(in.g, "g");
  require_aligned(in.beta, "beta");
  if (!in.cu_seqlens) throw InputError("cu_seqlens: is null");
  const bool h0 = sp.initial_state == StateFlag::present;
  if (h0 && !in.h0) throw InputError(fmt::format("h0: is null, but layer '{}' has initial_state: true", sp.name));
  if (!h0 && in.h0) throw InputError(fmt::format("h0: given, but layer '{}' has initial_state: false", sp.name));
  if (in.h0) require_aligned(in.h0, "h0");
  const size_t need_saved = saved_bytes(s), need_ws = workspace_bytes(form, s);
  if (saved_size < need_saved)
    throw InputError(fmt::format("saved: {} bytes given, {} needed (T={}, N={})", saved_size, need_saved, s.T, s.N));
  if (ws_size < need_ws)
    throw InputError(fmt::format("workspace: {} bytes given, {} needed for the {} (T={}, N={})", ws_size, need_ws,
                                 to_string(form), s.T, s.N));
}

CallFrame Layer::forward_frame(ProblemShape s, const LayerInputs& in, const LayerOutputs& out, void* saved,
                               size_t saved_size, void* ws, size_t ws_size, CUstream stream, OutputNeeded output,
                               const CpRankView* rank) const {
  check_common(s, in, saved_size, ws_size, CallForm::forward, rank);
  const Spec& sp = ir_.spec;
  if (output == OutputNeeded::yes) require_aligned(out.o, "o");
  const bool ht = sp.final_state == StateFlag::present;
  if (ht && !out.ht) throw InputError(fmt::format("ht: is null, but layer '{}' has final_state: true", sp.name));
  if (!ht && out.ht) throw InputError(fmt::format("ht: given, but layer '{}' has final_state: false", sp.name));
  require_aligned(saved, "saved");
  require_aligned(ws, "workspace");
  CallFrame f = frame_of(s, in, saved, ws, stream);
  f[Frame::o] = reinterpret_cast<uint64_t>(out.o);
  f[Frame::ht] = reinterpret_cast<uint64_t>(out.ht);
  return f;
}

CallFrame Layer::backward_frame(ProblemShape s, const LayerInputs& in, const LayerGrads& gr, const void* saved,
                                size_t saved_size, void* ws, size_t ws_size, CUstream stream,
                                const CpRankView* rank) const {
  check_common(s, in, saved_size, ws_size, CallForm::backward, rank);
  const Spec& sp = ir_.spec;
  require_aligned(gr.d_o, "do");
  require_aligned(gr.dq, "dq");
  require_aligned(gr.dk, "dk");
  require_aligned(gr.dv, "dv");
  require_aligned(gr.dg, "dg");
  require_aligned(gr.dbeta, "dbeta");
  const bool h0 = sp.initial_state == StateFlag::present;
  if (h0 && !gr.dh0) throw InputError(fmt::format("dh0: is null, but layer '{}' has initial_state: true", sp.name));
  if (!h0 && gr.dh0) throw InputError(fmt::format("dh0: given, but layer '{}' has initial_state: false", sp.name));
  if (gr.dht && sp.final_state != StateFlag::present)
    throw InputError(fmt::format("dht: given, but layer '{}' has final_state: false", sp.name));
  require_aligned(saved, "saved");
  require_aligned(ws, "workspace");
  CallFrame f = frame_of(s, in, const_cast<void*>(saved), ws, stream);
  // The backward reads the forward's chunk table and cannot check a bound of its own: its walks
  // take the rows that T allows.
  f[Frame::max_doc_tokens] = 0;
  f[Frame::seg_rows] = static_cast<uint64_t>(segment_rows(ir_, s.T));
  f[Frame::d_o] = reinterpret_cast<uint64_t>(gr.d_o);
  f[Frame::dht] = reinterpret_cast<uint64_t>(gr.dht);
  f[Frame::dq] = reinterpret_cast<uint64_t>(gr.dq);
  f[Frame::dk] = reinterpret_cast<uint64_t>(gr.dk);
  f[Frame::dv] = reinterpret_cast<uint64_t>(gr.dv);
  f[Frame::dg] = reinterpret_cast<uint64_t>(gr.dg);
  f[Frame::dbeta] = reinterpret_cast<uint64_t>(gr.dbeta);
  f[Frame::dh0] = reinterpret_cast<uint64_t>(gr.dh0);
  return f;
}

void Layer::forward(ProblemShape s, const LayerInputs& in, const LayerOutputs& out, void* saved, size_t saved_size,
                    void* ws, size_t ws_size, CUstream stream) const {
  const CallFrame f = forward_frame(s, in, out, saved, saved_size, ws, ws_size, stream, OutputNeeded::yes);
  run(for_frame(forward_, forward_unsplit_, f), f);
}

void Layer::backward(ProblemShape s, const LayerInputs& in, const LayerGrads& gr, const void* saved, size_t saved_size,
                     void* ws, size_t ws_size, CUstream stream) const {
  const CallFrame f = backward_frame(s, in, gr, saved, saved_size, ws, ws_size, stream);
  run(for_frame(backward_, backward_unsplit_, f), f);
}

void Layer::forward(ProblemShape s, const LayerInputs& in, const LayerOutputs& out, void* saved, size_t saved_size,
                    Workspace& ws, CUstream stream) const {
  const CallFrame f = forward_frame(s, in, out, saved, saved_size, ws.data(), ws.bytes(), stream, OutputNeeded::yes);
  ++ws.calls_;
  ws.has_handoff_ = false;
  PendingHandoffs::instance().written(saved);
  run(for_frame(forward_, forward_unsplit_, f), f);
}

HandOff Layer::recompute(ProblemShape s, const LayerInputs& in, const LayerOutputs& out, OutputNeeded output,
                         void* saved, size_t saved_size, Workspace& ws, CUstream stream) const {
  const CallFrame f = forward_frame(s, in, out, saved, saved_size, ws.data(), ws.bytes(), stream, output);
  return recompute_frame(f, s, output, saved, ws, stream);
}

HandOff Layer::recompute_frame(const CallFrame& f, ProblemShape s, OutputNeeded output, void* saved, Workspace& ws,
                               CUstream stream) const {
  ++ws.calls_;
  ws.has_handoff_ = false;
  PendingHandoffs::instance().written(saved);
  const bool decided = decide_handoff(ir_.spec.reuse_recompute_tapes, target_, s.T * ir_.spec.heads_v);
  // With the output, the tapes beside o only for a hand-off that will be taken. (A rank of a KCP
  // layer has no plans without the segment programs: for_frame gives it the others.)
  const Compiled& ran =
      output == OutputNeeded::no              ? for_frame(forward_without_output_, forward_without_output_unsplit_, f)
      : ir_.recompute_output_tapes && decided ? for_frame(recompute_with_output_, recompute_with_output_unsplit_, f)
                                              : for_frame(forward_, forward_unsplit_, f);
  run(ran, f);
  // Only a plan whose walk wrote the tapes has them to hand over (the fused forward has none).
  const bool take = ir_.spec.save_mode == SaveMode::light && ran.writes_tapes && decided;
  if (!take) return HandOff::not_taken;
  ws.has_handoff_ = true;
  ws.handoff_ = {serial_, ws.calls_, stream, s, saved, PendingHandoffs::instance().handed_off(saved)};
  return HandOff::taken;
}

bool Layer::handoff_is_fresh(const Workspace& ws, ProblemShape s, CUstream stream, const void* saved) const {
  const Workspace::Stamp& st = ws.handoff_;
  return ws.has_handoff_ && st.layer == serial_ && st.call == ws.calls_ && st.stream == stream && st.shape.T == s.T &&
         st.shape.N == s.N && st.saved == saved && PendingHandoffs::instance().pending(saved, st.region);
}

HandOff Layer::backward(ProblemShape s, const LayerInputs& in, const LayerGrads& gr, const void* saved,
                        size_t saved_size, Workspace& ws, CUstream stream) const {
  CallFrame f = backward_frame(s, in, gr, saved, saved_size, ws.data(), ws.bytes(), stream);
  const bool fresh = handoff_is_fresh(ws, s, stream, saved);
  if (fresh) PendingHandoffs::instance().taken(saved);
  // The recompute whose tapes it binds checked its bound on this saved region's chunk table (a
  // longer document leaves the table empty): its rows hold for this backward too.
  if (fresh) f[Frame::seg_rows] = static_cast<uint64_t>(segment_rows(ir_, s.T, ws.handoff_.shape.max_doc_tokens));
  ++ws.calls_;
  ws.has_handoff_ = false;
  run(fresh ? for_frame(backward_with_handoff_, backward_with_handoff_unsplit_, f)
            : for_frame(backward_, backward_unsplit_, f),
      f);
  return fresh ? HandOff::taken : HandOff::not_taken;
}

size_t Layer::kcp_record_bytes() const { return gdn::kcp_record_bytes(ir_.spec); }

ProblemShape Layer::kcp_shape(const CpRankView& rank) const { return {rank.tokens, rank.documents()}; }

void Layer::kcp_frame(CallFrame& f, const CpRankView& rank, int entry_mode, const void* send,
                      const void* gathered) const {
  if (rank.rank < 0 || rank.rank >= rank.world)
    throw InputError(fmt::format("rank view: rank {} is outside 0 .. {}", rank.rank, rank.world - 1));
  if (send) require_aligned(send, "send");
  if (gathered) require_aligned(gathered, "gathered");
  f[Frame::kcp_rank] = static_cast<uint64_t>(rank.rank);
  f[Frame::kcp_local] = 1;
  f[Frame::kcp_pieces_before] = static_cast<uint64_t>(rank.pieces_before);
  f[Frame::kcp_pieces_after] = static_cast<uint64_t>(rank.pieces_after);
  f[Frame::kcp_entry_mode] = static_cast<uint64_t>(entry_mode);
  f[Frame::kcp_send] = reinterpret_cast<uint64_t>(send);
  f[Frame::kcp_gathered] = reinterpret_cast<uint64_t>(gathered);
}

void Layer::kcp_forward_summaries(const CpRankView& rank, const LayerInputs& in, void* saved, size_t saved_size,
                                  void* ws, size_t ws_size, void* send, CUstream stream) const {
  const ProblemShape s = kcp_shape(rank);
  if (!send) throw InputError("send: is null");
  // The summaries produce no output: the frame's o and ht stay null (the walk phase binds them).
  CallFrame f = frame_of(s, in, saved, ws, stream);
  check_common(s, in, saved_size, ws_size, CallForm::forward, &rank);
  require_aligned(saved, "saved");
  require_aligned(ws, "workspace");
  kcp_frame(f, rank, kKcpEntryNone, send, nullptr);
  PendingHandoffs::instance().written(saved);
  run(kcp_forward_summaries_, f);
}

void Layer::kcp_forward_walk(const CpRankView& rank, const LayerInputs& in, const LayerOutputs& out, void* saved,
                             size_t saved_size, void* ws, size_t ws_size, const void* gathered, CUstream stream) const {
  const ProblemShape s = kcp_shape(rank);
  if (!gathered) throw InputError("gathered: is null");
  CallFrame f = forward_frame(s, in, out, saved, saved_size, ws, ws_size, stream, OutputNeeded::yes, &rank);
  kcp_frame(f, rank, kKcpEntryWrite, nullptr, gathered);
  PendingHandoffs::instance().written(saved);
  run(kcp_forward_walk_, f);
}

HandOff Layer::kcp_recompute(const CpRankView& rank, const LayerInputs& in, const LayerOutputs& out,
                             OutputNeeded output, void* saved, size_t saved_size, Workspace& ws,
                             CUstream stream) const {
  const ProblemShape s = kcp_shape(rank);
  CallFrame f = forward_frame(s, in, out, saved, saved_size, ws.data(), ws.bytes(), stream, output, &rank);
  kcp_frame(f, rank, kKcpEntryRead, nullptr, nullptr);
  return recompute_frame(f, s, output, saved, ws, stream);
}

HandOff Layer::kcp_backward_summaries(const CpRankView& rank, const LayerInputs& in, const LayerGrads& gr,
                                      const void* saved, size_t saved_size, Workspace& ws, void* send,
                                      CUstream stream) const {
  const ProblemShape s = kcp_shape(rank);
  if (!send) throw InputError("send: is null");
  CallFrame f = backward_frame(s, in, gr, saved, saved_size, ws.data(), ws.bytes(), stream, &rank);
  kcp_frame(f, rank, kKcpEntryRead, send, nullptr);
  const bool fresh = handoff_is_fresh(ws, s, stream, saved);
  if (fresh) PendingHandoffs::instance().taken(saved);
  ++ws.calls_;
  ws.has_handoff_ = false;
  run(fresh ? kcp_backward_summaries_with_handoff_ : kcp_backward_summaries_, f);
  return fresh ? HandOff::taken : HandOff::not_taken;
}

void Layer::kcp_backward_walk(const CpRankView& rank, const LayerInputs& in, const LayerGrads& gr, const void* saved,
                              size_t saved_size, Workspace& ws, const void* gathered, CUstream stream) const {
  const ProblemShape s = kcp_shape(rank);
  if (!gathered) throw InputError("gathered: is null");
  CallFrame f = backward_frame(s, in, gr, saved, saved_size, ws.data(), ws.bytes(), stream, &rank);
  kcp_frame(f, rank, kKcpEntryRead, nullptr, gathered);
  run(kcp_backward_walk_, f);
}

CallFrame Layer::frame_of(ProblemShape s, const LayerInputs& in, void* saved, void* ws, CUstream stream) const {
  CallFrame f;
  f[Frame::T] = static_cast<uint64_t>(s.T);
  f[Frame::N] = static_cast<uint64_t>(s.N);
  f[Frame::saved] = reinterpret_cast<uint64_t>(saved);
  f[Frame::ws] = reinterpret_cast<uint64_t>(ws);
  f[Frame::q] = reinterpret_cast<uint64_t>(in.q);
  f[Frame::k] = reinterpret_cast<uint64_t>(in.k);
  f[Frame::v] = reinterpret_cast<uint64_t>(in.v);
  f[Frame::g] = reinterpret_cast<uint64_t>(in.g);
  f[Frame::beta] = reinterpret_cast<uint64_t>(in.beta);
  f[Frame::cu_seqlens] = reinterpret_cast<uint64_t>(in.cu_seqlens);
  f[Frame::cu_is_int64] = in.cu_type == IndexType::int64 ? 1 : 0;
  f[Frame::h0] = reinterpret_cast<uint64_t>(in.h0);
  const float scale = in.scale != 0 ? in.scale : static_cast<float>(ir_.spec.effective_scale());
  uint32_t bits;
  std::memcpy(&bits, &scale, 4);
  f[Frame::scale_bits] = bits;
  f[Frame::stream] = reinterpret_cast<uint64_t>(stream);
  // A bound of T or more bounds nothing; below T chunk_table checks it, and the walks' rows follow it.
  const long long bound = s.max_doc_tokens > 0 && s.max_doc_tokens < s.T ? s.max_doc_tokens : 0;
  f[Frame::max_doc_tokens] = static_cast<uint64_t>(bound);
  f[Frame::seg_rows] = static_cast<uint64_t>(segment_rows(ir_, s.T, bound));
  return f;
}

std::optional<std::string> device_status_error(int code, int index, long long value, long long expected,
                                               int value_heads) {
  switch (code) {
    case kCuOk: return std::nullopt;
    case kCuFirstNotZero: return fmt::format("cu_seqlens[0]: {} must be 0", value);
    case kCuDecreasing:
      return fmt::format("cu_seqlens[{}]: {} < cu_seqlens[{}] ({}): must be non-decreasing", index, value, index - 1,
                         expected);
    case kCuLastNotT: return fmt::format("cu_seqlens[{}]: {} must equal T ({})", index, value, expected);
    case kCuTooManyChunks:
      return fmt::format("cu_seqlens: {} chunks exceed the bound {} (empty documents?)", value, expected);
    case kCuLongerThanBound:
      return fmt::format("cu_seqlens: document {} has {} tokens, more than max_doc_tokens {}", index - 1, value,
                         expected);
    case kGateNotLogDecay: {
      if (value_heads <= 0 || value < 0 || value == kStatusNoKey)
        return fmt::format("g: not a finite log decay (device status key {}, {} value heads)", value, value_heads);
      return fmt::format(
          "g[{}, {}]: positive, NaN or infinite (the first such [packed token, value head]); g is the log decay, "
          "finite and <= 0 (e.g. logsigmoid of a gate logit)",
          value / value_heads, value % value_heads);
    }
    default: return fmt::format("device status: unknown code {}", code);
  }
}

void Layer::check_device_status(const void* saved, ProblemShape s, CUstream stream) const {
  const RegionLayout sl = saved_layout(s);
  DeviceStatus st{};
  GDN_CHECK_CU(
      rt::drv().cuMemcpyDtoHAsync_v2(&st, reinterpret_cast<CUdeviceptr>(at(saved, sl, "status")), sizeof st, stream),
      "reading the device status of layer '{}'", ir_.spec.name);
  GDN_CHECK_CU(rt::drv().cuStreamSynchronize(stream), "cuStreamSynchronize");
  if (auto message = device_status_error(st.code, st.index, st.value, st.expected, ir_.spec.heads_v))
    throw InputError(*message);
}

}  // namespace gdn
