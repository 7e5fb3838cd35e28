/**
 * @file launcher.hpp
 * @brief Where a layer's launches go: the device, or a recorder in CPU tests. The call plans'
 *        executors (the interpreter in plan.cpp, the LLVM host stubs in stub.cpp) only need this.
 */
#pragma once

#include "compiler/ir.hpp"
#include "runtime/driver.hpp"

#include "params.cuh"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace gdn {

/// One tensor map a launch needs: an entry of Program::tensor_maps with its pointer and row count
/// read from the launch's parameter block.
struct TensorMapRequest {
  std::string name;
  const void* base = nullptr;
  int64_t rows = 0;
  int64_t row_elements = 0;
  uint32_t box_rows = 64;
};

/// The tensor maps `program` declares, read from its parameter block (`params_size` bytes). Throws
/// std::logic_error when an offset lies outside the block.
std::vector<TensorMapRequest> tensor_map_requests(const Program& program, const void* params, size_t params_size);

/// The entry's second argument on sm_90a: each request encoded for its boxes to and from SW128
/// tiles (rt::encode_bf16_sw128_map), the unused maps zero.
TensorMaps encode_tensor_maps(const Program& program, const void* params, size_t params_size);

class Launcher {
 public:
  virtual ~Launcher() = default;
  /// Launches `program` with one by-value parameter block of `params_size` bytes.
  virtual void launch(const Program& program, rt::dim3_t grid, const void* params, size_t params_size,
                      CUstream stream) = 0;
};

}  // namespace gdn
