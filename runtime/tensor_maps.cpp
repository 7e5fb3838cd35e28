/**
 * @file tensor_maps.cpp
 * @brief The TMA tensor maps of a launch (Program::tensor_maps), read from its parameter block and
 *        encoded by the driver.
 */
#include "runtime/launcher.hpp"

#include <fmt/format.h>

#include <cstring>
#include <stdexcept>

namespace gdn {

namespace {

template <class T>
T read_field(const void* params, size_t params_size, uint32_t offset, const Program& program, const std::string& name) {
  if (size_t{offset} + sizeof(T) > params_size)
    throw std::logic_error(fmt::format("program '{}': tensor map {} reads bytes {}..{} of a {}-byte parameter block",
                                       program.name, name, offset, offset + sizeof(T), params_size));
  T value;
  std::memcpy(&value, static_cast<const unsigned char*>(params) + offset, sizeof(T));
  return value;
}

}  // namespace

std::vector<TensorMapRequest> tensor_map_requests(const Program& program, const void* params, size_t params_size) {
  std::vector<TensorMapRequest> out;
  out.reserve(program.tensor_maps.size());
  for (const TensorMapOperand& m : program.tensor_maps) {
    TensorMapRequest r;
    r.name = m.name;
    r.base = read_field<const void*>(params, params_size, m.pointer_offset, program, m.name);
    const int64_t units = m.rows_field_bytes == 4
                              ? read_field<int32_t>(params, params_size, m.rows_offset, program, m.name)
                              : read_field<int64_t>(params, params_size, m.rows_offset, program, m.name);
    r.rows = units * m.rows_per_unit;
    r.row_elements = m.row_elements;
    r.box_rows = m.box_rows;
    out.push_back(std::move(r));
  }
  return out;
}

TensorMaps encode_tensor_maps(const Program& program, const void* params, size_t params_size) {
  static_assert(sizeof(CUtensorMap) == sizeof(TensorMap) && alignof(TensorMap) >= 64,
                "TensorMap holds the bytes of the driver's CUtensorMap at the 64-byte alignment TMA needs");
  TensorMaps maps{};
  const std::vector<TensorMapRequest> requests = tensor_map_requests(program, params, params_size);
  if (requests.size() > static_cast<size_t>(kMaxTensorMaps))
    throw std::logic_error(
        fmt::format("program '{}': {} tensor maps, at most {}", program.name, requests.size(), kMaxTensorMaps));
  for (size_t i = 0; i < requests.size(); ++i) {
    const TensorMapRequest& r = requests[i];
    const CUtensorMap map =
        rt::encode_bf16_sw128_map(r.base, static_cast<uint64_t>(r.rows), static_cast<uint64_t>(r.row_elements), 64,
                                  r.box_rows, fmt::format("{} of program '{}'", r.name, program.name));
    std::memcpy(&maps.map[i], &map, sizeof map);
  }
  return maps;
}

}  // namespace gdn
