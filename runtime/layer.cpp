/**
 * @file layer.cpp
 * @brief Layer creation, region layouts, argument checks and the launch sequences.
 */
#include "runtime/layer.hpp"

#include "bwd/geometry.hpp"
#include "compiler/compiler.hpp"
#include "params.cuh"
#include "prep/geometry.hpp"

#include <fmt/format.h>

#include <cstdint>

namespace gdn {

namespace {

constexpr size_t kAlign = 256;

size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

int program_bv(const Program& p) {
  for (const auto& [k, v] : p.constants)
    if (k == "BV") return std::stoi(v);
  return 0;
}

template <class T = void>
T* at(void* base, const RegionLayout& l, const char* name) {
  return reinterpret_cast<T*>(static_cast<char*>(base) + l.offset.at(name));
}

template <class T = void>
const T* at(const void* base, const RegionLayout& l, const char* name) {
  return reinterpret_cast<const T*>(static_cast<const char*>(base) + l.offset.at(name));
}

void require_aligned(const void* p, const char* name) {
  if (!p) throw InputError(fmt::format("{}: is null", name));
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0)
    throw InputError(fmt::format("{}: address {} is not 16-byte aligned", name, p));
}

}  // namespace

namespace {

/// Launches on the device through the layer's loaded modules.
class DeviceLauncher final : public Launcher {
 public:
  std::map<std::string, rt::Module> modules;
  void launch(const Program& program, rt::dim3_t grid, const void* params, size_t, CUstream stream) override {
    modules.at(program.name).launch_params(grid, stream, params);
  }
};

}  // namespace

std::unique_ptr<Layer> Layer::with_launcher(const Spec& spec, std::shared_ptr<Launcher> launcher) {
  std::unique_ptr<Layer> layer(new Layer());
  layer->ir_ = lower(spec);
  layer->target_ = spec.targets.front();
  layer->launcher_ = std::move(launcher);
  return layer;
}

std::unique_ptr<Layer> Layer::create(const Spec& spec, const rt::Context& ctx, cache::DiskCache& cache, int jobs) {
  std::unique_ptr<Layer> layer(new Layer());
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
  auto device = std::make_shared<DeviceLauncher>();
  for (const CompiledEntry& e : compile_layer(layer->ir_, {target}, cache, jobs)) {
    const Program& p = layer->ir_.program(e.program);
    device->modules.emplace(p.name, rt::Module::load(e.entry.read_file(kCubinFile), p.entry(), p.threads,
                                                     p.smem_bytes));
  }
  layer->launcher_ = std::move(device);
  return layer;
}

RegionLayout Layer::saved_layout(ProblemShape s) const {
  RegionLayout l;
  for (const Buffer& b : ir_.buffers) {
    if (b.role != BufferRole::saved) continue;
    l.offset[b.name] = l.bytes;
    l.bytes += align_up(static_cast<size_t>(b.bytes.eval(s.T, s.N, ir_.spec.chunk)));
  }
  return l;
}

RegionLayout Layer::workspace_layout(CallForm f, ProblemShape s) const {
  RegionLayout l;
  for (const Buffer& b : ir_.buffers) {
    if (b.role != BufferRole::workspace) continue;
    if (std::find(b.forms.begin(), b.forms.end(), f) == b.forms.end()) continue;
    l.offset[b.name] = l.bytes;
    l.bytes += align_up(static_cast<size_t>(b.bytes.eval(s.T, s.N, ir_.spec.chunk)));
  }
  return l;
}

rt::dim3_t Layer::grid(const Program& p, ProblemShape s) const {
  const Spec& sp = ir_.spec;
  const unsigned nt_max = static_cast<unsigned>(s.T / sp.chunk + s.N);
  switch (p.grid) {
    case GridKind::single: return {1, 1, 1};
    case GridKind::rows_qk: return {static_cast<unsigned>(L2NormGeometry::grid_x(s.T * sp.heads_qk)), 1, 1};
    case GridKind::chunk_heads: return {nt_max, static_cast<unsigned>(sp.heads_v), 1};
    case GridKind::chunk_head_groups:
      return {nt_max, static_cast<unsigned>(GateCumsumGeometry::grid_y(sp.heads_v)), 1};
    case GridKind::walk:
      return {static_cast<unsigned>(sp.head_dim_v / program_bv(p)), static_cast<unsigned>(sp.heads_v),
              static_cast<unsigned>(s.N)};
    case GridKind::finalize: return {static_cast<unsigned>(FinalizeGeometry::grid_x(s.T, sp.heads_qk)), 1, 1};
  }
  throw std::logic_error("unknown grid kind");
}

void Layer::check_common(ProblemShape s, const LayerInputs& in, size_t saved_size, size_t ws_size,
                         CallForm form) const {
  const Spec& sp = ir_.spec;
  if (s.T < 1 || s.T > (1LL << 31) - 1) throw InputError(fmt::format("T: {} is out of range (1 to 2^31-1)", s.T));
  if (s.N < 1 || s.N > 65535) throw InputError(fmt::format("N: {} documents is out of range (1 to 65535)", s.N));
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

void Layer::forward(ProblemShape s, const LayerInputs& in, const LayerOutputs& out, void* saved, size_t saved_size,
                    void* ws, size_t ws_size, CUstream stream) const {
  check_common(s, in, saved_size, ws_size, CallForm::forward);
  const Spec& sp = ir_.spec;
  require_aligned(out.o, "o");
  const bool ht = sp.final_state == StateFlag::present;
  if (ht && !out.ht) throw InputError(fmt::format("ht: is null, but layer '{}' has final_state: true", sp.name));
  if (!ht && out.ht) throw InputError(fmt::format("ht: given, but layer '{}' has final_state: false", sp.name));
  require_aligned(saved, "saved");
  require_aligned(ws, "workspace");
  const RegionLayout sl = saved_layout(s), wl = workspace_layout(CallForm::forward, s);
  const bool full = sp.save_mode == SaveMode::full;
  const bool norm = sp.norm == Norm::l2_in_kernel;
  const int nt_max = static_cast<int>(s.T / sp.chunk + s.N);
  auto tape = [&](const char* name) -> void* { return full ? at(saved, sl, name) : at(ws, wl, name); };

  auto* chunks = at<ChunkInfo>(saved, sl, "chunks");
  auto* doc_off = at<int>(saved, sl, "doc_chunk_offset");
  ChunkTableParams ct{in.cu_seqlens, in.cu_type == IndexType::int64, static_cast<int>(s.T), s.N, nt_max, chunks,
                      doc_off, at<int>(saved, sl, "num_chunks"), at<DeviceStatus>(saved, sl, "status")};
  launch("chunk_table", s, stream, ct);

  const bf16_t* q = static_cast<const bf16_t*>(in.q);
  const bf16_t* k = static_cast<const bf16_t*>(in.k);
  if (norm) {
    const long long rows = s.T * sp.heads_qk;
    launch("l2norm", s, stream, L2NormParams{q, at<bf16_t>(saved, sl, "qn"), at<float>(saved, sl, "rstd_q"), rows});
    launch("l2norm", s, stream, L2NormParams{k, at<bf16_t>(saved, sl, "kn"), at<float>(saved, sl, "rstd_k"), rows});
    q = at<bf16_t>(saved, sl, "qn");
    k = at<bf16_t>(saved, sl, "kn");
  }
  float* gc = at<float>(saved, sl, "gc");
  launch("gate_cumsum", s, stream, GateCumsumParams{in.g, gc, chunks, nt_max});
  auto* w = static_cast<bf16_t*>(tape("w"));
  auto* u = at<bf16_t>(ws, wl, "u");
  auto* tm = at<bf16_t>(saved, sl, "tm");
  launch("chunk_prep", s, stream, ChunkPrepParams{k, static_cast<const bf16_t*>(in.v), in.beta, gc, chunks, nt_max, 0, tm, 0, 0, w, u});
  auto* h_tape = static_cast<bf16_t*>(tape("h_tape"));
  auto* v_new = static_cast<bf16_t*>(tape("v_new"));
  launch("state_walk", s, stream, StateWalkParams{k, w, u, gc, chunks, doc_off, s.N, 0, in.h0, out.ht, h_tape, v_new});
  const float scale = in.scale != 0 ? in.scale : static_cast<float>(sp.effective_scale());
  launch("output", s, stream, OutputParams{q, k, v_new, h_tape, gc, chunks, nt_max, scale, static_cast<bf16_t*>(out.o)});
}

void Layer::backward(ProblemShape s, const LayerInputs& in, const LayerGrads& gr, const void* saved,
                     size_t saved_size, void* ws, size_t ws_size, CUstream stream) const {
  check_common(s, in, saved_size, ws_size, CallForm::backward);
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
  const RegionLayout sl = saved_layout(s), wl = workspace_layout(CallForm::backward, s);
  const bool full = sp.save_mode == SaveMode::full;
  const bool norm = sp.norm == Norm::l2_in_kernel;
  const int nt_max = static_cast<int>(s.T / sp.chunk + s.N);
  // Saved tapes are written by the forward and only read here; the casts drop const for the
  // parameter blocks, which share one struct between reading and writing programs.
  void* saved_rw = const_cast<void*>(saved);
  auto tape = [&](const char* name) -> bf16_t* {
    return full ? at<bf16_t>(saved_rw, sl, name) : at<bf16_t>(ws, wl, name);
  };
  const auto* chunks = at<ChunkInfo>(saved, sl, "chunks");
  const auto* doc_off = at<int>(saved, sl, "doc_chunk_offset");
  const bf16_t* q = norm ? at<bf16_t>(saved, sl, "qn") : static_cast<const bf16_t*>(in.q);
  const bf16_t* k = norm ? at<bf16_t>(saved, sl, "kn") : static_cast<const bf16_t*>(in.k);
  const auto* v = static_cast<const bf16_t*>(in.v);
  const float* gc = at<float>(saved, sl, "gc");
  auto* tm = at<bf16_t>(saved_rw, sl, "tm");
  bf16_t* w = tape("w");
  bf16_t* h_tape = tape("h_tape");
  bf16_t* v_new = tape("v_new");
  if (!full) {
    auto* u = at<bf16_t>(ws, wl, "u");
    launch("chunk_prep", s, stream, ChunkPrepParams{k, v, in.beta, gc, chunks, nt_max, 0, tm, 1, 0, w, u});
    launch("state_walk", s, stream, StateWalkParams{k, w, u, gc, chunks, doc_off, s.N, 0, in.h0, nullptr, h_tape, v_new});
  }
  const float scale = in.scale != 0 ? in.scale : static_cast<float>(sp.effective_scale());
  const auto* d_o = static_cast<const bf16_t*>(gr.d_o);
  auto* dv_local = at<bf16_t>(ws, wl, "dv_local");
  launch("dv_local", s, stream, DvLocalParams{q, k, gc, d_o, chunks, nt_max, scale, dv_local});
  auto* dh_tape = at<bf16_t>(ws, wl, "dh_tape");
  auto* dv_new = at<bf16_t>(ws, wl, "dv_new");
  launch("state_walk_bwd", s, stream, StateWalkBwdParams{q, k, w, gc, d_o, dv_local, chunks, doc_off, s.N, scale, gr.dht,
                                                     gr.dh0, dh_tape, dv_new});
  auto* dq_v = at<bf16_t>(ws, wl, "dq_v");
  auto* dk_v = at<bf16_t>(ws, wl, "dk_v");
  launch("chunk_bwd", s, stream, ChunkBwdParams{q, k, v, in.beta, gc, tm, h_tape, dh_tape, v_new, dv_new, d_o, chunks,
                                            nt_max, scale, dq_v, dk_v, static_cast<bf16_t*>(gr.dv), gr.dbeta, gr.dg});
  launch("finalize", s, stream, FinalizeParams{dq_v, dk_v, q, k, norm ? at<float>(saved, sl, "rstd_q") : nullptr,
                                           norm ? at<float>(saved, sl, "rstd_k") : nullptr,
                                           static_cast<bf16_t*>(gr.dq), static_cast<bf16_t*>(gr.dk),
                                           static_cast<int>(s.T)});
}

void Layer::check_device_status(const void* saved, ProblemShape s, CUstream stream) const {
  const RegionLayout sl = saved_layout(s);
  DeviceStatus st{};
  GDN_CHECK_CU(rt::drv().cuMemcpyDtoHAsync_v2(&st, reinterpret_cast<CUdeviceptr>(at(saved, sl, "status")),
                                              sizeof st, stream),
               "reading the device status of layer '{}'", ir_.spec.name);
  GDN_CHECK_CU(rt::drv().cuStreamSynchronize(stream), "cuStreamSynchronize");
  switch (st.code) {
    case kCuOk: return;
    case kCuFirstNotZero:
      throw InputError(fmt::format("cu_seqlens[0]: {} must be 0", st.value));
    case kCuDecreasing:
      throw InputError(fmt::format("cu_seqlens[{}]: {} < cu_seqlens[{}] ({}): must be non-decreasing", st.index,
                                   st.value, st.index - 1, st.expected));
    case kCuLastNotT:
      throw InputError(fmt::format("cu_seqlens[{}]: {} must equal T ({})", st.index, st.value, st.expected));
    case kCuTooManyChunks:
      throw InputError(fmt::format("cu_seqlens: {} chunks exceed the bound {} (empty documents?)", st.value, st.expected));
    default:
      throw InputError(fmt::format("device status: unknown code {}", st.code));
  }
}

}  // namespace gdn
