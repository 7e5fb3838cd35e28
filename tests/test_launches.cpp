/**
 * @file test_launches.cpp
 * @brief Launch sequences on the CPU: the programs, grids and parameter blocks that a layer's
 *        forward and backward launch, recorded instead of run, pinned as goldens (they were
 *        recorded from the code the GPU suites verified), and checked against the IR.
 */
#include "tests/launch_recorder.hpp"

#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace fs = std::filesystem;
using namespace gdn;

namespace {

void check_golden(const std::string& name, const std::string& got) {
  const fs::path path = fs::path(GDN_SOURCE_DIR) / "tests/goldens" / name;
  if (const char* u = std::getenv("UPDATE_GOLDENS"); u && std::string(u) == "1") {
    std::ofstream(path) << got;
    MESSAGE("rewrote " << path.string() << ": review and commit it");
    return;
  }
  std::ifstream in(path);
  REQUIRE_MESSAGE(in.good(), "missing golden " << path.string() << " (run with UPDATE_GOLDENS=1)");
  std::stringstream s;
  s << in.rdbuf();
  CHECK(s.str() == got);
}

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
  f.in = {ptr("q"), ptr("k"), ptr("v"), fptr("g"), fptr("beta"), ptr("cu_seqlens"), IndexType::int32,
          h0 ? fptr("h0") : nullptr, 0.f};
  f.out = {ptr("o"), ht ? fptr("ht") : nullptr};
  f.grads = {ptr("do"), ht ? fptr("dht") : nullptr, ptr("dq"), ptr("dk"), ptr("dv"), fptr("dg"), fptr("dbeta"),
             h0 ? fptr("dh0") : nullptr};
  f.saved_size = layer.saved_bytes(s);
  f.ws_size = std::max(layer.workspace_bytes(CallForm::forward, s), layer.workspace_bytes(CallForm::backward, s));
  f.saved = 0x100000000ull;
  f.ws = 0x200000000ull;
  // Slots are printed by name: one region per slot of each layout.
  for (const auto& [name, off] : layer.saved_layout(s).offset)
    f.regions.push_back({"saved." + name, f.saved + off, 1});
  for (const auto& [name, off] : layer.workspace_layout(CallForm::backward, s).offset)
    f.regions.push_back({"ws." + name, f.ws + off, 1});
  f.regions.push_back({"saved", f.saved, f.saved_size});
  f.regions.push_back({"ws", f.ws, f.ws_size});
  return f;
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
  // The sequences follow the IR's call forms, program by program.
  std::vector<std::string> want_fwd, want_bwd, got_fwd, got_bwd;
  for (const auto& l : layer->ir().call_forms[0].launches) want_fwd.push_back(l.program);
  for (const auto& l : layer->ir().call_forms[2].launches) want_bwd.push_back(l.program);
  for (size_t i = 0; i < rec->records.size(); ++i)
    (i < n_fwd ? got_fwd : got_bwd).push_back(rec->records[i].program);
  CHECK(got_fwd == want_fwd);
  CHECK(got_bwd == want_bwd);
  return testing::render(rec->records, f.regions);
}

Spec example(const char* name) {
  return spec_from_file((fs::path(GDN_SOURCE_DIR) / "examples" / (std::string(name) + ".json")).string());
}

}  // namespace

TEST_SUITE("launches") {
  TEST_CASE("launch sequences of the examples are pinned") {
    check_golden("launches_n_light.txt", record(example("n"), {8192, 3}));
    Spec full = example("m");
    full.save_mode = SaveMode::full;
    full.norm = Norm::none;
    full.initial_state = StateFlag::absent;
    check_golden("launches_m_full_nonorm_noh0.txt", record(full, {1000, 2}));
  }

  TEST_CASE("grids follow the problem size") {
    auto rec = std::make_shared<testing::RecordingLauncher>();
    auto layer = Layer::with_launcher(example("m"), rec);
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
  }

  TEST_CASE("argument errors name the argument and are raised before any launch") {
    auto rec = std::make_shared<testing::RecordingLauncher>();
    auto layer = Layer::with_launcher(example("n"), rec);
    const ProblemShape s{128, 1};
    FakeCall f = fake_call(*layer, s);
    auto fwd = [&](FakeCall c, ProblemShape shape) {
      layer->forward(shape, c.in, c.out, reinterpret_cast<void*>(c.saved), c.saved_size,
                     reinterpret_cast<void*>(c.ws), c.ws_size, nullptr);
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
    CHECK(rec->records.empty());
  }
}
