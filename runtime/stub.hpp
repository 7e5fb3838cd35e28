/**
 * @file stub.hpp
 * @brief LLVM ORC host stubs: a call plan compiled into one native function that computes the
 *        region offsets and grids from T and N, packs every parameter block and calls the launch
 *        entry point of an explicit table, with no per-field interpretation at call time.
 *
 * The stub reaches the runtime only through the StubRuntime table passed to it (no process
 * symbol search). Its launches are byte-identical to run_plan()'s; tests compare the two.
 */
#pragma once

#include "runtime/plan.hpp"

#include <memory>
#include <string>

namespace gdn {

/// The entry points a stub calls, passed as its second argument.
struct StubRuntime {
  void (*launch)(void* ctx, int32_t program, uint32_t gx, uint32_t gy, uint32_t gz, const void* params,
                 uint32_t params_size, uint64_t stream);
  void* ctx;
};

using StubFn = void (*)(const uint64_t* frame, const StubRuntime* runtime);

/// Owns one LLJIT instance and the stubs compiled into it; stubs live as long as this object.
class StubCompiler {
 public:
  /// Throws std::runtime_error if this gdnc was built without LLVM or the JIT cannot start.
  static std::unique_ptr<StubCompiler> create();
  virtual ~StubCompiler() = default;
  /// Compiles `plan` into a function named `symbol` (unique per compiler).
  virtual StubFn compile(const CallPlan& plan, const std::string& symbol) = 0;
  /// The LLVM IR text of the stub for `plan` (for inspection and tests).
  virtual std::string ir_text(const CallPlan& plan, const std::string& symbol) = 0;
};

/// Whether this build has LLVM (GDN_WITH_LLVM).
bool stubs_available();

/// Runs a compiled stub with `launcher` behind the runtime table.
void run_stub(StubFn stub, const LayerIR& ir, const CallFrame& frame, Launcher& launcher);

}  // namespace gdn
