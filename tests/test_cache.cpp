/**
 * @file tests/test_cache.cpp
 * @brief doctest suite "cache": keys, verified lookup, corruption repair, list/verify/rm/gc,
 *        and concurrent get_or_build() from threads and from processes.
 *
 * Every test works in its own fresh directory under temp_directory_path(). The
 * multi-process test needs the gdn_cache_stress executable, found through the environment
 * variable GDNC_CACHE_STRESS_EXE, and is skipped with a message when that is unset.
 */
#include <doctest/doctest.h>

#include <unistd.h>

#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/env.hpp"
#include "cache/cache.hpp"

namespace {
namespace fs = std::filesystem;
namespace gc = gdn::cache;
using nlohmann::json;

/// A fresh directory per test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = fs::temp_directory_path() / ("gdn_cache_test." + std::to_string(::getpid()) + "." + std::to_string(rd()));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

/// Sets or unsets an environment variable for one scope, restoring the old value after.
class EnvGuard {
 public:
  EnvGuard(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    value ? ::setenv(name, value, 1) : ::unsetenv(name);
  }
  ~EnvGuard() { old_ ? ::setenv(name_, old_->c_str(), 1) : ::unsetenv(name_); }
  EnvGuard(const EnvGuard&) = delete;
  EnvGuard& operator=(const EnvGuard&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

size_t count_children(const fs::path& dir) {
  if (!fs::exists(dir)) return 0;
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++n;
  return n;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void spit(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << bytes;
}

const std::string kCubin = std::string(
                               "\x7f"
                               "ELF",
                               4) +
                           std::string(1000, '\x5a');

gc::Key sample_key(const std::string& variant = "fwd") {
  return gc::make_key(
      {{"spec", {{"heads", 16}, {"head_dim", 128}, {"variant", variant}}}, {"arch", "sm_90a"}, {"nvrtc", "13.0.48"}},
      "m_layer." + variant + ".sm_90a");
}

/// Edits a published manifest and signs it again, as someone who knows the format would: only
/// the schema check stands between such a manifest and a hit.
void rewrite_signed(const fs::path& manifest, const std::function<void(json&)>& edit) {
  json m = json::parse(slurp(manifest));
  edit(m);
  m.erase("manifest_sha256");
  m["manifest_sha256"] = gc::sha256_hex(m.dump());
  spit(manifest, m.dump(2));
}

/// A build callback that counts its calls.
struct CountingBuild {
  int calls = 0;
  std::string cubin = kCubin;
  gc::BuildResult operator()() {
    ++calls;
    return {{{"program.cubin", cubin}, {"source.cu", "extern \"C\" __global__ void k() {}\n"}},
            {{"entries", {"k"}}, {"registers", 96}, {"shared_bytes", 49152}}};
  }
  std::function<gc::BuildResult()> fn() {
    return [this] { return (*this)(); };
  }
};

}  // namespace

TEST_SUITE("cache") {
  TEST_CASE("sha256_hex matches known vectors") {
    CHECK(gc::sha256_hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    CHECK(gc::sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  }

  TEST_CASE("key digest is deterministic, order-independent and sensitive to every input") {
    const json base = json::parse(R"({"spec":{"heads":16,"head_dim":128,"gate":"exp"},"arch":"sm_90a",
                                      "nvrtc":"13.0.48","options":["-O3","--use_fast_math"]})");
    const json reordered = json::parse(R"({"options":["-O3","--use_fast_math"],"nvrtc":"13.0.48",
                                           "arch":"sm_90a","spec":{"gate":"exp","head_dim":128,"heads":16}})");
    const gc::Key k = gc::make_key(base, "x");
    CHECK(k.digest.size() == 64);
    CHECK(k.digest == gc::make_key(base, "x").digest);
    CHECK(k.digest == gc::make_key(reordered, "x").digest);
    CHECK(k.inputs == base);
    // The readable tag is a label, not an input.
    CHECK(k.digest == gc::make_key(base, "something.else").digest);

    std::vector<json> variants;
    auto with = [&](auto mutate) {
      json j = base;
      mutate(j);
      variants.push_back(j);
    };
    with([](json& j) { j["spec"]["heads"] = 32; });
    with([](json& j) { j["spec"]["head_dim"] = 64; });
    with([](json& j) { j["spec"]["gate"] = "sigmoid"; });
    with([](json& j) { j["arch"] = "sm_100a"; });
    with([](json& j) { j["arch"] = "sm_90"; });  // the arch suffix matters
    with([](json& j) { j["nvrtc"] = "13.0.49"; });
    with([](json& j) { j["options"] = {"--use_fast_math", "-O3"}; });  // arrays keep their order
    with([](json& j) { j["options"].push_back("-lineinfo"); });
    with([](json& j) { j["spec"]["extra"] = nullptr; });
    with([](json& j) { j["spec"]["heads"] = "16"; });  // type matters
    with([](json& j) { j.erase("nvrtc"); });
    std::vector<std::string> digests{k.digest};
    for (const json& v : variants) {
      const std::string d = gc::make_key(v, "x").digest;
      for (const std::string& other : digests) CHECK(d != other);
      digests.push_back(d);
    }
  }

  TEST_CASE("readable tag is sanitized and dir_name is '<16 hex>.<readable>'") {
    const gc::Key k = gc::make_key({{"a", 1}}, "m layer/fwd:wu@sm_90a");
    CHECK(k.readable == "m_layer_fwd_wu_sm_90a");
    CHECK(k.dir_name() == k.digest.substr(0, 16) + ".m_layer_fwd_wu_sm_90a");
    CHECK(gc::make_key({{"a", 1}}, "").readable == "entry");
    CHECK(gc::make_key({{"a", 1}}, "../../etc").dir_name().find('/') == std::string::npos);
    CHECK(gc::make_key({{"a", 1}}, std::string(500, 'r')).readable.size() <= 96);
  }

  TEST_CASE("default_root precedence: GDNC_CACHE_DIR, then XDG_CACHE_HOME, then HOME") {
    EnvGuard home("HOME", "/home/someone");
    {
      EnvGuard xdg("XDG_CACHE_HOME", "/xdg/cache");
      EnvGuard dir("GDNC_CACHE_DIR", "/explicit/cache");
      CHECK(gc::default_root() == fs::path("/explicit/cache"));
    }
    {
      EnvGuard xdg("XDG_CACHE_HOME", "/xdg/cache");
      EnvGuard dir("GDNC_CACHE_DIR", nullptr);
      CHECK(gc::default_root() == fs::path("/xdg/cache/gdnc"));
      EnvGuard empty("GDNC_CACHE_DIR", "");  // empty counts as unset
      CHECK(gc::default_root() == fs::path("/xdg/cache/gdnc"));
    }
    {
      EnvGuard xdg("XDG_CACHE_HOME", nullptr);
      EnvGuard dir("GDNC_CACHE_DIR", nullptr);
      CHECK(gc::default_root() == fs::path("/home/someone/.cache/gdnc"));
      EnvGuard nohome("HOME", nullptr);
      CHECK_THROWS_AS(gc::default_root(), gc::CacheError);
    }
  }

  TEST_CASE("miss, then build, then hit") {
    TempDir tmp;
    gc::DiskCache cache(tmp.path());
    CHECK(cache.root() == tmp.path());
    const gc::Key key = sample_key();
    CountingBuild b;

    std::string why;
    CHECK_FALSE(cache.find(key, &why).has_value());
    CHECK(why.find("no entry") != std::string::npos);
    CHECK(why.find(key.dir_name()) != std::string::npos);

    gc::Fetched first = cache.get_or_build(key, b.fn());
    CHECK(first.outcome == gc::Outcome::built);
    CHECK(b.calls == 1);
    CHECK(first.entry.dir == tmp.path() / "entries" / key.dir_name());
    CHECK(first.entry.read_file("program.cubin") == kCubin);

    const json& m = first.entry.manifest;
    CHECK(m["format_version"] == gc::kFormatVersion);
    CHECK(m["key_digest"] == key.digest);
    CHECK(m["readable"] == key.readable);
    CHECK(m["key_inputs"] == key.inputs);
    CHECK(m["info"]["registers"] == 96);
    CHECK(m["files"].size() == 2);
    CHECK(m["files"][0]["name"] == "program.cubin");
    CHECK(m["files"][0]["bytes"] == kCubin.size());
    CHECK(m["files"][0]["sha256"] == gc::sha256_hex(kCubin));
    CHECK(m["created_unix"].get<int64_t>() > 1700000000);
    CHECK(m["created_by"]["pid"] == ::getpid());
    CHECK(m["created_by"]["host"].is_string());
    CHECK(m["manifest_sha256"].is_string());
    // What is on disk is what get_or_build returned.
    CHECK(json::parse(slurp(first.entry.dir / "manifest.json")) == m);

    gc::Fetched second = cache.get_or_build(key, b.fn());
    CHECK(second.outcome == gc::Outcome::hit);
    CHECK(b.calls == 1);
    CHECK(second.entry.manifest == m);
    REQUIRE(cache.find(key).has_value());
    CHECK(cache.find(key)->read_file("source.cu").find("__global__") != std::string::npos);
    CHECK_THROWS_AS(cache.find(key)->read_file("nope.bin"), gc::CacheError);

    // A different key is a different entry.
    CHECK(cache.get_or_build(sample_key("bwd"), b.fn()).outcome == gc::Outcome::built);
    CHECK(count_children(tmp.path() / "entries") == 2);
    CHECK(count_children(tmp.path() / "tmp") == 0);
  }

  TEST_CASE("truncated cubin is detected, named, and rebuilt") {
    TempDir tmp;
    gc::DiskCache cache(tmp.path());
    const gc::Key key = sample_key();
    CountingBuild b;
    const gc::Entry old = cache.get_or_build(key, b.fn()).entry;
    const fs::path cubin = old.dir / "program.cubin";
    fs::resize_file(cubin, kCubin.size() / 2);

    std::string why;
    CHECK_FALSE(cache.find(key, &why).has_value());
    CHECK(why.find(cubin.string()) != std::string::npos);
    CHECK(why.find("size") != std::string::npos);

    // A stale Entry refuses to hand out damaged bytes, and says how to fix it.
    try {
      (void)old.read_file("program.cubin");
      FAIL("read_file should have thrown");
    } catch (const gc::CacheError& e) {
      CHECK(e.path() == cubin);
      CHECK(std::string(e.what()).find(cubin.string()) != std::string::npos);
      CHECK(std::string(e.what()).find("gdnc cache rm " + key.dir_name()) != std::string::npos);
    }

    gc::Fetched f = cache.get_or_build(key, b.fn());
    CHECK(f.outcome == gc::Outcome::rebuilt_corrupt);
    CHECK(f.corrupt_reason.find(cubin.string()) != std::string::npos);
    CHECK(b.calls == 2);
    CHECK(f.entry.read_file("program.cubin") == kCubin);
    CHECK(cache.get_or_build(key, b.fn()).outcome == gc::Outcome::hit);
    CHECK(count_children(tmp.path() / "tmp") == 0);
    CHECK(count_children(tmp.path() / "entries") == 1);
  }

  TEST_CASE("flipped bit in a file and a missing file are detected and rebuilt") {
    TempDir tmp;
    gc::DiskCache cache(tmp.path());
    const gc::Key key = sample_key();
    CountingBuild b;
    const fs::path dir = cache.get_or_build(key, b.fn()).entry.dir;

    SUBCASE("flipped bit") {
      std::string bytes = slurp(dir / "program.cubin");
      bytes[bytes.size() / 2] ^= 0x04;
      spit(dir / "program.cubin", bytes);
      std::string why;
      CHECK_FALSE(cache.find(key, &why).has_value());
      CHECK(why.find("sha256") != std::string::npos);
      CHECK(why.find((dir / "program.cubin").string()) != std::string::npos);
    }
    SUBCASE("missing file") {
      fs::remove(dir / "source.cu");
      std::string why;
      CHECK_FALSE(cache.find(key, &why).has_value());
      CHECK(why.find("missing") != std::string::npos);
      CHECK(why.find((dir / "source.cu").string()) != std::string::npos);
    }
    SUBCASE("missing manifest") {
      fs::remove(dir / "manifest.json");
      std::string why;
      CHECK_FALSE(cache.find(key, &why).has_value());
      CHECK(why.find((dir / "manifest.json").string()) != std::string::npos);
    }
    gc::Fetched f = cache.get_or_build(key, b.fn());
    CHECK(f.outcome == gc::Outcome::rebuilt_corrupt);
    CHECK(b.calls == 2);
    CHECK(cache.find(key).has_value());
    CHECK(count_children(tmp.path() / "tmp") == 0);
  }

  TEST_CASE("a flipped bit anywhere in manifest.json is detected") {
    TempDir tmp;
    gc::DiskCache cache(tmp.path());
    const gc::Key key = sample_key();
    CountingBuild b;
    const fs::path manifest = cache.get_or_build(key, b.fn()).entry.dir / "manifest.json";
    const std::string good = slurp(manifest);

    SUBCASE("still valid JSON: caught by manifest_sha256") {
      const size_t at = good.find("\"created_unix\": ");
      REQUIRE(at != std::string::npos);
      const size_t last_digit = good.find_first_not_of("0123456789", at + 16) - 1;
      std::string bad = good;
      bad[last_digit] ^= 0x01;  // flips a digit into another digit: still valid JSON
      REQUIRE_FALSE(json::parse(bad, nullptr, false).is_discarded());
      spit(manifest, bad);
      std::string why;
      CHECK_FALSE(cache.find(key, &why).has_value());
      CHECK(why.find("integrity") != std::string::npos);
      CHECK(why.find(manifest.string()) != std::string::npos);

      gc::Fetched f = cache.get_or_build(key, b.fn());
      CHECK(f.outcome == gc::Outcome::rebuilt_corrupt);
      CHECK(f.corrupt_reason.find(manifest.string()) != std::string::npos);
      CHECK(b.calls == 2);
      CHECK(cache.find(key).has_value());
    }
    SUBCASE("invalid JSON: caught by the parser") {
      std::string bad = good;
      bad[0] ^= 0x40;
      spit(manifest, bad);
      std::string why;
      CHECK_FALSE(cache.find(key, &why).has_value());
      CHECK(why.find("not a valid JSON") != std::string::npos);
      CHECK(cache.get_or_build(key, b.fn()).outcome == gc::Outcome::rebuilt_corrupt);
    }
    SUBCASE("every byte position") {
      for (size_t i = 0; i < good.size(); ++i) {
        for (int bit : {0, 5}) {
          std::string bad = good;
          bad[i] = static_cast<char>(bad[i] ^ (1 << bit));
          spit(manifest, bad);
          std::string why;
          const bool found = cache.find(key, &why).has_value();
          if (found) FAIL_CHECK("flip of bit " << bit << " at byte " << i << " went unnoticed");
        }
      }
      spit(manifest, good);
      CHECK(cache.find(key).has_value());
    }
    CHECK(count_children(tmp.path() / "tmp") == 0);
  }

  TEST_CASE("build() throwing leaves no temporary files and no entry") {
    TempDir tmp;
    gc::DiskCache cache(tmp.path());
    const gc::Key key = sample_key();
    CHECK_THROWS_WITH_AS(
        cache.get_or_build(key, []() -> gc::BuildResult { throw std::runtime_error("nvrtc said no"); }),
        "nvrtc said no", std::runtime_error);
    CHECK(count_children(tmp.path() / "tmp") == 0);
    CHECK(count_children(tmp.path() / "entries") == 0);
    CHECK_FALSE(cache.find(key).has_value());

    // Invalid artifacts are refused before anything is written.
    for (const char* bad_name : {"manifest.json", "../evil", "", "a/b", "sp ace"}) {
      CAPTURE(bad_name);
      CHECK_THROWS_AS(cache.get_or_build(key,
                                         [&] {
                                           return gc::BuildResult{{{bad_name, "x"}}, {}};
                                         }),
                      std::invalid_argument);
    }
    CHECK_THROWS_AS(cache.get_or_build(key,
                                       [] {
                                         return gc::BuildResult{{{"a", "1"}, {"a", "2"}}, {}};
                                       }),
                    std::invalid_argument);
    CHECK(count_children(tmp.path() / "tmp") == 0);
    CHECK(count_children(tmp.path() / "entries") == 0);

    // The cache still works afterwards.
    CountingBuild b;
    CHECK(cache.get_or_build(key, b.fn()).outcome == gc::Outcome::built);
  }

  TEST_CASE("list, verify and remove") {
    TempDir tmp;
    gc::DiskCache cache(tmp.path());
    CHECK(cache.list().empty());
    CHECK(cache.verify().empty());
    CountingBuild b;
    const gc::Key ka = sample_key("a"), kb = sample_key("b"), kc = sample_key("c");
    for (const gc::Key* k : {&ka, &kb, &kc}) cache.get_or_build(*k, b.fn());

    REQUIRE(cache.list().size() == 3);
    for (const auto& r : cache.verify()) {
      CAPTURE(r.problem);
      CHECK(r.ok);
    }

    // Damage b's cubin and a's manifest: verify names both, list still shows b.
    fs::resize_file(tmp.path() / "entries" / kb.dir_name() / "program.cubin", 10);
    spit(tmp.path() / "entries" / ka.dir_name() / "manifest.json", "{ not json");
    const auto reports = cache.verify();
    REQUIRE(reports.size() == 3);
    int bad = 0;
    for (const auto& r : reports) {
      if (r.ok) continue;
      ++bad;
      CHECK(r.problem.find(r.dir.string()) != std::string::npos);
      CHECK(r.problem.find("gdnc cache rm " + r.dir.filename().string()) != std::string::npos);
    }
    CHECK(bad == 2);
    CHECK(cache.list().size() == 2);  // a's manifest does not parse

    CHECK_THROWS_AS(cache.remove("abc"), gdn::InputError);
    CHECK_THROWS_AS(cache.remove("ffffffffffff"), gc::CacheError);
    // By directory name (works even when the manifest is unreadable) ...
    CHECK(cache.remove(ka.dir_name()) == 1);
    // ... by a digest prefix longer than the 16 hex in the directory name ...
    CHECK(cache.remove(kb.digest.substr(0, 40)) == 1);
    CHECK(cache.list().size() == 1);
    CHECK(cache.find(kc).has_value());
    // ... and a removed key simply builds again.
    CHECK(cache.get_or_build(ka, b.fn()).outcome == gc::Outcome::built);
    CHECK(count_children(tmp.path() / "tmp") == 0);
  }

  TEST_CASE("verify skips entries of another format version but not tampered ones") {
    TempDir tmp;
    gc::DiskCache cache(tmp.path());
    CountingBuild b;
    const fs::path mpath = cache.get_or_build(sample_key(), b.fn()).entry.dir / "manifest.json";
    json m = json::parse(slurp(mpath));
    m["format_version"] = gc::kFormatVersion + 1;
    json unsigned_m = m;
    unsigned_m.erase("manifest_sha256");
    m["manifest_sha256"] = gc::sha256_hex(unsigned_m.dump());
    spit(mpath, m.dump(2));
    auto reports = cache.verify();
    REQUIRE(reports.size() == 1);
    CHECK(reports[0].ok);
    CHECK(reports[0].problem.find("skipped") != std::string::npos);
    CHECK_FALSE(cache.find(sample_key()).has_value());

    m["key_inputs"]["arch"] = "sm_100a";  // tampered without fixing the checksum
    spit(mpath, m.dump(2));
    reports = cache.verify();
    REQUIRE(reports.size() == 1);
    CHECK_FALSE(reports[0].ok);
  }

  TEST_CASE("a signed manifest with a field of the wrong type is corrupt, names the field, and is repaired") {
    struct Case {
      const char* what;
      std::function<void(json&)> edit;
      const char* problem;  // empty: the manifest is valid
    };
    const std::vector<Case> cases = {
        {"created_unix a string", [](json& m) { m["created_unix"] = "yesterday"; },
         "manifest does not follow the schema: /created_unix: expected an integer, got \"yesterday\""},
        {"bytes negative", [](json& m) { m["files"][0]["bytes"] = -1; },
         "/files/0/bytes: -1 is out of range (0 to 9223372036854775807)"},
        {"bytes 2^64-1", [](json& m) { m["files"][0]["bytes"] = 18446744073709551615ull; },
         "/files/0/bytes: 18446744073709551615 is out of range"},
        {"file name with a slash", [](json& m) { m["files"][0]["name"] = "../x"; },
         "/files/0/name: \"../x\" is an invalid or duplicate file name"},
        {"key_digest not hex", [](json& m) { m["key_digest"] = std::string(64, 'Z'); }, "/key_digest: \"ZZZZ"},
        {"created_by missing", [](json& m) { m.erase("created_by"); }, "/created_by: is required"},
        {"an unknown field", [](json& m) { m["extra"] = 1; }, "/extra: unknown field"},
        {"format_version 1.0", [](json& m) { m["format_version"] = 1.0; },
         "/format_version: expected an integer, got 1.0"},
        // "info" is free-form (docs/cache.md): any JSON is valid there.
        {"info an array", [](json& m) { m["info"] = json::array(); }, ""},
        {"registers a string", [](json& m) { m["info"]["registers"] = "many"; }, ""},
    };
    for (const Case& c : cases) {
      CAPTURE(c.what);
      TempDir tmp;
      gc::DiskCache cache(tmp.path());
      const gc::Key key = sample_key();
      CountingBuild b;
      const fs::path manifest = cache.get_or_build(key, b.fn()).entry.dir / "manifest.json";
      rewrite_signed(manifest, c.edit);
      std::string why;
      const bool hit = cache.find(key, &why).has_value();
      std::vector<gc::DiskCache::VerifyReport> skipped;
      const size_t listed = cache.list(&skipped).size();
      if (std::string(c.problem).empty()) {
        CHECK(hit);
        CHECK(listed == 1);
        CHECK(cache.verify().at(0).ok);
        continue;
      }
      CHECK_FALSE(hit);
      CHECK(why.find(manifest.string()) != std::string::npos);
      CHECK(why.find(c.problem) != std::string::npos);
      CHECK(listed == 0);
      REQUIRE(skipped.size() == 1);
      CHECK(skipped[0].problem == why);
      CHECK_FALSE(cache.verify().at(0).ok);
      CHECK(cache.get_or_build(key, b.fn()).outcome == gc::Outcome::rebuilt_corrupt);
      CHECK(cache.find(key).has_value());
    }
  }

  TEST_CASE("an artifact is read bounded by its file, not by the size its manifest claims") {
    TempDir tmp;
    gc::DiskCache cache(tmp.path());
    const gc::Key key = sample_key();
    CountingBuild b;
    const fs::path manifest = cache.get_or_build(key, b.fn()).entry.dir / "manifest.json";
    // A signed manifest claiming 2^62 bytes once made the reader allocate that much.
    rewrite_signed(manifest, [](json& m) { m["files"][0]["bytes"] = int64_t{1} << 62; });
    std::string why;
    CHECK_FALSE(cache.find(key, &why).has_value());
    CHECK(why.find("manifest says 4611686018427387904") != std::string::npos);
    const auto listed = cache.list();
    REQUIRE(listed.size() == 1);
    CHECK_THROWS_WITH_AS(listed[0].read_file("program.cubin"), doctest::Contains("manifest says 4611686018427387904"),
                         gc::CacheError);
  }

  TEST_CASE("a format_version beyond int is another version, never ours") {
    TempDir tmp;
    gc::DiskCache cache(tmp.path());
    const gc::Key key = sample_key();
    CountingBuild b;
    const fs::path manifest = cache.get_or_build(key, b.fn()).entry.dir / "manifest.json";
    // 2^32 + 1 reads as 1 through get<int>().
    rewrite_signed(manifest, [](json& m) { m["format_version"] = 4294967297LL; });
    std::string why;
    CHECK_FALSE(cache.find(key, &why).has_value());
    CHECK(why.find("format_version 4294967297 (this gdnc reads 1)") != std::string::npos);
    const auto reports = cache.verify();
    REQUIRE(reports.size() == 1);
    CHECK(reports[0].ok);
    CHECK(reports[0].problem.find("skipped") == 0);
    CHECK(cache.get_or_build(key, b.fn()).outcome == gc::Outcome::rebuilt_corrupt);
    CHECK(b.calls == 2);
  }

  TEST_CASE("a manifest or an artifact that is a FIFO, a device, deep or huge is refused without hanging") {
    struct Case {
      const char* what;
      std::function<void(const fs::path& dir)> damage;
      const char* problem;
    };
    const std::vector<Case> cases = {
        {"FIFO manifest",
         [](const fs::path& d) {
           fs::remove(d / "manifest.json");
           REQUIRE(::mkfifo((d / "manifest.json").c_str(), 0644) == 0);
         },
         "cannot read manifest: a FIFO, not a regular file"},
        {"manifest linked to /dev/zero",
         [](const fs::path& d) {
           fs::remove(d / "manifest.json");
           fs::create_symlink("/dev/zero", d / "manifest.json");
         },
         "cannot read manifest: a character device, not a regular file"},
        {"FIFO artifact",
         [](const fs::path& d) {
           fs::remove(d / "program.cubin");
           REQUIRE(::mkfifo((d / "program.cubin").c_str(), 0644) == 0);
         },
         "program.cubin: a FIFO, not a regular file"},
        {"deep manifest",
         [](const fs::path& d) { spit(d / "manifest.json", std::string(60000, '[') + std::string(60000, ']')); },
         "manifest is not a valid JSON object: /0/0/0/0"},
        {"manifest with a duplicate key",
         [](const fs::path& d) { spit(d / "manifest.json", R"({"format_version":1,"format_version":1})"); },
         "/format_version: duplicate key"},
        {"manifest over 1 MiB", [](const fs::path& d) { spit(d / "manifest.json", std::string((1 << 20) + 1, ' ')); },
         "cannot read manifest: 1048577 bytes, more than the 1048576 allowed"},
    };
    for (const Case& c : cases) {
      CAPTURE(c.what);
      TempDir tmp;
      gc::DiskCache cache(tmp.path());
      const gc::Key key = sample_key();
      CountingBuild b;
      c.damage(cache.get_or_build(key, b.fn()).entry.dir);
      std::string why;
      CHECK_FALSE(cache.find(key, &why).has_value());
      CHECK(why.find(c.problem) != std::string::npos);
      CHECK(why.size() < 400);
      CHECK_FALSE(cache.verify().at(0).ok);
      CHECK(cache.list().empty() == (std::string(c.what) != "FIFO artifact"));
      const gc::Fetched repaired = cache.get_or_build(key, b.fn());
      CHECK(repaired.outcome == gc::Outcome::rebuilt_corrupt);
      CHECK(repaired.entry.read_file("program.cubin") == kCubin);
      CHECK(count_children(tmp.path() / "tmp") == 0);
    }
  }

  TEST_CASE("gc removes least recently used entries first") {
    TempDir tmp;
    gc::DiskCache cache(tmp.path());
    CountingBuild b;
    const gc::Key ka = sample_key("a"), kb = sample_key("b"), kc = sample_key("c");
    std::vector<gc::Entry> entries;
    for (const gc::Key* k : {&ka, &kb, &kc}) entries.push_back(cache.get_or_build(*k, b.fn()).entry);
    const uint64_t one = gc::DiskCache::entry_bytes(entries[0]);
    CHECK(one > kCubin.size());

    // Age them explicitly (a oldest) so the test does not depend on timestamp granularity;
    // then use a: find() must make it the most recently used.
    const auto now = fs::file_time_type::clock::now();
    fs::last_write_time(entries[0].dir, now - std::chrono::hours(3));
    fs::last_write_time(entries[1].dir, now - std::chrono::hours(2));
    fs::last_write_time(entries[2].dir, now - std::chrono::hours(1));
    REQUIRE(cache.find(ka).has_value());

    // A stale directory from a crashed writer goes too; a fresh one is left alone.
    fs::create_directories(tmp.path() / "tmp" / "stale.123.abc");
    fs::last_write_time(tmp.path() / "tmp" / "stale.123.abc", now - std::chrono::hours(5));
    fs::create_directories(tmp.path() / "tmp" / "fresh.456.def");

    CHECK(cache.gc(UINT64_MAX).empty());
    const auto removed = cache.gc(one);
    REQUIRE(removed.size() == 2);
    CHECK(removed[0] == entries[1].dir);  // b was the oldest after a was used
    CHECK(removed[1] == entries[2].dir);
    CHECK(cache.find(ka).has_value());
    CHECK_FALSE(cache.find(kb).has_value());
    CHECK_FALSE(cache.find(kc).has_value());
    CHECK_FALSE(fs::exists(tmp.path() / "locks" / (kb.dir_name() + ".lock")));
    CHECK_FALSE(fs::exists(tmp.path() / "tmp" / "stale.123.abc"));
    CHECK(fs::exists(tmp.path() / "tmp" / "fresh.456.def"));

    CHECK(cache.gc(0).size() == 1);
    CHECK(count_children(tmp.path() / "entries") == 0);
  }

  TEST_CASE("8 threads racing on one key build it once") {
    TempDir tmp;
    gc::DiskCache cache(tmp.path());
    const gc::Key key = sample_key();
    std::atomic<int> builds{0}, hits{0}, failures{0};
    std::vector<std::thread> threads;
    for (int i = 0; i < 8; ++i)
      threads.emplace_back([&] {
        try {
          auto f = cache.get_or_build(key, [&] {
            ++builds;
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
            return gc::BuildResult{{{"program.cubin", kCubin}}, {}};
          });
          if (f.outcome == gc::Outcome::hit) ++hits;
        } catch (...) {
          ++failures;
        }
      });
    for (auto& t : threads) t.join();
    CHECK(failures == 0);
    CHECK(builds == 1);
    CHECK(hits == 7);
    CHECK(count_children(tmp.path() / "entries") == 1);
    CHECK(count_children(tmp.path() / "tmp") == 0);
  }

  TEST_CASE("8 processes racing on one key build it once") {
    const char* exe = gdn::env_value("CACHE_STRESS_EXE");
    if (!exe || !*exe) {
      MESSAGE("skipped: set GDNC_CACHE_STRESS_EXE to the gdn_cache_stress executable");
      return;
    }
    REQUIRE(fs::exists(exe));
    TempDir tmp;
    const fs::path root = tmp.path() / "root";
    const std::string cmd = "'" + std::string(exe) + "' '" + root.string() + "' stress_key 2>&1";
    // popen() starts each child at once; reading comes after all eight are running.
    std::vector<FILE*> children;
    for (int i = 0; i < 8; ++i) {
      FILE* p = ::popen(cmd.c_str(), "r");
      REQUIRE(p != nullptr);
      children.push_back(p);
    }
    int built = 0, hit = 0;
    for (FILE* p : children) {
      std::string out;
      char buf[256];
      while (size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
      const int status = ::pclose(p);
      CAPTURE(out);
      CHECK(status == 0);
      if (out == "built\n")
        ++built;
      else if (out == "hit\n")
        ++hit;
    }
    CHECK(built == 1);
    CHECK(hit == 7);
    CHECK(count_children(root / "entries") == 1);
    CHECK(count_children(root / "tmp") == 0);
  }
}
