/**
 * @file fuzz/fuzz_manifest.cpp
 * @brief libFuzzer target: the cache's manifest reader, through the public DiskCache calls that
 *        read one (find, verify, list, remove, Entry::read_file), on a real entry directory.
 *
 * A mutated manifest almost never keeps a matching manifest_sha256, which would stop every run at
 * the integrity check. So when the first byte is odd and the rest parses as a JSON object, the
 * target signs it again, as someone who knows the format would, and the schema checks behind the
 * integrity check get fuzzed too. Every refusal must be a miss, a report or a CacheError with a
 * bounded message; any other exception escapes and libFuzzer reports it.
 */
#include "cache/cache.hpp"
#include "common/json_input.hpp"

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const std::string kArtifact = "cubin bytes";

struct Fixture {
  fs::path root;
  gdn::cache::Key key;
  fs::path entry;

  Fixture() {
    // GDNC_FUZZ_DIR: a fixed directory (scripts/fuzz.sh gives one), so the paths in messages, and
    // with them the comparisons libFuzzer learns from, are the same on every run. Else a fresh
    // one on tmpfs where there is one: every run rewrites the entry, and a disk makes that the cost.
    if (const char* dir = std::getenv("GDNC_FUZZ_DIR"); dir && *dir) {
      root = dir;
      clear_cache_dirs();
      fs::create_directories(root);
    } else {
      std::string pattern =
          fs::is_directory("/dev/shm") ? "/dev/shm/gdn_fuzz_manifest.XXXXXX" : "/tmp/gdn_fuzz_manifest.XXXXXX";
      if (!::mkdtemp(pattern.data())) std::abort();
      root = pattern;
    }
    key = gdn::cache::make_key({{"program", "fuzz"}}, "fuzz");
    entry = root / "entries" / key.dir_name();
  }
  ~Fixture() {
    clear_cache_dirs();
    std::error_code ec;
    fs::remove(root, ec);  // only if nothing else is in it
  }
  /// The cache's own folders only: GDNC_FUZZ_DIR may name a directory that holds more.
  void clear_cache_dirs() const {
    std::error_code ec;
    for (const char* sub : {"entries", "locks", "tmp"}) fs::remove_all(root / sub, ec);
  }
};

Fixture& fixture() {
  static Fixture f;
  return f;
}

/// Puts the entry directory back with the artifact and @p manifest (a remove() or a repair may
/// have taken it away in the run before).
void write_entry(const std::string& manifest) {
  const Fixture& f = fixture();
  fs::create_directories(f.entry);
  std::ofstream(f.entry / "program.cubin", std::ios::binary | std::ios::trunc) << kArtifact;
  std::ofstream(f.entry / "manifest.json", std::ios::binary | std::ios::trunc) << manifest;
}

void check_message(const std::string& message) {
  if (message.size() > 8192) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string manifest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] & 1) {
    try {
      json m = gdn::parse_bounded_json(manifest, {1 << 20, 32});
      if (m.is_object()) {
        m.erase("manifest_sha256");
        m["manifest_sha256"] = gdn::cache::sha256_hex(m.dump());
        manifest = m.dump(2);
      }
    } catch (const gdn::JsonInputError&) {
      // Not JSON: written as it is, for the reader to refuse.
    }
  }
  write_entry(manifest);
  gdn::cache::DiskCache cache(fixture().root);
  std::string why;
  if (auto hit = cache.find(fixture().key, &why)) {
    if (hit->read_file("program.cubin") != kArtifact) __builtin_trap();
  } else {
    check_message(why);
  }
  for (const auto& report : cache.verify()) check_message(report.problem);
  std::vector<gdn::cache::DiskCache::VerifyReport> skipped;
  for (const gdn::cache::Entry& e : cache.list(&skipped)) {
    try {
      (void)e.read_file("program.cubin");
    } catch (const gdn::cache::CacheError& err) {
      check_message(err.what());
    }
  }
  for (const auto& report : skipped) check_message(report.problem);
  if (data[0] & 2) {  // one run in two: removing and recreating the directory is the slow part
    try {
      cache.remove(fixture().key.digest.substr(0, 40));  // matches only through an intact manifest's digest
    } catch (const gdn::cache::CacheError& err) {
      check_message(err.what());
    }
  }
  return 0;
}
