/**
 * @file tests/cache_stress_main.cpp
 * @brief `gdn_cache_stress ROOT KEYNAME`: one get_or_build() on a fixed key, for the
 *        multi-process test in tests/test_cache.cpp.
 *
 * build() sleeps 200 ms so that concurrently started processes really overlap on the
 * per-key lock. Prints exactly one word on stdout: "built", "hit" or "rebuilt_corrupt".
 * Exit status 0 on success, 1 on any exception (message on stderr), 2 on bad usage.
 */
#include <chrono>
#include <cstdio>
#include <exception>
#include <thread>

#include "cache/cache.hpp"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s ROOT KEYNAME\n", argc > 0 ? argv[0] : "gdn_cache_stress");
    return 2;
  }
  try {
    namespace gc = gdn::cache;
    gc::DiskCache cache{std::filesystem::path(argv[1])};
    const gc::Key key = gc::make_key({{"name", argv[2]}, {"purpose", "stress"}}, argv[2]);
    const gc::Fetched f = cache.get_or_build(key, [&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      return gc::BuildResult{{{"program.cubin", std::string(4096, 'x')}}, {{"entry", "stress"}}};
    });
    const char* word = f.outcome == gc::Outcome::hit     ? "hit"
                       : f.outcome == gc::Outcome::built ? "built"
                                                         : "rebuilt_corrupt";
    std::printf("%s\n", word);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gdn_cache_stress: %s\n", e.what());
    return 1;
  }
}
