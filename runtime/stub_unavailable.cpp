/**
 * @file stub_unavailable.cpp
 * @brief The host-stub entry points of a build without LLVM: layers use the interpreted path.
 */
#include "runtime/stub.hpp"

#include <stdexcept>

namespace gdn {

bool stubs_available() { return false; }

std::unique_ptr<StubCompiler> StubCompiler::create() {
  throw std::runtime_error(
      "this gdnc was built without LLVM (GDN_WITH_LLVM=OFF): host stubs are unavailable; "
      "layers run their call plans with the interpreter");
}

void run_stub(StubFn, const LayerIR&, const CallFrame&, Launcher&) {
  throw std::runtime_error("this gdnc was built without LLVM (GDN_WITH_LLVM=OFF): no host stub to run");
}

}  // namespace gdn
