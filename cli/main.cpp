/**
 * @file main.cpp
 * @brief The gdnc command line: compile-ahead, IR and source inspection, cache management and
 *        the GPU check against the fp64 reference.
 *
 * Exit codes (docs/cli.md): 0 success; 2 usage error (an option or argument value included);
 * 3 invalid spec (a spec file that cannot be read as one included); 4 compile error; 5 cache error
 * (corrupt entry, no match); 6 no usable GPU or driver; 7 check out of tolerance; 1 other.
 * Everything the user typed or a file held is quoted through a short, escaped excerpt.
 */
#include "cache/cache.hpp"
#include "compiler/compiler.hpp"
#include "compiler/nvrtc.hpp"
#include "runtime/layer.hpp"
#include "runtime/plan.hpp"
#include "runtime/check/layer_check.hpp"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <climits>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <optional>
#include <thread>

namespace {

using namespace gdn;
using nlohmann::json;
namespace fs = std::filesystem;

enum ExitCode { kOk = 0, kOther = 1, kUsage = 2, kBadSpec = 3, kCompile = 4, kCache = 5, kNoGpu = 6, kCheckFailed = 7 };

/// A command-line value that is not acceptable; main() prints "gdnc: <option>: <problem>" and
/// exits 2.
class UsageError : public InputError {
 public:
  UsageError(std::string_view option, const std::string& problem)
      : InputError(fmt::format("{}: {}", option, problem)) {}
};

/// A whole number in [min, max], read from the text exactly: no wrapping, no clamping, no
/// trailing characters (CLI11's own conversion clamps 99999999999999999999 silently).
template <class Int>
Int whole_number(std::string_view option, const std::string& text, Int min, Int max) {
  Int value{};
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec == std::errc::result_out_of_range || (ec == std::errc() && ptr == end && (value < min || value > max)))
    throw UsageError(option, fmt::format("{} is out of range ({} to {})", printable_excerpt(text, 24), min, max));
  if (ec != std::errc() || ptr != end)
    throw UsageError(option, fmt::format("{} is not a whole number ({} to {})", printable_excerpt(text, 24), min, max));
  return value;
}

/// A finite number in [min, max] (CLI11's Range lets NaN through).
double real_number(std::string_view option, const std::string& text, double min, double max) {
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE || !std::isfinite(value) || value < min ||
      value > max)
    throw UsageError(option, fmt::format("{} is not a number from {} to {}", printable_excerpt(text, 24), min, max));
  return value;
}

std::vector<Target> parse_targets(const std::vector<std::string>& names, const Spec* spec) {
  if (names.empty()) return spec ? spec->targets : supported_targets();
  std::vector<Target> out;
  for (const auto& n : names) {
    auto t = parse_target(n);
    if (!t) {
      std::string list;
      for (Target s : supported_targets()) list += (list.empty() ? "" : ", ") + std::string(to_string(s));
      throw UsageError("--target", fmt::format("{} is not supported (supported: {})", quoted_excerpt(n), list));
    }
    // Like the spec's /targets: a target named twice is a mistake, and would compile twice.
    if (std::find(out.begin(), out.end(), *t) != out.end())
      throw UsageError("--target", fmt::format("{} is given twice", quoted_excerpt(n)));
    out.push_back(*t);
  }
  return out;
}

std::string outcome_text(cache::Outcome o) {
  switch (o) {
    case cache::Outcome::hit: return "hit";
    case cache::Outcome::built: return "built";
    case cache::Outcome::rebuilt_corrupt: return "rebuilt (corrupt)";
  }
  return "?";
}

int cmd_compile(const std::vector<std::string>& specs, const std::vector<std::string>& target_names, int jobs,
                bool as_json) {
  cache::DiskCache cache;
  json all = json::array();
  for (const auto& path : specs) {
    const Spec spec = spec_from_file(path);
    const LayerIR ir = lower(spec);
    const auto targets = parse_targets(target_names, &spec);
    for (const CompiledEntry& e : compile_layer(ir, targets, cache, jobs)) {
      if (as_json) {
        all.push_back({{"layer", e.layer},
                       {"program", e.program},
                       {"target", to_string(e.target)},
                       {"key", e.key.dir_name()},
                       {"outcome", outcome_text(e.outcome)},
                       {"seconds", e.seconds}});
        continue;
      }
      fmt::print("{:<12} {:<15} {:<8} {}  {:6.2f}s  {}{}\n", e.layer, e.program, to_string(e.target), e.key.dir_name(),
                 e.seconds, e.outcome == cache::Outcome::hit ? "[cache hit]" : outcome_text(e.outcome),
                 e.corrupt_reason.empty() ? "" : ": " + e.corrupt_reason);
    }
  }
  if (as_json) fmt::print("{}\n", all.dump(2));
  return kOk;
}

/// The code sections of a cubin (ELF64): .text.*, .nv.info*, .nv.constant*, .nv.shared* (the
/// machine code, the kernel attributes, constants and shared sizes). The line tables move with any
/// edit of a header and are left out. scripts/compare_cubins.sh selects the same sections in
/// Python (it must read the caches of older builds, which have no `gdnc digest`): keep them alike.
std::string cubin_code_sections(const std::string& elf, const fs::path& file) {
  const fs::path entry_dir = file.parent_path();
  auto fail = [&](const std::string& problem) { return cache::CacheError::corrupt(problem, file, entry_dir); };
  auto read = [&](size_t at, auto& value) {
    if (at + sizeof(value) > elf.size()) throw fail("the cubin is truncated");
    std::memcpy(&value, elf.data() + at, sizeof(value));
  };
  if (elf.size() < 64 ||
      elf.compare(0, 4,
                  "\x7f"
                  "ELF") != 0 ||
      elf[4] != 2)
    throw fail("not a 64-bit ELF cubin");
  uint64_t shoff = 0;
  uint16_t shentsize = 0, shnum = 0, shstrndx = 0;
  read(0x28, shoff);
  read(0x3A, shentsize);
  read(0x3C, shnum);
  read(0x3E, shstrndx);
  struct Section {
    uint32_t name, type;
    uint64_t offset, size;
  };
  auto section = [&](uint16_t i) {
    Section sec{};
    const size_t at = shoff + size_t{i} * shentsize;
    read(at, sec.name);
    read(at + 4, sec.type);
    read(at + 24, sec.offset);
    read(at + 32, sec.size);
    return sec;
  };
  const Section names = section(shstrndx);
  std::vector<std::pair<std::string, std::string>> kept;
  for (uint16_t i = 0; i < shnum; ++i) {
    const Section sec = section(i);
    const size_t start = names.offset + sec.name;
    const size_t end = start < elf.size() ? elf.find('\0', start) : std::string::npos;
    if (end == std::string::npos) throw fail("a section name is cut off");
    std::string name = elf.substr(start, end - start);
    if (name.rfind(".text.", 0) != 0 && name.rfind(".nv.info", 0) != 0 && name.rfind(".nv.constant", 0) != 0 &&
        name.rfind(".nv.shared", 0) != 0)
      continue;
    constexpr uint32_t kNoBits = 8;  // occupies no file bytes: only its size is its content
    if (sec.type != kNoBits && (sec.offset > elf.size() || sec.size > elf.size() - sec.offset))
      throw fail(fmt::format("section {} lies past the file", name));
    kept.emplace_back(std::move(name),
                      sec.type == kNoBits ? std::to_string(sec.size) : elf.substr(sec.offset, sec.size));
  }
  std::sort(kept.begin(), kept.end());
  std::string out;
  for (const auto& [name, bytes] : kept) {
    out += fmt::format("{} {}\n", name, bytes.size());
    out += bytes;
  }
  return out;
}

/// A call plan as text: every launch's program, parameter bytes, grid formulas and fields.
std::string plan_text(const CallPlan& plan, const LayerIR& ir) {
  auto lin = [](const Lin& l) { return fmt::format("({},{},{},{},{},{})", l.t, l.n, l.nt, l.c, l.div, l.rows); };
  auto field = [&](const Field& f) {
    const ValueSource& v = f.source;
    return fmt::format("{}+{}:{}/{}/{}/{}/{}/{}/{}", f.offset, f.size, static_cast<int>(v.kind),
                       static_cast<int>(v.frame_word), static_cast<int>(v.region), v.slot, lin(v.formula), v.value,
                       v.buffer);
  };
  std::string out = fmt::format("plan {} chunk {}\n", plan.name, plan.chunk);
  for (const auto* slots : {&plan.saved_slots, &plan.ws_slots}) {
    for (const ByteFormula& b : *slots) {
      out += b.text();
      out += ';';
    }
    out += "\n";
  }
  for (const PlannedLaunch& l : plan.launches) {
    out += fmt::format("launch {} {} {}{}{}", ir.programs.at(static_cast<size_t>(l.program)).name, l.params_size,
                       lin(l.grid[0]), lin(l.grid[1]), lin(l.grid[2]));
    for (const Field& f : l.fields) {
      out += ' ';
      out += field(f);
    }
    for (const auto& [t, f] : l.target_fields) out += fmt::format(" [{}] {}", to_string(t), field(f));
    out += "\n";
  }
  return out;
}

/// What decides the GPU work of a layer on its targets: the IR (programs, constants, buffers),
/// the call plans (launch order, grids, parameter bindings) and every program's machine code.
/// Two builds with one digest launch the same kernels the same way, whatever else they differ in
/// (comments, documentation, host tooling): a benchmark run of one is a run of the other.
std::string code_digest(const LayerIR& ir, std::vector<CompiledEntry> entries) {
  std::string all = "gdnc code digest 1\n";
  all += to_json(ir).dump();
  all += '\n';
  all += plan_text(plan_forward(ir, OutputLaunch::yes), ir);
  all += plan_text(plan_forward(ir, OutputLaunch::no), ir);
  if (ir.recompute_output_tapes) all += plan_text(plan_recompute(ir, OutputLaunch::yes), ir);
  all += plan_text(plan_backward(ir, PrepRerun::yes), ir);
  all += plan_text(plan_backward(ir, PrepRerun::no), ir);
  if (has_unsplit_plans(ir)) {
    all += plan_text(plan_forward(ir, OutputLaunch::yes, DocSplits::none), ir);
    all += plan_text(plan_forward(ir, OutputLaunch::no, DocSplits::none), ir);
    if (ir.recompute_output_tapes) all += plan_text(plan_recompute(ir, OutputLaunch::yes, DocSplits::none), ir);
    all += plan_text(plan_backward(ir, PrepRerun::yes, DocSplits::none), ir);
    all += plan_text(plan_backward(ir, PrepRerun::no, DocSplits::none), ir);
  }
  // Which plan and how many segment rows a call gets: the rule at sample sizes and bounds.
  all += "segment rows";
  for (int64_t T : {int64_t{1}, int64_t{4032}, int64_t{4033}, int64_t{8192}, int64_t{65536}, int64_t{1} << 20,
                    (int64_t{1} << 31) - 1})
    for (int64_t bound : {int64_t{0}, int64_t{3000}, int64_t{4100}, int64_t{20000}})
      all += fmt::format(" {}", segment_rows(ir, T, bound));
  all += '\n';
  if (ir.spec.cp_ranks > 1)
    for (KcpPhase phase : {KcpPhase::summaries, KcpPhase::walk}) {
      all += plan_text(plan_kcp_forward(ir, phase), ir);
      for (PrepRerun rerun : {PrepRerun::yes, PrepRerun::no}) all += plan_text(plan_kcp_backward(ir, rerun, phase), ir);
    }
  std::sort(entries.begin(), entries.end(), [](const CompiledEntry& a, const CompiledEntry& b) {
    return std::make_pair(a.program, static_cast<int>(a.target)) <
           std::make_pair(b.program, static_cast<int>(b.target));
  });
  for (const CompiledEntry& e : entries) {
    all += fmt::format("program {} {}\n", e.program, to_string(e.target));
    all += cubin_code_sections(e.entry.read_file(kCubinFile), e.entry.dir / kCubinFile);
  }
  return cache::sha256_hex(all);
}

int cmd_digest(const std::vector<std::string>& specs, const std::vector<std::string>& target_names, int jobs,
               bool as_json) {
  cache::DiskCache cache;
  json out = json::array();
  std::string combined;
  for (const auto& path : specs) {
    const Spec spec = spec_from_file(path);
    const LayerIR ir = lower(spec);
    const auto targets = parse_targets(target_names, &spec);
    const std::string digest = code_digest(ir, compile_layer(ir, targets, cache, jobs));
    std::string target_list;
    for (Target t : targets) target_list += fmt::format("{}{}", target_list.empty() ? "" : ",", to_string(t));
    combined += digest;
    if (as_json)
      out.push_back({{"spec", path}, {"layer", spec.name}, {"targets", target_list}, {"digest", digest}});
    else
      fmt::print("{}  {:<12} {}  {}\n", digest.substr(0, 16), spec.name, target_list, path);
  }
  const std::string all = cache::sha256_hex(combined).substr(0, 16);
  if (as_json)
    fmt::print("{}\n", json{{"layers", out}, {"all", all}}.dump(2));
  else
    fmt::print("{}  all\n", all);
  return kOk;
}

int cmd_ir(const std::string& path, bool as_json) {
  const LayerIR ir = lower(spec_from_file(path));
  if (as_json)
    fmt::print("{}\n", to_json(ir).dump(2));
  else
    fmt::print("{}", to_text(ir));
  return kOk;
}

int cmd_source(const std::string& path, const std::string& program, const std::string& target) {
  const Spec spec = spec_from_file(path);
  const LayerIR ir = lower(spec);
  parse_targets({target}, &spec);
  try {
    fmt::print("{}", generate_source(ir.program(program)));
  } catch (const std::out_of_range&) {
    std::string names;
    for (const auto& p : ir.programs) names += (names.empty() ? "" : ", ") + p.name;
    throw UsageError("--program", fmt::format("{} is not a program of layer '{}' (programs: {})",
                                              quoted_excerpt(program), spec.name, names));
  }
  return kOk;
}

int cmd_targets(bool as_json) {
  const auto archs = nvrtc_supported_archs();
  json j = {{"nvrtc", nvrtc_version().text()}, {"nvrtc_archs", archs}, {"gdnc", json::array()}};
  for (Target t : supported_targets()) {
    const bool ok = std::find(archs.begin(), archs.end(), target_cc(t)) != archs.end();
    j["gdnc"].push_back({{"target", to_string(t)}, {"nvrtc_supports", ok}});
  }
  if (as_json) {
    fmt::print("{}\n", j.dump(2));
    return kOk;
  }
  std::string list;
  for (int a : archs) list += fmt::format("{}sm_{}", list.empty() ? "" : " ", a);
  fmt::print("NVRTC {} targets: {}\n", nvrtc_version().text(), list);
  fmt::print("gdnc targets:\n");
  for (Target t : supported_targets()) {
    const bool ok = std::find(archs.begin(), archs.end(), target_cc(t)) != archs.end();
    fmt::print("  {:<8} {}\n", to_string(t), ok ? "supported" : "NOT supported by this NVRTC");
  }
  fmt::print(
      "  (sm_107a and other targets are not supported by gdnc{})\n",
      std::find(archs.begin(), archs.end(), 107) == archs.end() ? "; this NVRTC does not know sm_107 either" : "");
  return kOk;
}

std::string age_text(int64_t created) {
  const auto now =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  const long long s = std::max<long long>(0, now - created);
  if (s < 120) return fmt::format("{}s", s);
  if (s < 7200) return fmt::format("{}m", s / 60);
  return fmt::format("{}h", s / 3600);
}

/// obj[key] as an integer, if obj is an object holding one there: "info" is free-form and
/// entries of other format versions may have other fields.
std::optional<int64_t> integer_field(const json& obj, const char* key) {
  if (!obj.is_object()) return std::nullopt;
  const auto it = obj.find(key);
  return it == obj.end() ? std::nullopt : as_int64(*it);
}

const json& field_or_null(const json& obj, const char* key) {
  static const json null_value;
  if (!obj.is_object()) return null_value;
  const auto it = obj.find(key);
  return it == obj.end() ? null_value : *it;
}

int cmd_cache_ls(bool as_json) {
  cache::DiskCache cache;
  json arr = json::array();
  uint64_t total = 0;
  std::vector<cache::DiskCache::VerifyReport> skipped;
  auto entries = cache.list(&skipped);
  if (!as_json) fmt::print("cache {}\n", cache.root().string());
  for (const auto& e : entries) {
    const uint64_t bytes = cache::DiskCache::entry_bytes(e);
    total += bytes;
    const json& info = field_or_null(e.manifest, "info");
    const std::optional<int64_t> created = integer_field(e.manifest, "created_unix");
    if (as_json) {
      arr.push_back({{"key", e.dir.filename().string()},
                     {"bytes", bytes},
                     {"info", info},
                     {"created_unix", created ? json(*created) : json(nullptr)}});
      continue;
    }
    const std::optional<int64_t> registers = integer_field(info, "registers");
    fmt::print("  {:<64} {:>8} B  regs={:<4} age={}\n", e.dir.filename().string(), bytes,
               registers ? std::to_string(*registers) : "-", created ? age_text(*created) : "-");
  }
  if (as_json) {
    for (const auto& r : skipped)
      arr.push_back({{"key", r.dir.filename().string()}, {"damaged", true}, {"problem", r.problem}});
    fmt::print("{}\n", arr.dump(2));
    return kOk;
  }
  fmt::print("{} entries, {} bytes\n", entries.size(), total);
  for (const auto& r : skipped) fmt::print("  damaged: {}\n", r.problem);
  if (!skipped.empty())
    fmt::print("{} damaged entr{} not listed; `gdnc cache verify` checks them, `gdnc cache rm <name>` removes one\n",
               skipped.size(), skipped.size() == 1 ? "y" : "ies");
  return kOk;
}

int cmd_cache_show(const std::string& key) {
  cache::DiskCache cache;
  for (const auto& e : cache.list()) {
    const std::string name = e.dir.filename().string();
    const json& digest = field_or_null(e.manifest, "key_digest");
    if (name.starts_with(key) || (digest.is_string() && digest.get_ref<const std::string&>().starts_with(key))) {
      fmt::print("{}\n", e.manifest.dump(2));
      return kOk;
    }
  }
  fmt::print(stderr, "gdnc: no cache entry matches {} in {}\n", quoted_excerpt(key), cache.root().string());
  return kCache;
}

int cmd_cache_verify(bool as_json) {
  cache::DiskCache cache;
  int bad = 0;
  json arr = json::array();
  for (const auto& r : cache.verify()) {
    bad += !r.ok;
    if (as_json)
      arr.push_back({{"dir", r.dir.string()}, {"ok", r.ok}, {"problem", r.problem}});
    else
      fmt::print("{} {}{}\n", r.ok ? "ok     " : "CORRUPT", r.dir.string(), r.problem.empty() ? "" : ": " + r.problem);
  }
  if (as_json) fmt::print("{}\n", arr.dump(2));
  return bad ? kCache : kOk;
}

int cmd_sizes(const std::string& path, long long tokens, int docs, const std::vector<std::string>& target_names,
              bool as_json) {
  const Spec spec = spec_from_file(path);
  const LayerIR ir = lower(spec);
  // Without --target: enough on any of the spec's targets (a target may leave buffers out).
  std::optional<Target> target;
  if (!target_names.empty()) {
    if (target_names.size() > 1) throw UsageError("--target", "sizes takes one target");
    target = parse_targets(target_names, &spec).front();
    if (std::find(spec.targets.begin(), spec.targets.end(), *target) == spec.targets.end())
      throw UsageError("--target", fmt::format("{} is not among the targets of layer '{}' (/targets)",
                                               to_string(*target), spec.name));
  }
  const size_t saved = region_bytes(ir, BufferRole::saved, CallForm::forward, tokens, docs, target);
  const size_t fwd = region_bytes(ir, BufferRole::workspace, CallForm::forward, tokens, docs, target);
  const size_t bwd = region_bytes(ir, BufferRole::workspace, CallForm::backward, tokens, docs, target);
  if (as_json) {
    fmt::print("{}\n", json{{"layer", ir.spec.name},
                            {"target", target ? std::string(to_string(*target)) : std::string("any")},
                            {"tokens", tokens},
                            {"docs", docs},
                            {"saved", saved},
                            {"workspace_forward", fwd},
                            {"workspace_backward", bwd},
                            {"workspace_step", std::max(fwd, bwd)}}
                           .dump(2));
    return kOk;
  }
  fmt::print("layer {} at T={} N={}, on {}:\n", ir.spec.name, tokens, docs,
             target ? std::string(to_string(*target)) : std::string("any of its targets"));
  fmt::print("  saved (forward -> backward)   {:>14} bytes\n", saved);
  fmt::print("  workspace, forward/recompute  {:>14} bytes\n", fwd);
  fmt::print("  workspace, backward           {:>14} bytes\n", bwd);
  fmt::print("  workspace, checkpointed step  {:>14} bytes (one workspace for the whole step)\n", std::max(fwd, bwd));
  return kOk;
}

const std::vector<long long> kDefaultCheckDocs = {1, 63, 64, 65, 700, 2049};

/// Overrides of `gdnc check`'s random inputs and spec, for accuracy questions from the command line.
struct CheckOverrides {
  std::optional<double> gate;          ///< every g equal to this
  std::optional<double> beta;          ///< every beta equal to this
  std::optional<int> segments;         ///< the spec's cp.segments (0: "auto"; none: the file's)
  int ranks = 0;                       ///< the spec's cp.ranks, the single-GPU proxy (0: the file's)
  bool phases = false;                 ///< run the ranks' phases in turn instead of the proxy's one call
  std::optional<ForwardPath> forward;  ///< the spec's forward (none: the file's)
  long long max_doc_tokens = 0;        ///< ProblemShape::max_doc_tokens of the calls (0: none)
};

int cmd_check(const std::string& path, const std::vector<long long>& docs, long long tokens, int n_docs, uint64_t seed,
              bool forward_only, check::Case::Step step, bool digests, const CheckOverrides& over) {
  const bool ckpt = step != check::Case::Step::fwd_bwd;
  Spec spec = spec_from_file(path);
  if (over.segments) spec.cp_segments = *over.segments;
  if (over.ranks != 0) spec.cp_ranks = over.ranks;
  if (over.forward) spec.forward = *over.forward;
  validate(spec);  // names /cp/segments, /cp/ranks or /forward and the value before any GPU work
  if (over.phases && spec.cp_ranks <= 1)
    throw UsageError("--phases", fmt::format("layer '{}' has cp.ranks 1: give --ranks R (2 or more)", spec.name));
  if (over.phases && over.max_doc_tokens > 0)
    throw UsageError("--max-doc-tokens",
                     "not used by the ranks' phases (each runs on its own tokens): drop it or "
                     "--phases");
  std::vector<long long> lens = docs;
  if (lens.empty() && (tokens > 0 || n_docs > 0)) {
    if (tokens <= 0 || n_docs <= 0) throw UsageError("--tokens/--n-docs", "give both --tokens T and --n-docs N");
    for (int i = 0; i < n_docs; ++i) lens.push_back(tokens / n_docs + (i < tokens % n_docs ? 1 : 0));
  }
  // Neither given: a varlen batch with every chunk-boundary case (a one-token document, one a
  // token short of a chunk, exactly one chunk, one token over, and longer documents).
  if (lens.empty()) lens = kDefaultCheckDocs;
  if (spec.cp_ranks > 1) {  // the proxy's equal parts, said before any GPU work
    long long total = 0;
    for (auto l : lens) total += l;
    if (total % spec.cp_ranks != 0)
      throw UsageError("--docs", fmt::format("T: {} tokens do not split into cp.ranks {} equal parts ({} left over)",
                                             total, spec.cp_ranks, total % spec.cp_ranks));
  }
  rt::Context ctx = rt::Context::create(0);
  cache::DiskCache cache;
  auto layer = Layer::create(spec, ctx, cache);
  check::Case c;
  c.doc_lens = lens;
  c.seed = seed;
  c.backward = !forward_only;
  c.gate_value = over.gate;
  c.beta_value = over.beta;
  c.step = step;
  c.simulated_ranks = over.phases;
  c.max_doc_tokens = over.max_doc_tokens;
  const check::Report r = check::run(*layer, c);
  long long T = 0;
  for (auto l : lens) T += l;
  fmt::print(
      "layer {} on {} ({}), T={} N={} seed={}{}{}{}{}{}{}\n", spec.name, ctx.name(), to_string(layer->target()), T,
      lens.size(), seed,
      ckpt ? fmt::format(", ckpt{} (hand-off {})", step == check::Case::Step::ckpt_with_output ? " with output" : "",
                         r.handoff == HandOff::taken ? "taken" : "not taken")
           : "",
      over.gate ? fmt::format(", g={}", *over.gate) : "", over.beta ? fmt::format(", beta={}", *over.beta) : "",
      spec.cp_ranks > 1      ? fmt::format(", ranks={} ({})", spec.cp_ranks,
                                      over.phases ? "each rank's phases in turn" : "single-GPU proxy")
      : spec.cp_segments > 1 ? fmt::format(", segments={}", spec.cp_segments)
                             : "",
      layer->ir().spec.forward == ForwardPath::fused ? ", forward=fused" : "",
      over.max_doc_tokens > 0 ? fmt::format(", max_doc_tokens={}", over.max_doc_tokens) : "");
  bool ok = true;
  for (const auto& [name, err] : r.rel_rms) {
    const bool pass = err <= check::tolerance(name);
    ok &= pass;
    fmt::print("  {:<6} rel-RMS {:.3e}  (bound {:.1e})  {}\n", name, err, check::tolerance(name), pass ? "ok" : "FAIL");
  }
  // With a fixed --seed the inputs are the same on every machine, so equal digests across two
  // builds show that a change left every result bit alone.
  if (digests)
    for (const auto& [name, bytes] : r.bytes) fmt::print("  {:<6} sha256 {}\n", name, cache::sha256_hex(bytes));
  return ok ? kOk : kCheckFailed;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"gdnc: JIT kernel compiler and runtime for Gated DeltaNet training layers"};
  app.require_subcommand(1);
  app.footer(
      "Exit codes: 0 ok, 2 usage, 3 invalid spec, 4 compile error, 5 cache error, 6 no GPU, 7 check failed, 1 other.\n"
      "Cache root: $GDNC_CACHE_DIR, else $XDG_CACHE_HOME/gdnc, else ~/.cache/gdnc.");
  std::vector<std::string> specs, targets;
  // Numbers are taken as text and converted by whole_number()/real_number() after parsing.
  std::string jobs = std::to_string(std::max(1u, std::thread::hardware_concurrency()));
  bool as_json = false;
  auto* compile = app.add_subcommand("compile", "Compile every program of the specs for their targets into the cache");
  compile->add_option("spec", specs, "layer spec files (JSON)")->required()->check(CLI::ExistingFile);
  compile->add_option("--target", targets, "target(s) to build (default: the spec's targets)");
  compile->add_option("--jobs,-j", jobs, "parallel NVRTC compiles (1 to 1024)");
  compile->add_flag("--json", as_json, "machine-readable output");

  auto* digest = app.add_subcommand(
      "digest",
      "Print a digest of what decides each layer's GPU work: IR, call plans, machine code (compiles if needed)");
  digest->add_option("spec", specs, "layer spec files (JSON)")->required()->check(CLI::ExistingFile);
  digest->add_option("--target", targets, "target(s) (default: the spec's targets)");
  digest->add_option("--jobs,-j", jobs, "parallel NVRTC compiles (1 to 1024)");
  digest->add_flag("--json", as_json, "machine-readable output");

  std::string spec_path, program, target = "sm_90a";
  auto* ir = app.add_subcommand("ir", "Print the kernel IR of a spec");
  ir->add_option("spec", spec_path, "layer spec file")->required()->check(CLI::ExistingFile);
  ir->add_flag("--json", as_json, "print JSON instead of text");

  auto* source = app.add_subcommand("source", "Print the generated CUDA source of one program");
  source->add_option("spec", spec_path, "layer spec file")->required()->check(CLI::ExistingFile);
  source->add_option("--program", program, "program name (see gdnc ir)")->required();
  source->add_option("--target", target, "target");

  auto* targets_cmd = app.add_subcommand("targets", "List the targets of this NVRTC and of gdnc");
  targets_cmd->add_flag("--json", as_json, "machine-readable output");

  auto* cache_cmd = app.add_subcommand("cache", "Inspect and manage the kernel cache");
  cache_cmd->require_subcommand(1);
  auto* ls = cache_cmd->add_subcommand("ls", "List entries");
  ls->add_flag("--json", as_json, "machine-readable output");
  std::string key;
  auto* show = cache_cmd->add_subcommand("show", "Print one entry's manifest");
  show->add_option("key", key, "entry name or digest prefix")->required();
  auto* verify = cache_cmd->add_subcommand("verify", "Check every entry's files against its manifest");
  verify->add_flag("--json", as_json, "machine-readable output");
  auto* rm = cache_cmd->add_subcommand("rm", "Remove entries whose name or digest starts with KEY");
  rm->add_option("key", key, "entry name or digest prefix (>= 6 characters)")->required();
  std::string max_bytes;
  auto* gc = cache_cmd->add_subcommand("gc", "Remove least recently used entries until the cache fits");
  gc->add_option("--max-bytes", max_bytes, "size bound in bytes (0 to 2^64-1)")->required();

  std::vector<std::string> docs;
  std::string tokens, size_docs;
  auto* sizes = app.add_subcommand("sizes", "Print the saved and workspace bytes a layer needs (no GPU)");
  sizes->add_option("spec", spec_path, "layer spec file")->required()->check(CLI::ExistingFile);
  sizes->add_option("--tokens", tokens, "total tokens T (1 to 2^31-1)")->required();
  sizes->add_option("--docs", size_docs, "documents N (1 to 65535)")->required();
  sizes->add_option("--target", targets, "the target a layer is loaded for (default: enough on any of the spec's)");
  sizes->add_flag("--json", as_json, "machine-readable output");
  std::string n_docs, seed = std::to_string(std::time(nullptr));
  bool forward_only = false, ckpt = false, ckpt_output = false, digests = false;
  auto* check_cmd = app.add_subcommand("check", "Run the layer on the GPU on random inputs against the fp64 reference");
  check_cmd->add_option("spec", spec_path, "layer spec file")->required()->check(CLI::ExistingFile);
  check_cmd->add_option("--docs", docs, "document lengths (default 1,63,64,65,700,2049)")->delimiter(',');
  check_cmd->add_option("--tokens", tokens, "total tokens (with --n-docs)");
  check_cmd->add_option("--n-docs", n_docs, "documents of about equal length");
  check_cmd->add_option("--seed", seed, "random seed (default: the time)");
  check_cmd->add_flag("--forward-only", forward_only, "skip the backward");
  check_cmd->add_flag("--ckpt", ckpt, "run the checkpointed step: forward, recompute, backward on one workspace");
  check_cmd
      ->add_flag("--ckpt-output", ckpt_output,
                 "the checkpointed step whose recompute writes the output again (torch.utils.checkpoint's)")
      ->excludes("--ckpt");
  check_cmd->add_flag("--digests", digests,
                      "also print the SHA-256 of every result's bytes (compare builds bit for bit)");
  std::string gate, beta, segments, ranks, forward, max_doc_tokens;
  check_cmd->add_option("--gate", gate,
                        "every g equal to this log decay (-10000 to 0; e.g. 0: no decay, -20), instead of random");
  check_cmd->add_option("--beta", beta, "every beta equal to this (0 to 1), instead of random");
  check_cmd->add_option("--segments", segments, "the spec's cp.segments (1 to 64 or auto), instead of the file's");
  check_cmd->add_option("--ranks", ranks,
                        "the spec's cp.ranks (the single-GPU proxy of context parallelism), instead of the file's");
  check_cmd->add_option("--forward", forward, "the spec's forward (programs, fused or auto), instead of the file's");
  check_cmd->add_option("--max-doc-tokens", max_doc_tokens,
                        "the calls' bound on every document's tokens (ProblemShape::max_doc_tokens; a longer document "
                        "is reported by the device check)");
  bool phases = false;
  check_cmd->add_flag("--phases", phases,
                      "with cp.ranks > 1: run every rank's KCP phases in turn on this GPU (each on its own tokens, "
                      "the records gathered in one buffer) instead of the proxy's one call");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    // CLI11 quotes what was typed whole; a 10 MB argument or an escape sequence must not reach the terminal.
    fmt::print(stderr, "gdnc: {}\nRun with --help for more information.\n", printable_excerpt(e.what(), 400));
    return kUsage;
  }
  constexpr long long kMaxTokens = (1LL << 31) - 1;
  try {
    if (*compile) return cmd_compile(specs, targets, whole_number<int>("--jobs", jobs, 1, 1024), as_json);
    if (*digest) return cmd_digest(specs, targets, whole_number<int>("--jobs", jobs, 1, 1024), as_json);
    if (*ir) return cmd_ir(spec_path, as_json);
    if (*source) return cmd_source(spec_path, program, target);
    if (*targets_cmd) return cmd_targets(as_json);
    if (*ls) return cmd_cache_ls(as_json);
    if (*show) return cmd_cache_show(key);
    if (*verify) return cmd_cache_verify(as_json);
    if (*rm) {
      const size_t n = cache::DiskCache().remove(key);
      fmt::print("removed {} entr{}\n", n, n == 1 ? "y" : "ies");
      return kOk;
    }
    if (*gc) {
      const auto removed = cache::DiskCache().gc(whole_number<uint64_t>("--max-bytes", max_bytes, 0, UINT64_MAX));
      for (const auto& p : removed) fmt::print("removed {}\n", p.string());
      fmt::print("removed {} entries\n", removed.size());
      return kOk;
    }
    if (*sizes)
      return cmd_sizes(spec_path, whole_number<long long>("--tokens", tokens, 1, kMaxTokens),
                       whole_number<int>("--docs", size_docs, 1, 65535), targets, as_json);
    if (*check_cmd) {
      std::vector<long long> lens;
      for (const auto& d : docs) lens.push_back(whole_number<long long>("--docs", d, 1, kMaxTokens));
      CheckOverrides over;
      if (!gate.empty()) over.gate = real_number("--gate", gate, -1e4, 0.0);
      if (!beta.empty()) over.beta = real_number("--beta", beta, 0.0, 1.0);
      if (segments == "auto")
        over.segments = 0;
      else if (!segments.empty()) {
        over.segments = whole_number<int>("--segments", segments, INT_MIN, INT_MAX);
        if (*over.segments == 0) throw UsageError("--segments", "0 is not a number of segments (give 1 to 64 or auto)");
      }
      if (!ranks.empty()) over.ranks = whole_number<int>("--ranks", ranks, INT_MIN, INT_MAX);
      over.phases = phases;
      if (!max_doc_tokens.empty())
        over.max_doc_tokens = whole_number<long long>("--max-doc-tokens", max_doc_tokens, 1, kMaxTokens);
      if (forward == "programs")
        over.forward = ForwardPath::programs;
      else if (forward == "fused")
        over.forward = ForwardPath::fused;
      else if (forward == "auto")
        over.forward = ForwardPath::automatic;
      else if (!forward.empty())
        throw UsageError("--forward", fmt::format("{} is not supported (supported: programs, fused, auto)",
                                                  printable_excerpt(forward, 40)));
      return cmd_check(spec_path, lens, tokens.empty() ? 0 : whole_number<long long>("--tokens", tokens, 1, kMaxTokens),
                       n_docs.empty() ? 0 : whole_number<int>("--n-docs", n_docs, 1, 65535),
                       whole_number<uint64_t>("--seed", seed, 0, UINT64_MAX), forward_only,
                       ckpt          ? check::Case::Step::ckpt
                       : ckpt_output ? check::Case::Step::ckpt_with_output
                                     : check::Case::Step::fwd_bwd,
                       digests, over);
    }
  } catch (const SpecError& e) {
    fmt::print(stderr, "gdnc: invalid spec: {}\n", e.what());
    return kBadSpec;
  } catch (const CompileError& e) {
    fmt::print(stderr, "gdnc: {}\n", e.what());
    return kCompile;
  } catch (const cache::CacheError& e) {
    fmt::print(stderr, "gdnc: {}\n", e.what());
    return kCache;
  } catch (const rt::DriverError& e) {
    fmt::print(stderr, "gdnc: {}\n", e.what());
    return kNoGpu;
  } catch (const InputError& e) {
    fmt::print(stderr, "gdnc: {}\n", e.what());
    return kUsage;
  } catch (const std::exception& e) {
    fmt::print(stderr, "gdnc: {}\n", e.what());
    return kOther;
  }
  return kOther;
}
