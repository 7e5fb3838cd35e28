/**
 * @file spec.cpp
 * @brief Parsing and validation of layer specs.
 */
#include "compiler/spec.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace gdn {

using nlohmann::json;

SpecError::SpecError(std::string pointer, std::string problem)
    : Error(pointer.empty() ? problem : fmt::format("{}: {}", pointer, problem)),
      pointer_(std::move(pointer)),
      problem_(std::move(problem)) {}

std::string_view to_string(Norm v) { return v == Norm::l2_in_kernel ? "l2_in_kernel" : "none"; }
std::string_view to_string(SaveMode v) { return v == SaveMode::light ? "light" : "full"; }
std::string_view to_string(ReuseTapes v) {
  switch (v) {
    case ReuseTapes::yes: return "true";
    case ReuseTapes::no: return "false";
    case ReuseTapes::automatic: return "auto";
  }
  return "?";
}
std::string_view to_string(GraphMode v) { return v == GraphMode::off ? "off" : "replay"; }
std::string_view to_string(TensorCores v) { return v == TensorCores::automatic ? "auto" : "mma_sync"; }
std::string_view to_string(WalkBwdLayout v) {
  switch (v) {
    case WalkBwdLayout::split: return "split";
    case WalkBwdLayout::fused: return "fused";
    case WalkBwdLayout::automatic: return "auto";
  }
  return "?";
}
std::string_view to_string(BackwardNorm v) {
  switch (v) {
    case BackwardNorm::launches: return "launches";
    case BackwardNorm::in_walk: return "in_walk";
    case BackwardNorm::automatic: return "auto";
  }
  return "?";
}
std::string_view to_string(BackwardW v) {
  switch (v) {
    case BackwardW::chunk_prep: return "chunk_prep";
    case BackwardW::walk: return "walk";
    case BackwardW::automatic: return "auto";
  }
  return "?";
}

std::string_view to_string(SegmentCarry v) {
  switch (v) {
    case SegmentCarry::merge: return "merge";
    case SegmentCarry::verified: return "verified";
    case SegmentCarry::automatic: return "auto";
  }
  return "?";
}

std::string_view to_string(ForwardPath v) {
  switch (v) {
    case ForwardPath::programs: return "programs";
    case ForwardPath::fused: return "fused";
    case ForwardPath::automatic: return "auto";
  }
  return "?";
}
std::string_view to_string(Target v) {
  switch (v) {
    case Target::sm_90a: return "sm_90a";
    case Target::sm_100a: return "sm_100a";
    case Target::sm_103a: return "sm_103a";
  }
  return "?";
}
std::optional<Target> parse_target(std::string_view s) {
  for (Target t : supported_targets())
    if (to_string(t) == s) return t;
  return std::nullopt;
}
int target_cc(Target t) {
  switch (t) {
    case Target::sm_90a: return 90;
    case Target::sm_100a: return 100;
    case Target::sm_103a: return 103;
  }
  return 0;
}
const std::vector<Target>& supported_targets() {
  static const std::vector<Target> all = {Target::sm_90a, Target::sm_100a, Target::sm_103a};
  return all;
}

double Spec::effective_scale() const { return scale ? *scale : 1.0 / std::sqrt(static_cast<double>(head_dim_k)); }

namespace {

constexpr int kSupportedHeadDim = 128;
constexpr int kSupportedChunk = 64;
/// Intra-card segments per document: the merge is serial over them, and FLA caps its split at 32.
constexpr int kMaxSegments = 64;
constexpr int kMaxHeads = 4096;

std::string supported_targets_text() {
  std::string s;
  for (Target t : supported_targets()) s += (s.empty() ? "" : ", ") + std::string(to_string(t));
  return s;
}

/// The range of one integer field and how to say that a value is outside it. The JSON reader
/// checks the value as written (any size) and validate() the struct, with the same words.
struct IntegerField {
  const char* pointer;
  long long min, max;
  const char* outside;
};

const IntegerField kHeadsQk{"/heads/qk", 1, kMaxHeads, "is out of range (1 to 4096)"};
const IntegerField kHeadsV{"/heads/v", 1, kMaxHeads, "is out of range (1 to 4096)"};
const IntegerField kHeadDimK{"/head_dim/k", kSupportedHeadDim, kSupportedHeadDim, "is not supported (supported: 128)"};
const IntegerField kHeadDimV{"/head_dim/v", kSupportedHeadDim, kSupportedHeadDim, "is not supported (supported: 128)"};
const IntegerField kChunk{"/chunk", kSupportedChunk, kSupportedChunk, "is not supported (supported: 64)"};
const IntegerField kCpRanks{"/cp/ranks", 1, kMaxSegments,
                            "is not supported (supported: 1 to 64; more than 1 runs the single-GPU proxy of context "
                            "parallelism)"};
const IntegerField kCpSegments{"/cp/segments", 0, kMaxSegments, "is not supported (supported: \"auto\", 1 to 64)"};

void check(const IntegerField& f, long long value) {
  if (value < f.min || value > f.max) throw SpecError(f.pointer, fmt::format("{} {}", value, f.outside));
}

bool valid_name(const std::string& n) {
  return !n.empty() && n.size() <= 64 && std::all_of(n.begin(), n.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
  });
}

}  // namespace

void validate(const Spec& s) {
  if (!valid_name(s.name))
    throw SpecError("/name", fmt::format("{} must be 1 to 64 characters of [A-Za-z0-9_-]", quoted_excerpt(s.name)));
  check(kHeadsQk, s.heads_qk);
  check(kHeadsV, s.heads_v);
  if (s.heads_v % s.heads_qk != 0)
    throw SpecError("/heads/v", fmt::format("{} is not a multiple of /heads/qk ({})", s.heads_v, s.heads_qk));
  check(kHeadDimK, s.head_dim_k);
  check(kHeadDimV, s.head_dim_v);
  auto check_dtype = [](const char* ptr, const std::string& got, const char* want) {
    if (got != want)
      throw SpecError(ptr, fmt::format("{} is not supported (supported: \"{}\")", quoted_excerpt(got), want));
  };
  check_dtype("/dtypes/qkv", s.dtype_qkv, "bf16");
  check_dtype("/dtypes/gate", s.dtype_gate, "fp32");
  check_dtype("/dtypes/beta", s.dtype_beta, "fp32");
  check_dtype("/dtypes/state", s.dtype_state, "fp32");
  check_dtype("/dtypes/output", s.dtype_output, "bf16");
  if (s.scale && !(std::isfinite(*s.scale) && *s.scale > 0))
    throw SpecError("/scale", fmt::format("{} must be a positive finite number or null (1/sqrt(K))", *s.scale));
  // Struct-built specs bypass the JSON reader's check.
  if (s.walk_slab != 0 && s.walk_slab != 32 && s.walk_slab != 64)
    throw SpecError("/walk_slab", fmt::format("{} is not supported (supported: \"auto\", 32, 64)", s.walk_slab));
  if (s.walk_bwd_slab != 0 && s.walk_bwd_slab != 32 && s.walk_bwd_slab != 64 && s.walk_bwd_slab != 128)
    throw SpecError("/walk_bwd_slab",
                    fmt::format("{} is not supported (supported: \"auto\", 32, 64, 128)", s.walk_bwd_slab));
  check(kChunk, s.chunk);
  if (s.targets.empty()) throw SpecError("/targets", "must list at least one target");
  for (size_t i = 0; i < s.targets.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (s.targets[i] == s.targets[j])
        throw SpecError(fmt::format("/targets/{}", i), fmt::format("\"{}\" is listed twice", to_string(s.targets[i])));
  check(kCpRanks, s.cp_ranks);
  check(kCpSegments, s.cp_segments);
  if (s.cp_ranks > 1 && s.cp_segments > 1)
    throw SpecError("/cp/segments", fmt::format("{} with cp.ranks {}: the ranks' pieces are the segments (use 1 or "
                                                "\"auto\" with more than one rank)",
                                                s.cp_segments, s.cp_ranks));
  if (s.cp_ranks > 1 && s.cp_carry == SegmentCarry::verified)
    throw SpecError("/cp/carry", fmt::format("\"verified\" with cp.ranks {}: the ranks' pieces are carried by the "
                                             "merge (the verified carry runs on one rank)",
                                             s.cp_ranks));
}

namespace {

/// Walks one JSON object of a spec: every key known, every value of its type and, for integers,
/// in its field's range before it is narrowed to int.
class Reader {
 public:
  Reader(const json& obj, std::string ptr) : fields_(obj, std::move(ptr)) {}
  void known(std::initializer_list<std::string_view> keys) const { fields_.only(keys); }
  std::string at(std::string_view key) const { return fields_.pointer(key); }
  const json* get(std::string_view key, bool required) const {
    return required ? &fields_.require(key) : fields_.find(key);
  }
  void integer(std::string_view key, const IntegerField& field, int& out, bool required = false) const {
    if (const json* v = get(key, required)) {
      if (!v->is_number_integer())
        throw SpecError(at(key), fmt::format("expected an integer, got {}", value_excerpt(*v)));
      const auto x = as_int64(*v);
      if (!x || *x < field.min || *x > field.max)
        throw SpecError(field.pointer, fmt::format("{} {}", value_excerpt(*v), field.outside));
      out = static_cast<int>(*x);
    }
  }
  void string(std::string_view key, std::string& out, bool required = false) const {
    if (const json* v = get(key, required)) {
      if (!v->is_string()) throw SpecError(at(key), fmt::format("expected a string, got {}", value_excerpt(*v)));
      out = v->get<std::string>();
    }
  }
  void boolean(std::string_view key, bool& out) const {
    if (const json* v = get(key, false)) {
      if (!v->is_boolean()) throw SpecError(at(key), fmt::format("expected true or false, got {}", value_excerpt(*v)));
      out = v->get<bool>();
    }
  }
  /// A string that must be one of `choices`.
  template <class E>
  void choice(std::string_view key, E& out, std::initializer_list<std::pair<const char*, E>> choices) const {
    const json* v = get(key, false);
    if (!v) return;
    std::string list;
    for (auto& [name, value] : choices) {
      if (v->is_string() && v->get<std::string>() == name) {
        out = value;
        return;
      }
      list += (list.empty() ? "\"" : ", \"") + std::string(name) + "\"";
    }
    throw SpecError(at(key), fmt::format("{} is not supported (supported: {})", value_excerpt(*v), list));
  }

 private:
  FieldReader fields_;
};

Spec read_spec(const json& j) {
  Spec s;
  Reader r(j, "");
  r.known({"name",
           "heads",
           "head_dim",
           "dtypes",
           "norm",
           "scale",
           "chunk",
           "save_mode",
           "reuse_recompute_tapes",
           "deterministic",
           "graph",
           "tensor_cores",
           "walk_slab",
           "walk_bwd_slab",
           "forward",
           "backward_w",
           "walk_bwd_layout",
           "backward_norm",
           "initial_state",
           "final_state",
           "targets",
           "cp"});
  r.string("name", s.name, true);
  {
    Reader h(*r.get("heads", true), "/heads");
    h.known({"qk", "v"});
    h.integer("qk", kHeadsQk, s.heads_qk, true);
    h.integer("v", kHeadsV, s.heads_v, true);
  }
  if (const json* hd = r.get("head_dim", false)) {
    Reader d(*hd, "/head_dim");
    d.known({"k", "v"});
    d.integer("k", kHeadDimK, s.head_dim_k);
    d.integer("v", kHeadDimV, s.head_dim_v);
  }
  if (const json* dt = r.get("dtypes", false)) {
    Reader d(*dt, "/dtypes");
    d.known({"qkv", "gate", "beta", "state", "output"});
    d.string("qkv", s.dtype_qkv);
    d.string("gate", s.dtype_gate);
    d.string("beta", s.dtype_beta);
    d.string("state", s.dtype_state);
    d.string("output", s.dtype_output);
  }
  r.choice("norm", s.norm, {{"l2_in_kernel", Norm::l2_in_kernel}, {"none", Norm::none}});
  if (const json* sc = r.get("scale", false)) {
    if (sc->is_null())
      s.scale.reset();
    else if (sc->is_number())
      s.scale = sc->get<double>();
    else
      throw SpecError("/scale", fmt::format("expected a number or null, got {}", value_excerpt(*sc)));
  }
  r.integer("chunk", kChunk, s.chunk);
  r.choice("save_mode", s.save_mode, {{"light", SaveMode::light}, {"full", SaveMode::full}});
  if (const json* re = r.get("reuse_recompute_tapes", false)) {
    if (re->is_boolean())
      s.reuse_recompute_tapes = re->get<bool>() ? ReuseTapes::yes : ReuseTapes::no;
    else if (re->is_string() && re->get<std::string>() == "auto")
      s.reuse_recompute_tapes = ReuseTapes::automatic;
    else
      throw SpecError("/reuse_recompute_tapes",
                      fmt::format("{} is not supported (supported: true, false, \"auto\")", value_excerpt(*re)));
  }
  bool det = true;
  r.boolean("deterministic", det);
  s.determinism = det ? Determinism::deterministic : Determinism::nondeterministic;
  r.choice("graph", s.graph, {{"off", GraphMode::off}, {"replay", GraphMode::replay}});
  r.choice("tensor_cores", s.tensor_cores, {{"auto", TensorCores::automatic}, {"mma_sync", TensorCores::mma_sync}});
  auto slab = [&](const char* key, int& out, bool wide) {
    if (const json* ws = r.get(key, false)) {
      if (ws->is_string() && ws->get<std::string>() == "auto")
        out = 0;
      else if (const auto width = as_int64(*ws);
               ws->is_number_integer() && width && (*width == 32 || *width == 64 || (wide && *width == 128)))
        out = static_cast<int>(*width);
      else
        throw SpecError(std::string("/") + key, fmt::format("{} is not supported (supported: \"auto\", 32, 64{})",
                                                            value_excerpt(*ws), wide ? ", 128" : ""));
    }
  };
  slab("walk_slab", s.walk_slab, false);
  slab("walk_bwd_slab", s.walk_bwd_slab, true);
  r.choice("forward", s.forward,
           {{"programs", ForwardPath::programs}, {"fused", ForwardPath::fused}, {"auto", ForwardPath::automatic}});
  r.choice("backward_w", s.backward_w,
           {{"chunk_prep", BackwardW::chunk_prep}, {"walk", BackwardW::walk}, {"auto", BackwardW::automatic}});
  r.choice("walk_bwd_layout", s.walk_bwd_layout,
           {{"split", WalkBwdLayout::split}, {"fused", WalkBwdLayout::fused}, {"auto", WalkBwdLayout::automatic}});
  r.choice(
      "backward_norm", s.backward_norm,
      {{"launches", BackwardNorm::launches}, {"in_walk", BackwardNorm::in_walk}, {"auto", BackwardNorm::automatic}});
  bool h0 = true, ht = true;
  r.boolean("initial_state", h0);
  r.boolean("final_state", ht);
  s.initial_state = h0 ? StateFlag::present : StateFlag::absent;
  s.final_state = ht ? StateFlag::present : StateFlag::absent;
  if (const json* ts = r.get("targets", false)) {
    if (!ts->is_array())
      throw SpecError("/targets", fmt::format("expected an array of target names, got {}", value_excerpt(*ts)));
    s.targets.clear();
    for (size_t i = 0; i < ts->size(); ++i) {
      const json& t = (*ts)[i];
      auto parsed = t.is_string() ? parse_target(t.get<std::string>()) : std::nullopt;
      if (!parsed)
        throw SpecError(fmt::format("/targets/{}", i),
                        fmt::format("{} is not supported (supported: {})", value_excerpt(t), supported_targets_text()));
      s.targets.push_back(*parsed);
    }
  }
  if (const json* cp = r.get("cp", false)) {
    Reader c(*cp, "/cp");
    c.known({"ranks", "segments", "carry"});
    c.integer("ranks", kCpRanks, s.cp_ranks);
    c.choice("carry", s.cp_carry,
             {{"merge", SegmentCarry::merge}, {"verified", SegmentCarry::verified}, {"auto", SegmentCarry::automatic}});
    if (const json* seg = c.get("segments", false); seg && seg->is_string() && seg->get<std::string>() == "auto")
      s.cp_segments = 0;
    else if (seg && !seg->is_number_integer())
      throw SpecError(kCpSegments.pointer, fmt::format("{} {}", value_excerpt(*seg), kCpSegments.outside));
    else if (seg && as_int64(*seg) == 0)  // "auto" is spelled out; 0 segments is not a number of segments
      throw SpecError(kCpSegments.pointer, fmt::format("0 {}", kCpSegments.outside));
    else
      c.integer("segments", kCpSegments, s.cp_segments);
  }
  validate(s);
  return s;
}

}  // namespace

Spec spec_from_json(const json& j) {
  try {
    return read_spec(j);
  } catch (const JsonInputError& e) {
    throw SpecError(e.pointer(), e.problem());
  }
}

Spec spec_from_text(std::string_view text) {
  json j;
  try {
    j = parse_bounded_json(text, kSpecJsonLimits);
  } catch (const JsonInputError& e) {
    throw SpecError(e.pointer(), e.problem());
  }
  return spec_from_json(j);
}

Spec spec_from_file(const std::string& path) {
  const std::string shown = printable_excerpt(path, 256);
  std::string text;
  try {
    text = read_bounded_file(path, kSpecJsonLimits.max_bytes);
  } catch (const JsonInputError& e) {
    throw SpecError("", fmt::format("{}: {}", shown, e.problem()));
  }
  try {
    return spec_from_text(text);
  } catch (const SpecError& e) {
    // Pointer errors keep their "<pointer>: <problem>" form; the others get the file in front.
    if (e.pointer().empty()) throw SpecError("", fmt::format("{}: {}", shown, e.problem()));
    throw SpecError(e.pointer(), e.problem() + fmt::format(" (in {})", shown));
  }
}

json to_json(const Spec& s) {
  json targets = json::array();
  for (Target t : s.targets) targets.push_back(to_string(t));
  json reuse;
  switch (s.reuse_recompute_tapes) {
    case ReuseTapes::yes: reuse = true; break;
    case ReuseTapes::no: reuse = false; break;
    case ReuseTapes::automatic: reuse = "auto"; break;
  }
  json j{
      {"name", s.name},
      {"heads", {{"qk", s.heads_qk}, {"v", s.heads_v}}},
      {"head_dim", {{"k", s.head_dim_k}, {"v", s.head_dim_v}}},
      {"dtypes",
       {{"qkv", s.dtype_qkv},
        {"gate", s.dtype_gate},
        {"beta", s.dtype_beta},
        {"state", s.dtype_state},
        {"output", s.dtype_output}}},
      {"norm", to_string(s.norm)},
      {"scale", s.scale ? json(*s.scale) : json(nullptr)},
      {"chunk", s.chunk},
      {"save_mode", to_string(s.save_mode)},
      {"reuse_recompute_tapes", reuse},
      {"deterministic", s.determinism == Determinism::deterministic},
      {"graph", to_string(s.graph)},
      {"tensor_cores", to_string(s.tensor_cores)},
      {"walk_slab", s.walk_slab ? json(s.walk_slab) : json("auto")},
      {"walk_bwd_slab", s.walk_bwd_slab ? json(s.walk_bwd_slab) : json("auto")},
      {"forward", to_string(s.forward)},
      {"backward_w", to_string(s.backward_w)},
      {"initial_state", s.initial_state == StateFlag::present},
      {"final_state", s.final_state == StateFlag::present},
      {"targets", targets},
      {"cp", {{"ranks", s.cp_ranks}, {"segments", s.cp_segments ? json(s.cp_segments) : json("auto")}}},
  };
  // Written only when set: the canonical form of every layer without it (and so its cache and
  // graph keys) stays what it was before the field existed.
  if (s.cp_carry != SegmentCarry::automatic) j["cp"]["carry"] = to_string(s.cp_carry);
  if (s.walk_bwd_layout != WalkBwdLayout::automatic) j["walk_bwd_layout"] = to_string(s.walk_bwd_layout);
  if (s.backward_norm != BackwardNorm::automatic) j["backward_norm"] = to_string(s.backward_norm);
  return j;
}

}  // namespace gdn
