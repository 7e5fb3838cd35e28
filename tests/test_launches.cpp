/**
 * @file test_launches.cpp
 * @brief Launch sequences on the CPU: the programs, grids and parameter blocks that a layer's
 *        forward and backward launch, recorded instead of run, pinned as goldens (they were
 *        recorded from the code the GPU suites verified), and checked against the IR.
 */
#include "tests/launch_recorder.hpp"

#include "tests/golden.hpp"
#include "common/segments.hpp"
#include "fwd/geometry.hpp"
#include "params.cuh"

#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

namespace fs = std::filesystem;
using namespace gdn;

namespace {

struct FakeCall {
  std::vector<testing::Region> regions;
  LayerInputs in;
  LayerOutputs out;
  LayerGrads grads;
  uint64_t saved, ws;
  size_t saved_size, ws_size;
};

/// Distinct, aligned, fake device addresses for every argument.
FakeCall fake_call(const Layer& layer, ProblemShape s) {
  FakeCall f;
  uint64_t next = 0x10000000;
  auto addr = [&](const char* name) {
    const uint64_t a = next;
    next += 0x1000000;  // 16 MB apart, all below the regions at 4 GB and 8 GB
    f.regions.push_back({name, a, 0x1000000});
    return a;
  };
  auto ptr = [&](const char* name) { return reinterpret_cast<void*>(addr(name)); };
  auto fptr = [&](const char* name) { return reinterpret_cast<float*>(addr(name)); };
  const Spec& sp = layer.ir().spec;
  const bool h0 = sp.initial_state == StateFlag::present, ht = sp.final_state == StateFlag::present;
  f.in = {ptr("q"),     ptr("k"),          ptr("v"),         fptr("g"),
          fptr("beta"), ptr("cu_seqlens"), IndexType::int32, h0 ? fptr("h0") : nullptr,
          0.f};
  f.out = {ptr("o"), ht ? fptr("ht") : nullptr};
  f.grads = {ptr("do"),     ht ? fptr("dht") : nullptr, ptr("dq"), ptr("dk"), ptr("dv"), fptr("dg"),
             fptr("dbeta"), h0 ? fptr("dh0") : nullptr};
  f.saved_size = layer.saved_bytes(s);
  f.ws_size = std::max(layer.workspace_bytes(CallForm::forward, s), layer.workspace_bytes(CallForm::backward, s));
  f.saved = 0x100000000ull;
  f.ws = 0x200000000ull;
  // Slots are printed by name: one region per slot of each layout.
  for (const auto& [name, off] : layer.saved_layout(s).offset) f.regions.push_back({"saved." + name, f.saved + off, 1});
  // Buffers that share bytes (IR lives_in) share a name: "ws.dk_v/dv_local/u".
  std::map<size_t, std::string> ws_names;
  for (const auto& [name, off] : layer.workspace_layout(CallForm::backward, s).offset)
    ws_names[off] += (ws_names[off].empty() ? "" : "/") + name;
  for (const auto& [off, names] : ws_names) f.regions.push_back({"ws." + names, f.ws + off, 1});
  f.regions.push_back({"saved", f.saved, f.saved_size});
  f.regions.push_back({"ws", f.ws, f.ws_size});
  return f;
}

/// One backward call of `spec` loaded for `target` on fake addresses, its launches recorded.
struct RecordedBackward {
  std::shared_ptr<testing::RecordingLauncher> rec = std::make_shared<testing::RecordingLauncher>();
  std::unique_ptr<Layer> layer;
  RegionLayout bwd;
  FakeCall f;
};
RecordedBackward record_backward(Spec spec, Target target, ProblemShape s) {
  RecordedBackward r;
  spec.targets = {target};
  r.layer = Layer::with_launcher(spec, r.rec);
  r.bwd = r.layer->workspace_layout(CallForm::backward, s);
  r.f = fake_call(*r.layer, s);
  r.layer->backward(s, r.f.in, r.f.grads, reinterpret_cast<void*>(r.f.saved), r.f.saved_size,
                    reinterpret_cast<void*>(r.f.ws), r.f.ws_size, nullptr);
  return r;
}
/// The 8-byte word at `offset` of a recorded launch's parameters.
uint64_t param_word(const testing::LaunchRecord& r, size_t offset) {
  uint64_t w = 0;
  REQUIRE(offset + 8 <= r.params.size());
  std::memcpy(&w, r.params.data() + offset, 8);
  return w;
}

std::string record(const Spec& spec, ProblemShape s) {
  auto rec = std::make_shared<testing::RecordingLauncher>();
  auto layer = Layer::with_launcher(spec, rec);
  const FakeCall f = fake_call(*layer, s);
  layer->forward(s, f.in, f.out, reinterpret_cast<void*>(f.saved), f.saved_size, reinterpret_cast<void*>(f.ws),
                 f.ws_size, nullptr);
  const size_t n_fwd = rec->records.size();
  layer->backward(s, f.in, f.grads, reinterpret_cast<void*>(f.saved), f.saved_size, reinterpret_cast<void*>(f.ws),
                  f.ws_size, nullptr);
  // The sequences follow the IR's call forms, program by program, less the programs idle on the
  // layer's target (neither compiled nor launched there).
  std::vector<std::string> want_fwd, want_bwd, got_fwd, got_bwd;
  const auto active = [&](const std::string& program) {
    return !layer->ir().program(program).idle_for(layer->target());
  };
  for (const auto& l : layer->ir().call_forms[0].launches)
    if (active(l.program)) want_fwd.push_back(l.program);
  for (const auto& l : layer->ir().call_forms[2].launches)
    if (active(l.program)) want_bwd.push_back(l.program);
  for (size_t i = 0; i < rec->records.size(); ++i) (i < n_fwd ? got_fwd : got_bwd).push_back(rec->records[i].program);
  CHECK(got_fwd == want_fwd);
  CHECK(got_bwd == want_bwd);
  return testing::render(rec->records, f.regions);
}

/// One launch's lines in a recording (from "PROGRAM grid" to the next launch) and where it starts,
/// the first at or after `from`.
std::pair<std::string, size_t> launch_block(const std::string& text, const std::string& program, size_t from) {
  const size_t at = text.find(program + " grid", from);
  REQUIRE(at != std::string::npos);
  const size_t end = text.find(" grid=", at + program.size() + 6);
  return {text.substr(at, (end == std::string::npos ? text.size() : text.rfind('\n', end)) - at), at};
}
/// A bound field as a recording prints it.
std::string field(size_t offset, const char* what) { return fmt::format("[{:3}] {}", offset, what); }

Spec example(const char* name) {
  return spec_from_file((fs::path(GDN_SOURCE_DIR) / "examples" / (std::string(name) + ".json")).string());
}

}  // namespace

TEST_SUITE("launches") {
  TEST_CASE("launch sequences of the examples are pinned") {
    testing::check_golden("launches_n_light.txt", record(example("n"), {8192, 3}));
    Spec full = example("m");
    full.save_mode = SaveMode::full;
    full.norm = Norm::none;
    full.initial_state = StateFlag::absent;
    testing::check_golden("launches_m_full_nonorm_noh0.txt", record(full, {1000, 2}));
  }

  // segment_rows(): no document of a call takes more segments than its walks' grid has rows, and
  // the longest document the call can hold takes exactly that many.
  TEST_CASE("segment rows: as many as the call's longest possible document takes") {
    Spec pinned = example("n"), none = example("n"), ranks = example("n");
    pinned.cp_segments = 5;
    none.cp_segments = 1;
    ranks.cp_segments = 0;
    ranks.cp_ranks = 4;
    const LayerIR ir = lower(example("n")), ir_pinned = lower(pinned), ir_none = lower(none), ir_ranks = lower(ranks);
    REQUIRE(ir.segments_auto);
    REQUIRE(has_unsplit_plans(ir));
    CHECK_FALSE(has_unsplit_plans(ir_pinned));
    CHECK_FALSE(has_unsplit_plans(ir_none));
    CHECK_FALSE(has_unsplit_plans(ir_ranks));
    const int most = ir.spec.cp_segments, m = ir.seg_min_chunks, C = ir.spec.chunk;
    auto takes = [&](int64_t tokens) { return seg::count(static_cast<int>((tokens + C - 1) / C), most, m); };
    for (int64_t T : {1LL, 63LL, 64LL, 4032LL, 4033LL, 4096LL, 6144LL, 8192LL, 100000LL, 1LL << 22, (1LL << 31) - 1}) {
      CAPTURE(T);
      const int64_t rows = segment_rows(ir, T);
      CHECK(rows >= 1);
      CHECK(rows <= most);
      CHECK(rows == takes(T));  // a single document of T tokens
      for (int64_t L = 1; L <= T; L = L < 4096 ? L + 61 : L * 3 / 2) CHECK(takes(L) <= rows);
      CHECK(segment_rows(ir_pinned, T) == 5);
      CHECK(segment_rows(ir_none, T) == 1);
      CHECK(segment_rows(ir_ranks, T) == ir_ranks.spec.cp_segments);
    }
    CHECK(segment_rows(ir, 4032) == 1);
    CHECK(segment_rows(ir, 4033) == 2);
    CHECK(segment_rows(ir, 8192) == 4);
    // The IR prints the rule with the same threshold.
    CHECK(to_text(ir).find("with 1 (T < 4033 tokens) leaves out every segment program") != std::string::npos);
  }

  // A call whose documents cannot split runs the DocSplits::none plans: the walks alone, one
  // segment row, every walk reading h0 or dht itself. One that can runs today's plans, with the
  // rows its longest possible document needs.
  TEST_CASE("segment rows: a call that cannot split a document launches no segment program") {
    auto sequence = [](const Spec& spec, ProblemShape s, bool handoff = false) {
      auto rec = std::make_shared<testing::RecordingLauncher>();
      auto layer = Layer::with_launcher(spec, rec);
      const FakeCall f = fake_call(*layer, s);
      void* saved = reinterpret_cast<void*>(f.saved);
      Workspace ws(reinterpret_cast<void*>(f.ws), f.ws_size);
      if (handoff) {
        layer->recompute(s, f.in, f.out, OutputNeeded::no, saved, f.saved_size, ws, nullptr);
      } else {
        layer->forward(s, f.in, f.out, saved, f.saved_size, ws, nullptr);
      }
      const size_t n_fwd = rec->records.size();
      layer->backward(s, f.in, f.grads, saved, f.saved_size, ws, nullptr);
      std::vector<std::string> fwd, bwd;
      std::map<std::string, unsigned> grid_y;
      for (size_t i = 0; i < rec->records.size(); ++i) {
        const auto& r = rec->records[i];
        (i < n_fwd ? fwd : bwd).push_back(r.program);
        grid_y[r.program] = r.grid.y;
      }
      return std::tuple{fwd, bwd, grid_y, testing::render(rec->records, f.regions)};
    };
    auto has = [](const std::vector<std::string>& v, const char* p) {
      return std::find(v.begin(), v.end(), p) != v.end();
    };
    const char* segment_programs[] = {"walk_prescan",     "walk_merge",     "walk_speculate",     "walk_verify",
                                      "fused_speculate",  "fused_verify",   "tape_speculate",     "tape_verify",
                                      "walk_bwd_prescan", "walk_merge_bwd", "walk_bwd_speculate", "walk_bwd_verify"};
    Spec merge = example("n"), verified = example("n"), fused = example("n"), pinned = example("n");
    verified.cp_carry = SegmentCarry::verified;
    fused.forward = ForwardPath::fused;
    pinned.cp_segments = 5;
    for (const Spec* spec : {&merge, &verified, &fused})
      for (bool handoff : {false, true}) {
        CAPTURE(spec->cp_carry == SegmentCarry::verified);
        CAPTURE(spec->forward == ForwardPath::fused);
        CAPTURE(handoff);
        // The longest document that takes one segment: 2 m - 1 chunks' tokens (m = 32 on the
        // programs forward, 128 on the fused one, which takes the verified carry).
        const LayerIR ir = lower(*spec);
        const bool verified_carry = ir.verified_carry;
        const int64_t unsplit = (2LL * ir.seg_min_chunks - 1) * ir.spec.chunk;
        CHECK(unsplit == (spec->forward == ForwardPath::fused ? 16320 : 4032));
        const auto [fwd, bwd, y, text] = sequence(*spec, {unsplit, 3}, handoff);
        for (const char* p : segment_programs) {
          CAPTURE(p);
          CHECK_FALSE(has(fwd, p));
          CHECK_FALSE(has(bwd, p));
        }
        const char* walk = spec->forward == ForwardPath::fused ? (handoff ? "walk_tape" : "fused_walk") : "state_walk";
        REQUIRE(has(fwd, walk));
        CHECK(y.at(walk) == 6);  // value heads x 1 row
        CHECK(y.at("state_walk_bwd") == 6);
        CHECK(has(bwd, "chunk_bwd"));
        // Under the verified carry the walks are bound without the marks: they walk every document.
        if (verified_carry) CHECK(text.find("seg_fail") == std::string::npos);
        // One more token and a document may take two segments: today's plan, two rows.
        const auto [fwd2, bwd2, y2, text2] = sequence(*spec, {unsplit + 1, 3}, handoff);
        const char* speculate = spec->forward != ForwardPath::fused ? "walk_speculate"
                                : handoff                           ? "tape_speculate"
                                                                    : "fused_speculate";
        CHECK(has(fwd2, verified_carry ? speculate : "walk_prescan"));
        CHECK(has(bwd2, verified_carry ? "walk_bwd_speculate" : "walk_bwd_prescan"));
        CHECK(y2.at("state_walk_bwd") == 12);
      }
    // The fused forward's light saves need W (and kn) only for the prescan: none without it.
    {
      const auto [fwd, bwd, y, text] = sequence(fused, {4032, 3});
      CHECK_FALSE(has(fwd, "chunk_prep"));
      CHECK(std::count(fwd.begin(), fwd.end(), "l2norm") == 1);
    }
    // Pinned segments split every document: the full plan whatever T, with the spec's rows.
    const auto [fwd, bwd, y, text] = sequence(pinned, {4032, 3});
    CHECK(has(fwd, "walk_prescan"));
    CHECK(has(bwd, "walk_bwd_prescan"));
    CHECK(y.at("state_walk") == 30);
  }

  // ProblemShape::max_doc_tokens: chunk_table gets the bound to check, the forward's rows follow it
  // (here none of the segment programs), and the backward, which cannot check it, keeps T's rows.
  TEST_CASE("max_doc_tokens: the forward's walks take the bound's rows, chunk_table checks it") {
    for (SegmentCarry carry : {SegmentCarry::merge, SegmentCarry::verified}) {
      CAPTURE(carry == SegmentCarry::verified);
      Spec spec = example("n");
      spec.cp_carry = carry;
      auto rec = std::make_shared<testing::RecordingLauncher>();
      auto layer = Layer::with_launcher(spec, rec);
      auto run = [&](long long bound) {
        const ProblemShape s{8192, 3, bound};
        const FakeCall f = fake_call(*layer, s);
        rec->records.clear();
        layer->forward(s, f.in, f.out, reinterpret_cast<void*>(f.saved), f.saved_size, reinterpret_cast<void*>(f.ws),
                       f.ws_size, nullptr);
        const size_t n_fwd = rec->records.size();
        layer->backward(s, f.in, f.grads, reinterpret_cast<void*>(f.saved), f.saved_size, reinterpret_cast<void*>(f.ws),
                        f.ws_size, nullptr);
        std::vector<std::string> fwd, bwd;
        std::map<std::string, unsigned> y;
        int chunk_table_bound = -1;
        for (size_t i = 0; i < rec->records.size(); ++i) {
          const auto& r = rec->records[i];
          (i < n_fwd ? fwd : bwd).push_back(r.program);
          y[(i < n_fwd ? "" : "bwd.") + r.program] = r.grid.y;  // the light backward re-runs state_walk
          if (r.program == "chunk_table")
            std::memcpy(&chunk_table_bound, r.params.data() + offsetof(ChunkTableParams, max_doc_tokens), 4);
        }
        return std::tuple{fwd, bwd, y, chunk_table_bound};
      };
      auto has = [](const std::vector<std::string>& v, const char* p) {
        return std::find(v.begin(), v.end(), p) != v.end();
      };
      const char* first = carry == SegmentCarry::verified ? "walk_speculate" : "walk_prescan";
      const char* first_bwd = carry == SegmentCarry::verified ? "walk_bwd_speculate" : "walk_bwd_prescan";
      {  // no bound: T's 4 rows
        const auto [fwd, bwd, y, bound] = run(0);
        CHECK(bound == 0);
        CHECK(has(fwd, first));
        CHECK(y.at("state_walk") == 24);
      }
      {  // 3142 tokens: 50 chunks, one segment at most
        const auto [fwd, bwd, y, bound] = run(3142);
        CHECK(bound == 3142);
        CHECK_FALSE(has(fwd, first));
        CHECK_FALSE(has(fwd, "walk_merge"));
        CHECK(y.at("state_walk") == 6);
        CHECK(has(bwd, first_bwd));  // the backward keeps T's rows
        CHECK(y.at("bwd.state_walk") == 24);
        CHECK(y.at("bwd.state_walk_bwd") == 24);
      }
      {  // 4100 tokens: 65 chunks, two segments at most
        const auto [fwd, bwd, y, bound] = run(4100);
        CHECK(bound == 4100);
        CHECK(has(fwd, first));
        CHECK(y.at("state_walk") == 12);
      }
      {  // a bound of T or more bounds nothing: chunk_table gets 0
        const auto [fwd, bwd, y, bound] = run(8192);
        CHECK(bound == 0);
        CHECK(y.at("state_walk") == 24);
      }
    }
    // A backward that binds a recompute's tapes takes the rows of the bound that recompute checked
    // on the same saved region; on another saved region the stamp is stale and it re-runs.
    for (bool same_saved : {true, false}) {
      CAPTURE(same_saved);
      auto rec = std::make_shared<testing::RecordingLauncher>();
      auto layer = Layer::with_launcher(example("n"), rec);
      const ProblemShape s{8192, 3, 3142};
      const FakeCall f = fake_call(*layer, s);
      Workspace ws(reinterpret_cast<void*>(f.ws), f.ws_size);
      void* saved = reinterpret_cast<void*>(f.saved);
      REQUIRE(layer->recompute(s, f.in, f.out, OutputNeeded::no, saved, f.saved_size, ws, nullptr) == HandOff::taken);
      rec->records.clear();
      void* backward_saved = same_saved ? saved : reinterpret_cast<void*>(f.saved + 0x1000);
      const HandOff h = layer->backward({8192, 3}, f.in, f.grads, backward_saved, f.saved_size, ws, nullptr);
      CHECK((h == HandOff::taken) == same_saved);
      bool prescan = false;
      unsigned walk_y = 0;
      for (const auto& r : rec->records) {
        prescan = prescan || r.program == "walk_bwd_prescan";
        if (r.program == "state_walk_bwd") walk_y = r.grid.y;
      }
      CHECK(prescan == !same_saved);
      CHECK(walk_y == (same_saved ? 6u : 24u));
    }
    // Refused on the host: a negative bound, and one that cannot hold T in N documents.
    auto layer = Layer::with_launcher(example("n"), std::make_shared<testing::RecordingLauncher>());
    for (auto [bound, message] :
         {std::pair<long long, const char*>{-1, "max_doc_tokens: -1 is negative (0: no bound)"},
          {2730, "max_doc_tokens: 3 documents of at most 2730 tokens cannot hold T=8192 tokens"}}) {
      const ProblemShape s{8192, 3, bound};
      const FakeCall f = fake_call(*layer, s);
      CHECK_THROWS_WITH_AS(layer->forward(s, f.in, f.out, reinterpret_cast<void*>(f.saved), f.saved_size,
                                          reinterpret_cast<void*>(f.ws), f.ws_size, nullptr),
                           message, InputError);
    }
    const ProblemShape fits{8192, 3, 2731};
    const FakeCall f = fake_call(*layer, fits);
    CHECK_NOTHROW(layer->forward(fits, f.in, f.out, reinterpret_cast<void*>(f.saved), f.saved_size,
                                 reinterpret_cast<void*>(f.ws), f.ws_size, nullptr));
  }

  TEST_CASE("backward_w \"walk\" on sm_90a: no chunk_prep, the reverse walk reads Tm and beta") {
    Spec spec = example("m");
    spec.backward_w = BackwardW::walk;
    const std::string text = record(spec, {1000, 2});
    CHECK(text.find("chunk_prep") == std::string::npos);
    // w's and seg_dz's bytes carry Tm and beta (StateWalkBwdParams' unions).
    const size_t walk = text.find("state_walk_bwd grid");
    REQUIRE(walk != std::string::npos);
    const std::string block = text.substr(walk, text.find("chunk_bwd grid", walk) - walk);
    CHECK(block.find(fmt::format("[{:3}] saved.tm", offsetof(StateWalkBwdParams, tm))) != std::string::npos);
    CHECK(block.find(fmt::format("[{:3}] beta", offsetof(StateWalkBwdParams, beta))) != std::string::npos);
    CHECK(block.find("saved.w") == std::string::npos);
    CHECK(block.find("ws.w") == std::string::npos);
  }

  TEST_CASE("full saves on the fused forward: the backward reads the forward's kn and makes none") {
    Spec spec = example("m");
    spec.save_mode = SaveMode::full;
    const std::string text = record(spec, {1000, 2});
    // The forward ends with its fused walk; the backward's launches follow.
    const auto [walk, walk_at] = launch_block(text, "fused_walk", 0);
    const std::string forward = text.substr(0, walk_at + walk.size()), backward = text.substr(forward.size());
    const std::string kn_written = field(offsetof(L2NormParams, y), "saved.kn");
    CHECK(forward.find(kn_written) != std::string::npos);
    CHECK(text.find("ws.kn") == std::string::npos);
    size_t l2norms = 0;
    for (size_t at = backward.find("l2norm grid"); at != std::string::npos; at = backward.find("l2norm grid", at + 1)) {
      ++l2norms;
      CHECK(launch_block(backward, "l2norm", at).first.find(kn_written) == std::string::npos);
    }
    CHECK(l2norms == 1);  // qn
    CHECK(launch_block(backward, "state_walk_bwd", 0).first.find("saved.kn") != std::string::npos);
    CHECK(launch_block(backward, "finalize", 0).first.find("saved.kn") != std::string::npos);
  }

  TEST_CASE("cp.carry \"verified\": the forward's walks bind the checkpoints and the marks; the re-run does not") {
    Spec spec = example("n");
    spec.cp_segments = 4;
    spec.cp_carry = SegmentCarry::verified;
    const std::string text = record(spec, {8192, 3});
    auto block = [&](const std::string& program, size_t from = 0) { return launch_block(text, program, from); };
    using P = StateWalkParams;
    for (const char* walk : {"walk_speculate", "walk_verify"}) {
      CAPTURE(walk);
      const std::string b = block(walk).first;
      CHECK(b.find(field(offsetof(P, seg_ckpt), "ws.seg_ckpt")) != std::string::npos);
      // The forward's marks are saved: the backward merges the chains the forward merged.
      CHECK(b.find(field(offsetof(P, seg_fail), "saved.fwd_fail")) != std::string::npos);
      CHECK(b.find(field(offsetof(P, seg_h0), "saved.seg_h0")) != std::string::npos);
    }
    CHECK(block("walk_prescan").first.find(field(offsetof(P, seg_fail), "saved.fwd_fail")) != std::string::npos);
    CHECK(block("walk_merge").first.find(field(offsetof(WalkMergeParams, seg_fail), "saved.fwd_fail")) !=
          std::string::npos);
    // The forward's full walk works for the marked chains only; the backward's re-run (from the
    // saved entry states) walks every segment: no marks.
    const auto [forward_walk, at] = block("state_walk");
    CHECK(forward_walk.find(field(offsetof(P, seg_fail), "saved.fwd_fail")) != std::string::npos);
    const std::string rerun = block("state_walk", at + 1).first;
    CHECK(rerun.find(field(offsetof(P, seg_fail), "0x0")) != std::string::npos);
    CHECK(rerun.find(field(offsetof(P, seg_h0), "saved.seg_h0")) != std::string::npos);
    // The backward's reverse walks likewise; the forward's prescan saves its maps, which the
    // backward's merge binds (it reads them for the chains that failed the forward's gate test).
    using B = StateWalkBwdParams;
    for (const char* walk : {"walk_bwd_speculate", "walk_bwd_verify"}) {
      CAPTURE(walk);
      const std::string b = block(walk).first;
      CHECK(b.find(field(offsetof(B, seg_ckpt), "ws.seg_ckpt")) != std::string::npos);
      CHECK(b.find(field(offsetof(B, seg_fail), "ws.seg_fail")) != std::string::npos);
      CHECK(b.find(field(offsetof(B, fwd_fail), "saved.fwd_fail")) != std::string::npos);
    }
    for (const char* walk : {"walk_bwd_prescan", "state_walk_bwd"})
      CHECK_MESSAGE(block(walk).first.find(field(offsetof(B, seg_fail), "ws.seg_fail")) != std::string::npos, walk);
    CHECK(block("walk_merge_bwd").first.find(field(offsetof(WalkMergeParams, seg_fail), "ws.seg_fail")) !=
          std::string::npos);
    CHECK(block("walk_prescan").first.find(field(offsetof(P, seg_hm), "saved.seg_hm")) != std::string::npos);
    const std::string merge_bwd = block("walk_merge_bwd").first;
    CHECK(merge_bwd.find(field(offsetof(WalkMergeParams, fwd_maps), "saved.seg_hm")) != std::string::npos);
    CHECK(merge_bwd.find(field(offsetof(WalkMergeParams, seg_hm), "ws.seg_dzm")) != std::string::npos);
  }

  TEST_CASE("a recompute whose output is needed binds the fused walks' tapes where walk_tape's go; the forward none") {
    for (const bool verified : {false, true}) {
      CAPTURE(verified);
      Spec spec = example("n");
      spec.forward = ForwardPath::fused;
      spec.cp_segments = verified ? 5 : 1;
      spec.cp_carry = verified ? SegmentCarry::verified : SegmentCarry::merge;
      if (verified) spec.walk_bwd_slab = 128;  // the sm_90a reverse walk's marked-only programs
      const ProblemShape s{8192, 3};
      auto rec = std::make_shared<testing::RecordingLauncher>();
      auto layer = Layer::with_launcher(spec, rec);
      REQUIRE(layer->ir().recompute_output_tapes);
      const FakeCall f = fake_call(*layer, s);
      Workspace ws(reinterpret_cast<void*>(f.ws), f.ws_size);
      void* saved = reinterpret_cast<void*>(f.saved);
      auto call = [&](auto&& run) {
        const size_t from = rec->records.size();
        run();
        return testing::render(
            std::vector<testing::LaunchRecord>(rec->records.begin() + static_cast<long>(from), rec->records.end()),
            f.regions);
      };
      const std::string forward = call([&] { layer->forward(s, f.in, f.out, saved, f.saved_size, ws, nullptr); });
      HandOff with_output = HandOff::not_taken, without = HandOff::not_taken;
      const std::string rec_out = call(
          [&] { with_output = layer->recompute(s, f.in, f.out, OutputNeeded::yes, saved, f.saved_size, ws, nullptr); });
      const std::string rec_tapes =
          call([&] { without = layer->recompute(s, f.in, f.out, OutputNeeded::no, saved, f.saved_size, ws, nullptr); });
      CHECK(with_output == HandOff::taken);
      CHECK(without == HandOff::taken);
      using P = FusedWalkParams;
      // The bound line of a field in a launch block.
      auto line = [](const std::string& block, size_t offset) {
        const std::string key = fmt::format("[{:3}] ", offset);
        const size_t at = block.find(key);
        REQUIRE(at != std::string::npos);
        return block.substr(at, block.find('\n', at) - at);
      };
      for (const char* walk : verified ? std::vector<const char*>{"fused_speculate", "fused_verify", "fused_walk"}
                                       : std::vector<const char*>{"fused_walk"}) {
        CAPTURE(walk);
        const std::string tape_walk = verified ? (std::string(walk) == "fused_walk"        ? "walk_tape"
                                                  : std::string(walk) == "fused_speculate" ? "tape_speculate"
                                                                                           : "tape_verify")
                                               : "walk_tape";
        const std::string fwd = launch_block(forward, walk, 0).first;
        // The speculative walk with the tape stores is a program of its own (the forward's spills less).
        const std::string out =
            launch_block(rec_out, std::string(walk) == "fused_speculate" ? "fused_speculate_tapes" : walk, 0).first;
        const std::string tapes = launch_block(rec_tapes, tape_walk, 0).first;
        for (size_t off : {offsetof(P, h_tape), offsetof(P, v_new)}) {
          CHECK(line(fwd, off) == field(off, "0x0"));
          CHECK(line(out, off) == line(tapes, off));
          CHECK(line(out, off).find("ws.") != std::string::npos);
        }
        CHECK(line(out, offsetof(P, o)) == line(fwd, offsetof(P, o)));
        CHECK(line(out, offsetof(P, o)) != field(offsetof(P, o), "0x0"));
      }
      CHECK(forward.find("fused_speculate_tapes grid") == std::string::npos);
      // Every row of kn and W for the hand-off, as the recompute without the output makes them.
      CHECK(rec_out.find("l2norm_k_marked grid") == std::string::npos);
      auto count = [](const std::string& text, const std::string& program) {
        size_t n = 0;
        for (size_t at = text.find(program + " grid"); at != std::string::npos;
             at = text.find(program + " grid", at + 1))
          ++n;
        return n;
      };
      CHECK(count(rec_out, "l2norm") == count(rec_tapes, "l2norm"));
      CHECK(count(rec_out, "chunk_prep") == count(rec_tapes, "chunk_prep"));
    }
  }

  TEST_CASE("cp.carry \"verified\" on the fused forward: its walks bind the checkpoints and the saved marks") {
    Spec spec = example("n");
    spec.forward = ForwardPath::fused;
    spec.cp_segments = 4;
    spec.cp_carry = SegmentCarry::verified;
    const std::string text = record(spec, {8192, 3});
    auto block = [&](const std::string& program, size_t from = 0) { return launch_block(text, program, from); };
    using P = FusedWalkParams;
    for (const char* walk : {"fused_speculate", "fused_verify"}) {
      CAPTURE(walk);
      const std::string b = block(walk).first;
      CHECK(b.find(field(offsetof(P, seg_ckpt), "ws.seg_ckpt")) != std::string::npos);
      CHECK(b.find(field(offsetof(P, seg_fail), "saved.fwd_fail")) != std::string::npos);
      CHECK(b.find(field(offsetof(P, seg_h0), "saved.seg_h0")) != std::string::npos);
    }
    // The merge path: the marked chains only; the prescan and the merge likewise.
    CHECK(block("fused_walk").first.find(field(offsetof(P, seg_fail), "saved.fwd_fail")) != std::string::npos);
    CHECK(block("fused_walk").first.find(field(offsetof(P, seg_ckpt), "0x0")) != std::string::npos);
    CHECK(block("walk_prescan").first.find(field(offsetof(StateWalkParams, seg_fail), "saved.fwd_fail")) !=
          std::string::npos);
    CHECK(block("walk_merge").first.find(field(offsetof(WalkMergeParams, seg_fail), "saved.fwd_fail")) !=
          std::string::npos);
    // The backward's re-run walks every segment from the saved entries: no marks (the recompute's
    // tape walks are in "every call plan launches what the IR's call form lists").
    const std::string rerun = block("walk_tape").first;
    CHECK(rerun.find(field(offsetof(P, seg_fail), "0x0")) != std::string::npos);
    CHECK(rerun.find(field(offsetof(P, seg_h0), "saved.seg_h0")) != std::string::npos);
    // With the reverse walk's sm_90a body (which forms W) the forward makes kn for the marked
    // chains only, from raw k, after the verify walk.
    spec.walk_bwd_slab = 128;
    const std::string sm90 = record(spec, {8192, 3});
    const auto [marked, at] = launch_block(sm90, "l2norm_k_marked", 0);
    using M = L2NormMarkedParams;
    CHECK(marked.find(field(offsetof(M, x), "k")) != std::string::npos);
    CHECK(marked.find(field(offsetof(M, y), "ws.kn")) != std::string::npos);
    CHECK(marked.find(field(offsetof(M, seg_fail), "saved.fwd_fail")) != std::string::npos);
    CHECK(at > launch_block(sm90, "fused_verify", 0).second);
    CHECK(sm90.find("l2norm_k grid") == std::string::npos);  // idle on sm_90a
  }

  TEST_CASE("every call plan launches what the IR's call form lists") {
    constexpr SegmentCarry merge = SegmentCarry::merge, verified = SegmentCarry::verified;
    for (auto [save, segments, path, carry] : {std::tuple{SaveMode::light, 1, ForwardPath::programs, merge},
                                               std::tuple{SaveMode::full, 1, ForwardPath::programs, merge},
                                               std::tuple{SaveMode::light, 4, ForwardPath::programs, merge},
                                               std::tuple{SaveMode::full, 4, ForwardPath::programs, merge},
                                               std::tuple{SaveMode::light, 4, ForwardPath::programs, verified},
                                               std::tuple{SaveMode::full, 4, ForwardPath::programs, verified},
                                               std::tuple{SaveMode::light, 1, ForwardPath::fused, merge},
                                               std::tuple{SaveMode::light, 4, ForwardPath::fused, merge},
                                               std::tuple{SaveMode::full, 1, ForwardPath::fused, merge},
                                               std::tuple{SaveMode::full, 4, ForwardPath::fused, merge},
                                               std::tuple{SaveMode::light, 4, ForwardPath::fused, verified},
                                               std::tuple{SaveMode::full, 4, ForwardPath::fused, verified},
                                               // the sm_90a reverse walk's marked-only programs
                                               std::tuple{SaveMode::light, 5, ForwardPath::fused, verified},
                                               std::tuple{SaveMode::full, 5, ForwardPath::fused, verified}}) {
      Spec spec = example("n");
      spec.save_mode = save;
      spec.cp_segments = segments;
      spec.forward = path;
      spec.cp_carry = carry;
      if (segments == 5) spec.walk_bwd_slab = 128;
      const LayerIR ir = lower(spec);
      if (segments == 5 && save == SaveMode::light) REQUIRE(ir.has_program("l2norm_k_marked"));
      CAPTURE(segments);
      CAPTURE(to_string(path));
      CAPTURE(to_string(carry));
      auto names = [&](const CallPlan& p) {
        std::vector<std::string> out;
        for (const auto& l : p.launches) out.push_back(ir.programs[static_cast<size_t>(l.program)].name);
        return out;
      };
      // `met`: the run's condition holds (the output is needed; the backward has no fresh hand-off).
      auto listed = [&](CallForm f, bool met) {
        std::vector<std::string> out;
        for (const auto& cf : ir.call_forms)
          if (cf.form == f)
            for (const auto& l : cf.launches) {
              const bool negated = l.when == "the output is not needed";
              REQUIRE((l.when.empty() || negated || l.when == "the output is needed" || l.when == "no fresh hand-off"));
              if (l.when.empty() || (negated ? !met : met)) out.push_back(l.program);
            }
        return out;
      };
      CHECK(names(plan_forward(ir, OutputLaunch::yes)) == listed(CallForm::forward, true));
      CHECK(names(plan_recompute(ir, OutputLaunch::yes)) == listed(CallForm::recompute, true));
      CHECK(names(plan_recompute(ir, OutputLaunch::no)) == listed(CallForm::recompute, false));
      CHECK(names(plan_recompute(ir, OutputLaunch::no)) == names(plan_forward(ir, OutputLaunch::no)));
      CHECK(names(plan_backward(ir, PrepRerun::yes)) == listed(CallForm::backward, true));
      CHECK(names(plan_backward(ir, PrepRerun::no)) == listed(CallForm::backward, false));
    }
  }

  TEST_CASE("the region sizes are exact: every slot a launch addresses ends inside, the last at the end") {
    // Runs every call form on a recording launcher and checks that the furthest byte a launch can
    // address is the region's end, rounded up to 256: no slot too short, none that nothing uses.
    auto check_exact = [](const Spec& spec) {
      auto rec = std::make_shared<testing::RecordingLauncher>();
      auto layer = Layer::with_launcher(spec, rec);
      const ProblemShape s{12345, 7};
      const FakeCall f = fake_call(*layer, s);
      layer->forward(s, f.in, f.out, reinterpret_cast<void*>(f.saved), f.saved_size, reinterpret_cast<void*>(f.ws),
                     f.ws_size, nullptr);
      // Both recomputes too (with the output, the fused path writes the tapes beside o).
      Workspace ws(reinterpret_cast<void*>(f.ws), f.ws_size);
      for (const OutputNeeded o : {OutputNeeded::yes, OutputNeeded::no})
        layer->recompute(s, f.in, f.out, o, reinterpret_cast<void*>(f.saved), f.saved_size, ws, nullptr);
      layer->backward(s, f.in, f.grads, reinterpret_cast<void*>(f.saved), f.saved_size, reinterpret_cast<void*>(f.ws),
                      f.ws_size, nullptr);
      // Each slot's end: its offset plus its own byte formula (before alignment).
      uint64_t saved_end = 0, ws_end = 0;
      std::map<uint64_t, uint64_t> slot_bytes;
      for (const auto& [n, off] : layer->saved_layout(s).offset)
        slot_bytes[f.saved + off] = static_cast<uint64_t>(layer->ir().buffer(n).bytes.eval(s.T, s.N, 64));
      for (const CallForm form : {CallForm::forward, CallForm::backward})
        for (const auto& [n, off] : layer->workspace_layout(form, s).offset)
          slot_bytes[f.ws + off] = static_cast<uint64_t>(layer->ir().buffer(n).bytes.eval(s.T, s.N, 64));
      for (const auto& r : rec->records)
        for (size_t off = 0; off + 8 <= r.params.size(); off += 8) {
          uint64_t w;
          std::memcpy(&w, r.params.data() + off, 8);
          auto it = slot_bytes.find(w);
          if (it == slot_bytes.end()) continue;
          if (w >= f.ws)
            ws_end = std::max(ws_end, w - f.ws + it->second);
          else
            saved_end = std::max(saved_end, w - f.saved + it->second);
        }
      CHECK((saved_end + 255) / 256 * 256 == layer->saved_bytes(s));
      CHECK((ws_end + 255) / 256 * 256 == f.ws_size);
    };
    for (const char* name : {"n", "m"}) {
      for (auto [save, segments, carry] :
           {std::tuple{SaveMode::light, 1, SegmentCarry::merge}, std::tuple{SaveMode::full, 1, SegmentCarry::merge},
            std::tuple{SaveMode::light, 3, SegmentCarry::merge}, std::tuple{SaveMode::full, 3, SegmentCarry::merge},
            std::tuple{SaveMode::light, 3, SegmentCarry::verified},
            std::tuple{SaveMode::full, 3, SegmentCarry::verified}}) {
        Spec spec = example(name);
        spec.save_mode = save;
        spec.cp_segments = segments;
        spec.cp_carry = carry;
        // The verified carry runs on the programs forward and the portable backward walk, which
        // "auto" gives n and not m.
        if (carry == SegmentCarry::verified) {
          spec.forward = ForwardPath::programs;
          if (std::string(name) == "m") spec.walk_bwd_slab = 64;
        }
        CAPTURE(name);
        CAPTURE(segments);
        CAPTURE(to_string(carry));
        check_exact(spec);
      }
    }
    // backward_norm "in_walk": on sm_90a the light saves' qn and kn slots go (nothing there
    // makes or reads them); full saves keep the forward's kn.
    for (const SaveMode save : {SaveMode::light, SaveMode::full}) {
      Spec spec = example("m");
      spec.save_mode = save;
      spec.backward_norm = BackwardNorm::in_walk;
      CAPTURE(to_string(save));
      check_exact(spec);
    }
    // The fused reverse walk's layout, on a target that leaves its dh tape and dV' out (sm_90a)
    // and on one that keeps them.
    for (const Target target : {Target::sm_90a, Target::sm_100a})
      for (const SaveMode save : {SaveMode::light, SaveMode::full})
        for (const int segments : {1, 4}) {
          Spec spec = example("m");
          spec.walk_bwd_layout = WalkBwdLayout::fused;
          spec.save_mode = save;
          spec.cp_segments = segments;
          spec.targets = {target};
          CAPTURE(to_string(target));
          CAPTURE(to_string(save));
          CAPTURE(segments);
          check_exact(spec);
        }
  }

  TEST_CASE("the fused layout with segments: every reverse walk of the verified carry is the fused body on sm_90a") {
    Spec spec = example("m");
    spec.walk_bwd_layout = WalkBwdLayout::fused;
    spec.cp_segments = 4;
    spec.cp_carry = SegmentCarry::verified;
    const ProblemShape s{40000, 3};  // documents long enough to split
    for (const Target target : {Target::sm_90a, Target::sm_100a}) {
      CAPTURE(to_string(target));
      const bool fused = target == Target::sm_90a;
      const RecordedBackward run = record_backward(spec, target, s);
      const RegionLayout& bwd = run.bwd;
      const FakeCall& f = run.f;
      std::vector<std::string> walks;
      for (const auto& r : run.rec->records) {
        CAPTURE(r.program);
        if (fused) CHECK(r.program != "chunk_bwd");
        if (r.program != "walk_bwd_speculate" && r.program != "walk_bwd_verify" && r.program != "state_walk_bwd")
          continue;
        walks.push_back(r.program);
        const auto field = [&](size_t off) { return param_word(r, off); };
        CHECK(r.params.size() == sizeof(StateWalkBwdFusedParams));
        constexpr size_t out = sizeof(StateWalkBwdParams);
        // The walk's carry fields keep their own bytes beside the fused outputs.
        CHECK(field(offsetof(StateWalkBwdParams, seg_dz)) == f.ws + bwd.offset.at("seg_dz"));
        CHECK(field(offsetof(StateWalkBwdParams, seg_fail)) == f.ws + bwd.offset.at("seg_fail"));
        if (fused) {
          CHECK(field(offsetof(StateWalkBwdParams, h_tape)) == f.ws + bwd.offset.at("h_tape"));
          CHECK(field(out + offsetof(WalkBwdFusedOutputs, dq_v)) == f.ws + bwd.offset.at("dq_v"));
          CHECK(field(out + offsetof(WalkBwdFusedOutputs, dk_v)) == f.ws + bwd.offset.at("dk_v"));
          CHECK(field(out + offsetof(WalkBwdFusedOutputs, dv)) == reinterpret_cast<uint64_t>(f.grads.dv));
        } else {
          CHECK(field(offsetof(StateWalkBwdParams, dh_tape)) == f.ws + bwd.offset.at("dh_tape"));
          CHECK(field(out + offsetof(WalkBwdFusedOutputs, dq_v)) == 0);
        }
      }
      CHECK(walks == std::vector<std::string>{"walk_bwd_speculate", "walk_bwd_verify", "state_walk_bwd"});
    }
  }

  TEST_CASE("backward_norm \"in_walk\": on sm_90a the fused walk and finalize get the raw rows and the saved rstd") {
    Spec spec = example("m");
    spec.backward_norm = BackwardNorm::in_walk;
    const ProblemShape s{12345, 7};
    for (const Target target : {Target::sm_90a, Target::sm_100a}) {
      CAPTURE(to_string(target));
      const bool in_walk = target == Target::sm_90a;
      const RecordedBackward run = record_backward(spec, target, s);
      const RegionLayout saved = run.layer->saved_layout(s);
      const FakeCall& f = run.f;
      const auto q = reinterpret_cast<uint64_t>(f.in.q), k = reinterpret_cast<uint64_t>(f.in.k);
      int norms = 0, walks = 0, finals = 0;
      for (const auto& r : run.rec->records) {
        CAPTURE(r.program);
        CHECK(r.program != "l2norm");
        if (r.program == "l2norm_rows") ++norms;
        const auto field = [&](size_t off) { return param_word(r, off); };
        if (r.program == "state_walk_bwd") {
          ++walks;
          REQUIRE(r.params.size() == sizeof(StateWalkBwdFusedParams));
          if (in_walk) {
            CHECK(field(offsetof(StateWalkBwdParams, q)) == q);
            CHECK(field(offsetof(StateWalkBwdParams, k)) == k);
            CHECK(field(offsetof(StateWalkBwdParams, rstd_q)) == f.saved + saved.offset.at("rstd_q"));
            CHECK(field(offsetof(StateWalkBwdParams, rstd_k)) == f.saved + saved.offset.at("rstd_k"));
          } else {  // the portable walk reads qn and kn, and no segment fields (one segment)
            CHECK(field(offsetof(StateWalkBwdParams, q)) == f.ws + run.bwd.offset.at("qn"));
            CHECK(field(offsetof(StateWalkBwdParams, k)) == f.ws + run.bwd.offset.at("kn"));
            CHECK(field(offsetof(StateWalkBwdParams, seg_dzm)) == 0);
          }
        }
        if (r.program == "finalize") {  // the raw rows on every target (RAW_QK is in its source)
          ++finals;
          CHECK(field(offsetof(FinalizeParams, qn)) == q);
          CHECK(field(offsetof(FinalizeParams, kn)) == k);
          CHECK(field(offsetof(FinalizeParams, rstd_q)) == f.saved + saved.offset.at("rstd_q"));
          CHECK(field(offsetof(FinalizeParams, rstd_k)) == f.saved + saved.offset.at("rstd_k"));
        }
      }
      CHECK(norms == (in_walk ? 0 : 2));  // qn, kn: elsewhere the portable programs read them
      CHECK(walks == 1);
      CHECK(finals == 1);
      // Light and full saves: the forward's and the backward's launches follow the IR's call forms.
      for (const SaveMode save : {SaveMode::light, SaveMode::full}) {
        Spec one = spec;
        one.save_mode = save;
        one.targets = {target};
        record(one, s);
      }
    }
  }

  TEST_CASE("a target's workspace has no slot for the buffers unused there") {
    Spec spec = example("m");
    spec.walk_bwd_layout = WalkBwdLayout::fused;
    const LayerIR ir = lower(spec);
    const ProblemShape s{12345, 7};
    const auto aligned = [&](const char* n) {
      return (static_cast<size_t>(ir.buffer(n).bytes.eval(s.T, s.N, 64)) + 255) / 256 * 256;
    };
    for (const char* n : {"dh_tape", "dv_new"}) {
      CHECK(ir.buffer(n).unused_for(Target::sm_90a));
      CHECK_FALSE(ir.buffer(n).unused_for(Target::sm_100a));
      CHECK_FALSE(ir.buffer(n).unused_for(Target::sm_103a));
    }
    // The split layout leaves nothing out.
    {
      Spec split = example("m");
      split.walk_bwd_layout = WalkBwdLayout::split;
      for (const Buffer& b : lower(split).buffers) CHECK(b.unused_on.empty());
    }
    const size_t any = region_bytes(ir, BufferRole::workspace, CallForm::backward, s.T, s.N);
    for (const Target target : {Target::sm_90a, Target::sm_100a}) {
      CAPTURE(to_string(target));
      const RecordedBackward run = record_backward(spec, target, s);
      const Layer* const layer = run.layer.get();
      const RegionLayout& bwd = run.bwd;
      const FakeCall& f = run.f;
      const bool left_out = target == Target::sm_90a;
      CHECK(bwd.offset.count("dh_tape") == (left_out ? 0u : 1u));
      CHECK(bwd.offset.count("dv_new") == (left_out ? 0u : 1u));
      CHECK(layer->workspace_bytes(CallForm::backward, s) ==
            (left_out ? any - aligned("dh_tape") - aligned("dv_new") : any));
      CHECK(bwd.bytes == layer->workspace_bytes(CallForm::backward, s));
      // The spec-level query on the layer's target agrees; without a target it gives the union.
      CHECK(region_bytes(ir, BufferRole::workspace, CallForm::backward, s.T, s.N, target) ==
            layer->workspace_bytes(CallForm::backward, s));
      int walks = 0;
      for (const auto& r : run.rec->records) {
        CAPTURE(r.program);
        if (left_out) CHECK(r.program != "chunk_bwd");  // it idles where the fused walk runs
        if (r.program != "state_walk_bwd") continue;
        ++walks;
        const auto field = [&](size_t off) { return param_word(r, off); };
        // On sm_90a the fused walk reads the forward's tapes in those bytes (the params' unions).
        if (left_out) {
          CHECK(field(offsetof(StateWalkBwdParams, h_tape)) == f.ws + bwd.offset.at("h_tape"));
          CHECK(field(offsetof(StateWalkBwdParams, v_new)) == f.ws + bwd.offset.at("v_new"));
        } else {
          CHECK(field(offsetof(StateWalkBwdParams, dh_tape)) == f.ws + bwd.offset.at("dh_tape"));
          CHECK(field(offsetof(StateWalkBwdParams, dv_new)) == f.ws + bwd.offset.at("dv_new"));
        }
      }
      CHECK(walks == 1);
    }
    // An IR that calls a buffer unused where a program running there binds it is refused when the
    // plan is made for that target, not left to write through a slot without bytes.
    LayerIR wrong = ir;
    for (Buffer& b : wrong.buffers)
      if (b.name == "dh_tape") b.unused_on.push_back(Target::sm_100a);
    CallPlan plan = plan_backward(wrong, PrepRerun::yes);
    CHECK_THROWS_WITH_AS(specialize_for_target(plan, wrong, Target::sm_100a),
                         "plan: layer 'shape_m': state_walk_bwd binds 'dh_tape', which is unused on sm_100a",
                         std::logic_error);
  }

  TEST_CASE("full saves: sm_90a's saved region has no W (the reverse walk forms its own), the others keep it") {
    Spec spec = example("m");
    spec.save_mode = SaveMode::full;
    const LayerIR ir = lower(spec);
    CHECK(ir.buffer("w").role == BufferRole::saved);
    CHECK(ir.buffer("w").unused_for(Target::sm_90a));
    CHECK_FALSE(ir.buffer("w").unused_for(Target::sm_100a));
    const ProblemShape s{12345, 7};
    const size_t any = region_bytes(ir, BufferRole::saved, CallForm::forward, s.T, s.N);
    const size_t w_bytes = (static_cast<size_t>(ir.buffer("w").bytes.eval(s.T, s.N, 64)) + 255) / 256 * 256;
    for (const Target target : {Target::sm_90a, Target::sm_100a}) {
      CAPTURE(to_string(target));
      const bool left_out = target == Target::sm_90a;
      Spec one = spec;
      one.targets = {target};
      auto rec = std::make_shared<testing::RecordingLauncher>();
      auto layer = Layer::with_launcher(one, rec);
      const FakeCall f = fake_call(*layer, s);
      const RegionLayout saved = layer->saved_layout(s);
      CHECK(saved.offset.count("w") == (left_out ? 0u : 1u));
      CHECK(layer->saved_bytes(s) == (left_out ? any - w_bytes : any));
      CHECK(region_bytes(ir, BufferRole::saved, CallForm::forward, s.T, s.N, target) == layer->saved_bytes(s));
      layer->forward(s, f.in, f.out, reinterpret_cast<void*>(f.saved), f.saved_size, reinterpret_cast<void*>(f.ws),
                     f.ws_size, nullptr);
      layer->backward(s, f.in, f.grads, reinterpret_cast<void*>(f.saved), f.saved_size, reinterpret_cast<void*>(f.ws),
                      f.ws_size, nullptr);
      const std::string text = testing::render(rec->records, f.regions);
      CHECK((text.find("saved.w\n") != std::string::npos) == !left_out);  // chunk_prep's W
      // The slots after W's moved up: the walks address the target's own layout.
      int walks = 0;
      for (const auto& r : rec->records) {
        if (r.program != "state_walk_bwd") continue;
        ++walks;
        if (left_out) {
          CHECK(param_word(r, offsetof(StateWalkBwdParams, h_tape)) == f.saved + saved.offset.at("h_tape"));
          CHECK(param_word(r, offsetof(StateWalkBwdParams, v_new)) == f.saved + saved.offset.at("v_new"));
        }
      }
      CHECK(walks == 1);
    }
  }

  TEST_CASE("grids follow the problem size") {
    auto rec = std::make_shared<testing::RecordingLauncher>();
    Spec programs = example("m");
    programs.forward = ForwardPath::programs;
    auto layer = Layer::with_launcher(programs, rec);
    const ProblemShape s{32768, 5};
    const FakeCall f = fake_call(*layer, s);
    layer->forward(s, f.in, f.out, reinterpret_cast<void*>(f.saved), f.saved_size, reinterpret_cast<void*>(f.ws),
                   f.ws_size, nullptr);
    for (const auto& r : rec->records) {
      CAPTURE(r.program);
      if (r.program == "chunk_prep" || r.program == "output") {
        CHECK(r.grid.x == 32768 / 64 + 5);
        CHECK(r.grid.y == 48);
      }
      if (r.program == "state_walk") {
        CHECK(r.grid.x * layer->ir().walk_bv == 128);
        CHECK(r.grid.y == 48);
        CHECK(r.grid.z == 5);
      }
    }
    // Intra-card segments: the prescan walks S_ext's V and M's K columns of every segment, the
    // merge runs per document, the walk per segment.
    Spec segmented = programs;
    segmented.cp_segments = 6;
    auto seg_rec = std::make_shared<testing::RecordingLauncher>();
    auto seg_layer = Layer::with_launcher(segmented, seg_rec);
    const FakeCall g = fake_call(*seg_layer, s);
    seg_layer->forward(s, g.in, g.out, reinterpret_cast<void*>(g.saved), g.saved_size, reinterpret_cast<void*>(g.ws),
                       g.ws_size, nullptr);
    std::vector<std::string> order;
    for (const auto& r : seg_rec->records) {
      CAPTURE(r.program);
      order.push_back(r.program);
      const unsigned bv = static_cast<unsigned>(seg_layer->ir().walk_bv);
      if (r.program == "walk_prescan") CHECK((r.grid.x == 256 / bv && r.grid.y == 48 * 6 && r.grid.z == 5));
      if (r.program == "walk_merge")
        CHECK((r.grid.x == 128 / gdn::WalkMergeGeometry::kColumns && r.grid.y == 48 && r.grid.z == 5));
      if (r.program == "state_walk") CHECK((r.grid.x == 128 / bv && r.grid.y == 48 * 6 && r.grid.z == 5));
    }
    const auto at = [&](const char* p) { return std::find(order.begin(), order.end(), p) - order.begin(); };
    CHECK(at("chunk_prep") < at("walk_prescan"));
    CHECK(at("walk_prescan") < at("walk_merge"));
    CHECK(at("walk_merge") < at("state_walk"));
    CHECK(at("state_walk") < at("output"));
  }

  TEST_CASE("argument errors name the argument and are raised before any launch") {
    auto rec = std::make_shared<testing::RecordingLauncher>();
    auto layer = Layer::with_launcher(example("n"), rec);
    const ProblemShape s{128, 1};
    FakeCall f = fake_call(*layer, s);
    auto fwd = [&](FakeCall c, ProblemShape shape) {
      layer->forward(shape, c.in, c.out, reinterpret_cast<void*>(c.saved), c.saved_size, reinterpret_cast<void*>(c.ws),
                     c.ws_size, nullptr);
    };
    FakeCall bad = f;
    bad.in.h0 = nullptr;
    CHECK_THROWS_WITH_AS(fwd(bad, s), "h0: is null, but layer 'shape_n' has initial_state: true", InputError);
    bad = f;
    bad.in.v = static_cast<const char*>(bad.in.v) + 8;
    CHECK_THROWS_WITH_AS(fwd(bad, s), doctest::Contains("v: address"), InputError);
    CHECK_THROWS_WITH_AS(fwd(f, {0, 1}), "T: 0 is out of range (1 to 2^31-1)", InputError);
    CHECK_THROWS_WITH_AS(fwd(f, {128, 0}), "N: 0 documents is out of range (1 to 65535)", InputError);
    bad = f;
    bad.ws_size = 0;
    CHECK_THROWS_WITH_AS(fwd(bad, s), doctest::Contains("workspace: 0 bytes given"), InputError);
    // A segmented walk's grid carries value heads x segments on y and the documents on z: 64
    // segments take 1024 documents (once past the z limit), "auto"'s 16 take 4096 (once past it too).
    Spec segmented = example("n");
    segmented.cp_segments = 64;
    auto seg_layer = Layer::with_launcher(segmented, rec);
    const ProblemShape many{8192, 1024};
    const FakeCall g = fake_call(*seg_layer, many);
    CHECK_NOTHROW(seg_layer->forward(many, g.in, g.out, reinterpret_cast<void*>(g.saved), g.saved_size,
                                     reinterpret_cast<void*>(g.ws), g.ws_size, nullptr));
    auto auto_layer = Layer::with_launcher(example("n"), rec);
    const ProblemShape docs4096{8192 * 4, 4096};
    const FakeCall a = fake_call(*auto_layer, docs4096);
    CHECK_NOTHROW(auto_layer->forward(docs4096, a.in, a.out, reinterpret_cast<void*>(a.saved), a.saved_size,
                                      reinterpret_cast<void*>(a.ws), a.ws_size, nullptr));
    rec->records.clear();
    // ... and value heads x segments must fit y.
    Spec wide = example("n");
    wide.heads_qk = 1024;
    wide.heads_v = 2048;
    wide.cp_segments = 64;
    CHECK_THROWS_WITH_AS(gdn::lower(wide),
                         doctest::Contains("cp.segments 64 x 2048 value heads = 131072 exceeds the walk grid's y "
                                           "limit 65535"),
                         SpecError);
    // The proxy's ranks are its segments: the refusal names /cp/ranks there.
    wide.cp_segments = 0;
    wide.cp_ranks = 64;
    try {
      (void)gdn::lower(wide);
      FAIL("64 ranks x 2048 value heads lowered");
    } catch (const SpecError& e) {
      CHECK(e.pointer() == "/cp/ranks");
      CHECK(std::string(e.what()).find("cp.ranks 64 x 2048 value heads = 131072 exceeds the walk grid's y limit") !=
            std::string::npos);
    }
    // The proxy of context parallelism cuts T into cp.ranks equal parts of at least a chunk each.
    Spec ranked = example("n");
    ranked.cp_ranks = 8;
    auto rank_layer = Layer::with_launcher(ranked, rec);
    auto ranked_fwd = [&](ProblemShape shape) {
      const FakeCall r = fake_call(*rank_layer, shape);
      rank_layer->forward(shape, r.in, r.out, reinterpret_cast<void*>(r.saved), r.saved_size,
                          reinterpret_cast<void*>(r.ws), r.ws_size, nullptr);
    };
    CHECK_THROWS_WITH_AS(ranked_fwd({1001, 3}), "T: 1001 tokens do not split into cp.ranks 8 equal parts (1 left over)",
                         InputError);
    CHECK_THROWS_WITH_AS(ranked_fwd({256, 3}),
                         "cp.ranks: 8 ranks for 256 tokens: each rank needs at least one 64-token chunk (at most 4 "
                         "ranks)",
                         InputError);
    CHECK(rec->records.empty());
    ranked_fwd({1024, 3});
    CHECK_FALSE(rec->records.empty());
  }
}

namespace {

/// Records like RecordingLauncher, and throws on the launch numbered `fail_at`.
class FailingLauncher final : public Launcher {
 public:
  explicit FailingLauncher(size_t fail_at) : fail_at_(fail_at) {}
  size_t calls = 0;
  void launch(const Program& p, rt::dim3_t, const void*, size_t, CUstream) override {
    if (calls++ == fail_at_) throw std::runtime_error("launch of " + p.name + " failed");
  }

 private:
  size_t fail_at_;
};

std::string record_plan(const CallPlan& plan, const LayerIR& ir, const CallFrame& f, bool stub) {
  testing::RecordingLauncher rec;
  if (stub) {
    static auto compiler = StubCompiler::create();
    static int serial = 0;
    run_stub(compiler->compile(plan, "test_stub_" + std::to_string(serial++)), ir, f, rec);
  } else {
    run_plan(plan, ir, f, rec);
  }
  return testing::render(rec.records, {});
}

CallFrame some_frame(int64_t T, int64_t N) {
  CallFrame f;
  for (int i = 0; i < kFrameWords; ++i) f.word[static_cast<size_t>(i)] = 0x1000000ull * (i + 1);
  f[Frame::T] = static_cast<uint64_t>(T);
  f[Frame::N] = static_cast<uint64_t>(N);
  f[Frame::cu_is_int64] = 1;
  f[Frame::scale_bits] = 0x3db504f3;
  return f;
}

}  // namespace

TEST_SUITE("launches") {
  TEST_CASE("LLVM host stubs launch exactly what the interpreter launches") {
    if (!stubs_available()) {
      MESSAGE("built without LLVM: only the interpreter exists");
      return;
    }
    Spec light = example("n"), full = example("m"), segmented = example("n");
    full.save_mode = SaveMode::full;
    full.norm = Norm::none;
    full.initial_state = StateFlag::absent;
    full.final_state = StateFlag::absent;
    segmented.cp_segments = 5;
    const Spec fused = example("m");  // the fused forward, whose recompute with the output has a plan of its own
    int compared = 0;
    for (const Spec& spec : {light, full, segmented, fused}) {
      const LayerIR ir = lower(spec);
      std::vector<CallPlan> plans = {plan_forward(ir, OutputLaunch::yes), plan_forward(ir, OutputLaunch::no),
                                     plan_recompute(ir, OutputLaunch::yes), plan_backward(ir, PrepRerun::yes),
                                     plan_backward(ir, PrepRerun::no)};
      if (has_unsplit_plans(ir))
        for (OutputLaunch o : {OutputLaunch::yes, OutputLaunch::no}) {
          plans.push_back(plan_forward(ir, o, DocSplits::none));
          plans.push_back(plan_recompute(ir, o, DocSplits::none));
        }
      if (has_unsplit_plans(ir))
        for (PrepRerun r : {PrepRerun::yes, PrepRerun::no}) plans.push_back(plan_backward(ir, r, DocSplits::none));
      for (const CallPlan& plan : plans)
        for (auto [T, N] : {std::pair<int64_t, int64_t>{1, 1}, {8192, 3}, {262144, 4}, {32768, 5}, {777, 77}}) {
          CAPTURE(plan.name);
          CAPTURE(T);
          CallFrame f = some_frame(T, N);
          f[Frame::seg_rows] = static_cast<uint64_t>(segment_rows(ir, T));
          const std::string interpreted = record_plan(plan, ir, f, false);
          CHECK(!interpreted.empty());
          CHECK(record_plan(plan, ir, f, true) == interpreted);
          ++compared;
        }
    }
    CHECK(compared == 130);  // 26 plans x 5 sizes: light has the unsplit plans too (11), the others 5 each
  }

  TEST_CASE("a stub calls only its runtime table") {
    if (!stubs_available()) return;
    const LayerIR ir = lower(example("n"));
    const std::string text = StubCompiler::create()->ir_text(plan_forward(ir, OutputLaunch::yes), "stub_text");
    CHECK(text.find("define void @stub_text(") != std::string::npos);
    size_t declares = 0;
    for (size_t at = 0; (at = text.find("\ndeclare ", at)) != std::string::npos; ++at) ++declares;
    CHECK(declares == 1);  // llvm.memset only: every other call goes through the table argument
    CHECK(text.find("declare void @llvm.memset") != std::string::npos);
  }

  TEST_CASE("a launch failure inside a stub propagates after the stub returns") {
    if (!stubs_available()) return;
    auto failing = std::make_shared<FailingLauncher>(2);
    auto layer = Layer::with_launcher(example("n"), failing, HostPath::llvm_stub);
    const ProblemShape s{128, 1};
    const FakeCall f = fake_call(*layer, s);
    CHECK_THROWS_WITH_AS(layer->forward(s, f.in, f.out, reinterpret_cast<void*>(f.saved), f.saved_size,
                                        reinterpret_cast<void*>(f.ws), f.ws_size, nullptr),
                         "launch of l2norm failed", std::runtime_error);
    CHECK(failing->calls == 3);  // the launches after the failure were skipped
  }

  TEST_CASE("both host paths give the pinned sequence") {
    for (HostPath path : {HostPath::interpreted, HostPath::llvm_stub}) {
      if (path == HostPath::llvm_stub && !stubs_available()) continue;
      auto rec = std::make_shared<testing::RecordingLauncher>();
      auto layer = Layer::with_launcher(example("n"), rec, path);
      CHECK(layer->host_path() == path);
      const ProblemShape s{8192, 3};
      const FakeCall f = fake_call(*layer, s);
      layer->forward(s, f.in, f.out, reinterpret_cast<void*>(f.saved), f.saved_size, reinterpret_cast<void*>(f.ws),
                     f.ws_size, nullptr);
      layer->backward(s, f.in, f.grads, reinterpret_cast<void*>(f.saved), f.saved_size, reinterpret_cast<void*>(f.ws),
                      f.ws_size, nullptr);
      std::ifstream in(fs::path(GDN_SOURCE_DIR) / "tests/goldens/launches_n_light.txt");
      std::stringstream golden;
      golden << in.rdbuf();
      CHECK_MESSAGE(testing::render(rec->records, f.regions) == golden.str(), to_string(path));
    }
  }

  TEST_CASE("GDNC_HOST_PATH is checked, and the older GDN_HOST_PATH still read") {
    setenv("GDNC_HOST_PATH", "fast", 1);
    CHECK_THROWS_WITH_AS(default_host_path(),
                         R"(GDNC_HOST_PATH: "fast" is not supported (supported: "llvm", "interpreted"))", InputError);
    setenv("GDNC_HOST_PATH", "interpreted", 1);
    CHECK(default_host_path() == HostPath::interpreted);
    unsetenv("GDNC_HOST_PATH");
    setenv("GDN_HOST_PATH", "slow", 1);  // deprecated name: read, and named in the message
    CHECK_THROWS_WITH_AS(default_host_path(),
                         R"(GDN_HOST_PATH: "slow" is not supported (supported: "llvm", "interpreted"))", InputError);
    setenv("GDN_HOST_PATH", "interpreted", 1);
    CHECK(default_host_path() == HostPath::interpreted);
    setenv("GDNC_HOST_PATH", "fast", 1);  // the new name wins
    CHECK_THROWS_AS(default_host_path(), InputError);
    unsetenv("GDNC_HOST_PATH");
    unsetenv("GDN_HOST_PATH");
    CHECK(default_host_path() == (stubs_available() ? HostPath::llvm_stub : HostPath::interpreted));
  }
}
