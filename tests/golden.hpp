/**
 * @file golden.hpp
 * @brief Golden-file comparison shared by the tests: UPDATE_GOLDENS=1 rewrites instead of
 *        comparing (then review the diff and commit it).
 */
#pragma once

#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace gdn::testing {

inline void check_golden(const std::string& name, const std::string& got) {
  const std::filesystem::path path = std::filesystem::path(GDN_SOURCE_DIR) / "tests/goldens" / name;
  if (const char* u = std::getenv("UPDATE_GOLDENS"); u && std::string(u) == "1") {
    std::ofstream(path) << got;
    MESSAGE("rewrote " << path.string() << ": review and commit it");
    return;
  }
  std::ifstream in(path);
  REQUIRE_MESSAGE(in.good(), "missing golden " << path.string() << " (run with UPDATE_GOLDENS=1)");
  std::stringstream s;
  s << in.rdbuf();
  CHECK(s.str() == got);
}

}  // namespace gdn::testing
