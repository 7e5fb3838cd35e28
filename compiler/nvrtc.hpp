/**
 * @file nvrtc.hpp
 * @brief NVRTC behind value types: one compile per (program, target), failures as data.
 */
#pragma once

#include "common/error.hpp"
#include "compiler/ir.hpp"

#include <stdexcept>
#include <string>
#include <vector>

namespace gdn {

struct NvrtcVersion {
  int major = 0;
  int minor = 0;
  std::string text() const;
};
NvrtcVersion nvrtc_version();
/// The SM numbers this NVRTC can target (nvrtcGetSupportedArchs), e.g. 75 ... 121.
std::vector<int> nvrtc_supported_archs();

/// The NVRTC options of one compile, in canonical order (they are part of the cache key).
std::vector<std::string> nvrtc_options(Target);

/// A compile failure: the NVRTC log, the options, the target and where the generated source was
/// written so the user can reproduce it.
class CompileError : public Error {
 public:
  CompileError(std::string program, Target target, std::string log, std::vector<std::string> options,
               std::string source_path);
  const std::string& program() const noexcept { return program_; }
  Target target() const noexcept { return target_; }
  const std::string& log() const noexcept { return log_; }
  const std::vector<std::string>& options() const noexcept { return options_; }
  const std::string& source_path() const noexcept { return source_path_; }

 private:
  std::string program_;
  Target target_;
  std::string log_;
  std::vector<std::string> options_;
  std::string source_path_;
};

struct CompiledProgram {
  std::string cubin;
  std::string log;             ///< ptxas -v output
  int registers = -1;          ///< per thread: the most any function of the program uses (ptxas -v)
  int spill_store_bytes = -1;  ///< summed over the kernel and every function it calls
  int static_smem_bytes = -1;
};

/// Reads ptxas -v output. It has one block per function: the kernel's, then one per function
/// the kernel calls (a __noinline__ one), each with its own registers and spills; the first
/// block alone hides a callee's spills. -1 when the log has no such line.
namespace ptxas {
int registers(const std::string& log);          ///< the largest "Used N registers"
int spill_store_bytes(const std::string& log);  ///< the sum of "N bytes spill stores"
}  // namespace ptxas

/// The generated translation unit: includes the template and instantiates it with the IR's
/// constants behind one extern "C" kernel named program.entry().
std::string generate_source(const Program&);

/// Compiles `source` for `target` with every embedded template available as a header.
/// Throws CompileError on failure (the source is written to a temporary file first).
CompiledProgram nvrtc_compile(const Program&, Target, const std::string& source);

}  // namespace gdn
