/**
 * @file test_runtime.cpp
 * @brief The checkpointed step on the CPU: the hand-off decision table, the launch sequences of
 *        ckpt with and without a hand-off, and every stale-stamp case falling back to the
 *        re-run (recorded launches, no GPU).
 */
#include "tests/launch_recorder.hpp"
#include "runtime/gdn.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fmt/format.h>
#include <fmt/ranges.h>

// A failed comparison of launch sequences prints both lists.
template <>
struct doctest::StringMaker<std::vector<std::string>> {
  static doctest::String convert(const std::vector<std::string>& v) { return fmt::format("{}", v).c_str(); }
};

namespace fs = std::filesystem;
using namespace gdn;

namespace {

Spec example(const char* name) {
  return spec_from_file((fs::path(GDN_SOURCE_DIR) / "examples" / (std::string(name) + ".json")).string());
}

/// A layer on a recorder with fake, aligned device addresses for every argument.
struct Rig {
  std::shared_ptr<testing::RecordingLauncher> rec = std::make_shared<testing::RecordingLauncher>();
  std::unique_ptr<Layer> layer;
  ProblemShape shape{8192, 3};
  LayerInputs in;
  LayerOutputs out;
  LayerGrads grads;
  void* saved = reinterpret_cast<void*>(0x100000000ull);
  size_t saved_size = 0;
  Workspace ws{reinterpret_cast<void*>(0x200000000ull), 0};

  explicit Rig(const Spec& spec) : layer(Layer::with_launcher(spec, rec)) {
    auto p = [](uint64_t i) { return reinterpret_cast<void*>(0x1000000ull * i); };
    auto fp = [](uint64_t i) { return reinterpret_cast<float*>(0x1000000ull * i); };
    const bool h0 = spec.initial_state == StateFlag::present, ht = spec.final_state == StateFlag::present;
    in = {p(1), p(2), p(3), fp(4), fp(5), p(6), IndexType::int32, h0 ? fp(7) : nullptr, 0};
    out = {p(8), ht ? fp(9) : nullptr};
    grads = {p(10), ht ? fp(11) : nullptr, p(12), p(13), p(14), fp(15), fp(16), h0 ? fp(17) : nullptr};
    saved_size = layer->saved_bytes(shape);
    ws = Workspace(ws.data(), std::max(layer->workspace_bytes(CallForm::forward, shape),
                                       layer->workspace_bytes(CallForm::backward, shape)));
  }
  std::vector<std::string> programs_since(size_t from) const {
    std::vector<std::string> out;
    for (size_t i = from; i < rec->records.size(); ++i) out.push_back(rec->records[i].program);
    return out;
  }
  HandOff recompute(CUstream s = nullptr, OutputNeeded o = OutputNeeded::no) {
    return layer->recompute(shape, in, out, o, saved, saved_size, ws, s);
  }
  HandOff backward(CUstream s = nullptr) { return layer->backward(shape, in, grads, saved, saved_size, ws, s); }
};

// Shape n's example spec: cp.segments "auto" with the verified carry ("auto") puts the walk from
// zero and its verification before the prescan, the merge and the walk of the chains that fail.
const std::vector<std::string> kBackwardWithHandoff = {
    "dv_local",       "walk_bwd_speculate", "walk_bwd_verify", "walk_bwd_prescan",
    "walk_merge_bwd", "state_walk_bwd",     "chunk_bwd",       "finalize"};
const std::vector<std::string> kForwardWalk = {"chunk_prep",   "walk_speculate", "walk_verify",
                                               "walk_prescan", "walk_merge",     "state_walk"};
// The backward's re-run walk starts every segment from the forward's saved seg_h0.
const std::vector<std::string> kRerunWalk = {"chunk_prep", "state_walk"};
const std::vector<std::string> kBackwardRerun = [] {
  std::vector<std::string> v = kRerunWalk;
  v.insert(v.end(), kBackwardWithHandoff.begin(), kBackwardWithHandoff.end());
  return v;
}();

/// A recompute then a backward of `spec`, neither taking a hand-off; the backward's programs.
std::vector<std::string> backward_after_recompute_without_handoff(const Spec& spec) {
  Rig r(spec);
  CHECK(r.recompute() == HandOff::not_taken);
  const size_t mark = r.rec->records.size();
  CHECK(r.backward() == HandOff::not_taken);
  return r.programs_since(mark);
}

/// Capture records the launches issued during capture; a replay re-issues them to `replayed`.
class FakeGraphBackend final : public GraphBackend {
 public:
  explicit FakeGraphBackend(std::shared_ptr<testing::RecordingLauncher> rec, size_t bytes_per_graph = 1000)
      : rec_(std::move(rec)), bytes_(bytes_per_graph) {}
  static inline const auto kCaptureStream = reinterpret_cast<CUstream>(0xca97);
  std::vector<testing::LaunchRecord> replayed;
  std::vector<CUstream> replay_streams;
  bool outer_capture = false;  ///< pretend someone else (torch.cuda.graph) is capturing the stream
  bool capturing(CUstream) override { return outer_capture; }

  std::unique_ptr<CapturedGraph> capture(const std::function<void(CUstream)>& run) override {
    const size_t mark = rec_->records.size();
    run(kCaptureStream);
    std::vector<testing::LaunchRecord> captured(rec_->records.begin() + static_cast<long>(mark), rec_->records.end());
    return std::make_unique<Graph>(this, std::move(captured), bytes_);
  }

 private:
  struct Graph final : CapturedGraph {
    Graph(FakeGraphBackend* b, std::vector<testing::LaunchRecord> l, size_t bytes)
        : backend(b), launches(std::move(l)), size(bytes) {}
    void replay(CUstream stream) override {
      backend->replay_streams.push_back(stream);
      backend->replayed.insert(backend->replayed.end(), launches.begin(), launches.end());
    }
    size_t bytes() const override { return size; }
    FakeGraphBackend* backend;
    std::vector<testing::LaunchRecord> launches;
    size_t size;
  };
  std::shared_ptr<testing::RecordingLauncher> rec_;
  size_t bytes_;
};

std::string render(const std::vector<testing::LaunchRecord>& r) { return testing::render(r, {}); }

/// Shape n in graph mode over a recording launcher and a fake capture backend.
struct GraphRig {
  explicit GraphRig(size_t bytes_per_graph = 1000, bool outer_capture = false)
      : rec(std::make_shared<testing::RecordingLauncher>()),
        backend(std::make_shared<FakeGraphBackend>(rec, bytes_per_graph)) {
    backend->outer_capture = outer_capture;
    Spec s = example("n");
    s.graph = GraphMode::replay;
    layer = Layer::with_launcher(s, rec, default_host_path(), backend);
  }
  std::shared_ptr<testing::RecordingLauncher> rec;
  std::shared_ptr<FakeGraphBackend> backend;
  std::unique_ptr<Layer> layer;
};

}  // namespace

TEST_SUITE("runtime") {
  TEST_CASE("a launch's tensor maps are read from its parameter block: the pointer and the token rows") {
    auto spec = gdn::spec_from_file((fs::path(GDN_SOURCE_DIR) / "examples/m.json").string());
    spec.walk_bwd_layout = gdn::WalkBwdLayout::split;  // the split walk's parameter block
    const auto ir = gdn::lower(spec);
    const gdn::Program& walk = ir.program("state_walk_bwd");
    gdn::StateWalkBwdParams p{};
    alignas(16) static unsigned char q[16], k[16], tm[16], d_o[16];
    p.q = reinterpret_cast<const gdn::bf16_t*>(q);
    p.k = reinterpret_cast<const gdn::bf16_t*>(k);
    p.tm = reinterpret_cast<const gdn::bf16_t*>(tm);
    p.d_o = reinterpret_cast<const gdn::bf16_t*>(d_o);
    p.dh_tape = reinterpret_cast<gdn::bf16_t*>(k);
    p.dv_new = reinterpret_cast<gdn::bf16_t*>(q);
    p.T = 33000;
    p.nt_max = 566;
    const auto r = gdn::tensor_map_requests(walk, &p, sizeof p);
    REQUIRE(r.size() == 6);
    CHECK(r[0].base == k);
    CHECK(r[1].base == q);
    CHECK(r[2].base == tm);
    CHECK(r[3].base == d_o);
    for (int i : {0, 1, 2, 3, 5}) CHECK(r[i].rows == 33000);
    CHECK(r[2].row_elements == 48 * 64);
    CHECK(r[4].rows == 566 * 48 * 128);
    CHECK(r[4].row_elements == 128);
    CHECK(r[4].box_rows == 128);
    // A parameter block too short for the declared fields is the plan's bug, caught before a launch.
    CHECK_THROWS_AS(gdn::tensor_map_requests(walk, &p, 64), std::logic_error);
  }

  TEST_CASE("a TMA operand the driver could not map is refused with its name, before the driver is asked") {
    alignas(16) static unsigned char x[32];
    CHECK_THROWS_WITH_AS(gdn::rt::encode_bf16_sw128_map(nullptr, 64, 2048, 64, 64, "k of program 'state_walk_bwd'"),
                         doctest::Contains("k of program 'state_walk_bwd': address"), gdn::InputError);
    CHECK_THROWS_AS(gdn::rt::encode_bf16_sw128_map(x + 2, 64, 2048, 64, 64, "q"), gdn::InputError);  // misaligned
    CHECK_THROWS_AS(gdn::rt::encode_bf16_sw128_map(x, 64, 36, 64, 64, "v"), gdn::InputError);        // 72-byte rows
    CHECK_THROWS_WITH_AS(gdn::rt::encode_bf16_sw128_map(x, 1ull << 31, 128, 64, 128, "dh_tape"),
                         doctest::Contains("rows exceed the 2^31"), gdn::InputError);
    CHECK_THROWS_AS(gdn::rt::encode_bf16_sw128_map(x, 64, 2048, 32, 64, "k"), std::logic_error);  // not a SW128 box
  }

  TEST_CASE("graph mode: capture once, replay what the eager call launches, new addresses capture anew") {
    GraphRig g;
    auto& [rec, backend, layer] = g;
    Rig eager(example("n"));
    auto stream = reinterpret_cast<CUstream>(0x5);
    for (int i = 0; i < 3; ++i)
      layer->forward(eager.shape, eager.in, eager.out, eager.saved, eager.saved_size, eager.ws.data(), eager.ws.bytes(),
                     stream);
    eager.layer->forward(eager.shape, eager.in, eager.out, eager.saved, eager.saved_size, eager.ws.data(),
                         eager.ws.bytes(), stream);
    CHECK(layer->graph_stats().captures == 1);
    CHECK(layer->graph_stats().replays == 3);
    CHECK(render(rec->records) == render(eager.rec->records));  // captured = eager
    CHECK(backend->replayed.size() == 3 * rec->records.size());
    for (const auto& r : rec->records) CHECK(r.stream == FakeGraphBackend::kCaptureStream);
    CHECK(backend->replay_streams == std::vector<CUstream>(3, stream));
    LayerInputs moved = eager.in;
    moved.v = static_cast<const char*>(moved.v) + 256;
    layer->forward(eager.shape, moved, eager.out, eager.saved, eager.saved_size, eager.ws.data(), eager.ws.bytes(),
                   stream);
    CHECK(layer->graph_stats().captures == 2);
    layer->forward(eager.shape, eager.in, eager.out, eager.saved, eager.saved_size, eager.ws.data(), eager.ws.bytes(),
                   reinterpret_cast<CUstream>(0x6));  // another stream is another key
    CHECK(layer->graph_stats().captures == 3);
    // The legacy default stream cannot be captured; the capture runs on the backend's own stream
    // and the replay on the caller's.
    layer->forward(eager.shape, eager.in, eager.out, eager.saved, eager.saved_size, eager.ws.data(), eager.ws.bytes(),
                   nullptr);
    CHECK(layer->graph_stats().captures == 4);
    CHECK(backend->replay_streams.back() == nullptr);
    CHECK(rec->records.back().stream == FakeGraphBackend::kCaptureStream);
  }

  TEST_CASE("graph mode: the cache stays within both bounds over 1000 distinct layouts") {
    GraphRig g(1000);
    auto& layer = g.layer;
    Rig r(example("n"));
    for (auto [entries, bytes] : {std::pair<size_t, size_t>{256, size_t{1} << 30}, {1000000, 50 * 1000}}) {
      layer->set_graph_cache_limits({entries, bytes});
      size_t max_entries = 0, max_bytes = 0;
      for (long long t = 1; t <= 1000; ++t) {
        const ProblemShape shape{1000 + t, 3};
        Workspace ws(r.ws.data(), size_t{1} << 40);
        layer->forward(shape, r.in, r.out, r.saved, size_t{1} << 40, ws, reinterpret_cast<CUstream>(0x5));
        max_entries = std::max(max_entries, layer->graph_stats().entries);
        max_bytes = std::max(max_bytes, layer->graph_stats().bytes);
      }
      CAPTURE(entries);
      CHECK(max_entries == std::min<size_t>(entries, bytes / 1000));
      CHECK(max_bytes <= bytes);
      CHECK(layer->graph_stats().evictions == 1000 - max_entries);
    }
  }

  TEST_CASE("graph mode inside an outer capture launches eagerly into it") {
    GraphRig g(1000, true);
    auto& [rec, backend, layer] = g;
    Rig r(example("n"));
    layer->forward(r.shape, r.in, r.out, r.saved, r.saved_size, r.ws, reinterpret_cast<CUstream>(0x5));
    CHECK(layer->graph_stats().captures == 0);
    CHECK(rec->records.size() == 12);  // the forward's launches, issued into the outer capture
  }

  TEST_CASE("graph mode keeps the hand-off: the recompute and the bound backward are graphs of their own") {
    GraphRig g;
    auto& layer = g.layer;
    Rig r(example("n"));
    auto stream = reinterpret_cast<CUstream>(0x5);
    for (int step = 0; step < 2; ++step) {
      layer->forward(r.shape, r.in, r.out, r.saved, r.saved_size, r.ws, stream);
      CHECK(layer->recompute(r.shape, r.in, r.out, OutputNeeded::no, r.saved, r.saved_size, r.ws, stream) ==
            HandOff::taken);
      CHECK(layer->backward(r.shape, r.in, r.grads, r.saved, r.saved_size, r.ws, stream) == HandOff::taken);
    }
    CHECK(layer->graph_stats().captures == 3);  // forward, recompute, backward with the hand-off
    CHECK(layer->graph_stats().replays == 6);
  }

  TEST_CASE("hand-off decision table and size rule per target") {
    CHECK(handoff_threshold_rows(Target::sm_90a) == 0);
    CHECK(handoff_threshold_rows(Target::sm_100a) == 61440);
    CHECK(handoff_threshold_rows(Target::sm_103a) == 0);
    for (Target t : supported_targets()) {
      CHECK(decide_handoff(ReuseTapes::yes, t, 1));
      CHECK_FALSE(decide_handoff(ReuseTapes::no, t, 1LL << 40));
    }
    CHECK_FALSE(decide_handoff(ReuseTapes::automatic, Target::sm_100a, 61439));
    CHECK(decide_handoff(ReuseTapes::automatic, Target::sm_100a, 61440));
    CHECK(decide_handoff(ReuseTapes::automatic, Target::sm_103a, 1));
    CHECK(decide_handoff(ReuseTapes::automatic, Target::sm_90a, 1));
  }

  TEST_CASE("the device check's verdicts name the field, the position and the values") {
    CHECK_FALSE(device_status_error(kCuOk, 0, kStatusNoKey, 0, 6).has_value());
    CHECK(device_status_error(kCuFirstNotZero, 0, 5, 0, 6) == "cu_seqlens[0]: 5 must be 0");
    CHECK(device_status_error(kCuDecreasing, 2, 50, 100, 6) ==
          "cu_seqlens[2]: 50 < cu_seqlens[1] (100): must be non-decreasing");
    CHECK(device_status_error(kCuLastNotT, 2, 127, 128, 6) == "cu_seqlens[2]: 127 must equal T (128)");
    // cu_seqlens[3] - cu_seqlens[2] is document 2's length.
    CHECK(device_status_error(kCuLongerThanBound, 3, 3000, 2048, 6) ==
          "cu_seqlens: document 2 has 3000 tokens, more than max_doc_tokens 2048");
    // gate_cumsum's key is t x HV + head: 777 x 6 + 3.
    CHECK(device_status_error(kGateNotLogDecay, 0, 777 * 6 + 3, 0, 6) ==
          "g[777, 3]: positive, NaN or infinite (the first such [packed token, value head]); g is the log decay, "
          "finite and <= 0 (e.g. logsigmoid of a gate logit)");
    // Keys past 2^31 (T x HV can exceed an int) decode in 64 bits.
    const long long far = 3000000000LL * 48 + 47;
    CHECK(device_status_error(kGateNotLogDecay, 0, far, 0, 48).value().rfind("g[3000000000, 47]:", 0) == 0);
    // A status block that was never written by these kernels (wrong pointer, stale region).
    CHECK(device_status_error(kGateNotLogDecay, 0, kStatusNoKey, 0, 6).value().find("not a finite log decay") !=
          std::string::npos);
    CHECK(device_status_error(99, 0, 0, 0, 6) == "device status: unknown code 99");
  }

  TEST_CASE("ckpt with a hand-off: the backward binds the recompute's tapes") {
    Rig r(example("n"));
    r.layer->forward(r.shape, r.in, r.out, r.saved, r.saved_size, r.ws, nullptr);  // the no-save forward
    size_t mark = r.rec->records.size();
    CHECK(r.recompute() == HandOff::taken);
    std::vector<std::string> recompute = {"chunk_table", "l2norm", "l2norm", "gate_cumsum", "chunk_solve"};
    recompute.insert(recompute.end(), kForwardWalk.begin(), kForwardWalk.end());
    CHECK(r.programs_since(mark) == recompute);
    mark = r.rec->records.size();
    CHECK(r.backward() == HandOff::taken);
    CHECK(r.programs_since(mark) == kBackwardWithHandoff);
    CHECK(r.ws.calls() == 3);
  }

  TEST_CASE("forward fused: a recompute hands its tapes over with or without the output; the forward has none") {
    Spec spec = example("n");
    spec.forward = ForwardPath::fused;
    spec.cp_segments = 1;  // segments take the norm fold away (the prescans read qn, kn)
    Rig r(spec);
    // The forward's fused walk leaves no tapes: the backward normalizes q and k itself (the fused
    // forward folds the norm and saves no qn, kn) and makes its tapes with the fused walk without
    // the output (walk_tape), in the re-run as in a recompute.
    size_t mark = r.rec->records.size();
    r.layer->forward(r.shape, r.in, r.out, r.saved, r.saved_size, r.ws, nullptr);
    CHECK(r.programs_since(mark) ==
          std::vector<std::string>{"chunk_table", "l2norm", "gate_cumsum", "chunk_solve", "fused_walk"});
    mark = r.rec->records.size();
    CHECK(r.backward() == HandOff::not_taken);
    const std::vector<std::string> rerun = {"l2norm",   "l2norm",         "chunk_prep", "walk_tape",
                                            "dv_local", "state_walk_bwd", "chunk_bwd",  "finalize"};
    CHECK(r.programs_since(mark) == rerun);
    // A recompute whose output is needed (torch.utils.checkpoint's) writes the tapes beside o, with
    // kn and W, and hands them over, as one without the output does with walk_tape; the backward
    // skips its re-run and normalizes q alone.
    const std::vector<std::string> handoff = {"l2norm", "dv_local", "state_walk_bwd", "chunk_bwd", "finalize"};
    for (const auto& [output, walk] : {std::pair{OutputNeeded::yes, "fused_walk"}, {OutputNeeded::no, "walk_tape"}}) {
      CAPTURE(walk);
      mark = r.rec->records.size();
      CHECK(r.recompute(nullptr, output) == HandOff::taken);
      CHECK(r.programs_since(mark) == std::vector<std::string>{"chunk_table", "l2norm", "l2norm", "gate_cumsum",
                                                               "chunk_solve", "chunk_prep", walk});
      mark = r.rec->records.size();
      CHECK(r.backward() == HandOff::taken);
      CHECK(r.programs_since(mark) == handoff);
    }
    // Where no hand-off will be taken the recompute whose output is needed is the forward:
    // reuse_recompute_tapes false, or "auto" below the target's threshold (sm_100a: 61440 rows;
    // 8192 tokens x 6 value heads are fewer).
    const std::vector<std::string> plain_forward = {"chunk_table", "l2norm", "gate_cumsum", "chunk_solve",
                                                    "fused_walk"};
    Spec below = spec;
    below.targets = {Target::sm_100a};
    Rig small(below);
    REQUIRE(small.shape.T * below.heads_v < handoff_threshold_rows(Target::sm_100a));
    mark = small.rec->records.size();
    CHECK(small.recompute(nullptr, OutputNeeded::yes) == HandOff::not_taken);
    CHECK(small.programs_since(mark) == plain_forward);
    spec.reuse_recompute_tapes = ReuseTapes::no;
    Rig no(spec);
    mark = no.rec->records.size();
    CHECK(no.recompute(nullptr, OutputNeeded::yes) == HandOff::not_taken);
    CHECK(no.programs_since(mark) == plain_forward);
  }

  TEST_CASE("the hand-off backward launches what the re-run backward launches, minus the re-run") {
    Rig a(example("n")), b(example("n"));
    a.recompute(nullptr, OutputNeeded::yes);
    const size_t ma = a.rec->records.size();
    a.backward();
    b.layer->forward(b.shape, b.in, b.out, b.saved, b.saved_size, b.ws.data(), b.ws.bytes(), nullptr);
    const size_t mb = b.rec->records.size();
    b.layer->backward(b.shape, b.in, b.grads, b.saved, b.saved_size, b.ws.data(), b.ws.bytes(), nullptr);
    const size_t rerun = kRerunWalk.size();
    REQUIRE(b.rec->records.size() - mb == a.rec->records.size() - ma + rerun);
    for (size_t i = 0; i < a.rec->records.size() - ma; ++i) {
      const auto& x = a.rec->records[ma + i];
      const auto& y = b.rec->records[mb + rerun + i];
      CAPTURE(x.program);
      CHECK(x.program == y.program);
      CHECK(x.params == y.params);
      CHECK(x.grid.x == y.grid.x);
    }
  }

  TEST_CASE("stale hand-offs fall back to the re-run") {
    SUBCASE("another call on the workspace in between") {
      Rig r(example("n"));
      r.recompute();
      r.layer->forward(r.shape, r.in, r.out, r.saved, r.saved_size, r.ws, nullptr);
      const size_t mark = r.rec->records.size();
      CHECK(r.backward() == HandOff::not_taken);
      CHECK(r.programs_since(mark) == kBackwardRerun);
    }
    SUBCASE("another stream") {
      Rig r(example("n"));
      r.recompute(reinterpret_cast<CUstream>(0x1));
      CHECK(r.backward(reinterpret_cast<CUstream>(0x2)) == HandOff::not_taken);
    }
    SUBCASE("another shape") {
      Rig r(example("n"));
      r.recompute();
      r.shape = {8000, 3};
      CHECK(r.backward() == HandOff::not_taken);
    }
    SUBCASE("another layer on the same workspace") {
      Rig r(example("n"));
      auto other = Layer::with_launcher(example("n"), r.rec);
      r.recompute();
      CHECK(other->backward(r.shape, r.in, r.grads, r.saved, r.saved_size, r.ws, nullptr) == HandOff::not_taken);
    }
    SUBCASE("a forward into the same saved region on another workspace") {
      Rig r(example("n"));
      r.recompute();
      Workspace other(reinterpret_cast<void*>(0x300000000ull), r.ws.bytes());
      r.layer->forward(r.shape, r.in, r.out, r.saved, r.saved_size, other, nullptr);
      CHECK(r.backward() == HandOff::not_taken);
    }
    SUBCASE("another layer's recompute into the same saved region") {
      Rig r(example("n"));
      auto other = Layer::with_launcher(example("n"), r.rec);
      Workspace ws(reinterpret_cast<void*>(0x300000000ull), r.ws.bytes());
      r.recompute();
      other->recompute(r.shape, r.in, r.out, OutputNeeded::no, r.saved, r.saved_size, ws, nullptr);
      CHECK(r.backward() == HandOff::not_taken);
      // The other layer's own hand-off is intact.
      CHECK(other->backward(r.shape, r.in, r.grads, r.saved, r.saved_size, ws, nullptr) == HandOff::taken);
    }
    SUBCASE("calls on other saved regions leave the hand-off fresh") {
      Rig r(example("n"));
      r.recompute();
      Workspace other(reinterpret_cast<void*>(0x300000000ull), r.ws.bytes());
      void* elsewhere = reinterpret_cast<void*>(0x400000000ull);
      r.layer->forward(r.shape, r.in, r.out, elsewhere, r.saved_size, other, nullptr);
      r.layer->recompute(r.shape, r.in, r.out, OutputNeeded::no, elsewhere, r.saved_size, other, nullptr);
      CHECK(r.backward() == HandOff::taken);
    }
    SUBCASE("a second backward on the same hand-off") {
      Rig r(example("n"));
      r.recompute();
      CHECK(r.backward() == HandOff::taken);
      CHECK(r.backward() == HandOff::not_taken);
    }
    SUBCASE("reuse_recompute_tapes: false") {
      Spec s = example("n");
      s.reuse_recompute_tapes = ReuseTapes::no;
      CHECK(backward_after_recompute_without_handoff(s) == kBackwardRerun);
    }
  }

  TEST_CASE("full saves never re-run and need no hand-off") {
    Spec s = example("n");
    s.save_mode = SaveMode::full;
    CHECK(backward_after_recompute_without_handoff(s) == kBackwardWithHandoff);
  }

  TEST_CASE("graph mode without a backend is an error, not a silent eager run") {
    Spec s = example("n");
    s.graph = GraphMode::replay;
    CHECK_THROWS_WITH_AS(Layer::with_launcher(s, std::make_shared<testing::RecordingLauncher>()),
                         R"(/graph: "replay" needs a graph backend (layer 'shape_n'))", InputError);
  }

  TEST_CASE("a recompute that skips the output needs no o") {
    Rig r(example("n"));
    r.out.o = nullptr;
    CHECK_NOTHROW(r.recompute(nullptr, OutputNeeded::no));
    CHECK_THROWS_WITH_AS(r.recompute(nullptr, OutputNeeded::yes), "o: is null", InputError);
  }

  // The C ABI's layout query needs only the spec and the target: it must describe exactly the
  // regions a layer loaded there sizes and binds (its own layouts and byte counts) for every region
  // and call form.
  TEST_CASE("gdn_spec_region_layout gives the layer's regions from the spec alone") {
    for (const char* name : {"n", "m"})
      for (const SaveMode mode : {SaveMode::light, SaveMode::full})
        for (const bool fused : {false, true}) {
          if (fused && mode == SaveMode::full) continue;  // the fused forward takes light saves only
          Spec spec = example(name);
          spec.save_mode = mode;
          if (fused) spec.forward = ForwardPath::fused;
          CAPTURE(name);
          CAPTURE(static_cast<int>(mode));
          CAPTURE(fused);
          const std::string json = to_json(spec).dump();
          auto layer = Layer::with_launcher(spec, std::make_shared<testing::RecordingLauncher>());
          const std::string target(to_string(layer->target()));
          const ProblemShape shape{10000, 7};
          for (int region : {GDN_REGION_SAVED, GDN_REGION_WORKSPACE})
            for (int form : {GDN_FORWARD, GDN_RECOMPUTE, GDN_BACKWARD}) {
              if (region == GDN_REGION_SAVED && form != GDN_FORWARD) continue;
              CAPTURE(region);
              CAPTURE(form);
              const CallForm f = form == GDN_FORWARD     ? CallForm::forward
                                 : form == GDN_RECOMPUTE ? CallForm::recompute
                                                         : CallForm::backward;
              const RegionLayout want =
                  region == GDN_REGION_SAVED ? layer->saved_layout(shape) : layer->workspace_layout(f, shape);
              const size_t want_total =
                  region == GDN_REGION_SAVED ? layer->saved_bytes(shape) : layer->workspace_bytes(f, shape);
              size_t count = 0, total = 0;
              REQUIRE(gdn_spec_region_layout_on(json.c_str(), target.c_str(), region, form, shape.T, shape.N, nullptr,
                                                0, &count, &total) == GDN_OK);
              CHECK(count == want.offset.size());
              CHECK(total == want_total);
              std::vector<gdn_slot> slots(count);
              REQUIRE(gdn_spec_region_layout_on(json.c_str(), target.c_str(), region, form, shape.T, shape.N,
                                                slots.data(), slots.size(), &count, nullptr) == GDN_OK);
              uint64_t end_of_previous = 0, previous_offset = 0;
              for (const gdn_slot& sl : slots) {
                CAPTURE(sl.name);
                REQUIRE(want.offset.count(sl.name) == 1);
                CHECK(sl.offset == want.offset.at(sl.name));
                CHECK(sl.offset % 256 == 0);
                CHECK(sl.bytes > 0);
                CHECK(sl.offset + sl.bytes <= total);
                CHECK(sl.offset >= previous_offset);  // ordered by offset
                // A buffer starting where an earlier one ends or later: distinct slots never overlap.
                if (sl.offset != previous_offset) CHECK(sl.offset >= end_of_previous);
                end_of_previous = std::max<uint64_t>(end_of_previous, sl.offset + sl.bytes);
                previous_offset = sl.offset;
              }
            }
        }
    const std::string json = to_json(example("n")).dump();
    size_t count = 0;
    gdn_slot one[1];
    CHECK(gdn_spec_region_layout(json.c_str(), GDN_REGION_SAVED, 0, 1000, 2, one, 1, &count, nullptr) == GDN_ERR_INPUT);
    CHECK(std::string(gdn_last_error()).find("capacity: 1 slots given, the layout has ") == 0);
    CHECK(gdn_spec_region_layout(json.c_str(), 7, 0, 1000, 2, nullptr, 0, &count, nullptr) == GDN_ERR_INPUT);
    CHECK(std::string(gdn_last_error()) == "region: 7 is not a region (0 saved, 1 workspace)");
    CHECK(gdn_spec_region_layout(json.c_str(), GDN_REGION_WORKSPACE, 9, 1000, 2, nullptr, 0, &count, nullptr) ==
          GDN_ERR_INPUT);
    CHECK(std::string(gdn_last_error()).find("form: 9") == 0);
    CHECK(gdn_spec_region_layout(json.c_str(), GDN_REGION_SAVED, 0, -5, 2, nullptr, 0, &count, nullptr) ==
          GDN_ERR_INPUT);
    CHECK(gdn_spec_region_layout(json.c_str(), GDN_REGION_SAVED, 0, 1000, 2, nullptr, 0, nullptr, nullptr) ==
          GDN_ERR_INPUT);
    CHECK(std::string(gdn_last_error()) == "count: is null");
    CHECK(gdn_spec_region_layout(R"({"name":"x","heads":{"qk":2,"v":6},"chunk":48})", GDN_REGION_SAVED, 0, 1000, 2,
                                 nullptr, 0, &count, nullptr) == GDN_ERR_SPEC);
  }

  // On a target: the loaded layer's own layout (a target may leave workspace buffers out).
  TEST_CASE("gdn_spec_region_layout_on gives one target's regions") {
    Spec spec = example("m");
    spec.walk_bwd_layout = WalkBwdLayout::fused;
    const std::string json = to_json(spec).dump();
    const ProblemShape shape{12345, 7};
    size_t any_count = 0, any_total = 0;
    REQUIRE(gdn_spec_region_layout_on(json.c_str(), nullptr, GDN_REGION_WORKSPACE, GDN_BACKWARD, shape.T, shape.N,
                                      nullptr, 0, &any_count, &any_total) == GDN_OK);
    size_t plain_count = 0, plain_total = 0;
    REQUIRE(gdn_spec_region_layout(json.c_str(), GDN_REGION_WORKSPACE, GDN_BACKWARD, shape.T, shape.N, nullptr, 0,
                                   &plain_count, &plain_total) == GDN_OK);
    CHECK(any_total == plain_total);
    CHECK(any_count == plain_count);
    for (const char* name : {"sm_90a", "sm_100a"}) {
      CAPTURE(name);
      Spec on = spec;
      on.targets = {*parse_target(name)};
      auto layer = Layer::with_launcher(on, std::make_shared<testing::RecordingLauncher>());
      const RegionLayout want = layer->workspace_layout(CallForm::backward, shape);
      size_t count = 0, total = 0;
      REQUIRE(gdn_spec_region_layout_on(json.c_str(), name, GDN_REGION_WORKSPACE, GDN_BACKWARD, shape.T, shape.N,
                                        nullptr, 0, &count, &total) == GDN_OK);
      CHECK(total == layer->workspace_bytes(CallForm::backward, shape));
      std::vector<gdn_slot> slots(count);
      REQUIRE(gdn_spec_region_layout_on(json.c_str(), name, GDN_REGION_WORKSPACE, GDN_BACKWARD, shape.T, shape.N,
                                        slots.data(), slots.size(), &count, nullptr) == GDN_OK);
      REQUIRE(count == want.offset.size());
      for (const gdn_slot& sl : slots) {
        CAPTURE(sl.name);
        REQUIRE(want.offset.count(sl.name) == 1);
        CHECK(sl.offset == want.offset.at(sl.name));
      }
      const bool left_out = std::string(name) == "sm_90a";
      CHECK((total < any_total) == left_out);
    }
    size_t count = 0;
    CHECK(gdn_spec_region_layout_on(json.c_str(), "sm_80", GDN_REGION_WORKSPACE, GDN_BACKWARD, 1000, 2, nullptr, 0,
                                    &count, nullptr) == GDN_ERR_INPUT);
    CHECK(std::string(gdn_last_error()) == "target: \"sm_80\" is not among the targets of layer 'shape_m' (/targets)");
    Spec only100 = spec;
    only100.targets = {Target::sm_100a};
    CHECK(gdn_spec_region_layout_on(to_json(only100).dump().c_str(), "sm_90a", GDN_REGION_SAVED, 0, 1000, 2, nullptr, 0,
                                    &count, nullptr) == GDN_ERR_INPUT);
    CHECK(std::string(gdn_last_error()).find("target: \"sm_90a\" is not among") == 0);
  }
}
