/**
 * @file test_ir.cpp
 * @brief IR goldens: the text form of each example's IR is pinned in tests/goldens/.
 *        UPDATE_GOLDENS=1 rewrites them (then review the diff and commit).
 */
#include "compiler/ir.hpp"
#include "compiler/nvrtc.hpp"
#include "bwd/geometry.hpp"
#include "fwd/geometry.hpp"

#include "tests/golden.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <tuple>

namespace fs = std::filesystem;

namespace {
/// The value of a program's specialization constant, or "(absent)".
std::string constant_of(const gdn::Program& p, const std::string& name) {
  for (const auto& [k, v] : p.constants)
    if (k == name) return v;
  return "(absent)";
}
/// `spec`'s canonical JSON with one top-level field set to `value` (a value the reader must refuse).
nlohmann::json with_field(const gdn::Spec& spec, const char* field, const char* value) {
  auto j = gdn::to_json(spec);
  j[field] = value;
  return j;
}
}  // namespace

TEST_SUITE("ir") {
  TEST_CASE("IR text goldens of the example specs") {
    for (const char* name : {"n", "m"}) {
      const auto spec =
          gdn::spec_from_file((fs::path(GDN_SOURCE_DIR) / "examples" / (std::string(name) + ".json")).string());
      gdn::testing::check_golden(std::string("ir_") + name + ".txt", gdn::to_text(gdn::lower(spec)));
    }
    auto spec = gdn::spec_from_file((fs::path(GDN_SOURCE_DIR) / "examples/m.json").string());
    spec.save_mode = gdn::SaveMode::full;
    spec.norm = gdn::Norm::none;
    spec.initial_state = gdn::StateFlag::absent;
    gdn::testing::check_golden("ir_m_full_nonorm_noh0.txt", gdn::to_text(gdn::lower(spec)));
  }

  TEST_CASE("save modes move the walk's tapes between saved and workspace") {
    auto spec = gdn::spec_from_file((fs::path(GDN_SOURCE_DIR) / "examples/m.json").string());
    spec.forward = gdn::ForwardPath::programs;
    const auto light = gdn::lower(spec);
    CHECK(light.buffer("h_tape").role == gdn::BufferRole::workspace);
    CHECK(light.call_forms[2].launches.front().program == "chunk_prep");
    spec.save_mode = gdn::SaveMode::full;
    const auto full = gdn::lower(spec);
    CHECK(full.buffer("h_tape").role == gdn::BufferRole::saved);
    CHECK(full.call_forms[2].launches.front().program == "dv_local");
  }

  TEST_CASE("tensor_cores picks the instructions of chunk_bwd, the fused walks and state_walk_bwd, and only theirs") {
    auto spec = gdn::spec_from_file((fs::path(GDN_SOURCE_DIR) / "examples/m.json").string());
    const auto automatic = gdn::lower(spec);
    spec.tensor_cores = gdn::TensorCores::mma_sync;
    const auto mma_sync = gdn::lower(spec);
    CHECK(constant_of(automatic.program("chunk_bwd"), "WGMMA") == "true");
    CHECK(constant_of(mma_sync.program("chunk_bwd"), "WGMMA") == "false");
    CHECK(constant_of(automatic.program("fused_walk"), "WGMMA") == "true");  // m.json: forward "auto" -> fused
    CHECK(constant_of(mma_sync.program("fused_walk"), "WGMMA") == "false");
    CHECK(constant_of(automatic.program("walk_tape"), "WGMMA") == "true");
    CHECK(constant_of(mma_sync.program("walk_tape"), "WGMMA") == "false");
    CHECK(constant_of(automatic.program("state_walk_bwd"), "WGMMA") == "true");
    CHECK(constant_of(mma_sync.program("state_walk_bwd"), "WGMMA") == "false");
    for (const auto& p : automatic.programs)
      if (p.name != "chunk_bwd" && p.name != "fused_walk" && p.name != "walk_tape" && p.name != "state_walk_bwd")
        CHECK(constant_of(p, "WGMMA") == "(absent)");
    CHECK(gdn::spec_from_json(gdn::to_json(spec)).tensor_cores == gdn::TensorCores::mma_sync);
  }

  TEST_CASE("walk_slab sets the forward walk's slab width, shared memory and grid, and nothing else") {
    auto spec = gdn::spec_from_file((fs::path(GDN_SOURCE_DIR) / "examples/m.json").string());
    spec.forward = gdn::ForwardPath::programs;  // the fused path has no state_walk
    spec.walk_slab = 32;
    const auto narrow = gdn::lower(spec);
    spec.walk_slab = 64;
    const auto wide = gdn::lower(spec);
    CHECK(narrow.walk_bv == 32);
    CHECK(constant_of(narrow.program("state_walk"), "BV") == "32");
    CHECK(wide.walk_bv == 64);
    CHECK(constant_of(wide.program("state_walk"), "BV") == "64");
    CHECK(wide.program("state_walk").smem_bytes == gdn::StateWalkGeometry::smem_bytes_bv(128, 64, 64));
    CHECK(wide.program("state_walk").smem_bytes != narrow.program("state_walk").smem_bytes);
    // The backward walk keeps its own slab; every other program is untouched.
    for (const auto& p : narrow.programs) {
      if (p.name == "state_walk") continue;
      const gdn::Program& q = wide.program(p.name);
      CHECK_MESSAGE(p.constants == q.constants, p.name);
      CHECK_MESSAGE(p.smem_bytes == q.smem_bytes, p.name);
    }
    CHECK(gdn::spec_from_json(gdn::to_json(spec)).walk_slab == 64);
    CHECK(gdn::to_json(gdn::spec_from_file((fs::path(GDN_SOURCE_DIR) / "examples/m.json").string()))["walk_slab"] ==
          "auto");
    spec.walk_slab = 48;
    CHECK_THROWS_WITH_AS(gdn::lower(spec), doctest::Contains("/walk_slab"), gdn::SpecError);
  }

  TEST_CASE("walk_slab \"auto\" is 64 where one document gives 32 or more 64-wide slabs, else 32") {
    for (const auto& [example, heads_v, want] : {std::tuple{"m", 48, 64}, std::tuple{"n", 6, 32}}) {
      auto spec =
          gdn::spec_from_file((fs::path(GDN_SOURCE_DIR) / "examples" / (std::string(example) + ".json")).string());
      REQUIRE(spec.heads_v == heads_v);
      REQUIRE(spec.walk_slab == 0);
      CHECK_MESSAGE(gdn::lower(spec).walk_bv == want, example);
    }
    auto spec = gdn::spec_from_file((fs::path(GDN_SOURCE_DIR) / "examples/n.json").string());
    spec.heads_v = 16;  // 16 * 128 / 64 = 32 slabs: the first head count that takes 64
    spec.heads_qk = 16;
    CHECK(gdn::lower(spec).walk_bv == 64);
    spec.heads_v = 15;
    spec.heads_qk = 15;
    CHECK(gdn::lower(spec).walk_bv == 32);
  }

  TEST_CASE("walk_bwd_slab sets the backward walk's slab width, warps, shared memory and grid, and nothing else") {
    auto spec = gdn::spec_from_file((fs::path(GDN_SOURCE_DIR) / "examples/m.json").string());
    spec.walk_bwd_layout = gdn::WalkBwdLayout::split;  // the split body's geometry
    const auto automatic = gdn::lower(spec);
    spec.walk_bwd_slab = 64;
    const auto wide = gdn::lower(spec);
    const gdn::Program& w = wide.program("state_walk_bwd");
    CHECK(automatic.walk_bwd_bv == 128);  // tensor_cores "auto": the sm_90a body's width
    CHECK(automatic.program("state_walk_bwd").max_registers == 128);
    CHECK(automatic.program("state_walk_bwd").smem_bytes == gdn::StateWalkBwdSm90Layout::smem_bytes(128, 64));
    CHECK(w.max_registers == 0);
    CHECK(wide.walk_bwd_bv == 64);
    CHECK(w.threads == 512);
    CHECK(w.min_blocks_per_sm == 1);
    CHECK(w.smem_bytes == gdn::StateWalkBwdGeometry::smem_bytes_bv(128, 64, 64));
    CHECK(constant_of(w, "BV") == "64");
    for (const auto& p : automatic.programs) {
      if (p.name == "state_walk_bwd" || p.name == "dv_local") continue;
      const gdn::Program& q = wide.program(p.name);
      CHECK_MESSAGE(p.constants == q.constants, p.name);
      CHECK_MESSAGE(p.threads == q.threads, p.name);
    }
    CHECK(gdn::spec_from_json(gdn::to_json(spec)).walk_bwd_slab == 64);
    CHECK_THROWS_WITH_AS(
        gdn::spec_from_json(nlohmann::json::parse(R"({"name":"x","heads":{"qk":1,"v":1},"walk_bwd_slab":16})")),
        "/walk_bwd_slab: 16 is not supported (supported: \"auto\", 32, 64, 128)", gdn::SpecError);
    CHECK_THROWS_WITH_AS(
        gdn::spec_from_json(nlohmann::json::parse(R"({"name":"x","heads":{"qk":1,"v":1},"walk_slab":128})")),
        "/walk_slab: 128 is not supported (supported: \"auto\", 32, 64)", gdn::SpecError);
    spec.walk_bwd_slab = 0;
    spec.tensor_cores = gdn::TensorCores::mma_sync;
    const auto portable = gdn::lower(spec);
    CHECK(portable.walk_bwd_bv == gdn::StateWalkBwdGeometry::bv(128));
    CHECK(portable.program("state_walk_bwd").max_registers == 0);
    CHECK(portable.program("state_walk_bwd").threads == 256);
    // The sm_90a body loads whole chunks by TMA: K, Q, Tm (the walk forms W) and dO, in that order,
    // each map's rows as wide as the tensor's token rows; the portable body has no maps.
    {
      std::vector<std::pair<std::string, int64_t>> maps;
      for (const auto& m : automatic.program("state_walk_bwd").tensor_maps) maps.emplace_back(m.name, m.row_elements);
      CHECK(maps == std::vector<std::pair<std::string, int64_t>>{{"k", 16 * 128},
                                                                 {"q", 16 * 128},
                                                                 {"tm", 48 * 64},
                                                                 {"d_o", 48 * 128},
                                                                 {"dh_tape", 128},
                                                                 {"dv_new", 48 * 128}});
      // The dh tape's map spans every chunk's HV x K state rows, in boxes of one K x 64 block.
      CHECK(automatic.program("state_walk_bwd").tensor_maps[4].rows_per_unit == 48 * 128);
      CHECK(automatic.program("state_walk_bwd").tensor_maps[4].box_rows == 128);
      CHECK(automatic.program("fused_walk").tensor_maps.size() == 5);  // k, v, tm, q loaded; o stored
      // No q (no output); the tapes leave by TMA: h_tape in K x 64 boxes over nt_max x HV x K rows.
      CHECK(automatic.program("walk_tape").tensor_maps.size() == 5);
      CHECK(automatic.program("walk_tape").tensor_maps[3].name == "h_tape");
      CHECK(automatic.program("walk_tape").tensor_maps[3].rows_per_unit == 48 * 128);
      CHECK(automatic.program("walk_tape").tensor_maps[3].rows_field_bytes == 4);  // FusedWalkParams::nt_max
      CHECK(automatic.program("walk_tape").tensor_maps[4].name == "v_new");
      CHECK(automatic.program("chunk_bwd").tensor_maps.size() == 12);  // every tile loaded; dk_v, dq_v, dv stored
      CHECK(automatic.program("chunk_bwd").tensor_maps[10].name == "dq_v");
      CHECK(automatic.program("chunk_bwd").tensor_maps[11].row_elements == 48 * 128);  // dv: [T, HV x V]
      CHECK(automatic.program("chunk_bwd").tensor_maps[6].rows_field_bytes == 4);      // ChunkBwdParams::nt_max
      CHECK(automatic.program("finalize").tensor_maps.empty());
      CHECK(w.tensor_maps.empty());
      CHECK(portable.program("state_walk_bwd").tensor_maps.empty());
      CHECK(portable.program("fused_walk").tensor_maps.empty());
    }
    // Few value heads (N: 6) keep the 32-wide portable body under "auto": 128-wide blocks would
    // leave most SMs idle.
    const auto few = gdn::lower(gdn::spec_from_file((fs::path(GDN_SOURCE_DIR) / "examples/n.json").string()));
    CHECK(few.walk_bwd_bv == 32);
    CHECK(few.program("state_walk_bwd").max_registers == 0);
    // The sm_90a body computes dv_local itself: the program idles there (neither compiled nor
    // launched for sm_90a) unless a segment prescan (portable, 32 wide) reads it.
    CHECK(constant_of(automatic.program("dv_local"), "WALK_FUSES_DV") == "true");
    CHECK(automatic.program("dv_local").idle_for(gdn::Target::sm_90a));
    CHECK_FALSE(automatic.program("dv_local").idle_for(gdn::Target::sm_100a));
    CHECK_FALSE(automatic.program("state_walk_bwd").idle_for(gdn::Target::sm_90a));
    CHECK(constant_of(wide.program("dv_local"), "WALK_FUSES_DV") == "false");
    CHECK(constant_of(portable.program("dv_local"), "WALK_FUSES_DV") == "false");
    CHECK(constant_of(few.program("dv_local"), "WALK_FUSES_DV") == "false");
    for (const auto* ir : {&wide, &portable, &few}) CHECK(ir->program("dv_local").idle_on.empty());
    // Segments under the merge: the prescan reads dv_local on every target. Under the verified
    // carry ("auto" takes it on the fused forward) dv_local idles on sm_90a and dv_local_marked
    // makes the marked chains' after the walks.
    spec.tensor_cores = gdn::TensorCores::automatic;
    spec.cp_segments = 4;
    spec.cp_carry = gdn::SegmentCarry::merge;
    CHECK(constant_of(gdn::lower(spec).program("dv_local"), "WALK_FUSES_DV") == "false");
    CHECK(gdn::lower(spec).program("dv_local").idle_on.empty());
    spec.cp_carry = gdn::SegmentCarry::automatic;
    const auto verified = gdn::lower(spec);
    REQUIRE(verified.verified_carry);
    CHECK(constant_of(verified.program("dv_local"), "WALK_FUSES_DV") == "true");
    CHECK(verified.program("dv_local").idle_for(gdn::Target::sm_90a));
    CHECK_FALSE(verified.program("dv_local_marked").idle_for(gdn::Target::sm_90a));
  }

  /// Each change keeps the reverse walk from forming W: the programs forward, segments under the
  /// merge carry, ranks, mma.sync, a narrower backward slab.
  std::vector<std::function<void(gdn::Spec&)>> walk_w_blockers() {
    return {[](gdn::Spec& s) { s.forward = gdn::ForwardPath::programs; },
            [](gdn::Spec& s) {
              s.cp_segments = 4;
              s.cp_carry = gdn::SegmentCarry::merge;
            },
            [](gdn::Spec& s) { s.cp_ranks = 2; }, [](gdn::Spec& s) { s.tensor_cores = gdn::TensorCores::mma_sync; },
            [](gdn::Spec& s) { s.walk_bwd_slab = 64; }};
  }

  TEST_CASE("walk_bwd_layout: \"split\", \"fused\" or \"auto\"; other values are refused naming the field") {
    CHECK_THROWS_WITH_AS(
        gdn::spec_from_json(
            nlohmann::json::parse(R"({"name":"x","heads":{"qk":1,"v":1},"walk_bwd_layout":"z_owner"})")),
        "/walk_bwd_layout: \"z_owner\" is not supported (supported: \"split\", \"fused\", \"auto\")", gdn::SpecError);
  }

  TEST_CASE("walk_bwd_layout \"fused\": the walk takes chunk_bwd's body, which idles on sm_90a only") {
    auto spec = gdn::spec_from_file((fs::path(GDN_SOURCE_DIR) / "examples/m.json").string());
    spec.walk_bwd_layout = gdn::WalkBwdLayout::split;
    const auto split = gdn::lower(spec);
    spec.walk_bwd_layout = gdn::WalkBwdLayout::fused;
    const auto fu = gdn::lower(spec);
    const gdn::Program& walk = fu.program("state_walk_bwd");
    CHECK(constant_of(walk, "WALK_FUSED") == "true");
    CHECK(constant_of(walk, "WALK_Z_OWNER") == "(absent)");
    CHECK(walk.template_path == "bwd/walk_bwd_fused_sm90.cuh");
    CHECK(split.program("state_walk_bwd").template_path == "bwd/state_walk_bwd.cuh");
    CHECK(walk.smem_bytes == gdn::StateWalkBwdSm90Layout::fu_smem_bytes(128, 64));
    CHECK(walk.smem_bytes <= 227 * 1024);
    // The walk's loads (k, q, tm, d_o, the h tape, v_new, v) and chunk_bwd's stores (dq_v, dk_v, dv).
    REQUIRE(walk.tensor_maps.size() == 10);
    CHECK(walk.tensor_maps[4].name == "h_tape");
    CHECK(walk.tensor_maps[9].name == "dv");
    CHECK(fu.program("chunk_bwd").idle_for(gdn::Target::sm_90a));
    CHECK_FALSE(fu.program("chunk_bwd").idle_for(gdn::Target::sm_100a));
    CHECK_FALSE(split.program("chunk_bwd").idle_for(gdn::Target::sm_90a));
    CHECK(gdn::to_json(fu.spec)["walk_bwd_layout"] == "fused");
    CHECK(walk.params_type == "StateWalkBwdFusedParams");
    CHECK(split.program("state_walk_bwd").params_type == "StateWalkBwdParams");
    // Segments under the verified carry: its speculate and verify walks run the fused body too
    // (chunk_bwd still idles on sm_90a); the prescan keeps the split walk's parameters.
    gdn::Spec segmented = spec;
    segmented.cp_segments = 4;
    segmented.cp_carry = gdn::SegmentCarry::verified;
    const auto fs = gdn::lower(segmented);
    REQUIRE(fs.verified_carry);
    for (const char* name : {"walk_bwd_speculate", "walk_bwd_verify", "state_walk_bwd"}) {
      CAPTURE(name);
      const gdn::Program& w = fs.program(name);
      CHECK(w.template_path == "bwd/walk_bwd_fused_sm90.cuh");
      CHECK(w.params_type == "StateWalkBwdFusedParams");
      CHECK(constant_of(w, "WALK_FUSED") == "true");
      CHECK(constant_of(w, "SEGMENTS") == "4");
      CHECK(w.smem_bytes == gdn::StateWalkBwdSm90Layout::fu_smem_bytes(128, 64));
      CHECK(w.tensor_maps.size() == 10);
    }
    CHECK(fs.program("walk_bwd_prescan").params_type == "StateWalkBwdParams");
    CHECK(fs.program("chunk_bwd").idle_for(gdn::Target::sm_90a));
    // "auto" resolves to the verified carry here; the merge carry's segmented walk is refused.
    gdn::Spec auto_carry = segmented;
    auto_carry.cp_carry = gdn::SegmentCarry::automatic;
    CHECK(gdn::lower(auto_carry).verified_carry);
    gdn::Spec bad = segmented;
    bad.cp_carry = gdn::SegmentCarry::merge;
    CHECK_THROWS_WITH_AS(gdn::lower(bad), doctest::Contains("\"fused\" needs"), gdn::SpecError);
    bad = spec;
    bad.cp_ranks = 2;
    CHECK_THROWS_AS(gdn::lower(bad), gdn::SpecError);
  }

  TEST_CASE("backward_w \"walk\": the reverse walk's sm_90a body forms W, chunk_prep idles on sm_90a") {
    auto spec = gdn::spec_from_file((fs::path(GDN_SOURCE_DIR) / "examples/m.json").string());
    spec.walk_bwd_layout = gdn::WalkBwdLayout::split;  // the split body, with and without W
    spec.backward_w = gdn::BackwardW::chunk_prep;
    const auto prep = gdn::lower(spec);
    CHECK_FALSE(prep.backward_w_auto);
    CHECK(constant_of(prep.program("state_walk_bwd"), "WALK_FUSES_W") == "false");
    CHECK(prep.program("chunk_prep").idle_on.empty());
    spec.backward_w = gdn::BackwardW::walk;
    const auto walk = gdn::lower(spec);
    CHECK(constant_of(walk.program("state_walk_bwd"), "WALK_FUSES_W") == "true");
    // chunk_prep's product is the same program either way: only where it runs changes.
    CHECK(walk.program("chunk_prep").constants == prep.program("chunk_prep").constants);
    CHECK(walk.program("chunk_prep").idle_for(gdn::Target::sm_90a));
    CHECK_FALSE(walk.program("chunk_prep").idle_for(gdn::Target::sm_100a));
    CHECK(walk.program("state_walk_bwd").smem_bytes == prep.program("state_walk_bwd").smem_bytes);
    // It needs the fused forward without segments (but the verified carry's, below) or ranks and the
    // sm_90a reverse walk.
    for (const auto& change : walk_w_blockers()) {
      gdn::Spec bad = spec;
      change(bad);
      CHECK_THROWS_AS(gdn::lower(bad), gdn::SpecError);
      try {
        gdn::lower(bad);
      } catch (const gdn::SpecError& e) {
        CHECK(e.pointer() == "/backward_w");
      }
    }
    // Segments under the verified carry: the sm_90a walks form W; on sm_90a the forward's and the
    // backward's chunk_prep run for the marked chains only, after the verify walks
    // (chunk_prep_fwd_marked: W and U for the forward's prescan; chunk_prep_marked: W for the
    // backward's); the other targets keep chunk_prep in the forward and chunk_prep_rerun in the
    // backward.
    gdn::Spec segmented = spec;
    segmented.cp_segments = 4;
    segmented.cp_carry = gdn::SegmentCarry::verified;
    segmented.backward_w = gdn::BackwardW::automatic;
    const auto verified = gdn::lower(segmented);
    CHECK(verified.spec.backward_w == gdn::BackwardW::walk);
    for (const char* name : {"walk_bwd_speculate", "walk_bwd_verify", "state_walk_bwd"})
      CHECK_MESSAGE(constant_of(verified.program(name), "WALK_FUSES_W") == "true", name);
    CHECK(verified.program("chunk_prep").idle_on == std::vector<gdn::Target>{gdn::Target::sm_90a});
    CHECK(verified.program("chunk_prep_rerun").constants == verified.program("chunk_prep").constants);
    const gdn::Program& fwd_marked = verified.program("chunk_prep_fwd_marked");
    CHECK(constant_of(fwd_marked, "WRITES_U") == "true");
    CHECK(constant_of(fwd_marked, "MARKED_CHAINS") == "true");
    CHECK(fwd_marked.idle_on == std::vector<gdn::Target>{gdn::Target::sm_100a, gdn::Target::sm_103a});
    CHECK(verified.program("chunk_prep_rerun").idle_on == std::vector<gdn::Target>{gdn::Target::sm_90a});
    const gdn::Program& marked = verified.program("chunk_prep_marked");
    CHECK(constant_of(marked, "WRITES_U") == "false");
    CHECK(constant_of(marked, "MARKED_CHAINS") == "true");
    CHECK(marked.idle_on == std::vector<gdn::Target>{gdn::Target::sm_100a, gdn::Target::sm_103a});
    {
      std::vector<std::string> order;
      for (const auto& form : verified.call_forms)
        if (form.form == gdn::CallForm::backward)
          for (const auto& launch : form.launches) order.push_back(launch.program);
      const auto at = [&](const char* name) { return std::find(order.begin(), order.end(), name) - order.begin(); };
      CHECK(at("chunk_prep_rerun") < at("walk_bwd_speculate"));
      CHECK(at("chunk_prep") == static_cast<long>(order.size()));  // not in the backward
      CHECK(at("dv_local_marked") + 1 == at("chunk_prep_marked"));
      CHECK(at("chunk_prep_marked") + 1 == at("walk_bwd_prescan"));
      for (const auto& form : verified.call_forms) {
        if (form.form == gdn::CallForm::backward) continue;
        std::vector<std::string> fwd;
        for (const auto& launch : form.launches) fwd.push_back(launch.program);
        const auto in_fwd = [&](const char* name) { return std::find(fwd.begin(), fwd.end(), name) - fwd.begin(); };
        const char* verify = form.form == gdn::CallForm::forward ? "fused_verify" : "tape_verify";
        CAPTURE(gdn::to_string(form.form));
        CHECK(in_fwd("chunk_prep") < in_fwd(verify));
        // The forward makes the marked chains' kn between the verify walk and their W; a
        // recompute hands its tapes over, with or without the output, and makes every row
        // before the walks.
        const bool forward = form.form == gdn::CallForm::forward;
        CHECK(in_fwd(verify) + (forward ? 2 : 1) == in_fwd("chunk_prep_fwd_marked"));
        if (forward) CHECK(in_fwd(verify) + 1 == in_fwd("l2norm_k_marked"));
        if (forward) CHECK(in_fwd("l2norm_k") < in_fwd("chunk_solve"));
        CHECK(std::count(fwd.begin(), fwd.end(), "l2norm_k_marked") == (forward ? 1 : 0));
        CHECK(std::count(fwd.begin(), fwd.end(), "l2norm") == 2 - forward);
      }
    }
    // kn: the forward's k launch is l2norm_k (l2norm's code, idle on sm_90a) and l2norm_k_marked
    // runs on sm_90a alone.
    CHECK(verified.program("l2norm_k").class_name == verified.program("l2norm").class_name);
    CHECK(verified.program("l2norm_k").constants == verified.program("l2norm").constants);
    CHECK(verified.program("l2norm_k").idle_on == std::vector<gdn::Target>{gdn::Target::sm_90a});
    CHECK(verified.program("l2norm_k_marked").class_name == "L2NormMarked");
    CHECK(verified.program("l2norm_k_marked").grid == gdn::GridKind::chunk_heads);
    CHECK(verified.program("l2norm_k_marked").idle_on ==
          std::vector<gdn::Target>{gdn::Target::sm_100a, gdn::Target::sm_103a});
    // Full saves: W is a saved tape, whole on every target; nothing re-runs.
    segmented.save_mode = gdn::SaveMode::full;
    const auto full = gdn::lower(segmented);
    CHECK(full.program("chunk_prep").idle_on.empty());
    for (const char* name :
         {"chunk_prep_marked", "chunk_prep_rerun", "chunk_prep_fwd_marked", "l2norm_k", "l2norm_k_marked"})
      CHECK_FALSE_MESSAGE(full.has_program(name), name);
    // The merge carry's prescan reads every chain's W: refused there.
    segmented.cp_carry = gdn::SegmentCarry::merge;
    segmented.backward_w = gdn::BackwardW::walk;
    CHECK_THROWS_WITH_AS(gdn::lower(segmented), doctest::Contains("either no segments or cp.carry \"verified\""),
                         gdn::SpecError);
    CHECK_THROWS_WITH_AS(
        gdn::spec_from_json(nlohmann::json::parse(R"({"name":"x","heads":{"qk":1,"v":1},"backward_w":"prep"})")),
        "/backward_w: \"prep\" is not supported (supported: \"chunk_prep\", \"walk\", \"auto\")", gdn::SpecError);
  }

  TEST_CASE("cp.carry \"verified\": its programs and constants, saved maps, its refusals, its canonical form") {
    auto spec = gdn::spec_from_file((fs::path(GDN_SOURCE_DIR) / "examples/n.json").string());
    spec.cp_segments = 4;
    spec.cp_carry = gdn::SegmentCarry::merge;
    const auto merge = gdn::lower(spec);
    CHECK_FALSE(merge.verified_carry);
    CHECK(merge.saved_segment_maps);
    spec.cp_carry = gdn::SegmentCarry::verified;
    const auto verified = gdn::lower(spec);
    CHECK(verified.verified_carry);
    // The backward takes A from the forward's maps for the chains that failed the forward's gate test.
    CHECK(verified.saved_segment_maps);
    CHECK(verified.segment_entries_saved);
    for (const char* name :
         {"walk_speculate", "walk_verify", "walk_prescan", "walk_merge", "state_walk", "walk_bwd_speculate",
          "walk_bwd_verify", "walk_bwd_prescan", "walk_merge_bwd", "state_walk_bwd"})
      CHECK_MESSAGE(constant_of(verified.program(name), "VERIFIED_CARRY") == "true", name);
    CHECK(verified.buffer("seg_hm").role == gdn::BufferRole::saved);
    CHECK(constant_of(verified.program("walk_prescan"), "SAVED_MAPS") == "true");
    CHECK(constant_of(verified.program("walk_bwd_prescan"), "SAVED_MAPS") == "true");
    // The forward's marks are saved: the backward merges the chains the forward merged.
    CHECK(verified.buffer("fwd_fail").role == gdn::BufferRole::saved);
    CHECK(verified.buffer("seg_fail").role == gdn::BufferRole::workspace);
    CHECK(constant_of(verified.program("walk_merge_bwd"), "SAVED_MAPS") == "true");
    // ... and for the others walks A itself: the prescan's grid keeps A's blocks.
    CHECK(verified.program("walk_bwd_prescan").grid == gdn::GridKind::walk_prescan);
    CHECK(merge.program("walk_bwd_prescan").grid == gdn::GridKind::walk_segments);
    CHECK(verified.buffer("seg_h0").role == gdn::BufferRole::saved);
    CHECK(verified.buffer("seg_ckpt").bytes.eval(1000, 3, 64) == 3 * 4 * 6 * 4 * 128 * 128 * 4LL);
    CHECK(verified.buffer("seg_fail").bytes.eval(1000, 3, 64) == 3 * 6 * 4);
    // The merge carry's programs carry no such constant: their sources (and cache keys) are unchanged.
    for (const auto& p : merge.programs) CHECK_MESSAGE(constant_of(p, "VERIFIED_CARRY") == "(absent)", p.name);
    // One segment per document: no effect.
    gdn::Spec one = spec;
    one.cp_segments = 1;
    CHECK_FALSE(gdn::lower(one).verified_carry);
    // The reverse walk's sm_90a body (128-wide slabs) runs its own speculative and verify walks:
    // the walk's shape, pinned registers and tensor maps for all three; "auto" keeps the merge there.
    gdn::Spec wide = spec;
    wide.walk_bwd_slab = 128;
    const auto sm90 = gdn::lower(wide);
    CHECK(sm90.verified_carry);
    const gdn::Program& walk = sm90.program("state_walk_bwd");
    for (const char* name : {"walk_bwd_speculate", "walk_bwd_verify"}) {
      const gdn::Program& p = sm90.program(name);
      CHECK_MESSAGE(p.threads == walk.threads, name);
      CHECK_MESSAGE(p.smem_bytes == walk.smem_bytes, name);
      CHECK_MESSAGE(p.max_registers == walk.max_registers, name);
      CHECK_MESSAGE(p.max_registers == 128, name);
      CHECK_MESSAGE(p.tensor_maps.size() == walk.tensor_maps.size(), name);
      CHECK_MESSAGE(p.tensor_maps.size() == 6, name);
      CHECK_MESSAGE(constant_of(p, "WGMMA") == "true", name);
      CHECK_MESSAGE(constant_of(p, "VERIFIED_CARRY") == "true", name);
    }
    // dv_local there: idle on sm_90a (the walk computes its own), dv_local_marked after the
    // reverse walks makes the marked chains' for their prescan on sm_90a and idles elsewhere.
    CHECK(sm90.program("dv_local").idle_for(gdn::Target::sm_90a));
    const gdn::Program& marked = sm90.program("dv_local_marked");
    CHECK(constant_of(marked, "MARKED_CHAINS") == "true");
    CHECK(constant_of(marked, "SEGMENTS") == "4");
    CHECK_FALSE(marked.idle_for(gdn::Target::sm_90a));
    CHECK(marked.idle_for(gdn::Target::sm_100a));
    CHECK(marked.idle_for(gdn::Target::sm_103a));
    {
      std::vector<std::string> order;
      for (const auto& form : sm90.call_forms)
        if (form.form == gdn::CallForm::backward)
          for (const auto& launch : form.launches) order.push_back(launch.program);
      const auto at = [&](const char* name) { return std::find(order.begin(), order.end(), name) - order.begin(); };
      CHECK(at("walk_bwd_verify") + 1 == at("dv_local_marked"));
      CHECK(at("dv_local_marked") + 1 == at("walk_bwd_prescan"));
    }
    gdn::Spec wide_auto = wide;
    wide_auto.cp_carry = gdn::SegmentCarry::automatic;
    CHECK_FALSE(gdn::lower(wide_auto).verified_carry);
    CHECK_FALSE(gdn::lower(wide_auto).has_program("dv_local_marked"));
    wide.tensor_cores = gdn::TensorCores::mma_sync;  // the portable body at 128 columns
    const auto portable = gdn::lower(wide);
    CHECK(portable.verified_carry);
    CHECK(portable.program("walk_bwd_speculate").tensor_maps.empty());
    CHECK(portable.program("walk_bwd_speculate").max_registers == 0);
    CHECK_FALSE(portable.has_program("dv_local_marked"));
    // The canonical form names the carry only when it is not the default ("auto").
    CHECK(gdn::to_json(merge.spec)["cp"]["carry"] == "merge");
    CHECK(gdn::to_json(verified.spec)["cp"]["carry"] == "verified");
    CHECK(gdn::spec_from_json(gdn::to_json(verified.spec)).cp_carry == gdn::SegmentCarry::verified);
  }

  TEST_CASE("cp.carry \"verified\" on the fused forward: its walks, their constants, taken by \"auto\"") {
    auto spec = gdn::spec_from_file((fs::path(GDN_SOURCE_DIR) / "examples/n.json").string());
    spec.forward = gdn::ForwardPath::fused;
    spec.cp_segments = 4;
    spec.cp_carry = gdn::SegmentCarry::verified;
    const auto ir = gdn::lower(spec);
    REQUIRE(ir.verified_carry);
    // The speculative and verify walks of the output and of the tapes: the fused walk's body, its
    // geometry and operands, a class per walk.
    // The output walks carry the tape stores a recompute binds (light saves), but the forward's
    // speculative walk: the recompute's is fused_speculate_tapes.
    const std::map<std::string, std::pair<std::string, std::string>> walks = {
        {"fused_speculate", {"FusedWalkSpeculate", "true"}},
        {"fused_speculate_tapes", {"FusedWalkSpeculate", "true"}},
        {"fused_verify", {"FusedWalkVerify", "true"}},
        {"tape_speculate", {"FusedWalkSpeculate", "false"}},
        {"tape_verify", {"FusedWalkVerify", "false"}}};
    const auto without_tapes = [](std::vector<std::pair<std::string, std::string>> c) {
      c.erase(std::remove_if(c.begin(), c.end(), [](const auto& kv) { return kv.first == "TAPES"; }), c.end());
      return c;
    };
    for (const auto& [name, cls_output] : walks) {
      CAPTURE(name);
      const gdn::Program& p = ir.program(name);
      const gdn::Program& twin = ir.program(cls_output.second == "true" ? "fused_walk" : "walk_tape");
      CHECK(p.class_name == cls_output.first);
      CHECK(p.template_path == twin.template_path);
      CHECK(p.smem_bytes == twin.smem_bytes);
      CHECK(p.grid == twin.grid);
      CHECK(p.tensor_maps.size() == twin.tensor_maps.size());
      CHECK(p.max_registers == twin.max_registers);
      CHECK(constant_of(p, "OUTPUT") == cls_output.second);
      CHECK(constant_of(p, "VERIFIED_CARRY") == "true");
      CHECK(constant_of(p, "TAPES") == (name == "fused_speculate" ? "false" : "true"));
      CHECK(without_tapes(p.constants) == without_tapes(twin.constants));
    }
    // The forward: the two walks, then the merge path for the chains they mark.
    std::vector<std::string> forward;
    for (const auto& cf : ir.call_forms)
      if (cf.form == gdn::CallForm::forward)
        for (const auto& l : cf.launches) forward.push_back(l.program);
    const std::vector<std::string> tail = {"chunk_prep",   "fused_speculate", "fused_verify",
                                           "walk_prescan", "walk_merge",      "fused_walk"};
    REQUIRE(forward.size() >= tail.size());
    CHECK(std::vector<std::string>(forward.end() - static_cast<long>(tail.size()), forward.end()) == tail);
    CHECK(ir.buffer("fwd_fail").role == gdn::BufferRole::saved);
    CHECK(ir.buffer("seg_h0").role == gdn::BufferRole::saved);
    // The backward runs the portable reverse walk's verified carry.
    CHECK(constant_of(ir.program("walk_bwd_speculate"), "VERIFIED_CARRY") == "true");
    // With the reverse walk's sm_90a body (128-wide slabs, the fused path's default at 48 value
    // heads) that body's own, and "auto" takes the verified carry on the fused forward: the same
    // programs as pinned.
    gdn::Spec wide = spec;
    wide.walk_bwd_slab = 128;
    const auto sm90 = gdn::lower(wide);
    CHECK(sm90.verified_carry);
    // walk_bwd_layout "auto" takes the fused body there (ten maps); the split body has six.
    CHECK(sm90.spec.walk_bwd_layout == gdn::WalkBwdLayout::fused);
    CHECK(sm90.program("walk_bwd_verify").tensor_maps.size() == 10);
    {
      gdn::Spec split = wide;
      split.walk_bwd_layout = gdn::WalkBwdLayout::split;
      CHECK(gdn::lower(split).program("walk_bwd_verify").tensor_maps.size() == 6);
    }
    // "auto" decides the carry before backward_w, so with the sm_90a reverse walk the walks form W
    // under it and the marked-only programs come with it, as pinned.
    for (const auto& [base, pinned] : {std::pair{&spec, &ir}, std::pair{&wide, &sm90}}) {
      gdn::Spec automatic = *base;
      automatic.cp_carry = gdn::SegmentCarry::automatic;
      const auto picked = gdn::lower(automatic);
      CAPTURE(automatic.walk_bwd_slab);
      CHECK(picked.spec.cp_carry == gdn::SegmentCarry::verified);
      CHECK(picked.verified_carry);
      CHECK(picked.spec.backward_w == pinned->spec.backward_w);
      REQUIRE(picked.programs.size() == pinned->programs.size());
      for (size_t i = 0; i < picked.programs.size(); ++i)
        CHECK_MESSAGE(gdn::generate_source(picked.programs[i]) == gdn::generate_source(pinned->programs[i]),
                      picked.programs[i].name);
    }
    CHECK(sm90.spec.backward_w == gdn::BackwardW::walk);
    CHECK(sm90.has_program("chunk_prep_fwd_marked"));
    CHECK(sm90.has_program("l2norm_k_marked"));
  }

  TEST_CASE("cp.carry \"auto\": verified where the layer can take it, the merge elsewhere, and the IR says why") {
    auto spec = gdn::spec_from_file((fs::path(GDN_SOURCE_DIR) / "examples/n.json").string());
    spec.cp_segments = 4;
    spec.cp_carry = gdn::SegmentCarry::automatic;
    const auto chosen = gdn::lower(spec);
    CHECK(chosen.carry_auto);
    CHECK(chosen.verified_carry);
    CHECK(chosen.spec.cp_carry == gdn::SegmentCarry::verified);
    CHECK(chosen.saved_segment_maps);
    CHECK(gdn::to_text(chosen).find("carry: auto -> verified (") != std::string::npos);
    // The same programs as "verified" pinned.
    gdn::Spec pinned = spec;
    pinned.cp_carry = gdn::SegmentCarry::verified;
    const auto verified = gdn::lower(pinned);
    REQUIRE(chosen.programs.size() == verified.programs.size());
    for (size_t i = 0; i < chosen.programs.size(); ++i)
      CHECK(gdn::generate_source(chosen.programs[i]) == gdn::generate_source(verified.programs[i]));
    // Where "verified" is refused or has no effect, "auto" takes the merge without an error.
    const std::vector<std::pair<std::string, std::function<void(gdn::Spec&)>>> elsewhere = {
        {"1 segment, 1 rank, the programs forward, the portable backward walk",
         [](gdn::Spec& s) { s.cp_segments = 1; }},
        {"4 segments, 1 rank, the programs forward, the sm_90a backward walk",
         [](gdn::Spec& s) { s.walk_bwd_slab = 128; }},
    };
    for (const auto& [facts, change] : elsewhere) {
      gdn::Spec other = spec;
      change(other);
      const auto ir = gdn::lower(other);
      CHECK_MESSAGE(ir.carry_auto, facts);
      CHECK_FALSE_MESSAGE(ir.verified_carry, facts);
      CHECK_MESSAGE(ir.spec.cp_carry == gdn::SegmentCarry::merge, facts);
      CHECK_MESSAGE(gdn::to_text(ir).find("carry: auto -> merge (verified with segments on one rank and either the "
                                          "fused forward or the portable backward walk; here " +
                                          facts + ")") != std::string::npos,
                    facts << "\n"
                          << gdn::to_text(ir));
    }
    gdn::Spec ranks = spec;
    ranks.cp_segments = 0;
    ranks.cp_ranks = 2;
    const auto ranked = gdn::lower(ranks);
    CHECK_FALSE(ranked.verified_carry);
    CHECK(ranked.spec.cp_carry == gdn::SegmentCarry::merge);
    // "auto" is the default: the canonical form leaves it out, and a spec without it reads as "auto".
    CHECK_FALSE(gdn::to_json(spec)["cp"].contains("carry"));
    CHECK(gdn::spec_from_json(gdn::to_json(spec)).cp_carry == gdn::SegmentCarry::automatic);
  }

  TEST_CASE("backward_w \"auto\": the walk forms W wherever it can, chunk_prep elsewhere, and the IR says so") {
    auto spec = gdn::spec_from_file((fs::path(GDN_SOURCE_DIR) / "examples/m.json").string());
    CHECK(spec.backward_w == gdn::BackwardW::automatic);
    const auto m = gdn::lower(spec);
    CHECK(m.backward_w_auto);
    CHECK(m.spec.backward_w == gdn::BackwardW::walk);
    CHECK(m.program("chunk_prep").idle_for(gdn::Target::sm_90a));
    CHECK(gdn::to_text(m).find("backward_w: auto -> walk") != std::string::npos);
    for (const auto& change : walk_w_blockers()) {
      gdn::Spec other = spec;
      change(other);
      const auto ir = gdn::lower(other);
      CHECK(ir.spec.backward_w == gdn::BackwardW::chunk_prep);
      CHECK(constant_of(ir.program("state_walk_bwd"), "WALK_FUSES_W") == "false");
      CHECK(ir.program("chunk_prep").idle_on.empty());
      CHECK(gdn::to_text(ir).find("backward_w: auto -> chunk_prep") != std::string::npos);
    }
  }

  TEST_CASE("walk_bwd_layout \"auto\": the fused layout wherever the layer can take it, split elsewhere") {
    auto spec = gdn::spec_from_file((fs::path(GDN_SOURCE_DIR) / "examples/m.json").string());
    gdn::Spec pinned = spec;
    pinned.walk_bwd_layout = gdn::WalkBwdLayout::fused;
    spec.walk_bwd_layout = gdn::WalkBwdLayout::automatic;
    const auto m = gdn::lower(spec), fused = gdn::lower(pinned);
    CHECK(m.walk_bwd_layout_auto);
    CHECK_FALSE(fused.walk_bwd_layout_auto);
    CHECK(m.spec.walk_bwd_layout == gdn::WalkBwdLayout::fused);
    CHECK(gdn::to_text(m).find("walk_bwd_layout: auto -> fused") != std::string::npos);
    // Resolved, it is the pinned layout: the same programs and constants.
    REQUIRE(m.programs.size() == fused.programs.size());
    for (size_t i = 0; i < m.programs.size(); ++i) {
      CHECK(m.programs[i].name == fused.programs[i].name);
      CHECK(m.programs[i].constants == fused.programs[i].constants);
    }
    // Segments under the verified carry keep it.
    gdn::Spec segmented = spec;
    segmented.cp_segments = 4;
    segmented.cp_carry = gdn::SegmentCarry::verified;
    CHECK(gdn::lower(segmented).spec.walk_bwd_layout == gdn::WalkBwdLayout::fused);
    // Where "fused" would be refused, "auto" takes the split layout without an error.
    for (const auto& change : walk_w_blockers()) {
      gdn::Spec other = spec;
      change(other);
      const auto ir = gdn::lower(other);
      CHECK(ir.spec.walk_bwd_layout == gdn::WalkBwdLayout::split);
      CHECK(gdn::to_text(ir).find("walk_bwd_layout: auto -> split") != std::string::npos);
      gdn::Spec refused = other;
      refused.walk_bwd_layout = gdn::WalkBwdLayout::fused;
      CHECK_THROWS_AS(gdn::lower(refused), gdn::SpecError);
    }
    // "auto" is the default, which the canonical form leaves out; a pinned layout is written and read back.
    CHECK(gdn::Spec{}.walk_bwd_layout == gdn::WalkBwdLayout::automatic);
    CHECK_FALSE(gdn::to_json(spec).contains("walk_bwd_layout"));
    CHECK(gdn::spec_from_json(gdn::to_json(spec)).walk_bwd_layout == gdn::WalkBwdLayout::automatic);
    CHECK(gdn::to_json(pinned)["walk_bwd_layout"] == "fused");
    CHECK(gdn::spec_from_json(gdn::to_json(pinned)).walk_bwd_layout == gdn::WalkBwdLayout::fused);
    CHECK_THROWS_WITH_AS(gdn::spec_from_json(with_field(spec, "walk_bwd_layout", "fastest")),
                         doctest::Contains("/walk_bwd_layout"), gdn::SpecError);
  }

  TEST_CASE("backward_norm: \"auto\" takes the launches; \"in_walk\" moves the norm into the fused walk on sm_90a") {
    auto spec = gdn::spec_from_file((fs::path(GDN_SOURCE_DIR) / "examples/m.json").string());
    const auto m = gdn::lower(spec);
    CHECK(m.spec.backward_norm == gdn::BackwardNorm::automatic);  // "launches", and the default's IR unchanged
    CHECK_FALSE(m.has_program("l2norm_rows"));
    CHECK(gdn::to_text(m).find("backward_norm") == std::string::npos);  // the default's IR text is unchanged
    gdn::Spec pinned = spec;
    pinned.backward_norm = gdn::BackwardNorm::in_walk;
    const auto in_walk = gdn::lower(pinned);
    CHECK(gdn::to_text(in_walk).find("backward_norm: in_walk") != std::string::npos);
    CHECK(constant_of(in_walk.program("state_walk_bwd"), "RAW_QK") == "true");
    CHECK(constant_of(in_walk.program("finalize"), "RAW_QK") == "true");
    CHECK(constant_of(m.program("state_walk_bwd"), "RAW_QK") == "(absent)");  // the default's sources are unchanged
    const gdn::Program& rows = in_walk.program("l2norm_rows");
    CHECK(rows.idle_for(gdn::Target::sm_90a));
    CHECK_FALSE(rows.idle_for(gdn::Target::sm_100a));
    CHECK(rows.class_name == "L2Norm");
    // The backward's qn and kn launches and a light recompute's kn are l2norm_rows'; the
    // forward's q launch (the rows' rstd) stays l2norm's.
    auto programs_of = [&](const gdn::LayerIR& ir, gdn::CallForm form) {
      std::vector<std::string> out;
      for (const auto& f : ir.call_forms)
        if (f.form == form)
          for (const auto& l : f.launches) out.push_back(l.program);
      return out;
    };
    const auto bwd = programs_of(in_walk, gdn::CallForm::backward);
    CHECK(std::count(bwd.begin(), bwd.end(), "l2norm_rows") == 2);
    CHECK(std::count(bwd.begin(), bwd.end(), "l2norm") == 0);
    const auto rec = programs_of(in_walk, gdn::CallForm::recompute);
    CHECK(std::count(rec.begin(), rec.end(), "l2norm_rows") == 1);
    CHECK(std::count(rec.begin(), rec.end(), "l2norm") == 1);
    CHECK(programs_of(in_walk, gdn::CallForm::forward) == programs_of(m, gdn::CallForm::forward));
    // Canonical form: "auto" left out (the default's cache keys stay), a pinned value written and read back.
    CHECK_FALSE(gdn::to_json(spec).contains("backward_norm"));
    CHECK(gdn::to_json(pinned)["backward_norm"] == "in_walk");
    CHECK(gdn::spec_from_json(gdn::to_json(pinned)).backward_norm == gdn::BackwardNorm::in_walk);
    CHECK_THROWS_WITH_AS(gdn::spec_from_json(with_field(spec, "backward_norm", "fold")),
                         doctest::Contains("/backward_norm: \"fold\" is not supported"), gdn::SpecError);
    // Where the fused walk does not run unsegmented with the in-kernel norm, "in_walk" is refused.
    for (const auto& change : std::vector<std::function<void(gdn::Spec&)>>{
             [](gdn::Spec& s) { s.walk_bwd_layout = gdn::WalkBwdLayout::split; },
             [](gdn::Spec& s) { s.norm = gdn::Norm::none; },
             [](gdn::Spec& s) {
               s.cp_segments = 4;
               s.cp_carry = gdn::SegmentCarry::verified;
             }}) {
      gdn::Spec refused = pinned;
      change(refused);
      CHECK_THROWS_WITH_AS(gdn::lower(refused), doctest::Contains("/backward_norm"), gdn::SpecError);
    }
  }

  TEST_CASE("forward \"fused\": chunk_solve solves Tm, fused_walk writes o, walk_tape the backward's tapes") {
    auto spec = gdn::spec_from_file((fs::path(GDN_SOURCE_DIR) / "examples/m.json").string());
    spec.forward = gdn::ForwardPath::programs;
    const auto plain = gdn::lower(spec);
    CHECK_THROWS_AS(plain.program("fused_walk"), std::out_of_range);
    spec.forward = gdn::ForwardPath::fused;
    const auto fused = gdn::lower(spec);
    const gdn::Program& solve = fused.program("chunk_solve");
    CHECK(solve.grid == gdn::GridKind::chunk_heads);
    // 8 blocks per SM: 8 x (shared memory + the driver's 1 KB per block) within the H200's 228 KB.
    CHECK(solve.min_blocks_per_sm == 8);
    CHECK(8 * (solve.smem_bytes + 1024) <= 228 * 1024);
    CHECK_THROWS_AS(fused.program("output"), std::out_of_range);  // no call form launches it
    const gdn::Program& fw = fused.program("fused_walk");
    CHECK(fw.grid == gdn::GridKind::walk);
    CHECK(constant_of(fw, "BV") == std::to_string(gdn::FusedWalkGeometry::kBV));
    // tensor_cores "auto": the sm_90a body rebalances registers with setmaxnreg, so the entry pins
    // 128 (512 threads, one block per SM) instead of bounding them; "mma_sync" keeps
    // __launch_bounds__(512, 1).
    CHECK(constant_of(fw, "WGMMA") == "true");
    CHECK(fw.threads == 512);
    CHECK(fw.max_registers == 128);
    CHECK(fw.min_blocks_per_sm == 1);
    CHECK(fw.smem_bytes <= 227 * 1024);
    {
      auto portable = spec;
      portable.tensor_cores = gdn::TensorCores::mma_sync;
      const gdn::LayerIR portable_ir = gdn::lower(portable);
      const gdn::Program& pw = portable_ir.program("fused_walk");
      CHECK(constant_of(pw, "WGMMA") == "false");
      CHECK(pw.max_registers == 0);
      CHECK(pw.min_blocks_per_sm == 1);
    }
    auto launches = [&](gdn::CallForm f) {
      std::vector<std::string> out;
      for (const auto& cf : fused.call_forms)
        if (cf.form == f)
          for (const auto& l : cf.launches) out.push_back(l.program + (l.when.empty() ? "" : " [" + l.when + "]"));
      return out;
    };
    // One l2norm launch (q's rstd): chunk_solve takes k's rstd from K K^T's diagonal, and kn is
    // made only for the tape pair.
    CHECK(launches(gdn::CallForm::forward) ==
          std::vector<std::string>{"chunk_table", "l2norm", "gate_cumsum", "chunk_solve", "fused_walk"});
    // A recompute leaves the tapes to hand over in either case: walk_tape without the output, the
    // fused walk with its tape stores bound with it (kn and W for the hand-off both ways).
    CHECK(fused.recompute_output_tapes);
    CHECK(launches(gdn::CallForm::recompute) ==
          std::vector<std::string>{"chunk_table", "l2norm", "l2norm", "gate_cumsum", "chunk_solve", "chunk_prep",
                                   "walk_tape [the output is not needed]", "fused_walk [the output is needed]"});
    {  // without the hand-off, the recompute whose output is needed is the forward
      auto no_reuse = spec;
      no_reuse.reuse_recompute_tapes = gdn::ReuseTapes::no;
      const gdn::LayerIR ir = gdn::lower(no_reuse);
      CHECK_FALSE(ir.recompute_output_tapes);
      CHECK(constant_of(ir.program("fused_walk"), "TAPES") == "false");
      std::vector<std::string> rec;
      for (const auto& cf : ir.call_forms)
        if (cf.form == gdn::CallForm::recompute)
          for (const auto& l : cf.launches) rec.push_back(l.program + (l.when.empty() ? "" : " [" + l.when + "]"));
      CHECK(rec == std::vector<std::string>{"chunk_table", "l2norm", "l2norm [the output is not needed]", "gate_cumsum",
                                            "chunk_solve", "chunk_prep [the output is not needed]",
                                            "walk_tape [the output is not needed]",
                                            "fused_walk [the output is needed]"});
    }
    // The backward is the programs path's after its own L2 norm (the fused forward folds the norm
    // into its products and saves no qn, kn), with the tapes from the fused walk without its
    // output: walk_tape instead of state_walk, the same program as the recompute's.
    CHECK(launches(gdn::CallForm::backward) == [&] {
      std::vector<std::string> out = {"l2norm", "l2norm [no fresh hand-off]"};
      for (const auto& cf : plain.call_forms)
        if (cf.form == gdn::CallForm::backward)
          for (const auto& l : cf.launches)
            out.push_back((l.program == "state_walk" ? std::string("walk_tape") : l.program) +
                          (l.when.empty() ? "" : " [" + l.when + "]"));
      return out;
    }());
    CHECK_THROWS_AS(fused.program("state_walk"), std::out_of_range);
    const gdn::Program& tape = fused.program("walk_tape");
    CHECK(constant_of(tape, "OUTPUT") == "false");
    CHECK(constant_of(tape, "TAPES") == "true");
    CHECK(constant_of(fw, "OUTPUT") == "true");
    CHECK(constant_of(fw, "TAPES") == "true");  // stores bound by the recompute alone
    CHECK(tape.class_name == fw.class_name);
    CHECK(tape.smem_bytes == fw.smem_bytes);
    CHECK(tape.max_registers == fw.max_registers);
    // No U on the fused path without segments (its walks take raw v); the prescan needs it.
    CHECK(constant_of(fused.program("chunk_prep"), "WRITES_U") == "false");
    CHECK(constant_of(plain.program("chunk_prep"), "WRITES_U") == "true");
    {
      auto segmented = spec;
      segmented.cp_segments = 4;
      CHECK(constant_of(gdn::lower(segmented).program("chunk_prep"), "WRITES_U") == "true");
    }
    CHECK(constant_of(fused.program("chunk_solve"), "FOLD_RSTD") == "true");
    CHECK(constant_of(fw, "FOLD_RSTD") == "true");
    CHECK(constant_of(plain.program("chunk_solve"), "FOLD_RSTD") == "false");
    CHECK(fused.buffer("qn").role == gdn::BufferRole::workspace);
    CHECK(fused.buffer("qn").forms == std::vector<gdn::CallForm>{gdn::CallForm::backward});
    CHECK(fused.buffer("kn").role == gdn::BufferRole::workspace);
    CHECK(fused.buffer("rstd_q").role == gdn::BufferRole::saved);
    CHECK(plain.buffer("qn").role == gdn::BufferRole::saved);
    CHECK(gdn::to_text(fused).find("decisions: forward=fused") != std::string::npos);
    CHECK(gdn::spec_from_json(gdn::to_json(spec)).forward == gdn::ForwardPath::fused);
    // Full saves: the fused walk writes the saved tapes beside o (the roundings of walk_tape, which
    // a light backward re-runs, so light and full keep the same bits), after chunk_prep for the
    // saved W and kn (the forward's launch, so the backward's bits); the backward normalizes q
    // itself and re-runs nothing.
    spec.save_mode = gdn::SaveMode::full;
    const auto full = gdn::lower(spec);
    const auto full_launches = [&](gdn::CallForm form) {
      std::vector<std::string> out;
      for (const auto& cf : full.call_forms)
        if (cf.form == form)
          for (const auto& l : cf.launches) out.push_back(l.program + (l.when.empty() ? "" : " [" + l.when + "]"));
      return out;
    };
    CHECK(full_launches(gdn::CallForm::forward) == std::vector<std::string>{"chunk_table", "l2norm", "l2norm",
                                                                            "gate_cumsum", "chunk_solve", "chunk_prep",
                                                                            "fused_walk"});
    CHECK(full_launches(gdn::CallForm::recompute) ==
          std::vector<std::string>{"chunk_table", "l2norm", "l2norm", "gate_cumsum", "chunk_solve", "chunk_prep",
                                   "fused_walk [the output is needed]", "walk_tape [the output is not needed]"});
    CHECK(constant_of(full.program("fused_walk"), "TAPES") == "true");
    CHECK(full_launches(gdn::CallForm::backward) ==
          std::vector<std::string>{"l2norm", "dv_local", "state_walk_bwd", "chunk_bwd", "finalize"});
    CHECK(full.buffer("h_tape").role == gdn::BufferRole::saved);
    CHECK(full.buffer("kn").role == gdn::BufferRole::saved);
    CHECK(full.buffer("kn").forms.empty());
  }

  TEST_CASE("forward \"auto\" picks the fused forward from the layer's heads alone") {
    auto spec = gdn::spec_from_file((fs::path(GDN_SOURCE_DIR) / "examples/m.json").string());
    CHECK(spec.forward == gdn::ForwardPath::automatic);  // the default
    for (const auto& [heads_v, want] :
         {std::pair{48, gdn::ForwardPath::fused}, std::pair{16, gdn::ForwardPath::fused},
          std::pair{15, gdn::ForwardPath::programs}, std::pair{6, gdn::ForwardPath::programs}}) {
      CAPTURE(heads_v);
      spec.heads_v = heads_v;
      spec.heads_qk = heads_v % 16 == 0 ? 16 : heads_v % 3 == 0 ? 3 : 1;
      for (const gdn::SaveMode save : {gdn::SaveMode::light, gdn::SaveMode::full}) {
        spec.save_mode = save;
        const auto ir = gdn::lower(spec);
        CHECK(ir.forward_auto);
        CHECK(ir.spec.forward == want);
        CHECK(gdn::to_text(ir).find(fmt::format("forward: auto -> {} (", gdn::to_string(want))) != std::string::npos);
        // The resolved path is what the IR's JSON and its decisions carry.
        CHECK(gdn::to_json(ir)["decisions"]["forward"] == std::string(gdn::to_string(want)));
      }
    }
    spec.forward = gdn::ForwardPath::programs;
    CHECK_FALSE(gdn::lower(spec).forward_auto);
    CHECK(gdn::to_text(gdn::lower(spec)).find("forward: auto") == std::string::npos);
    CHECK(
        gdn::spec_from_json(nlohmann::json::parse(R"({"name":"x","heads":{"qk":1,"v":1},"forward":"auto"})")).forward ==
        gdn::ForwardPath::automatic);
  }

  TEST_CASE("cp.segments adds the prescan and the merge before every forward walk, and their workspace") {
    auto spec = gdn::spec_from_file((fs::path(GDN_SOURCE_DIR) / "examples/m.json").string());
    spec.forward = gdn::ForwardPath::programs;
    const auto plain = gdn::lower(spec);
    CHECK_THROWS_AS(plain.program("walk_prescan"), std::out_of_range);
    CHECK(constant_of(plain.program("state_walk"), "SEGMENTS") == "1");
    CHECK_THROWS_AS(plain.buffer("seg_hm"), std::out_of_range);
    spec.cp_segments = 8;
    const auto seg = gdn::lower(spec);
    for (const char* name : {"walk_prescan", "walk_merge", "state_walk"})
      CHECK_MESSAGE(constant_of(seg.program(name), "SEGMENTS") == "8", name);
    CHECK(seg.program("walk_prescan").grid == gdn::GridKind::walk_prescan);
    CHECK(seg.program("state_walk").grid == gdn::GridKind::walk_segments);
    // The backward walk is segmented too: its prescan and merge run between dv_local and it.
    for (const char* name : {"walk_bwd_prescan", "walk_merge_bwd", "state_walk_bwd"})
      CHECK_MESSAGE(constant_of(seg.program(name), "SEGMENTS") == "8", name);
    // One rank: the backward prescan walks dZ_ext alone (A = M^T comes from the forward's saved maps).
    CHECK(seg.program("walk_bwd_prescan").grid == gdn::GridKind::walk_segments);
    CHECK(seg.saved_segment_maps);
    CHECK(constant_of(seg.program("walk_bwd_prescan"), "SAVED_MAPS") == "true");
    CHECK(constant_of(seg.program("walk_merge_bwd"), "SAVED_MAPS") == "true");
    CHECK(constant_of(seg.program("walk_prescan"), "SAVED_MAPS") == "true");
    // The prescan keeps the portable body's 32-wide slabs when the walk takes the sm_90a body's 128.
    CHECK(constant_of(seg.program("walk_bwd_prescan"), "BV") == "32");
    CHECK(seg.program("walk_bwd_prescan").threads == gdn::StateWalkBwdGeometry::threads(32));
    CHECK(constant_of(seg.program("state_walk_bwd"), "BV") == "128");
    CHECK(seg.program("state_walk_bwd").grid == gdn::GridKind::walk_segments);
    CHECK(constant_of(plain.program("state_walk_bwd"), "SEGMENTS") == "1");
    CHECK(plain.program("state_walk_bwd").grid == gdn::GridKind::walk);
    CHECK_THROWS_AS(plain.program("walk_bwd_prescan"), std::out_of_range);
    {
      std::vector<std::string> bwd;
      for (const auto& cf : seg.call_forms)
        if (cf.form == gdn::CallForm::backward)
          for (const auto& l : cf.launches) bwd.push_back(l.program);
      const auto walk = std::find(bwd.begin(), bwd.end(), "state_walk_bwd");
      REQUIRE(walk - bwd.begin() >= 3);
      CHECK(*(walk - 3) == "dv_local");
      CHECK(*(walk - 2) == "walk_bwd_prescan");
      CHECK(*(walk - 1) == "walk_merge_bwd");
    }
    // seg_dzm: dZ_ext | A per segment; seg_dz: the gradient at each segment's end. The forward's
    // maps (seg_hm) are saved for the backward's transitions and, with light saves, seg_h0 for its
    // re-run walk: seg_dzm and seg_dz have workspace slots of their own.
    CHECK(seg.buffer("seg_dzm").bytes.text() == seg.buffer("seg_hm").bytes.text());
    CHECK(seg.buffer("seg_dz").bytes.text() == seg.buffer("seg_h0").bytes.text());
    CHECK(seg.buffer("seg_dzm").lives_in.empty());
    CHECK(seg.buffer("seg_dz").lives_in.empty());
    CHECK(seg.buffer("seg_hm").role == gdn::BufferRole::saved);
    CHECK(seg.buffer("seg_h0").role == gdn::BufferRole::saved);
    // seg_hm: S_ext | M per segment, fp32; seg_h0: the entry state per segment.
    CHECK(seg.buffer("seg_hm").bytes.eval(32768, 5, 64) == 5LL * 8 * 48 * 128 * 256 * 4);
    CHECK(seg.buffer("seg_h0").bytes.eval(32768, 5, 64) == 5LL * 8 * 48 * 128 * 128 * 4);
    // The forward call forms run prescan, merge, walk; the backward's re-run walk (light saves)
    // starts from the saved seg_h0, with no prescan or merge of the forward.
    for (const auto& cf : seg.call_forms) {
      std::vector<std::string> names;
      for (const auto& l : cf.launches) names.push_back(l.program);
      const auto walk = std::find(names.begin(), names.end(), "state_walk");
      REQUIRE(walk != names.end());
      CAPTURE(gdn::to_string(cf.form));
      if (cf.form == gdn::CallForm::backward) {
        CHECK(std::find(names.begin(), names.end(), "walk_prescan") == names.end());
        CHECK(std::find(names.begin(), names.end(), "walk_merge") == names.end());
        continue;
      }
      REQUIRE(walk - names.begin() >= 2);
      CHECK(*(walk - 2) == "walk_prescan");
      CHECK(*(walk - 1) == "walk_merge");
    }
    spec.save_mode = gdn::SaveMode::full;
    const auto full = gdn::lower(spec);
    CHECK(full.buffer("seg_hm").role == gdn::BufferRole::saved);  // the backward's transitions
    CHECK(full.buffer("seg_dzm").forms == std::vector<gdn::CallForm>{gdn::CallForm::backward});
    CHECK(full.buffer("seg_dzm").lives_in.empty());
    CHECK(full.buffer("seg_h0").role == gdn::BufferRole::workspace);  // the backward re-runs no walk
    CHECK(full.buffer("seg_h0").forms == std::vector<gdn::CallForm>{gdn::CallForm::forward, gdn::CallForm::recompute});
    CHECK(gdn::spec_from_json(gdn::to_json(spec)).cp_segments == 8);
    spec.cp_segments = 65;
    CHECK_THROWS_WITH_AS(gdn::lower(spec), "/cp/segments: 65 is not supported (supported: \"auto\", 1 to 64)",
                         gdn::SpecError);
  }

  TEST_CASE("cp.ranks > 1: the single-GPU proxy walks the ranks' pieces as segments, NT gains ranks - 1 chunks") {
    auto spec = gdn::spec_from_file((fs::path(GDN_SOURCE_DIR) / "examples/m.json").string());
    const auto plain = gdn::lower(spec);
    CHECK(plain.extra_chunks == 0);
    CHECK(constant_of(plain.program("chunk_table"), "RANKS") == "1");
    spec.cp_ranks = 4;
    for (int segments : {1, 0}) {
      spec.cp_segments = segments;
      const auto ir = gdn::lower(spec);
      CHECK(ir.spec.cp_segments == 4);
      CHECK_FALSE(ir.segments_auto);
      CHECK(ir.seg_min_chunks == 0);
      CHECK(ir.extra_chunks == 3);
      for (const char* name : {"chunk_table", "walk_prescan", "walk_merge", "fused_walk", "walk_tape",
                               "walk_bwd_prescan", "walk_merge_bwd", "state_walk_bwd"})
        CHECK_MESSAGE(constant_of(ir.program(name), "RANKS") == "4", name);
      CHECK(constant_of(ir.program("fused_walk"), "SEGMENTS") == "4");
      CHECK(ir.program("fused_walk").grid == gdn::GridKind::walk_segments);
      // The ranks exchange their own backward records (dZ_ext | A): no maps are saved.
      CHECK_FALSE(ir.saved_segment_maps);
      CHECK(ir.program("walk_bwd_prescan").grid == gdn::GridKind::walk_prescan);
      CHECK(ir.buffer("seg_hm").role == gdn::BufferRole::workspace);
      // Every per-chunk buffer holds three more chunks; per-token and per-document ones are unchanged.
      CHECK(ir.buffer("h_tape").bytes.eval(32768, 5, 64) == plain.buffer("h_tape").bytes.eval(32768, 8, 64));
      CHECK(ir.buffer("chunks").bytes.eval(1000, 2, 64) == (1000 / 64 + 2 + 3) * 16);
      CHECK(ir.buffer("o").bytes.eval(1000, 2, 64) == plain.buffer("o").bytes.eval(1000, 2, 64));
      const std::string text = gdn::to_text(ir);
      CHECK(text.find("ranks: 4 on one GPU (the proxy of context parallelism)") != std::string::npos);
      CHECK(text.find("buffers (bytes with NT = T/chunk + N + 3):") != std::string::npos);
    }
    CHECK(gdn::spec_from_json(gdn::to_json(spec)).cp_ranks == 4);
    spec.cp_segments = 2;
    CHECK_THROWS_WITH_AS(gdn::lower(spec),
                         "/cp/segments: 2 with cp.ranks 4: the ranks' pieces are the segments (use 1 or \"auto\" "
                         "with more than one rank)",
                         gdn::SpecError);
    spec.cp_segments = 1;
    spec.cp_ranks = 65;
    CHECK_THROWS_AS(gdn::lower(spec), gdn::SpecError);
  }

  TEST_CASE("cp.segments \"auto\": the most per document from the layer, the slots from the documents' lengths") {
    auto spec = gdn::spec_from_file((fs::path(GDN_SOURCE_DIR) / "examples/n.json").string());
    spec.cp_segments = 0;
    // Shape N's heads: 6 value heads x 4 slabs of 32 = 24 walks per document, 264 slots: 8.
    const auto few = gdn::lower(spec);
    CHECK(few.segments_auto);
    CHECK(few.spec.cp_segments == 16);  // the programs path (6 value heads)
    CHECK(few.seg_min_chunks == 32);
    for (const char* name :
         {"walk_prescan", "walk_merge", "state_walk", "walk_bwd_prescan", "walk_merge_bwd", "state_walk_bwd"}) {
      CHECK_MESSAGE(constant_of(few.program(name), "SEGMENTS") == "16", name);
      CHECK_MESSAGE(constant_of(few.program(name), "SEG_MIN_CHUNKS") == "32", name);
    }
    // One slot per 32 chunks (only split documents take slots): NT / 32 slots.
    CHECK(few.buffer("seg_h0").bytes.eval(32768, 1, 64) == ((32768 / 64 + 1) / 32.0) * 6 * 128 * 128 * 4);
    CHECK(gdn::to_text(few).find("segments: auto, at most 16 per document") != std::string::npos);
    CHECK(gdn::to_json(spec)["cp"]["segments"] == "auto");
    CHECK(gdn::spec_from_json(gdn::to_json(spec)).cp_segments == 0);
    // The programs path splits where one document's walks fill at most an eighth of its 264 slots:
    // 12 value heads (4 slabs of 32: 48 walks) keep one segment, 8 (32 walks) take 16. The fused
    // walk splits where they fill at most a quarter of its 132 SMs, into as many segments as fit one
    // wave (at most 8): 32 value heads take 4, 16 take 8, 34 keep one.
    for (const auto& [heads_v, forward, most] :
         std::vector<std::tuple<int, gdn::ForwardPath, int>>{{12, gdn::ForwardPath::programs, 1},
                                                             {32, gdn::ForwardPath::fused, 4},
                                                             {34, gdn::ForwardPath::fused, 1},
                                                             {16, gdn::ForwardPath::fused, 8},
                                                             {8, gdn::ForwardPath::programs, 16}}) {
      auto mid = spec;
      mid.heads_v = heads_v;
      mid.heads_qk = 2;
      mid.forward = forward;
      CAPTURE(heads_v);
      CHECK(gdn::lower(mid).spec.cp_segments == most);
    }
    // Shape M's heads: 48 value heads x 2 slabs of 64 fill the GPU alone: 1, as pinned.
    auto m = gdn::spec_from_file((fs::path(GDN_SOURCE_DIR) / "examples/m.json").string());
    const auto pinned = gdn::lower(m);
    m.cp_segments = 0;
    const auto many = gdn::lower(m);
    CHECK(many.spec.cp_segments == 1);
    CHECK(many.seg_min_chunks == 0);
    REQUIRE(many.programs.size() == pinned.programs.size());
    for (size_t i = 0; i < many.programs.size(); ++i)
      CHECK_MESSAGE(many.programs[i].constants == pinned.programs[i].constants, many.programs[i].name);
    // The fused forward walks 128 columns per block, one block per SM: N's 6 value heads take 8
    // there (132 / 6, at most 8), one per 128 chunks, under the verified carry; M's 48 take 1.
    spec.forward = gdn::ForwardPath::fused;
    const auto fused_few = gdn::lower(spec);
    CHECK(fused_few.spec.cp_segments == 8);
    CHECK(fused_few.seg_min_chunks == 128);
    CHECK(fused_few.verified_carry);
    CHECK(fused_few.program("fused_walk").grid == gdn::GridKind::walk_segments);
    for (const char* name : {"fused_speculate", "fused_verify", "fused_walk", "walk_bwd_speculate", "state_walk_bwd"}) {
      CHECK_MESSAGE(constant_of(fused_few.program(name), "SEGMENTS") == "8", name);
      CHECK_MESSAGE(constant_of(fused_few.program(name), "SEG_MIN_CHUNKS") == "128", name);
    }
    CHECK(fused_few.buffer("seg_ckpt").bytes.eval(32768, 1, 64) == ((32768 / 64 + 1) / 128.0) * 6 * 4 * 128 * 128 * 4);
    CHECK(gdn::to_text(fused_few).find("segments: auto, at most 8 per document (one document's fused walks") !=
          std::string::npos);
    m.forward = gdn::ForwardPath::fused;
    CHECK(gdn::lower(m).spec.cp_segments == 1);
    CHECK(gdn::lower(m).program("fused_walk").grid == gdn::GridKind::walk);
    // In JSON, "auto" is spelled out; 0 is not a number of segments.
    auto parse = [](const std::string& segments) {
      return gdn::spec_from_json(
          nlohmann::json::parse(R"({"name":"x","heads":{"qk":2,"v":6},"cp":{"segments":)" + segments + "}}"));
    };
    CHECK(parse("\"auto\"").cp_segments == 0);
    CHECK(parse("4").cp_segments == 4);
    CHECK_THROWS_WITH_AS(parse("0"), "/cp/segments: 0 is not supported (supported: \"auto\", 1 to 64)", gdn::SpecError);
    CHECK_THROWS_WITH_AS(parse("\"many\""), "/cp/segments: \"many\" is not supported (supported: \"auto\", 1 to 64)",
                         gdn::SpecError);
  }

  TEST_CASE("byte formulas") {
    const auto ir = gdn::lower(gdn::spec_from_file((fs::path(GDN_SOURCE_DIR) / "examples/m.json").string()));
    // h_tape: NT * HV * K * V * 2 bytes with NT = T/64 + N.
    CHECK(ir.buffer("h_tape").bytes.eval(32768, 5, 64) == (32768LL / 64 + 5) * 48 * 128 * 128 * 2);
    CHECK(ir.buffer("q").bytes.eval(32768, 5, 64) == 32768LL * 16 * 128 * 2);
    CHECK(ir.buffer("h_tape").bytes.text() == "1572864*NT");
  }

  TEST_CASE("the JSON form carries every program and buffer") {
    const auto ir = gdn::lower(gdn::spec_from_file((fs::path(GDN_SOURCE_DIR) / "examples/n.json").string()));
    const auto j = gdn::to_json(ir);
    CHECK(j["programs"].size() == ir.programs.size());
    CHECK(j["buffers"].size() == ir.buffers.size());
    CHECK(j["call_forms"].size() == 3);
  }
}
