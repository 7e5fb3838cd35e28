/**
 * @file test_compile.cpp
 * @brief Every program of a layer compiles with NVRTC for sm_90a, sm_100a and sm_103a into the
 *        cache; a second compile is all hits; a corrupt cubin is rebuilt; failures carry the log.
 */
#include "compiler/compiler.hpp"
#include "compiler/nvrtc.hpp"
#include "compiler/templates.hpp"
#include "params.cuh"
#include "tests/pipeline_probe.hpp"
#include "tests/wgmma_probe.hpp"

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <map>

namespace fs = std::filesystem;

namespace {

gdn::Spec example(const char* name) {
  return gdn::spec_from_file((fs::path(GDN_SOURCE_DIR) / "examples" / (std::string(name) + ".json")).string());
}

/// One cache shared by this binary's tests, so each program is compiled once per run.
gdn::cache::DiskCache& shared_cache() {
  static const fs::path root = fs::path(GDN_BINARY_DIR) / "test-kernel-cache";
  static gdn::cache::DiskCache cache(root);
  return cache;
}

}  // namespace

TEST_SUITE("compile") {
  TEST_CASE("every program compiles for all three targets, then the cache answers") {
    const auto ir = gdn::lower(example("n"));
    const auto first = gdn::compile_layer(ir, gdn::supported_targets(), shared_cache(), 2);
    CHECK(first.size() == ir.programs.size() * 3);
    for (const auto& e : first) {
      CAPTURE(e.program);
      CAPTURE(gdn::to_string(e.target));
      const std::string cubin = e.entry.read_file(gdn::kCubinFile);
      REQUIRE(cubin.size() > 4);
      CHECK(cubin.substr(0, 4) ==
            "\x7f"
            "ELF");
      CHECK(e.entry.manifest["info"]["registers"].get<int>() > 0);
    }
    const auto second = gdn::compile_layer(ir, gdn::supported_targets(), shared_cache(), 2);
    for (const auto& e : second) CHECK(e.outcome == gdn::cache::Outcome::hit);
  }

  TEST_CASE("the intra-card segment programs compile for all three targets") {
    auto spec = example("n");
    spec.cp_segments = 4;
    const auto ir = gdn::lower(spec);
    const auto entries = gdn::compile_layer(ir, gdn::supported_targets(), shared_cache(), 2);
    int segment_programs = 0;
    for (const auto& e : entries) {
      if (e.program != "walk_prescan" && e.program != "walk_merge" && e.program != "state_walk") continue;
      CAPTURE(e.program);
      CAPTURE(gdn::to_string(e.target));
      CHECK(e.entry.read_file(gdn::kCubinFile).substr(0, 4) ==
            "\x7f"
            "ELF");
      CHECK(e.entry.manifest["info"]["spill_store_bytes"].get<int>() == 0);
      ++segment_programs;
    }
    CHECK(segment_programs == 9);
  }

  // fused_walk within one 4-byte store: since the segmented walks decode the value head from y
  // (value heads x segments), ptxas gives the ranks' fused_walk 12 bytes of spills against the
  // segmented one's 8 (not timed: neither runs by default on L or N, whose walks timed the same).
  TEST_CASE("the proxy's programs (cp.ranks 4) compile for sm_90a and spill about as much as 4 segments do") {
    auto spec = example("m");
    spec.cp_segments = 4;
    std::map<std::string, int> segmented_spills;
    for (const auto& e : gdn::compile_layer(gdn::lower(spec), {gdn::Target::sm_90a}, shared_cache(), 2))
      segmented_spills[e.program] = e.entry.manifest["info"]["spill_store_bytes"].get<int>();
    spec.cp_segments = 1;
    spec.cp_ranks = 4;
    const auto ir = gdn::lower(spec);
    int ranked = 0;
    for (const auto& e : gdn::compile_layer(ir, {gdn::Target::sm_90a}, shared_cache(), 2)) {
      bool has_ranks = false;
      for (const auto& [k, v] : ir.program(e.program).constants) has_ranks |= k == "RANKS" && v == "4";
      if (!has_ranks) continue;
      CAPTURE(e.program);
      if (e.program == "kcp_exchange") {  // a rank's copies: no segmented counterpart
        CHECK(e.entry.manifest["info"]["spill_store_bytes"].get<int>() == 0);
        continue;
      }
      REQUIRE(segmented_spills.count(e.program) == 1);
      CHECK(e.entry.manifest["info"]["spill_store_bytes"].get<int>() <=
            segmented_spills[e.program] + (e.program == "fused_walk" ? 4 : 0));
      ++ranked;
    }
    CHECK(ranked == 8);  // chunk_table, both prescans and merges, fused_walk, walk_tape, state_walk_bwd
  }

  TEST_CASE("a program idle on a target is not compiled for it") {
    const auto ir = gdn::lower(example("m"));  // dv_local: the reverse walk's sm_90a body computes it
    REQUIRE(ir.program("dv_local").idle_for(gdn::Target::sm_90a));
    std::map<std::string, int> per_program;
    for (const auto& e : gdn::compile_layer(ir, {gdn::Target::sm_90a, gdn::Target::sm_100a}, shared_cache(), 2))
      ++per_program[e.program];
    CHECK(per_program["dv_local"] == 1);  // sm_100a's
    CHECK(per_program["state_walk_bwd"] == 2);
    CHECK(per_program.size() == ir.programs.size());
  }

  TEST_CASE("backward_w \"walk\": the walk that forms W compiles for sm_90a, chunk_prep's W for sm_100a") {
    auto spec = example("m");
    spec.backward_w = gdn::BackwardW::walk;
    spec.walk_bwd_layout = gdn::WalkBwdLayout::split;  // the split body forming W
    int prep = 0;
    for (const auto& e :
         gdn::compile_layer(gdn::lower(spec), {gdn::Target::sm_90a, gdn::Target::sm_100a}, shared_cache(), 2)) {
      CAPTURE(e.program);
      CAPTURE(gdn::to_string(e.target));
      if (e.program == "chunk_prep") {
        CHECK(e.target == gdn::Target::sm_100a);
        CHECK(e.entry.manifest["info"]["spill_store_bytes"].get<int>() == 0);
        ++prep;
      }
      if (e.program == "state_walk_bwd" && e.target == gdn::Target::sm_90a)
        // A few bytes in the loading and scoring warpgroups (off the walks' chain), none in the walks.
        CHECK(e.entry.manifest["info"]["spill_store_bytes"].get<int>() <= 16);
    }
    CHECK(prep == 1);
  }

  TEST_CASE("walk_bwd_layout \"fused\": the reverse walk with chunk_bwd's body compiles for sm_90a") {
    auto spec = example("m");
    spec.walk_bwd_layout = gdn::WalkBwdLayout::fused;
    const auto ir = gdn::lower(spec);
    const gdn::Program p = ir.program("state_walk_bwd");
    const auto c = gdn::nvrtc_compile(p, gdn::Target::sm_90a, gdn::generate_source(p));
    MESSAGE("fused walk: ", c.registers, " registers, ", c.spill_store_bytes, " bytes of spill stores\n", c.log);
    // Known: 172 bytes at setmaxnreg 32 / 160 / 160 / 160, nearly all the body warpgroups' and the
    // owner's loop-invariant addresses stored once before the chunk loop; a bound, so that worse
    // is seen.
    CHECK(c.spill_store_bytes <= 192);
    CHECK(c.registers <= 128);
    CHECK(c.log.find("C7510") == std::string::npos);  // no wgmma serialized
    // chunk_bwd idles on sm_90a only; the portable walk ignores the layout.
    CHECK(ir.program("chunk_bwd").idle_for(gdn::Target::sm_90a));
    CHECK_FALSE(ir.program("chunk_bwd").idle_for(gdn::Target::sm_100a));
    CHECK(gdn::nvrtc_compile(p, gdn::Target::sm_100a, gdn::generate_source(p)).spill_store_bytes == 0);
  }

  TEST_CASE("cp.carry \"verified\" on the fused forward: its walks compile for sm_90a and sm_100a, spills bounded") {
    auto spec = example("n");
    spec.name = "n_fused_verified";
    spec.forward = gdn::ForwardPath::fused;
    spec.walk_bwd_slab = 64;
    spec.cp_segments = 4;
    spec.cp_carry = gdn::SegmentCarry::verified;
    auto merged = spec;
    merged.name = "n_fused_merge4";
    merged.cp_carry = gdn::SegmentCarry::merge;
    std::map<std::string, int> merge_spills;
    for (const auto& e : gdn::compile_layer(gdn::lower(merged), {gdn::Target::sm_90a}, shared_cache(), 2))
      merge_spills[e.program] = e.entry.manifest["info"]["spill_store_bytes"].get<int>();
    int walks = 0;
    for (const auto& e :
         gdn::compile_layer(gdn::lower(spec), {gdn::Target::sm_90a, gdn::Target::sm_100a}, shared_cache(), 2)) {
      CAPTURE(e.program);
      CAPTURE(gdn::to_string(e.target));
      const int spills = e.entry.manifest["info"]["spill_store_bytes"].get<int>();
      const std::string log = e.entry.manifest["info"]["ptxas_log"].get<std::string>();
      CHECK(log.find("C7510") == std::string::npos);  // no wgmma serialized
      if (e.target != gdn::Target::sm_90a) continue;
      // The merge path's walks keep their spills; the speculative walk stores its checkpoints and
      // the verify walk compares them (known: about 160 bytes in the verify walk with the output,
      // on a window of 4 chunks a segment; a bound, so that worse is seen).
      if (e.program == "fused_walk" || e.program == "walk_tape") CHECK(spills <= merge_spills.at(e.program));
      if (e.program == "tape_speculate" || e.program == "tape_verify") CHECK(spills == 0);
      // The output walks carry the tape stores a recompute binds, the forward's main walk at its
      // 8 bytes; the speculative walk's are a program of their own (fused_speculate_tapes: 60
      // bytes), since compiled in they made the forward's spill more (16 -> 68 at heads 16/32).
      if (e.program == "fused_walk") CHECK(spills <= 8);
      if (e.program == "fused_speculate") CHECK(spills <= 32);
      if (e.program == "fused_speculate_tapes") CHECK(spills <= 64);
      if (e.program == "fused_verify") CHECK(spills <= 192);
      if (e.program.find("speculate") != std::string::npos || e.program.find("verify") != std::string::npos) ++walks;
    }
    CHECK(walks == 7);  // fused_, fused_speculate_tapes, tape_speculate / _verify, walk_bwd_speculate / _verify
    // Full saves: the output's walks also store the tapes (from registers), a little more pressure.
    auto full = spec;
    full.name = "n_fused_verified_full";
    full.save_mode = gdn::SaveMode::full;
    for (const auto& e : gdn::compile_layer(gdn::lower(full), {gdn::Target::sm_90a}, shared_cache(), 2)) {
      CAPTURE(e.program);
      const int spills = e.entry.manifest["info"]["spill_store_bytes"].get<int>();
      if (e.program == "fused_speculate") CHECK(spills <= 96);
      if (e.program == "fused_verify") CHECK(spills <= 256);
    }
  }

  // Under cp.segments "auto" a segment's count and bounds are run-time values: a 64-bit division
  // by the count was a called routine that made the walks spill (fused_speculate 208 bytes against
  // 16 pinned, the reverse walk's wgmma serialized) and ran 50 % slower. The auto layer's walks
  // must compile as well as the pinned layer's.
  TEST_CASE("cp.segments \"auto\" on the fused forward: the walks spill no more than with pinned segments") {
    auto automatic = example("m");
    automatic.heads_qk = 16;
    automatic.heads_v = 32;
    automatic.cp_segments = 0;
    automatic.name = "f_auto_spills";
    const auto ir = gdn::lower(automatic);
    REQUIRE(ir.verified_carry);
    REQUIRE(ir.seg_min_chunks == 128);
    auto pinned = automatic;
    pinned.name = "f_pinned_spills";
    pinned.cp_segments = ir.spec.cp_segments;
    pinned.cp_carry = gdn::SegmentCarry::verified;
    std::map<std::string, int> pinned_spills;
    for (const auto& e : gdn::compile_layer(gdn::lower(pinned), {gdn::Target::sm_90a}, shared_cache(), 2))
      pinned_spills[e.program] = e.entry.manifest["info"]["spill_store_bytes"].get<int>();
    // Every program that reads the segments' bounds (a SEGMENTS constant): the walks, the prescans,
    // the merges and the marked-only programs.
    int segmented = 0, walks = 0;
    for (const auto& e : gdn::compile_layer(ir, {gdn::Target::sm_90a}, shared_cache(), 2)) {
      const auto& constants = ir.program(e.program).constants;
      if (std::none_of(constants.begin(), constants.end(), [](const auto& c) { return c.first == "SEGMENTS"; }))
        continue;
      CAPTURE(e.program);
      ++segmented;
      if (e.program.find("speculate") != std::string::npos || e.program.find("verify") != std::string::npos) ++walks;
      const int spills = e.entry.manifest["info"]["spill_store_bytes"].get<int>();
      CHECK(spills <= pinned_spills.at(e.program) + 8);
      CHECK(e.entry.manifest["info"]["ptxas_log"].get<std::string>().find("C7520") == std::string::npos);
    }
    CHECK(walks == 7);  // fused_ and tape_speculate / _verify, fused_speculate_tapes, walk_bwd_speculate / _verify
    CHECK(segmented > walks);
  }

  TEST_CASE("cp.carry \"verified\" on the reverse walk's sm_90a body: its walks compile, spills bounded") {
    auto spec = example("n");
    spec.name = "n_bwd128_verified";
    spec.forward = gdn::ForwardPath::fused;  // the walks form W (backward_w "auto")
    spec.walk_bwd_slab = 128;
    spec.cp_segments = 4;
    spec.cp_carry = gdn::SegmentCarry::verified;
    spec.walk_bwd_layout = gdn::WalkBwdLayout::split;  // the split body's walks; the fused body's in gpu_fused
    auto merged = spec;
    merged.name = "n_bwd128_merge4";
    merged.cp_carry = gdn::SegmentCarry::merge;  // backward_w "auto": chunk_prep's W
    int merge_walk_spills = -1;
    for (const auto& e : gdn::compile_layer(gdn::lower(merged), {gdn::Target::sm_90a}, shared_cache(), 2))
      if (e.program == "state_walk_bwd") merge_walk_spills = e.entry.manifest["info"]["spill_store_bytes"].get<int>();
    REQUIRE(merge_walk_spills >= 0);
    int walks = 0;
    std::vector<std::string> dv_locals;
    for (const auto& e :
         gdn::compile_layer(gdn::lower(spec), {gdn::Target::sm_90a, gdn::Target::sm_100a}, shared_cache(), 2)) {
      if (e.program.starts_with("dv_local") || e.program.starts_with("chunk_prep"))
        dv_locals.push_back(e.program + " " + std::string(gdn::to_string(e.target)));
      if (e.program.find("walk_bwd") == std::string::npos) continue;
      CAPTURE(e.program);
      CAPTURE(gdn::to_string(e.target));
      const int spills = e.entry.manifest["info"]["spill_store_bytes"].get<int>();
      CHECK(e.entry.manifest["info"]["ptxas_log"].get<std::string>().find("C7510") == std::string::npos);
      ++walks;
      if (e.target != gdn::Target::sm_90a) continue;
      // The segmented walk spills 32 bytes under the merge (chunk_prep's W), 12 forming W; the
      // speculative walk's checkpoint stores add some (measured 40 bytes forming W, 24 reading
      // chunk_prep's), the verify walk's comparison none (12 and 16). Bounds, so that worse is seen.
      if (e.program == "state_walk_bwd") CHECK(spills <= merge_walk_spills);
      if (e.program == "walk_bwd_speculate") CHECK(spills <= 48);
      if (e.program == "walk_bwd_verify") CHECK(spills <= 32);
    }
    CHECK(walks == 8);  // walk_bwd_speculate, _verify, _prescan and state_walk_bwd on both targets
    // dv_local and W in full where the portable walk reads them, for the marked chains on sm_90a
    // (the forward's and the backward's).
    std::sort(dv_locals.begin(), dv_locals.end());
    CHECK(dv_locals == std::vector<std::string>{"chunk_prep sm_100a", "chunk_prep_fwd_marked sm_90a",
                                                "chunk_prep_marked sm_90a", "chunk_prep_rerun sm_100a",
                                                "dv_local sm_100a", "dv_local_marked sm_90a"});
  }

  TEST_CASE("a truncated cubin is detected and rebuilt") {
    const auto ir = gdn::lower(example("n"));
    auto entries = gdn::compile_layer(ir, {gdn::Target::sm_90a}, shared_cache(), 2);
    const fs::path cubin = entries.front().entry.dir / gdn::kCubinFile;
    fs::resize_file(cubin, fs::file_size(cubin) / 2);
    const auto again = gdn::compile_layer(ir, {gdn::Target::sm_90a}, shared_cache(), 2);
    CHECK(again.front().outcome == gdn::cache::Outcome::rebuilt_corrupt);
    CHECK(again.front().corrupt_reason.find(gdn::kCubinFile) != std::string::npos);
    for (size_t i = 1; i < again.size(); ++i) CHECK(again[i].outcome == gdn::cache::Outcome::hit);
  }

  TEST_CASE("keys change with the target and the constants, not with the layer name") {
    auto a = gdn::lower(example("n"));
    auto spec = example("n");
    spec.name = "renamed";
    auto b = gdn::lower(spec);
    const auto& pa = a.program("chunk_prep");
    CHECK(gdn::program_key(pa, gdn::Target::sm_90a).digest ==
          gdn::program_key(b.program("chunk_prep"), gdn::Target::sm_90a).digest);
    CHECK(gdn::program_key(pa, gdn::Target::sm_90a).digest != gdn::program_key(pa, gdn::Target::sm_100a).digest);
    const auto m = gdn::lower(example("m"));
    CHECK(gdn::program_key(pa, gdn::Target::sm_90a).digest !=
          gdn::program_key(m.program("chunk_prep"), gdn::Target::sm_90a).digest);
  }

  TEST_CASE("the template include graph is closed and hashed") {
    const auto inc = gdn::transitive_includes("fwd/chunk_prep.cuh");
    CHECK(std::find(inc.begin(), inc.end(), "common/numeric.cuh") != inc.end());
    CHECK(gdn::templates_digest("fwd/chunk_prep.cuh").size() == 64);
    CHECK_THROWS_WITH_AS(gdn::find_template("nope.cuh"), doctest::Contains("nope.cuh"), std::out_of_range);
  }

  TEST_CASE("ptxas logs: registers are the most any function uses, spills are summed over functions") {
    // ptxas -v for a kernel that calls __noinline__ functions: the kernel's block with its
    // register line, then a properties block per callee (spills, no register line of its own).
    // A second register line (another entry) is read too, for the maximum.
    const std::string log =
        "ptxas info    : Compiling entry function 'gdn_chunk_bwd' for 'sm_100a'\n"
        "ptxas info    : Function properties for gdn_chunk_bwd\n"
        "ptxas         .     168 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
        "ptxas info    : Used 128 registers, used 1 barriers\n"
        "ptxas info    : Function properties for run_item\n"
        "ptxas         .     168 bytes stack frame, 156 bytes spill stores, 168 bytes spill loads\n"
        "ptxas info    : Function properties for helper\n"
        "ptxas         .     8 bytes stack frame, 12 bytes spill stores, 12 bytes spill loads\n"
        "ptxas info    : Used 40 registers\n";
    CHECK(gdn::ptxas::registers(log) == 128);
    CHECK(gdn::ptxas::spill_store_bytes(log) == 168);
    CHECK(gdn::ptxas::spill_store_bytes("no such lines") == -1);
    CHECK(gdn::ptxas::registers("no such lines") == -1);
  }

  TEST_CASE("a compile failure carries the log, the options and the source path") {
    gdn::Program p = gdn::lower(example("n")).program("gate_cumsum");
    try {
      gdn::nvrtc_compile(p, gdn::Target::sm_90a, "#include \"prep/gate_cumsum.cuh\"\nthis is not C++;\n");
      FAIL("expected a CompileError");
    } catch (const gdn::CompileError& e) {
      CHECK(e.log().find("error") != std::string::npos);
      CHECK(e.options().front() == "--gpu-architecture=sm_90a");
      CHECK(fs::exists(e.source_path()));
      CHECK(std::string(e.what()).find(e.source_path()) != std::string::npos);
      fs::remove(e.source_path());
    }
  }

  TEST_CASE("chunk_bwd on sm_90a: wgmma by default, the mma.sync kernel with tensor_cores mma_sync") {
    auto spec = example("n");
    const gdn::Program wg = gdn::lower(spec).program("chunk_bwd");
    spec.tensor_cores = gdn::TensorCores::mma_sync;
    const gdn::Program ms = gdn::lower(spec).program("chunk_bwd");
    const auto a = gdn::nvrtc_compile(wg, gdn::Target::sm_90a, gdn::generate_source(wg));
    const auto b = gdn::nvrtc_compile(ms, gdn::Target::sm_90a, gdn::generate_source(ms));
    CHECK(a.cubin != b.cubin);
    CHECK(a.spill_store_bytes == 0);
    // Elsewhere the choice does not exist: both specs build the same mma.sync machine code
    // (the cubins differ only in the constant's name in the source, not in .text).
    const auto c = gdn::nvrtc_compile(wg, gdn::Target::sm_100a, gdn::generate_source(wg));
    const auto d = gdn::nvrtc_compile(ms, gdn::Target::sm_100a, gdn::generate_source(ms));
    CHECK(c.registers == d.registers);
    CHECK(c.spill_store_bytes == d.spill_store_bytes);
  }

  TEST_CASE("the forward walk compiles with 64-wide slabs for every target, without spills") {
    auto spec = example("m");
    spec.forward = gdn::ForwardPath::programs;  // the fused path has no state_walk
    spec.walk_slab = 64;
    const gdn::Program p = gdn::lower(spec).program("state_walk");
    for (gdn::Target t : gdn::supported_targets()) {
      INFO(gdn::to_string(t));
      const auto c = gdn::nvrtc_compile(p, t, gdn::generate_source(p));
      CHECK(c.spill_store_bytes == 0);
      // Two blocks per SM must fit the shared memory (registers always fit at 128 threads).
      CHECK(2 * p.smem_bytes <= 227 * 1024);
    }
  }

  TEST_CASE("the fused forward walk compiles for every target without spills, one 512-thread block per SM") {
    // Its three forms: o alone (light saves), o and the tapes (full saves), the tapes alone (walk_tape).
    for (const gdn::SaveMode mode : {gdn::SaveMode::light, gdn::SaveMode::full})
      for (const char* name : {"fused_walk", "walk_tape"}) {
        if (mode == gdn::SaveMode::full && std::string(name) == "walk_tape") continue;
        auto spec = example("m");
        spec.forward = gdn::ForwardPath::fused;
        spec.save_mode = mode;
        const gdn::Program p = gdn::lower(spec).program(name);
        for (gdn::Target t : gdn::supported_targets()) {
          INFO(std::string(name) << " " << gdn::to_string(mode) << " " << gdn::to_string(t));
          const auto c = gdn::nvrtc_compile(p, t, gdn::generate_source(p));
          CHECK(c.spill_store_bytes == 0);
          CHECK(c.registers <= 65536 / p.threads);  // pinned at 128 (__maxnreg__) for setmaxnreg
          CHECK(p.smem_bytes <= 227 * 1024);
        }
      }
  }

  TEST_CASE("the backward walk compiles with 64-wide slabs (16 warps) for every target, without spills") {
    auto spec = example("m");
    spec.walk_bwd_slab = 64;
    const gdn::Program p = gdn::lower(spec).program("state_walk_bwd");
    CHECK(p.threads == 512);
    for (gdn::Target t : gdn::supported_targets()) {
      INFO(gdn::to_string(t));
      const auto c = gdn::nvrtc_compile(p, t, gdn::generate_source(p));
      CHECK(c.spill_store_bytes == 0);
      CHECK(c.registers <= 128);  // 512 threads per block
      CHECK(p.smem_bytes <= 227 * 1024);
    }
  }

  TEST_CASE("the backward walk compiles with 128-wide slabs for every target and both bodies, without spills") {
    // tensor_cores "auto" (m.json's default): the warp-specialized body on sm_90a, the portable one
    // elsewhere; "mma_sync": the portable one everywhere. Both in 512-thread blocks. The sm_90a body
    // that forms W (backward_w "walk", m.json's choice) keeps a few bytes of spills in its loading
    // and scoring warpgroups, off the walks' chain; the one that loads W has none.
    for (auto [tc, w] : {std::pair{gdn::TensorCores::automatic, gdn::BackwardW::walk},
                         std::pair{gdn::TensorCores::automatic, gdn::BackwardW::chunk_prep},
                         std::pair{gdn::TensorCores::mma_sync, gdn::BackwardW::automatic}}) {
      auto spec = example("m");
      spec.tensor_cores = tc;
      spec.walk_bwd_slab = 128;
      spec.backward_w = w;
      spec.walk_bwd_layout = gdn::WalkBwdLayout::split;  // the fused layout's own case is above
      const gdn::Program p = gdn::lower(spec).program("state_walk_bwd");
      CHECK(p.threads == 512);
      CHECK(p.smem_bytes <= 227 * 1024);
      for (gdn::Target t : gdn::supported_targets()) {
        INFO(gdn::to_string(t) << (tc == gdn::TensorCores::automatic ? " auto" : " mma_sync") << " backward_w "
                               << gdn::to_string(w));
        const auto c = gdn::nvrtc_compile(p, t, gdn::generate_source(p));
        const bool forms_w = t == gdn::Target::sm_90a && w == gdn::BackwardW::walk;
        CHECK(c.spill_store_bytes <= (forms_w ? 16 : 0));
        CHECK(c.registers <= 128);
      }
    }
  }

  TEST_CASE("the wgmma probe compiles for sm_90a in every operand form, and is refused elsewhere") {
    for (const auto& probe : gdn::test::all_wgmma_probes()) {
      if (probe.kd != 128) continue;  // the depth only changes a loop count; the GPU test runs both
      INFO(probe.label());
      const gdn::CompiledProgram c = gdn::nvrtc_compile(probe.program(), gdn::Target::sm_90a, probe.source());
      CHECK(!c.cubin.empty());
      CHECK(c.spill_store_bytes == 0);
    }
    const gdn::test::WgmmaProbe probe;
    for (gdn::Target t : {gdn::Target::sm_100a, gdn::Target::sm_103a}) {
      try {
        gdn::nvrtc_compile(probe.program(), t, probe.source());
        FAIL("expected the sm_90a-only guard to fire");
      } catch (const gdn::CompileError& e) {
        CHECK(e.log().find("the wgmma probe needs sm_90a") != std::string::npos);
        fs::remove(e.source_path());
      }
    }
  }

  TEST_CASE("the descriptor probe (desc_* against step_*) compiles for sm_90a") {
    const gdn::test::DescStepProbe probe;
    const gdn::CompiledProgram c = gdn::nvrtc_compile(probe.program(), gdn::Target::sm_90a, probe.source());
    CHECK(!c.cubin.empty());
  }

  TEST_CASE(
      "the pipeline probe (mbarriers, cp.async arrivals, named barriers, elect, setmaxnreg) compiles for sm_90a only") {
    const gdn::test::PipelineProbe probe;
    const gdn::CompiledProgram c = gdn::nvrtc_compile(probe.program(), gdn::Target::sm_90a, probe.source());
    CHECK(!c.cubin.empty());
    CHECK(c.spill_store_bytes == 0);
    CHECK(c.registers == 128);  // __maxnreg__ pins what setmaxnreg rebalances
    try {
      gdn::nvrtc_compile(probe.program(), gdn::Target::sm_100a, probe.source());
      FAIL("expected the sm_90a-only guard to fire");
    } catch (const gdn::CompileError& e) {
      CHECK(e.log().find("the pipeline probe needs sm_90a") != std::string::npos);
      fs::remove(e.source_path());
    }
  }

  TEST_CASE("max_registers pins the entry's register count with __maxnreg__ instead of __launch_bounds__") {
    gdn::Program p = gdn::lower(example("n")).program("gate_cumsum");
    p.max_registers = 64;
    const std::string src = gdn::generate_source(p);
    CHECK(src.find("__maxnreg__(64)") != std::string::npos);
    CHECK(src.find("__launch_bounds__") == std::string::npos);
    const gdn::CompiledProgram c = gdn::nvrtc_compile(p, gdn::Target::sm_90a, src);
    CHECK(c.registers <= 64);
    CHECK(gdn::program_key(p, gdn::Target::sm_90a).digest != [&] {
      gdn::Program q = p;
      q.max_registers = 0;
      return gdn::program_key(q, gdn::Target::sm_90a).digest;
    }());
    p.min_blocks_per_sm = 2;
    CHECK_THROWS_AS(gdn::generate_source(p), std::logic_error);
  }

  TEST_CASE("a program with tensor maps takes them as a second, __grid_constant__ argument") {
    const auto ir = gdn::lower(example("m"));
    const gdn::Program& walk = ir.program("state_walk_bwd");
    REQUIRE(!walk.tensor_maps.empty());
    const std::string src = gdn::generate_source(walk);
    CHECK(src.find("(gdn::StateWalkBwdFusedParams p, const __grid_constant__ gdn::TensorMaps maps)") !=
          std::string::npos);
    CHECK(src.find("::run(p, maps);") != std::string::npos);
    const std::string plain = gdn::generate_source(ir.program("finalize"));
    CHECK(plain.find("TensorMaps") == std::string::npos);
    gdn::Program too_many = walk;
    while (too_many.tensor_maps.size() <= static_cast<size_t>(gdn::kMaxTensorMaps))
      too_many.tensor_maps.push_back(walk.tensor_maps.front());
    CHECK_THROWS_AS(gdn::generate_source(too_many), std::logic_error);
  }

  TEST_CASE("the generated translation unit is tiny and names the entry") {
    auto spec = example("m");
    spec.forward = gdn::ForwardPath::programs;
    const auto ir = gdn::lower(spec);
    const std::string src = gdn::generate_source(ir.program("state_walk"));
    CHECK(src.find("#include \"fwd/state_walk.cuh\"") != std::string::npos);
    CHECK(src.find("extern \"C\" __global__") != std::string::npos);
    CHECK(src.find("gdn_state_walk(gdn::StateWalkParams p)") != std::string::npos);
    CHECK(src.find("static constexpr int HV = 48;") != std::string::npos);
    CHECK(std::count(src.begin(), src.end(), '\n') < 25);
  }
}
