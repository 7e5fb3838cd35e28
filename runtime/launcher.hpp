/**
 * @file launcher.hpp
 * @brief Where a layer's launches go: the device, or a recorder in CPU tests. The call plans'
 *        executors (the interpreter in plan.cpp, the LLVM host stubs in stub.cpp) only need this.
 */
#pragma once

#include "compiler/ir.hpp"
#include "runtime/driver.hpp"

#include <cstddef>

namespace gdn {

class Launcher {
 public:
  virtual ~Launcher() = default;
  /// Launches `program` with one by-value parameter block of `params_size` bytes.
  virtual void launch(const Program& program, rt::dim3_t grid, const void* params, size_t params_size,
                      CUstream stream) = 0;
};

}  // namespace gdn
