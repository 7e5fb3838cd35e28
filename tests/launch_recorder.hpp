/**
 * @file launch_recorder.hpp
 * @brief A Launcher that records launches instead of running them, and a readable rendering of
 *        the records with pointers shown as region+offset, for launch-sequence tests on the CPU.
 */
#pragma once

#include "runtime/layer.hpp"

#include <fmt/format.h>

#include <cstring>
#include <string>
#include <vector>

namespace gdn::testing {

struct LaunchRecord {
  std::string program;
  rt::dim3_t grid;
  int threads;
  int smem;
  std::string params;  ///< the parameter block's bytes
  CUstream stream;
};

class RecordingLauncher final : public Launcher {
 public:
  std::vector<LaunchRecord> records;
  void launch(const Program& p, rt::dim3_t grid, const void* params, size_t size, CUstream stream) override {
    records.push_back(
        {p.name, grid, p.threads, p.smem_bytes, std::string(static_cast<const char*>(params), size), stream});
  }
};

/// Named address ranges used to print pointers symbolically.
struct Region {
  std::string name;
  uint64_t base;
  uint64_t size;
};

inline std::string render(const std::vector<LaunchRecord>& records, const std::vector<Region>& regions) {
  std::string out;
  for (const auto& r : records) {
    out += fmt::format("{} grid=({}, {}, {}) threads={} smem={}\n", r.program, r.grid.x, r.grid.y, r.grid.z, r.threads,
                       r.smem);
    for (size_t off = 0; off < r.params.size(); off += 8) {
      uint64_t w = 0;
      std::memcpy(&w, r.params.data() + off, std::min<size_t>(8, r.params.size() - off));
      std::string text = fmt::format("0x{:x}", w);
      for (const Region& g : regions)  // the first (most specific) match names the pointer
        if (w >= g.base && w < g.base + g.size) {
          text = w == g.base ? g.name : fmt::format("{}+{}", g.name, w - g.base);
          break;
        }
      out += fmt::format("  [{:3}] {}\n", off, text);
    }
  }
  return out;
}

}  // namespace gdn::testing
