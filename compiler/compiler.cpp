/**
 * @file compiler.cpp
 * @brief Parallel compile-through-cache of a layer's programs.
 */
#include "compiler/compiler.hpp"

#include "compiler/nvrtc.hpp"
#include "compiler/templates.hpp"

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <mutex>
#include <thread>

namespace gdn {

using nlohmann::json;

cache::Key program_key(const Program& p, Target t) {
  json constants = json::object();
  for (const auto& [k, v] : p.constants) constants[k] = v;
  const NvrtcVersion nv = nvrtc_version();
  json inputs = {
      {"program", p.name},
      {"entry", p.entry()},
      {"template", p.template_path},
      {"constants", constants},
      {"threads", p.threads},
      {"min_blocks_per_sm", p.min_blocks_per_sm},
      {"max_registers", p.max_registers},
      {"templates_sha256", templates_digest(p.template_path)},
      {"source_sha256", cache::sha256_hex(generate_source(p))},
      {"target", to_string(t)},
      {"nvrtc", nv.text()},
      {"options", nvrtc_options(t)},
      {"codegen_version", kCodegenVersion},
  };
  return cache::make_key(std::move(inputs), fmt::format("{}.{}.nvrtc{}", p.name, to_string(t), nv.text()));
}

std::vector<CompiledEntry> compile_layer(const LayerIR& ir, const std::vector<Target>& targets, cache::DiskCache& cache,
                                         int jobs) {
  struct Work {
    const Program* program;
    Target target;
  };
  std::vector<Work> work;
  for (Target t : targets)
    for (const Program& p : ir.programs)
      if (!p.idle_for(t)) work.push_back({&p, t});
  std::vector<CompiledEntry> results(work.size());
  std::atomic<size_t> next{0};
  std::mutex error_mutex;
  std::exception_ptr first_error;
  auto worker = [&] {
    for (size_t i; (i = next.fetch_add(1)) < work.size();) {
      {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (first_error) return;
      }
      try {
        const Program& p = *work[i].program;
        const Target t = work[i].target;
        const auto start = std::chrono::steady_clock::now();
        cache::Key key = program_key(p, t);
        cache::Fetched f = cache.get_or_build(key, [&] {
          CompiledProgram c = nvrtc_compile(p, t, generate_source(p));
          cache::BuildResult b;
          b.files.push_back({kCubinFile, std::move(c.cubin)});
          b.files.push_back({"source.cu", generate_source(p)});
          b.info = {{"entry", p.entry()},
                    {"threads", p.threads},
                    {"dynamic_smem_bytes", p.smem_bytes},
                    {"registers", c.registers},
                    {"spill_store_bytes", c.spill_store_bytes},
                    {"static_smem_bytes", c.static_smem_bytes},
                    {"layer", ir.spec.name},
                    {"ptxas_log", c.log}};
          return b;
        });
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        results[i] = CompiledEntry{ir.spec.name, p.name,           t,    std::move(key),
                                   f.outcome,    f.corrupt_reason, secs, std::move(f.entry)};
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!first_error) first_error = std::current_exception();
        return;
      }
    }
  };
  const int n = std::max(1, std::min<int>(jobs, static_cast<int>(work.size())));
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) threads.emplace_back(worker);
  for (auto& th : threads) th.join();
  if (first_error) std::rethrow_exception(first_error);
  return results;
}

}  // namespace gdn
