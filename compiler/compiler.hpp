/**
 * @file compiler.hpp
 * @brief From IR to cached cubins: cache keys, parallel compiles, and the manifest info.
 */
#pragma once

#include "cache/cache.hpp"
#include "compiler/ir.hpp"

#include <string>
#include <vector>

namespace gdn {

/// Version of everything gdnc puts into a cache key besides the template text; bump it when the
/// generated source or the parameter ABI changes in a way the key would not see.
inline constexpr int kCodegenVersion = 1;

/// The key of one (program, target): the program's constants, the template text it includes,
/// the target, the NVRTC version and options, the generated source and the format versions.
cache::Key program_key(const Program&, Target);

struct CompiledEntry {
  std::string layer;
  std::string program;
  Target target;
  cache::Key key;
  cache::Outcome outcome;
  std::string corrupt_reason;
  double seconds = 0;
  cache::Entry entry;
};

/// Compiles (or finds in the cache) every program of `ir` for every target in `targets`, with
/// at most `jobs` compiles at once. Throws CompileError for the first program that fails.
std::vector<CompiledEntry> compile_layer(const LayerIR& ir, const std::vector<Target>& targets, cache::DiskCache& cache,
                                         int jobs);

/// The file name of the cubin inside a cache entry.
inline constexpr const char* kCubinFile = "program.cubin";

}  // namespace gdn
