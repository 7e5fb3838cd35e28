/**
 * @file bench.cpp
 * @brief Times our forward, forward+backward and checkpointed step on the benchmark shapes N, M,
 *        G, A, for up to five arms (the spec, an A/A copy, without the hand-off, graph replay): CUDA
 *        events, warm-ups, L2 flushed before every sample, arms interleaved in mirrored order,
 *        median and spread, with FLA 0.5.2's earlier H200 numbers and the floors (docs/benchmark.md).
 *
 * Modes (gdn_bench --help lists the options):
 *   (default)     the timing table: arms spec, spec-aa (A/A), no-handoff, graph, graph-no-handoff, mma-sync,
 *                 walk32, walk64, walkbwd32, walkbwd64, walks64 (the walks' slab widths), walk-w, prep-w (backward_w
 * "walk", "chunk_prep"), walk-fused (walk_bwd_layout "fused"; walk-fused-seg2/4/8 with pinned
 * verified segments, walk-fused-seg-auto with cp.segments "auto"), walk-auto ("auto", the default), walk-split
 * ("split"), norm-in-walk (backward_norm "in_walk"), seg1 .. seg32, seg-auto
 * (cp.segments), programs, fused (forward "programs" / "fused"), fused-seg-auto, fused-seg16 (and cp.segments "auto",
 * 16), programs-walks32, programs-walks64, programs-walks32-seg2 / -seg4 (the programs forward with both walks' slabs
 * pinned), ranks2, ranks4 (cp.ranks: the single-GPU proxy), kcp2r0
 * .. kcp4r3 (rank r of a context-parallel run of 2 or 4 ranks: its phases on its own tokens, without the all-gather,
 * whose records stay as the last call left them), nondet (determinism "nondeterministic"), verified,
 * verified-seg11, verified-seg16 (cp.carry "verified")
 *   --programs    per-program GPU time of an eager fwd+bwd (events around every launch), per --arms given
 *   --host-time   host time per layer call on the GPU: stub and interpreter eager, and replay
 *   --sweep       ckpt with and without the tape hand-off over token counts (the sm_90a threshold)
 *   --host-only   host time per call with launches discarded (no GPU needed)
 */
#include "common/env.hpp"
#include "runtime/bf16.hpp"
#include "runtime/kcp.hpp"
#include "runtime/layer.hpp"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <random>
#include <thread>

using namespace gdn;

namespace {

/// The repository root: $GDNC_SOURCE_DIR on a machine the build was carried to.
const char* source_dir() {
  const char* e = env_value("SOURCE_DIR");
  return e ? e : GDN_SOURCE_DIR;
}

/// FLA 0.5.2's earlier H200 numbers and the floors (docs/benchmark.md), in ms, per operation (fwd, fwd+bwd, ckpt).
/// The ckpt floor is a forward plus a forward+backward (the step runs 2 x fwd + bwd).
struct Shape {
  const char* name;
  const char* example;
  std::vector<long long> docs;
  double fla[3];
  double floor[3];
  int heads_qk = 0, heads_v = 0;  ///< instead of the example's (0: the example's)
};

const Shape kShapes[] = {
    {"N", "n", {2049, 3001, 3142}, {0.626, 3.138, 5.339}, {0.011, 0.043, 0.054}},
    {"M", "m", {12000, 9000, 6000, 3768, 2000}, {2.909, 11.363, 14.378}, {0.352, 1.36, 1.712}},
    {"G",
     "g",
     {3598, 18252, 9000, 14000, 12000, 6000, 16000, 10000, 11000, 8000, 13222, 10000},
     {11.440, 45.777, 57.577},
     {1.406, 5.45, 6.856}},
    {"A", "a", {98304, 65536, 57344, 40960}, {23.182, 95.348, 118.855}, {2.812, 10.90, 13.712}},
    // Single long documents, where the walks' chains are the bound (intra-card segments' case).
    // FLA 0.5.2 was not measured on them (NaN: printed as such); the floors scale with
    // tokens x value heads: L = N's heads at 4x N's tokens, M1 = M's tokens and heads.
    {"L", "n", {32768}, {NAN, NAN, NAN}, {0.044, 0.172, 0.216}},
    {"M1", "m", {32768}, {NAN, NAN, NAN}, {0.352, 1.36, 1.712}},
    // FlashQLA's published layout, heads 16/32 (M's spec otherwise): eight 4096-token documents
    // that fill the GPU without intra-card segments, and one 32768-token document that does not.
    // Between N's 6 value heads and M's 48, where cp.segments "auto" keeps one segment unmeasured.
    {"F", "m", std::vector<long long>(8, 4096), {NAN, NAN, NAN}, {0.234, 0.908, 1.143}, 16, 32},
    {"F1", "m", {32768}, {NAN, NAN, NAN}, {0.234, 0.908, 1.143}, 16, 32},
    // M's documents shortest first: the walks take documents longest first whatever the batch's
    // order, so this times as M does (docs/PERF.md has the order's effect).
    {"MR", "m", {2000, 3768, 6000, 9000, 12000}, {NAN, NAN, NAN}, {0.352, 1.36, 1.712}},
};

/// `--shapes` as a canonical list (spaces dropped); an unknown name is an error naming it.
std::string canonical_shapes(const std::string& given) {
  std::string out, name;
  for (size_t at = 0; at <= given.size(); ++at) {
    if (at < given.size() && given[at] != ',') {
      if (given[at] != ' ') name += given[at];
      continue;
    }
    if (name.empty()) continue;
    bool known = false;
    for (const Shape& sh : kShapes) known = known || name == sh.name;
    if (!known)
      throw std::invalid_argument(
          fmt::format("--shapes: unknown shape '{}' (known: N, M, G, A, L, M1, F, F1, MR)", name));
    out += (out.empty() ? "" : ",") + name;
    name.clear();
  }
  return out;
}

/// Whether `name` is one of the comma-separated `shapes` (not a substring match: M1 is not M).
bool wanted(const std::string& shapes, const char* name) {
  size_t at = 0;
  while (at <= shapes.size()) {
    const size_t comma = std::min(shapes.find(',', at), shapes.size());
    if (shapes.compare(at, comma - at, name) == 0) return true;
    at = comma + 1;
  }
  return false;
}
const char* const kOps[] = {"fwd", "fwd+bwd", "ckpt"};

/// The gates' distribution (--gates): logsigmoid(N(0,1) + gate_logit_shift), or all zero.
/// Shift 0 is the benchmark's default (mean g about -0.8); shift 4 gives slow-decay heads
/// (mean g about -0.03), as trained models have.
float gate_logit_shift = 0.f;
bool zero_gates = false;
/// --max-doc-tokens longest: every call gets the problem's longest document as its bound
/// (ProblemShape::max_doc_tokens), as a training loop that knows its packing would pass it.
bool bound_documents = false;

rt::DeviceBuffer random_buffer(size_t n_elems, int kind, uint64_t seed) {
  // kind 0: bf16 N(0,1); 1: fp32 gate (see gate_logit_shift); 2: fp32 sigmoid beta. Blocks of 2^20 values
  // with their own generators fill in parallel: A's inputs are 4.3 G values, about 90 s on one
  // thread, device time every benchmark call paid before its first sample.
  const size_t width = kind == 0 ? 2 : 4;
  std::string host(n_elems * width, '\0');
  constexpr size_t kBlock = size_t{1} << 20;
  const size_t blocks = (n_elems + kBlock - 1) / kBlock;
  const auto fill_blocks = [&](size_t first, size_t step) {
    for (size_t blk = first; blk < blocks; blk += step) {
      std::mt19937_64 rng(seed * 0x9e3779b97f4a7c15ull + blk);
      std::normal_distribution<float> nd;
      for (size_t i = blk * kBlock; i < std::min(n_elems, (blk + 1) * kBlock); ++i) {
        const float x = nd(rng);
        if (kind == 0) {
          const uint16_t b = to_bf16(x);
          std::memcpy(host.data() + 2 * i, &b, 2);
        } else {
          const float v = kind == 2    ? 1.f / (1.f + std::exp(-x))
                          : zero_gates ? 0.f
                                       : -std::log1p(std::exp(-(x + gate_logit_shift)));
          std::memcpy(host.data() + 4 * i, &v, 4);
        }
      }
    }
  };
  const size_t threads = std::min<size_t>({blocks, 16, std::max(1u, std::thread::hardware_concurrency())});
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(fill_blocks, t, threads);
  fill_blocks(0, std::max<size_t>(threads, 1));
  for (auto& th : pool) th.join();
  auto b = rt::DeviceBuffer::create(host.size());
  GDN_CHECK_CU(rt::drv().cuMemcpyHtoD_v2(b.handle(), host.data(), host.size()), "upload");
  return b;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

/// Discards launches: what remains is the host work of a call.
class NullLauncher final : public Launcher {
 public:
  size_t launches = 0;
  void launch(const Program&, rt::dim3_t, const void*, size_t, CUstream) override { ++launches; }
};

int host_only() {
  fmt::print("host time per call, launches discarded (median of 31 rounds of 2000 calls)\n");
  fmt::print("{:<6} {:<12} {:>12} {:>12}\n", "shape", "path", "fwd us", "bwd us");
  for (const char* name : {"n", "m"}) {
    Spec spec =
        spec_from_file((std::filesystem::path(source_dir()) / "examples" / (std::string(name) + ".json")).string());
    for (HostPath path : {HostPath::llvm_stub, HostPath::interpreted}) {
      if (path == HostPath::llvm_stub && !stubs_available()) continue;
      auto null = std::make_shared<NullLauncher>();
      auto layer = Layer::with_launcher(spec, null, path);
      const ProblemShape s{32768, 5};
      // Distinct aligned fake addresses: nothing is dereferenced on the host.
      auto p = [](uint64_t i) { return reinterpret_cast<void*>(0x100000000ull * i); };
      auto fp = [](uint64_t i) { return reinterpret_cast<float*>(0x100000000ull * i); };
      const LayerInputs in{p(1), p(2), p(3), fp(4), fp(5), p(6), IndexType::int32, fp(7), 0};
      const LayerOutputs out{p(8), fp(9)};
      const LayerGrads gr{p(10), nullptr, p(11), p(12), p(13), fp(14), fp(15), fp(16)};
      const size_t saved = layer->saved_bytes(s), ws = layer->workspace_bytes(CallForm::backward, s);
      std::vector<double> fwd, bwd;
      for (int round = 0; round < 31; ++round) {
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < 2000; ++i) layer->forward(s, in, out, p(20), saved, p(30), ws, nullptr);
        auto t1 = std::chrono::steady_clock::now();
        for (int i = 0; i < 2000; ++i) layer->backward(s, in, gr, p(20), saved, p(30), ws, nullptr);
        auto t2 = std::chrono::steady_clock::now();
        fwd.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / 2000);
        bwd.push_back(std::chrono::duration<double, std::micro>(t2 - t1).count() / 2000);
      }
      fmt::print("{:<6} {:<12} {:>12.3f} {:>12.3f}\n", name, to_string(path), median(fwd), median(bwd));
    }
  }
  return 0;
}

namespace {

/// The inputs, outputs and gradients of one problem on the device.
struct Problem {
  ProblemShape shape;
  rt::DeviceBuffer q, k, v, d_o, g, beta, cu, h0, ht, dh0, o, dq, dk, dv, dg, db;
  std::vector<int64_t> cu_host;
  LayerInputs in() const {
    return {q.get(),          k.get(),         v.get(), g.get<float>(), beta.get<float>(), cu.get(),
            IndexType::int32, h0.get<float>(), 0};
  }
  LayerOutputs out() const { return {o.get(), ht.get<float>()}; }
  LayerOutputs no_output() const { return {nullptr, ht.get<float>()}; }
  LayerGrads grads() const {
    return {d_o.get(), nullptr, dq.get(), dk.get(), dv.get(), dg.get<float>(), db.get<float>(), dh0.get<float>()};
  }
};

Problem make_problem(const std::vector<long long>& docs, int H, int HV) {
  long long T = 0;
  for (auto d : docs) T += d;
  const int N = static_cast<int>(docs.size());
  Problem p{{T, N},
            random_buffer(size_t(T) * H * 128, 0, 1),
            random_buffer(size_t(T) * H * 128, 0, 2),
            random_buffer(size_t(T) * HV * 128, 0, 3),
            random_buffer(size_t(T) * HV * 128, 0, 4),
            random_buffer(size_t(T) * HV, 1, 5),
            random_buffer(size_t(T) * HV, 2, 6)};
  std::vector<int> cu = {0};
  for (auto d : docs) cu.push_back(cu.back() + static_cast<int>(d));
  p.cu_host.assign(cu.begin(), cu.end());
  if (bound_documents) p.shape.max_doc_tokens = *std::max_element(docs.begin(), docs.end());
  p.cu = rt::DeviceBuffer::create(cu.size() * 4);
  GDN_CHECK_CU(rt::drv().cuMemcpyHtoD_v2(p.cu.handle(), cu.data(), cu.size() * 4), "upload");
  const size_t state = size_t(N) * HV * 128 * 128 * 4;
  p.h0 = rt::DeviceBuffer::create(state);
  p.ht = rt::DeviceBuffer::create(state);
  p.dh0 = rt::DeviceBuffer::create(state);
  GDN_CHECK_CU(rt::drv().cuMemsetD8_v2(p.h0.handle(), 0, state), "zero h0");
  p.o = rt::DeviceBuffer::create(size_t(T) * HV * 128 * 2);
  p.dq = rt::DeviceBuffer::create(size_t(T) * H * 128 * 2);
  p.dk = rt::DeviceBuffer::create(size_t(T) * H * 128 * 2);
  p.dv = rt::DeviceBuffer::create(size_t(T) * HV * 128 * 2);
  p.dg = rt::DeviceBuffer::create(size_t(T) * HV * 4);
  p.db = rt::DeviceBuffer::create(size_t(T) * HV * 4);
  // Uploads and memsets ran on the legacy stream, which does not order against ours.
  GDN_CHECK_CU(rt::drv().cuCtxSynchronize(), "setup");
  return p;
}

/// One layer; its saved region and workspace are views of buffers that all arms of a table
/// share (arms run one after another on one stream, and every operation starts with a forward,
/// so no arm reads what another wrote: the 35 GB workspace of shape A exists once, not per arm).
/// One rank's share of a problem (the kcp arms): its context and its rows of every tensor.
struct RankSlice {
  std::unique_ptr<KcpContext> kcp;
  rt::DeviceBuffer cu;
  LayerInputs in;
  LayerOutputs out, no_output;
  LayerGrads grads;
};

struct Arm {
  std::string name;
  std::unique_ptr<Layer> layer;
  void* saved = nullptr;
  size_t saved_bytes = 0;
  std::unique_ptr<Workspace> stamp;
  std::optional<RankSlice> slice;  ///< a kcp arm: one rank's phases
  bool recompute_output = false;   ///< ckpt's recompute writes o again (torch.utils.checkpoint's)
  ProblemShape shape(const ProblemShape& whole) const { return slice ? slice->kcp->shape() : whole; }
};

/// The buffers shared by a table's arms, sized for the largest arm.
struct SharedRegions {
  rt::DeviceBuffer saved, ws;
};

size_t workspace_for_all_forms(const Layer& layer, const ProblemShape& ps) {
  return std::max({layer.workspace_bytes(CallForm::forward, ps), layer.workspace_bytes(CallForm::recompute, ps),
                   layer.workspace_bytes(CallForm::backward, ps)});
}

/// Rank `rank`'s slice of `p` for a layer with cp.ranks > 1.
RankSlice rank_slice(const Layer& layer, const Problem& p, int rank) {
  RankSlice r;
  const Spec& sp = layer.ir().spec;
  r.kcp = std::make_unique<KcpContext>(layer, p.cu_host, rank, sp.cp_ranks);
  const CpRankView& v = r.kcp->view();
  r.cu = rt::DeviceBuffer::create(v.cu_seqlens.size() * 8);
  GDN_CHECK_CU(rt::drv().cuMemcpyHtoD_v2(r.cu.handle(), v.cu_seqlens.data(), v.cu_seqlens.size() * 8), "upload");
  const size_t t0 = static_cast<size_t>(v.token_begin), n0 = static_cast<size_t>(v.docs.front());
  const size_t qk = size_t(sp.heads_qk) * 128 * 2, vo = size_t(sp.heads_v) * 128 * 2, gb = size_t(sp.heads_v) * 4;
  const size_t state = size_t(sp.heads_v) * 128 * 128 * 4;
  const auto at = [](const rt::DeviceBuffer& b, size_t bytes) { return b.get<char>() + bytes; };
  const auto fat = [&](const rt::DeviceBuffer& b, size_t bytes) { return reinterpret_cast<float*>(at(b, bytes)); };
  r.in = {at(p.q, t0 * qk),  at(p.k, t0 * qk),      at(p.v, t0 * vo),
          fat(p.g, t0 * gb), fat(p.beta, t0 * gb),  r.cu.get(),
          IndexType::int64,  fat(p.h0, n0 * state), 0};
  r.out = {at(p.o, t0 * vo), fat(p.ht, n0 * state)};
  r.no_output = {nullptr, fat(p.ht, n0 * state)};
  r.grads = {at(p.d_o, t0 * vo), nullptr,
             at(p.dq, t0 * qk),  at(p.dk, t0 * qk),
             at(p.dv, t0 * vo),  fat(p.dg, t0 * gb),
             fat(p.db, t0 * gb), fat(p.dh0, n0 * state)};
  return r;
}

/// The arms of `specs`; rank[i] >= 0 makes arm i a kcp arm (that rank's phases on `p`).
std::vector<Arm> make_arms(const std::vector<std::pair<std::string, Spec>>& specs, const ProblemShape& ps,
                           const rt::Context& ctx, cache::DiskCache& cache, SharedRegions& regions,
                           const Problem* p = nullptr, const std::vector<int>& rank = {}) {
  std::vector<Arm> arms;
  size_t saved = 0, ws = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto& [name, spec] = specs[i];
    arms.push_back(Arm{name, Layer::create(spec, ctx, cache), nullptr, 0, nullptr, std::nullopt});
    Arm& a = arms.back();
    if (i < rank.size() && rank[i] >= 0) {
      a.slice = rank_slice(*a.layer, *p, rank[i]);
      a.saved_bytes = a.slice->kcp->saved_bytes();
    } else {
      a.saved_bytes = a.layer->saved_bytes(ps);
    }
    const size_t a_ws =
        a.slice ? a.slice->kcp->workspace_bytes(CallForm::backward) : workspace_for_all_forms(*a.layer, ps);
    saved = std::max(saved, a.saved_bytes);
    ws = std::max(ws, a_ws);
    a.stamp = std::make_unique<Workspace>(nullptr, a_ws);
  }
  regions.saved = rt::DeviceBuffer::create(saved);
  regions.ws = rt::DeviceBuffer::create(ws);
  // The kcp arms' gathered records start as zeros (no all-gather refills them).
  GDN_CHECK_CU(rt::drv().cuMemsetD8_v2(regions.ws.handle(), 0, ws), "zero the workspace");
  for (auto& a : arms) {
    a.saved = regions.saved.get();
    a.stamp = std::make_unique<Workspace>(regions.ws.get(), a.stamp->bytes());
  }
  return arms;
}

/// One operation (0 fwd, 1 fwd+bwd, 2 ckpt) on an arm, enqueued on `stream`.
void enqueue_op(Arm& a, const Problem& p, int op, CUstream stream) {
  if (a.slice) {
    const KcpContext& k = *a.slice->kcp;
    const RankSlice& r = *a.slice;
    k.forward_summaries(r.in, a.saved, a.saved_bytes, *a.stamp, stream);
    k.forward_walk(r.in, r.out, a.saved, a.saved_bytes, *a.stamp, stream);
    if (op == 2) k.recompute(r.in, r.no_output, OutputNeeded::no, a.saved, a.saved_bytes, *a.stamp, stream);
    if (op >= 1) {
      k.backward_summaries(r.in, r.grads, a.saved, a.saved_bytes, *a.stamp, stream);
      k.backward_walk(r.in, r.grads, a.saved, a.saved_bytes, *a.stamp, stream);
    }
    return;
  }
  a.layer->forward(p.shape, p.in(), p.out(), a.saved, a.saved_bytes, *a.stamp, stream);
  if (op == 2 && a.recompute_output)
    a.layer->recompute(p.shape, p.in(), p.out(), OutputNeeded::yes, a.saved, a.saved_bytes, *a.stamp, stream);
  else if (op == 2)
    a.layer->recompute(p.shape, p.in(), p.no_output(), OutputNeeded::no, a.saved, a.saved_bytes, *a.stamp, stream);
  if (op >= 1) a.layer->backward(p.shape, p.in(), p.grads(), a.saved, a.saved_bytes, *a.stamp, stream);
}

struct Bench {
  rt::Context ctx;
  cache::DiskCache cache;
  rt::Stream stream;
  rt::DeviceBuffer flush;
  rt::Event e0, e1;
  int groups, samples, warmup;
  TensorCores tensor_cores = TensorCores::automatic;  ///< --tensor-cores: the base spec of every mode
  int walk_slab = 0;                                  ///< --walk-slab: the base spec of every mode (0: auto)
  int walk_bwd_slab = 0;                              ///< --walk-bwd-slab: likewise
  int segments = 0;                                   ///< --segments: the base spec's cp.segments (0: "auto")
  ForwardPath forward = ForwardPath::automatic;       ///< --forward: the base spec's forward
  BackwardW backward_w = BackwardW::automatic;        ///< --backward-w: the base spec's backward_w
  SegmentCarry carry = SegmentCarry::automatic;       ///< --carry: the base spec's cp.carry

  void flush_l2() {
    GDN_CHECK_CU(rt::drv().cuMemsetD8Async(flush.handle(), 0, flush.bytes(), stream.handle()), "L2 flush");
  }
  double time_op(Arm& a, const Problem& p, int op) {
    flush_l2();
    e0.record(stream.handle());
    enqueue_op(a, p, op, stream.handle());
    e1.record(stream.handle());
    return static_cast<double>(rt::Event::elapsed_ms(e0, e1));
  }
  /// The benchmark's timing protocol (docs/benchmark.md): `groups` groups; each visits every arm twice in mirrored
  /// order (A B C C B A), each visit `warmup` untimed calls then `samples` timed ones. Returns per arm the median of
  /// all samples and the drift (first vs last group median, % of the median).
  std::vector<std::pair<double, double>> protocol(std::vector<Arm>& arms, const Problem& p, int op) {
    std::vector<std::vector<std::vector<double>>> by_group(arms.size(), std::vector<std::vector<double>>(groups));
    for (int grp = 0; grp < groups; ++grp)
      for (size_t visit = 0; visit < 2 * arms.size(); ++visit) {
        const size_t j = visit < arms.size() ? visit : 2 * arms.size() - 1 - visit;
        for (int w = 0; w < warmup; ++w) time_op(arms[j], p, op);
        for (int k = 0; k < samples; ++k) by_group[j][size_t(grp)].push_back(time_op(arms[j], p, op));
      }
    std::vector<std::pair<double, double>> cells;
    for (auto& groups_of_arm : by_group) {
      std::vector<double> all;
      for (const auto& g : groups_of_arm) all.insert(all.end(), g.begin(), g.end());
      const double med = median(all);
      cells.emplace_back(med, std::abs(median(groups_of_arm.front()) - median(groups_of_arm.back())) / med * 100);
    }
    return cells;
  }
  Spec example(const Shape& sh) const {
    Spec s = spec_from_file(
        (std::filesystem::path(source_dir()) / "examples" / (std::string(sh.example) + ".json")).string());
    s.targets = {Target::sm_90a};
    if (sh.heads_qk != 0) {  // every caller names its specs after the shape
      s.heads_qk = sh.heads_qk;
      s.heads_v = sh.heads_v;
    }
    s.tensor_cores = tensor_cores;
    s.walk_slab = walk_slab;
    s.walk_bwd_slab = walk_bwd_slab;
    s.cp_segments = segments;
    s.forward = forward;
    s.backward_w = backward_w;
    s.cp_carry = carry;
    return s;
  }
};

struct ArmKind {
  bool graph_replay, handoff, mma_sync;
  int walk_slab = 0;                               ///< the spec's walk_slab (0: the base spec's)
  int walk_bwd_slab = 0;                           ///< the spec's walk_bwd_slab (0: the base spec's)
  int segments = 0;                                ///< the spec's cp.segments (0: the base spec's, -1: "auto")
  std::optional<ForwardPath> forward{};            ///< the spec's forward (none: the base spec's)
  int ranks = 0;                                   ///< the spec's cp.ranks (0: the base spec's)
  int rank = -1;                                   ///< >= 0: time this rank's phases only
  std::optional<BackwardW> backward_w{};           ///< the spec's backward_w (none: the base spec's)
  bool nondeterministic = false;                   ///< the spec's determinism "nondeterministic"
  bool verified = false;                           ///< the spec's cp.carry "verified"
  bool recompute_output = false;                   ///< ckpt's recompute with the output needed
  std::optional<WalkBwdLayout> walk_bwd_layout{};  ///< the spec's walk_bwd_layout (none: the base spec's)
  bool full_saves = false;                         ///< the spec's save_mode "full"
  bool norm_in_walk = false;                       ///< the spec's backward_norm "in_walk"
};
const std::map<std::string, ArmKind> kArms = {
    {"spec", {false, true, false}},
    {"spec-aa", {false, true, false}},
    {"no-handoff", {false, false, false}},
    // ckpt as torch.utils.checkpoint runs it: the recompute writes o again (the output needed)
    {"ckpt-output", {false, true, false, 0, 0, 0, std::nullopt, 0, -1, std::nullopt, false, false, true}},
    {"ckpt-output-no-handoff", {false, false, false, 0, 0, 0, std::nullopt, 0, -1, std::nullopt, false, false, true}},
    {"graph", {true, true, false}},
    // save_mode "full": the forward writes the tapes the backward would otherwise recompute
    {"full", {false, true, false, 0, 0, 0, std::nullopt, 0, -1, std::nullopt, false, false, false, std::nullopt, true}},
    // the reverse walk with chunk_bwd's body (one segment, W from the walk)
    {"walk-fused",
     {false, true, false, 0, 0, 1, std::nullopt, 0, -1, BackwardW::walk, false, false, false, WalkBwdLayout::fused}},
    // the same under the verified carry with pinned segments (its three reverse walks fused)
    {"walk-fused-seg2",
     {false, true, false, 0, 0, 2, ForwardPath::fused, 0, -1, BackwardW::walk, false, true, false,
      WalkBwdLayout::fused}},
    {"walk-fused-seg4",
     {false, true, false, 0, 0, 4, ForwardPath::fused, 0, -1, BackwardW::walk, false, true, false,
      WalkBwdLayout::fused}},
    {"walk-fused-seg8",
     {false, true, false, 0, 0, 8, ForwardPath::fused, 0, -1, BackwardW::walk, false, true, false,
      WalkBwdLayout::fused}},
    // the fused layout under the layer's own segment rule (cp.segments and cp.carry "auto")
    {"walk-fused-seg-auto",
     {false, true, false, 0, 0, -1, std::nullopt, 0, -1, BackwardW::walk, false, false, false, WalkBwdLayout::fused}},
    // walk_bwd_layout "auto" with the layer's own rules for the rest: the default it would make
    {"walk-auto",
     {false, true, false, 0, 0, 0, std::nullopt, 0, -1, std::nullopt, false, false, false, WalkBwdLayout::automatic}},
    // the split layout (the default before the fused one) with the layer's own rules for the rest
    {"walk-split",
     {false, true, false, 0, 0, 0, std::nullopt, 0, -1, std::nullopt, false, false, false, WalkBwdLayout::split}},
    // backward_norm "in_walk": the fused reverse walk normalizes the raw q and k rows itself
    {"norm-in-walk",
     {false, true, false, 0, 0, 0, std::nullopt, 0, -1, std::nullopt, false, false, false, std::nullopt, false, true}},
    {"graph-no-handoff", {true, false, false}},
    {"mma-sync", {false, true, true}},  // tensor_cores "mma_sync": the kernels before wgmma, side by side
    {"walk32", {false, true, false, 32}},
    {"walk64", {false, true, false, 64}},        // the forward walk's slab width
    {"walkbwd32", {false, true, false, 0, 32}},  // the backward walk's portable body, 32 wide
    {"walkbwd64", {false, true, false, 0, 64}},
    {"walks64", {false, true, false, 64, 64}},  // the backward's, both
    {"seg1", {false, true, false, 0, 0, 1}},    // cp.segments 1: no document split (the default is "auto")
    {"seg2", {false, true, false, 0, 0, 2}},
    {"seg4", {false, true, false, 0, 0, 4}},  // cp.segments
    {"seg8", {false, true, false, 0, 0, 8}},
    {"seg11", {false, true, false, 0, 0, 11}},  // L: the backward walks' 4 x 6 x 11 blocks are one wave (264)
    {"seg12", {false, true, false, 0, 0, 12}},
    {"seg16", {false, true, false, 0, 0, 16}},
    {"seg32", {false, true, false, 0, 0, 32}},
    {"seg-auto", {false, true, false, 0, 0, -1}},                        // cp.segments "auto"
    {"programs", {false, true, false, 0, 0, 0, ForwardPath::programs}},  // forward "programs"
    {"fused",
     {false, true, false, 0, 0, 0, ForwardPath::fused}},  // forward "fused": the walk and the output in one program
    {"fused-seg-auto", {false, true, false, 0, 0, -1, ForwardPath::fused}},  // forward "fused", cp.segments "auto"
    {"fused-seg16", {false, true, false, 0, 0, 16, ForwardPath::fused}},     // forward "fused", 16 segments
    // The programs path with both walks' slabs pinned (few documents on many heads: more blocks)
    {"programs-walks32", {false, true, false, 32, 32, 0, ForwardPath::programs}},
    {"programs-walks64", {false, true, false, 64, 64, 0, ForwardPath::programs}},
    {"programs-walks32-seg2", {false, true, false, 32, 32, 2, ForwardPath::programs}},
    {"programs-walks32-seg4", {false, true, false, 32, 32, 4, ForwardPath::programs}},
    {"ranks2", {false, true, false, 0, 0, 0, std::nullopt, 2}},  // cp.ranks: the single-GPU proxy
    {"ranks4", {false, true, false, 0, 0, 0, std::nullopt, 4}},
    {"kcp2r0", {false, true, false, 0, 0, 0, std::nullopt, 2, 0}},  // one rank's phases, no all-gather
    {"kcp2r1", {false, true, false, 0, 0, 0, std::nullopt, 2, 1}},
    {"kcp4r0", {false, true, false, 0, 0, 0, std::nullopt, 4, 0}},
    {"kcp4r1", {false, true, false, 0, 0, 0, std::nullopt, 4, 1}},
    {"kcp4r2", {false, true, false, 0, 0, 0, std::nullopt, 4, 2}},
    {"kcp4r3", {false, true, false, 0, 0, 0, std::nullopt, 4, 3}},
    {"walk-w", {false, true, false, 0, 0, 0, std::nullopt, 0, -1, BackwardW::walk}},        // the reverse walk forms W
    {"prep-w", {false, true, false, 0, 0, 0, std::nullopt, 0, -1, BackwardW::chunk_prep}},  // chunk_prep re-runs
    // determinism "nondeterministic": the deterministic and non-deterministic layers side by side
    {"nondet", {false, true, false, 0, 0, 0, std::nullopt, 0, -1, std::nullopt, true}},
    // cp.carry "verified" (segments walked from 0 at once, re-walked until bitwise equal), with the
    // base spec's segments or 11 / 16 (L)
    {"verified", {false, true, false, 0, 0, 0, std::nullopt, 0, -1, std::nullopt, false, true}},
    {"verified-seg11", {false, true, false, 0, 0, 11, std::nullopt, 0, -1, std::nullopt, false, true}},
    {"verified-seg16", {false, true, false, 0, 0, 16, std::nullopt, 0, -1, std::nullopt, false, true}},
    // Many heads on few long documents (F1): the verified carry makes segments cheap enough for
    // layers the fused forward serves unsplit today; it runs on the programs forward and the
    // portable backward walk (64 wide).
    {"verified-programs-seg4", {false, true, false, 0, 64, 4, ForwardPath::programs, 0, -1, std::nullopt, false, true}},
    {"verified-programs-seg8", {false, true, false, 0, 64, 8, ForwardPath::programs, 0, -1, std::nullopt, false, true}},
    // The verified carry on the fused forward (its own speculate and verify walks) with the
    // portable reverse walk (64 wide), for F1.
    {"verified-fused-seg4", {false, true, false, 0, 64, 4, ForwardPath::fused, 0, -1, std::nullopt, false, true}},
    {"verified-fused-seg8", {false, true, false, 0, 64, 8, ForwardPath::fused, 0, -1, std::nullopt, false, true}},
    {"verified-fused-seg16", {false, true, false, 0, 64, 16, ForwardPath::fused, 0, -1, std::nullopt, false, true}},
    // The same with the reverse walk's default slab (128 wide where the sm_90a body runs: its own
    // speculative and verify walks); seg2 for 48 value heads, whose two segments still fit one wave
    // (96 blocks) where "auto" splits nothing (M1, A).
    {"verified-fused128-seg2", {false, true, false, 0, 0, 2, ForwardPath::fused, 0, -1, std::nullopt, false, true}},
    {"verified-fused128-seg4", {false, true, false, 0, 0, 4, ForwardPath::fused, 0, -1, std::nullopt, false, true}},
    {"verified-fused128-seg8", {false, true, false, 0, 0, 8, ForwardPath::fused, 0, -1, std::nullopt, false, true}},
};

/// `base` with arm `name`'s spec changes.
Spec arm_spec(Spec s, const std::string& name) {
  const ArmKind& k = kArms.at(name);
  if (k.graph_replay) s.graph = GraphMode::replay;
  if (!k.handoff) s.reuse_recompute_tapes = ReuseTapes::no;
  if (k.mma_sync) s.tensor_cores = TensorCores::mma_sync;
  if (k.walk_slab != 0) s.walk_slab = k.walk_slab;
  if (k.walk_bwd_slab != 0) s.walk_bwd_slab = k.walk_bwd_slab;
  if (k.segments != 0) s.cp_segments = std::max(0, k.segments);
  if (k.forward) s.forward = *k.forward;
  if (k.backward_w) s.backward_w = *k.backward_w;
  if (k.nondeterministic) s.determinism = Determinism::nondeterministic;
  if (k.verified) s.cp_carry = SegmentCarry::verified;
  if (k.walk_bwd_layout) s.walk_bwd_layout = *k.walk_bwd_layout;
  if (k.full_saves) s.save_mode = SaveMode::full;
  if (k.norm_in_walk) s.backward_norm = BackwardNorm::in_walk;
  if (k.ranks != 0) {
    s.cp_ranks = k.ranks;
    s.cp_segments = 1;  // the ranks' pieces are the segments
  }
  return s;
}

void timing_table(Bench& b, const std::string& shapes, const std::vector<std::string>& arm_names) {
  fmt::print("{:<5} {:<8} {:<18} {:>9} {:>8} {:>9} {:>9} {:>8}\n", "shape", "op", "arm", "ms", "drift %", "FLA ms",
             "FLA/ours", "floor x");
  for (const Shape& sh : kShapes) {
    if (!wanted(shapes, sh.name)) continue;
    const Spec base = b.example(sh);
    Problem p = make_problem(sh.docs, base.heads_qk, base.heads_v);
    std::vector<std::pair<std::string, Spec>> specs;
    std::vector<int> rank;
    for (const auto& name : arm_names) {
      Spec s = arm_spec(base, name);
      s.name = fmt::format("{}_bench_{}", sh.name, specs.size());
      specs.emplace_back(name, s);
      rank.push_back(kArms.at(name).rank);
    }
    SharedRegions regions;
    std::vector<Arm> arms = make_arms(specs, p.shape, b.ctx, b.cache, regions, &p, rank);
    for (size_t j = 0; j < arms.size(); ++j) arms[j].recompute_output = kArms.at(arm_names[j]).recompute_output;
    for (auto& a : arms) {
      b.time_op(a, p, 2);
      a.layer->check_device_status(a.saved, a.shape(p.shape), b.stream.handle());
    }
    for (int op = 0; op < 3; ++op) {
      const auto cells = b.protocol(arms, p, op);
      for (size_t j = 0; j < arms.size(); ++j)
        fmt::print("{:<5} {:<8} {:<18} {:>9.3f} {:>8.2f} {:>9.3f} {:>9.2f} {:>8.1f}\n", sh.name, kOps[op], arms[j].name,
                   cells[j].first, cells[j].second, sh.fla[op], sh.fla[op] / cells[j].first,
                   cells[j].first / sh.floor[op]);
      for (size_t j = 1; j < arms.size(); ++j)
        if (arms[j].name == "spec-aa")
          fmt::print("{:<5} {:<8} A/A difference {:.2f} %\n", sh.name, kOps[op],
                     std::abs(cells[0].first - cells[j].first) / cells[0].first * 100);
    }
    std::fflush(stdout);
  }
}

/// GPU time per program of an eager fwd+bwd (light saves: the backward re-runs the prep and the
/// walk, which show as separate rows), events around every launch, L2 flushed before the call.
/// `op`: 0 fwd, 1 fwd+bwd, 2 ckpt (with the ckpt-output arms the recompute writes o).
void program_breakdown(Bench& b, const std::string& shapes, const std::vector<std::string>& arm_names, int op) {
  for (const Shape& sh : kShapes) {
    if (!wanted(shapes, sh.name)) continue;
    for (const auto& arm : arm_names) {
      if (kArms.at(arm).rank >= 0 || kArms.at(arm).graph_replay)
        throw std::invalid_argument(fmt::format("--programs times eager calls of a whole layer, not arm '{}'", arm));
      Spec s = arm_spec(b.example(sh), arm);
      s.name = fmt::format("{}_programs_{}", sh.name, arm);
      Problem p = make_problem(sh.docs, s.heads_qk, s.heads_v);
      SharedRegions regions;
      std::vector<Arm> one = make_arms({{"programs", s}}, p.shape, b.ctx, b.cache, regions);
      Arm& a = one.front();
      a.recompute_output = kArms.at(arm).recompute_output;
      std::vector<std::pair<std::string, rt::Event>> marks;  // (label, event) in launch order
      size_t next = 0;
      bool recording = false;
      a.layer->observe_launches([&](const Program& prog, CUstream st, bool after) {
        if (!recording) return;
        if (next == marks.size()) marks.emplace_back(std::string(), rt::Event::create());
        marks[next].first = after ? std::string() : prog.name;
        marks[next].second.record(st);
        ++next;
      });
      std::map<std::string, std::vector<double>> per;  // "index name" -> samples
      std::vector<std::string> order;
      for (int rep = 0; rep < b.warmup + b.samples; ++rep) {
        b.flush_l2();
        next = 0;
        recording = true;
        b.e0.record(b.stream.handle());
        enqueue_op(a, p, op, b.stream.handle());
        b.e1.record(b.stream.handle());
        recording = false;
        const double total = rt::Event::elapsed_ms(b.e0, b.e1);
        if (rep < b.warmup) continue;
        for (size_t i = 0; i + 1 < next; i += 2) {
          const std::string key = fmt::format("{:02} {}", i / 2, marks[i].first);
          if (rep == b.warmup) order.push_back(key);
          per[key].push_back(rt::Event::elapsed_ms(marks[i].second, marks[i + 1].second));
        }
        per["total"].push_back(total);
      }
      a.layer->check_device_status(a.saved, p.shape, b.stream.handle());
      fmt::print("shape {} arm {} {}, eager, per program (median of {} calls, L2 flushed per call)\n", sh.name, arm,
                 kOps[op], b.samples);
      double sum = 0;
      for (const auto& key : order) sum += median(per[key]);
      for (const auto& key : order)
        fmt::print("  {:<28} {:>8.3f} ms {:>6.1f} %\n", key, median(per[key]), median(per[key]) / sum * 100);
      fmt::print("  {:<28} {:>8.3f} ms (call; sum of programs {:.3f})\n", "total", median(per["total"]), sum);
      std::fflush(stdout);
    }
  }
}

/// Host time per layer call with the real driver: each call timed alone on the wall clock, the
/// stream drained every 8 calls so the launch queue never blocks the host.
void host_time(Bench& b) {
  fmt::print("host time per call on the GPU machine (median of 800 calls, us)\n");
  fmt::print("{:<6} {:<12} {:<7} {:>9} {:>9}\n", "shape", "path", "mode", "fwd us", "bwd us");
  for (const Shape& sh : kShapes) {
    if (std::string(sh.name) != "N" && std::string(sh.name) != "M") continue;
    const Spec base = b.example(sh);
    Problem p = make_problem(sh.docs, base.heads_qk, base.heads_v);
    for (HostPath path : {HostPath::llvm_stub, HostPath::interpreted}) {
      if (path == HostPath::llvm_stub && !stubs_available()) continue;
      for (bool replay : {false, true}) {
        Spec s = base;
        s.name = fmt::format("{}_host_{}_{}", sh.name, to_string(path), replay ? "replay" : "eager");
        if (replay) s.graph = GraphMode::replay;
        auto layer = Layer::create(s, b.ctx, b.cache, 0, path);
        auto saved = rt::DeviceBuffer::create(layer->saved_bytes(p.shape));
        auto ws = rt::DeviceBuffer::create(layer->workspace_bytes(CallForm::backward, p.shape));
        std::vector<double> fwd, bwd;
        for (int i = 0; i < 816; ++i) {
          auto t0 = std::chrono::steady_clock::now();
          layer->forward(p.shape, p.in(), p.out(), saved.get(), saved.bytes(), ws.get(), ws.bytes(), b.stream.handle());
          auto t1 = std::chrono::steady_clock::now();
          layer->backward(p.shape, p.in(), p.grads(), saved.get(), saved.bytes(), ws.get(), ws.bytes(),
                          b.stream.handle());
          auto t2 = std::chrono::steady_clock::now();
          if (i >= 16) {  // the first calls capture graphs and load modules
            fwd.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
            bwd.push_back(std::chrono::duration<double, std::micro>(t2 - t1).count());
          }
          if (i % 8 == 7) b.stream.synchronize();
        }
        b.stream.synchronize();
        fmt::print("{:<6} {:<12} {:<7} {:>9.2f} {:>9.2f}\n", sh.name, to_string(path), replay ? "replay" : "eager",
                   median(fwd), median(bwd));
      }
    }
  }
}

/// ckpt with and without the tape hand-off at M's heads over growing single documents:
/// rows = tokens x value heads; the crossover (if any) is the sm_90a threshold.
void handoff_sweep(Bench& b) {
  const Shape& m = kShapes[1];
  const Spec base = b.example(m);
  fmt::print("ckpt hand-off sweep (heads {}/{}, one document per row of the table)\n", base.heads_qk, base.heads_v);
  fmt::print("{:>8} {:>10} {:>12} {:>12} {:>8} {:>8}\n", "tokens", "rows", "hand-off ms", "re-run ms", "gain %",
             "drift %");
  for (long long T : {64LL, 256LL, 1024LL, 2048LL, 4096LL, 8192LL, 16384LL, 32768LL}) {
    Problem p = make_problem({T}, base.heads_qk, base.heads_v);
    std::vector<std::pair<std::string, Spec>> specs;
    for (bool handoff : {true, false}) {
      Spec s = base;
      s.name = fmt::format("m_sweep_{}", handoff ? "handoff" : "rerun");
      s.reuse_recompute_tapes = handoff ? ReuseTapes::yes : ReuseTapes::no;
      specs.emplace_back(s.name, s);
    }
    SharedRegions regions;
    std::vector<Arm> arms = make_arms(specs, p.shape, b.ctx, b.cache, regions);
    const auto cells = b.protocol(arms, p, 2);
    fmt::print("{:>8} {:>10} {:>12.4f} {:>12.4f} {:>8.2f} {:>8.2f}\n", T, T * base.heads_v, cells[0].first,
               cells[1].first, (cells[1].first - cells[0].first) / cells[1].first * 100,
               std::max(cells[0].second, cells[1].second));
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  // Line-buffered even into a pipe: a device call cut by its time limit keeps the rows printed so far.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  CLI::App app{"gdn_bench: times gdnc's layer calls on the GPU (the benchmark's timing protocol)"};
  std::string shapes = "N,M,G,A";
  std::vector<std::string> arm_names = {"spec", "spec-aa", "no-handoff", "graph"};
  int groups = 5, samples = 12, warmup = 10;
  bool programs = false, host = false, sweep = false, host_only_mode = false;
  app.add_option("--shapes", shapes,
                 "comma-separated subset of N,M,G,A, the single long documents L (N's heads, "
                 "32768 tokens) and M1 (M's heads, 32768 tokens), and F (heads 16/32, eight 4096-token "
                 "documents) and F1 (heads 16/32, one 32768-token document), MR (M's documents shortest first)");
  app.add_option(
         "--arms", arm_names,
         "arms of the timing table: spec (the example spec), spec-aa (an A/A copy: the noise envelope), "
         "no-handoff (ckpt re-runs the prep and the walk), full (save_mode \"full\"), graph, graph-no-handoff, "
         "mma-sync (tensor_cores "
         "\"mma_sync\"), walk32, walk64 (walk_slab 32 / 64), walkbwd32, walkbwd64 (walk_bwd_slab 32 / 64), walks64 "
         "(both 64), seg1, seg2, seg4, seg8, seg11, seg12, seg16, seg32 (cp.segments), seg-auto (cp.segments "
         "\"auto\"), programs, "
         "fused (forward \"programs\", \"fused\"), fused-seg-auto, fused-seg16, programs-walks32, programs-walks64, "
         "programs-walks32-seg2, "
         "programs-walks32-seg4 (the programs forward, both walks' slabs pinned), ranks2, ranks4 (cp.ranks: the "
         "single-GPU proxy), "
         "kcp2r0 .. kcp4r3 (rank r of 2 or 4: its phases on its own tokens, without the all-gather), walk-w, prep-w "
         "(backward_w \"walk\", \"chunk_prep\"), walk-fused (walk_bwd_layout \"fused\"), "
         "walk-fused-seg2, -seg4, -seg8 (with verified segments), walk-fused-seg-auto (cp.segments \"auto\"), "
         "walk-auto (walk_bwd_layout \"auto\", the default), walk-split (\"split\"), "
         "norm-in-walk (backward_norm \"in_walk\"), nondet (determinism "
         "\"nondeterministic\"), verified, "
         "verified-seg11, verified-seg16 (cp.carry \"verified\"), verified-programs-seg4, verified-programs-seg8 "
         "(the verified carry on the programs forward and the 64-wide backward walk, for F1), verified-fused-seg4, "
         "-seg8, -seg16 (the verified carry on the fused forward, the 64-wide backward walk), verified-fused128-seg2, "
         "-seg4, -seg8 (the same, the backward walk's default slab: the sm_90a body's verified walks)")
      ->check(CLI::IsMember([] {
        std::vector<std::string> names;
        for (const auto& [name, kind] : kArms) names.push_back(name);
        return names;
      }()))
      ->delimiter(',');
  app.add_option("--groups", groups, "groups of mirrored visits")->check(CLI::PositiveNumber);
  app.add_option("--samples", samples, "timed calls per visit")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "untimed calls per visit")->check(CLI::NonNegativeNumber);
  app.add_flag("--programs", programs, "per-program GPU time of an eager call (of each --arms given, else the spec)");
  std::string programs_op = "fwd+bwd";
  app.add_option("--programs-op", programs_op, "the call --programs times")
      ->check(CLI::IsMember({"fwd", "fwd+bwd", "ckpt"}));
  app.add_flag("--host-time", host, "host time per call on the GPU (eager and replay, both host paths)");
  app.add_flag("--sweep", sweep, "ckpt with and without the tape hand-off over token counts");
  app.add_flag("--host-only", host_only_mode, "host time per call with launches discarded (no GPU)");
  std::string tensor_cores = "auto";
  app.add_option("--tensor-cores", tensor_cores, "the specs' tensor_cores (auto: wgmma where a program has it)")
      ->check(CLI::IsMember({"auto", "mma_sync"}));
  std::string walk_slab = "auto";
  app.add_option("--walk-slab", walk_slab, "the specs' walk_slab (the forward walk's V-slab width)")
      ->check(CLI::IsMember({"auto", "32", "64"}));
  std::string walk_bwd_slab = "auto";
  app.add_option("--walk-bwd-slab", walk_bwd_slab, "the specs' walk_bwd_slab (the backward walk's V-slab width)")
      ->check(CLI::IsMember({"auto", "32", "64", "128"}));
  std::string segments = "auto";
  app.add_option("--segments", segments, "the specs' cp.segments (intra-card segments per document): 1 to 64 or auto")
      ->check(CLI::IsMember({"auto"}) | CLI::Range(1, 64));
  std::string forward = "auto";
  app.add_option("--forward", forward,
                 "the specs' forward (\"fused\": the walk and the output in one program; \"auto\": the layer's rule)")
      ->check(CLI::IsMember({"programs", "fused", "auto"}));
  std::string backward_w = "auto";
  app.add_option("--backward-w", backward_w,
                 "the specs' backward_w (\"walk\": the reverse walk forms W on sm_90a; \"auto\": wherever it can)")
      ->check(CLI::IsMember({"chunk_prep", "walk", "auto"}));
  std::string carry = "auto";
  app.add_option("--carry", carry,
                 "the specs' cp.carry (\"verified\": segments walked from 0, re-walked until equal; \"auto\": "
                 "verified where the layer allows it)")
      ->check(CLI::IsMember({"merge", "verified", "auto"}));
  std::string gates = "logsigmoid";
  app.add_option("--gates", gates,
                 "the gates g: logsigmoid of N(0,1) (mean about -0.8), slow (logsigmoid of N(4,1): mean about "
                 "-0.03, slow-decay heads), zero (no decay)")
      ->check(CLI::IsMember({"logsigmoid", "slow", "zero"}));
  std::string max_doc_tokens = "none";
  app.add_option("--max-doc-tokens", max_doc_tokens,
                 "the calls' bound on every document's tokens (ProblemShape::max_doc_tokens): none, or longest "
                 "(the problem's longest document; the forward's walks then take its segment rows)")
      ->check(CLI::IsMember({"none", "longest"}));
  CLI11_PARSE(app, argc, argv);
  bound_documents = max_doc_tokens == "longest";
  gate_logit_shift = gates == "slow" ? 4.f : 0.f;
  zero_gates = gates == "zero";
  try {
    if (host_only_mode) return host_only();
    shapes = canonical_shapes(shapes);
    Bench b{rt::Context::create(0),
            cache::DiskCache(),
            rt::Stream::create(),
            rt::DeviceBuffer::create(256u << 20),  // > the H200's 60 MB L2
            rt::Event::create(),
            rt::Event::create(),
            groups,
            samples,
            warmup};
    b.tensor_cores = tensor_cores == "auto" ? TensorCores::automatic : TensorCores::mma_sync;
    b.walk_slab = walk_slab == "auto" ? 0 : std::stoi(walk_slab);
    b.walk_bwd_slab = walk_bwd_slab == "auto" ? 0 : std::stoi(walk_bwd_slab);
    b.segments = segments == "auto" ? 0 : std::stoi(segments);
    b.forward = forward == "fused"      ? ForwardPath::fused
                : forward == "programs" ? ForwardPath::programs
                                        : ForwardPath::automatic;
    b.backward_w = backward_w == "walk"         ? BackwardW::walk
                   : backward_w == "chunk_prep" ? BackwardW::chunk_prep
                                                : BackwardW::automatic;
    b.carry = carry == "verified" ? SegmentCarry::verified
              : carry == "auto"   ? SegmentCarry::automatic
                                  : SegmentCarry::merge;
    fmt::print(
        "device: {} ({} SMs), tensor_cores {}, walk_slab {}, walk_bwd_slab {}, segments {}, forward {}, backward_w "
        "{}, carry {}, gates {}\n",
        b.ctx.name(), b.ctx.sm_count(), tensor_cores, walk_slab, walk_bwd_slab, segments, forward, backward_w, carry,
        gates);
    // --programs times the example spec unless --arms names others (each eager, one after another).
    if (programs)
      program_breakdown(b, shapes, app.count("--arms") ? arm_names : std::vector<std::string>{"spec"},
                        static_cast<int>(std::find(std::begin(kOps), std::end(kOps), programs_op) - std::begin(kOps)));
    if (host) host_time(b);
    if (sweep) handoff_sweep(b);
    if (!programs && !host && !sweep) timing_table(b, shapes, arm_names);
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "gdn_bench: {}\n", e.what());
    return 1;
  }
}
