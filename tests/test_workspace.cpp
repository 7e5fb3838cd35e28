/**
 * @file test_workspace.cpp
 * @brief Workspace buffers that share bytes (IR lives_in) are proven safe from the call plans:
 *        over every call sequence that shares one workspace, no two buffers placed in the same
 *        bytes are accessed in overlapping launch intervals. The proof reads the plans' own
 *        bindings (what the launches really address), not the IR's reasoning.
 */
#include "runtime/plan.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <map>

namespace fs = std::filesystem;
using namespace gdn;

namespace {

Spec example(const char* name) {
  return spec_from_file((fs::path(GDN_SOURCE_DIR) / "examples" / (std::string(name) + ".json")).string());
}

/// Conflicts of one call sequence (plans run in order on one workspace): "a and b share slot
/// i and are both live at launch p". Empty means the sharing is safe for this sequence.
std::vector<std::string> sharing_conflicts(const std::vector<const CallPlan*>& sequence, bool same_slots) {
  std::vector<std::string> out;
  // Slot i must mean the same bytes in every plan when values pass between them (light saves):
  // shorter workspaces are prefixes of longer.
  const CallPlan* longest = sequence.front();
  for (const CallPlan* p : sequence)
    if (p->ws_slots.size() > longest->ws_slots.size()) longest = p;
  for (const CallPlan* p : sequence)
    for (size_t i = 0; same_slots && i < p->ws_slots.size(); ++i)
      if (p->ws_slots[i].text() != longest->ws_slots[i].text())
        out.push_back(fmt::format("{}: workspace slot {} differs from {}'s", p->name, i, longest->name));
  // [first, last] launch index of every buffer, per slot.
  std::map<int, std::map<std::string, std::pair<int, int>>> live;
  int at = 0;
  for (const CallPlan* p : sequence)
    for (const PlannedLaunch& l : p->launches) {
      for (const Field& f : l.fields) {
        if (f.source.kind != ValueSource::from_slot || f.source.region != RegionKind::ws) continue;
        auto [it, fresh] = live[f.source.slot].try_emplace(f.source.buffer, at, at);
        if (!fresh) it->second.second = at;
      }
      ++at;
    }
  for (const auto& [slot, buffers] : live)
    for (auto a = buffers.begin(); a != buffers.end(); ++a)
      for (auto b = std::next(a); b != buffers.end(); ++b)
        if (!(a->second.second < b->second.first || b->second.second < a->second.first))
          out.push_back(fmt::format("slot {}: {} (launches {}..{}) and {} (launches {}..{}) overlap", slot, a->first,
                                    a->second.first, a->second.second, b->first, b->second.first, b->second.second));
  return out;
}

/// Every sequence of call forms that one workspace sees: each form alone, a forward followed by
/// the re-run backward, and a recompute followed by the backward that binds its tapes or (stale
/// stamp) re-runs.
/// With full saves nothing passes from a forward to a backward through the workspace (the tapes
/// are saved, there is no hand-off), so the slot-prefix rule does not apply there (with segments
/// the forward's seg_hm is not the backward's second slot); the sequences are still checked.
/// Per target, as the layer runs them: the launches of programs idle there dropped, the target's
/// own fields applied.
std::vector<std::string> all_conflicts(const LayerIR& ir) {
  std::vector<std::string> out;
  for (Target t : kTargets) {
    auto on = [&](CallPlan plan) {
      specialize_for_target(plan, ir, t);
      return plan;
    };
    const CallPlan fwd = on(plan_forward(ir, OutputLaunch::yes)), rec = on(plan_forward(ir, OutputLaunch::no));
    const CallPlan bwd = on(plan_backward(ir, PrepRerun::yes)), bound = on(plan_backward(ir, PrepRerun::no));
    const bool light = ir.spec.save_mode == SaveMode::light;
    for (const auto& seq : std::vector<std::vector<const CallPlan*>>{
             {&fwd}, {&bwd}, {&fwd, &bwd}, {&rec, &bwd}, {&fwd, &bound}, {&rec, &bound}})
      for (auto& c : sharing_conflicts(seq, light))
        out.push_back(fmt::format("{}: {} then {}: {}", to_string(t), seq.front()->name, seq.back()->name, c));
  }
  return out;
}

/// A buffer placed in another's bytes fits them for every T, N and NT.
bool fits(const ByteFormula& guest, const ByteFormula& host) {
  return guest.per_token <= host.per_token && guest.per_doc <= host.per_doc && guest.per_chunk <= host.per_chunk &&
         guest.constant <= host.constant;
}

/// `example`'s layer with the variant's forward path, saves, norm, states (h0 and ht together) and
/// segment count.
Spec variant(const char* example_name, ForwardPath path, SaveMode save, Norm norm, StateFlag states, int segments) {
  Spec s = example(example_name);
  s.forward = path;
  s.save_mode = save;
  s.norm = norm;
  s.initial_state = states;
  s.final_state = states;
  s.cp_segments = segments;
  return s;
}

}  // namespace

TEST_SUITE("workspace") {
  TEST_CASE("buffers sharing workspace bytes are never live at the same time") {
    int variants = 0, shared = 0;
    for (const char* name : {"n", "m"})
      for (SaveMode save : {SaveMode::light, SaveMode::full})
        for (Norm norm : {Norm::l2_in_kernel, Norm::none})
          for (StateFlag h0 : {StateFlag::present, StateFlag::absent})
            for (int segments : {1, 2, 8})
              for (ForwardPath path : {ForwardPath::programs, ForwardPath::fused}) {
                const LayerIR ir = lower(variant(name, path, save, norm, h0, segments));
                for (const Buffer& b : ir.buffers)
                  if (!b.lives_in.empty()) {
                    ++shared;
                    CHECK_MESSAGE(fits(b.bytes, ir.buffer(b.lives_in).bytes), b.name << " does not fit " << b.lives_in);
                  }
                for (const auto& c : all_conflicts(ir))
                  FAIL_CHECK(name << " " << to_string(save) << " " << to_string(path) << " segments " << segments
                                  << ": " << c);
                ++variants;
              }
    CHECK(variants == 96);  // 2 shapes x 2 saves x 2 norms x 2 states x 3 segment counts x 2 forward paths
    CHECK(shared > 0);      // the property was checked on real sharing, not vacuously
    // The verified carry (programs or fused forward, the portable backward walk or the sm_90a one
    // with dv_local_marked): its own slots, saved maps.
    int verified = 0;
    for (int slab : {64, 128})
      for (SaveMode save : {SaveMode::light, SaveMode::full})
        for (Norm norm : {Norm::l2_in_kernel, Norm::none})
          for (StateFlag h0 : {StateFlag::present, StateFlag::absent})
            for (int segments : {2, 8, 0})
              for (ForwardPath path : {ForwardPath::programs, ForwardPath::fused}) {
                Spec s = variant("n", path, save, norm, h0, segments);
                s.walk_bwd_slab = slab;
                s.cp_carry = SegmentCarry::verified;
                const LayerIR ir = lower(s);
                REQUIRE(ir.verified_carry);
                for (const auto& c : all_conflicts(ir))
                  FAIL_CHECK("verified, slab " << slab << ", " << to_string(save) << " " << to_string(path)
                                               << " segments " << segments << ": " << c);
                ++verified;
              }
    CHECK(verified == 96);
    // walk_bwd_layout "fused" (the fused walk binds chunk_bwd's buffers on sm_90a, where chunk_bwd
    // idles): light and full saves, with and without the norm and the states, and with verified
    // segments (its three reverse walks, the marked chains' programs).
    int layouts = 0;
    for (SaveMode save : {SaveMode::light, SaveMode::full})
      for (Norm norm : {Norm::l2_in_kernel, Norm::none})
        for (StateFlag h0 : {StateFlag::present, StateFlag::absent})
          for (int segments : {1, 2, 8}) {
            Spec s = variant("m", ForwardPath::fused, save, norm, h0, segments);
            s.walk_bwd_layout = WalkBwdLayout::fused;
            if (segments > 1) s.cp_carry = SegmentCarry::verified;
            const LayerIR ir = lower(s);
            for (const auto& c : all_conflicts(ir))
              FAIL_CHECK("fused " << to_string(save) << " segments " << segments << ": " << c);
            ++layouts;
          }
    CHECK(layouts == 24);
  }

  TEST_CASE("the proof catches a buffer placed in bytes that are still live") {
    LayerIR ir = lower(example("m"));
    for (Buffer& b : ir.buffers)
      if (b.name == "dq_v") b.lives_in = "h_tape";  // chunk_bwd reads h_tape while writing dq_v
    const auto conflicts = all_conflicts(ir);
    REQUIRE_FALSE(conflicts.empty());
    CHECK(conflicts.front().find("dq_v") != std::string::npos);
  }

  TEST_CASE("sharing shrinks the backward workspace by the shared buffers' bytes") {
    const LayerIR ir = lower(example("m"));
    const int64_t T = 32768, N = 5;
    size_t own = 0;
    for (const Buffer& b : ir.buffers)
      if (b.role == BufferRole::workspace &&
          std::find(b.forms.begin(), b.forms.end(), CallForm::backward) != b.forms.end())
        own += (static_cast<size_t>(b.bytes.eval(T, N, 64)) + 255) / 256 * 256;
    const size_t shared = 3 * static_cast<size_t>(T) * 48 * 128 * 2;  // dv_local, dq_v, dk_v
    CHECK(region_bytes(ir, BufferRole::workspace, CallForm::backward, T, N) == own - shared);
  }

  TEST_CASE("region sizes refuse problem sizes whose bytes could wrap") {
    const LayerIR ir = lower(example("m"));
    // T = 2^63-1 wrapped the workspace size to a plausible-looking number.
    CHECK_THROWS_WITH_AS(region_bytes(ir, BufferRole::workspace, CallForm::forward, INT64_MAX, 1),
                         "T: 9223372036854775807 is out of range (1 to 2^31-1)", InputError);
    CHECK_THROWS_WITH_AS(region_bytes(ir, BufferRole::saved, CallForm::forward, 64, 65536),
                         "N: 65536 documents is out of range (1 to 65535)", InputError);
    CHECK_THROWS_AS(region_bytes(ir, BufferRole::saved, CallForm::forward, 0, 1), InputError);
    // The largest accepted sizes stay far from 2^64.
    CHECK(region_bytes(ir, BufferRole::workspace, CallForm::backward, (1LL << 31) - 1, 65535) < (size_t{1} << 62));
  }
}
