/**
 * @file test_cli.cpp
 * @brief The gdnc executable: documented exit codes, messages, and compile-through-cache.
 */
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <array>
#include <cstdlib>
#include <fstream>
#include <cstdio>
#include <filesystem>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

namespace fs = std::filesystem;

namespace {

struct Run {
  int code;
  std::string out;
};

Run gdnc(const std::string& args) {
  const std::string cmd = "GDNC_CACHE_DIR='" + (fs::path(GDN_BINARY_DIR) / "test-kernel-cache").string() + "' '" +
                          GDN_GDNC_EXE + "' " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p);
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

std::string src(const char* rel) { return (fs::path(GDN_SOURCE_DIR) / rel).string(); }

}  // namespace

TEST_SUITE("cli") {
  TEST_CASE("usage errors exit 2") {
    CHECK(gdnc("").code == 2);
    CHECK(gdnc("frobnicate").code == 2);
    CHECK(gdnc("compile").code == 2);
    const Run r = gdnc("compile " + src("examples/n.json") + " --target sm_107a");
    CHECK(r.code == 2);
    CHECK(r.out.find("sm_107a is not supported") != std::string::npos);
  }

  TEST_CASE("--help exits 0 everywhere") {
    for (const char* c : {"--help", "compile --help", "ir --help", "cache --help", "cache gc --help", "check --help"})
      CHECK_MESSAGE(gdnc(c).code == 0, c);
  }

  TEST_CASE("an invalid spec exits 3 with the pointer") {
    const Run r = gdnc("ir " + src("tests/specs/invalid/heads_v_not_multiple.json"));
    CHECK(r.code == 3);
    CHECK(r.out.find("/heads/v: 50 is not a multiple of /heads/qk (16)") != std::string::npos);
  }

  TEST_CASE("ir, source and targets print") {
    const Run ir = gdnc("ir " + src("examples/n.json"));
    CHECK(ir.code == 0);
    CHECK(ir.out.find("launch state_walk") != std::string::npos);
    CHECK(gdnc("ir --json " + src("examples/n.json")).out.find("\"programs\"") != std::string::npos);
    const Run s = gdnc("source " + src("examples/n.json") + " --program l2norm --target sm_100a");
    CHECK(s.code == 0);
    CHECK(s.out.find("gdn_l2norm") != std::string::npos);
    CHECK(gdnc("source " + src("examples/n.json") + " --program nope").code == 2);
    const Run t = gdnc("targets");
    CHECK(t.code == 0);
    CHECK(t.out.find("sm_103a") != std::string::npos);
  }

  TEST_CASE("a second compile is all cache hits; cache ls, show and verify") {
    const Run first = gdnc("compile " + src("examples/n.json") + " --target sm_90a");
    REQUIRE(first.code == 0);
    const Run second = gdnc("compile " + src("examples/n.json") + " --target sm_90a");
    CHECK(second.code == 0);
    size_t lines = 0, hits = 0;
    for (size_t pos = 0; (pos = second.out.find('\n', pos)) != std::string::npos; ++pos) ++lines;
    for (size_t pos = 0; (pos = second.out.find("[cache hit]", pos)) != std::string::npos; ++pos) ++hits;
    CHECK(lines > 0);
    CHECK(hits == lines);
    const Run ls = gdnc("cache ls");
    CHECK(ls.code == 0);
    CHECK(ls.out.find("chunk_prep.sm_90a") != std::string::npos);
    CHECK(gdnc("cache verify").code == 0);
    CHECK(gdnc("cache show ffffffffffffffff").code == 5);
  }

  TEST_CASE("8 gdnc processes compiling the same spec leave one entry per key and no temporary files") {
    const fs::path root = fs::temp_directory_path() / ("gdnc-concurrent-" + std::to_string(::getpid()));
    fs::remove_all(root);
    std::string cmd = "cd '" + root.parent_path().string() + "' && for i in 1 2 3 4 5 6 7 8; do GDNC_CACHE_DIR='" +
                      root.string() + "' '" + GDN_GDNC_EXE + "' compile '" + src("examples/n.json") +
                      "' --target sm_100a --jobs 2 > '" + root.string() + "'.$i.log 2>&1 & done; wait";
    REQUIRE(std::system(cmd.c_str()) == 0);
    size_t entries = 0;
    for (const auto& e : fs::directory_iterator(root / "entries")) entries += e.is_directory();
    size_t leftovers = 0;
    if (fs::exists(root / "tmp"))
      for ([[maybe_unused]] const auto& e : fs::directory_iterator(root / "tmp")) ++leftovers;
    CHECK(entries == 10);  // the 10 programs of shape n, one target
    CHECK(leftovers == 0);
    int built = 0;
    for (int i = 1; i <= 8; ++i) {
      std::ifstream log(root.string() + "." + std::to_string(i) + ".log");
      std::string line;
      while (std::getline(log, line)) built += line.find(" built") != std::string::npos;
      fs::remove(root.string() + "." + std::to_string(i) + ".log");
    }
    CHECK(built == 10);  // every key compiled exactly once across the 8 processes
    fs::remove_all(root);
  }

  TEST_CASE("sizes prints the region bytes without a GPU") {
    const Run r = gdnc("sizes " + src("examples/m.json") + " --tokens 32768 --docs 5 --json");
    REQUIRE(r.code == 0);
    const auto j = nlohmann::json::parse(r.out);
    // h_tape alone is NT * HV * K * V * 2 bytes with NT = T/64 + N: the backward holds two tapes.
    CHECK(j["workspace_backward"].get<long long>() > 2LL * (32768 / 64 + 5) * 48 * 128 * 128 * 2);
    CHECK(j["workspace_step"] == j["workspace_backward"]);
    CHECK(gdnc("sizes " + src("examples/m.json") + " --tokens 0 --docs 5").code == 2);
  }

  TEST_CASE("check without a GPU exits 6 with the driver message") {
    if (fs::exists("/dev/nvidia0")) {
      MESSAGE("a GPU is present; the no-driver case is not testable here");
      return;
    }
    const Run r = gdnc("check " + src("examples/n.json") + " --docs 64");
    CHECK(r.code == 6);
    CHECK(r.out.find("libcuda.so.1") != std::string::npos);
    // Without sizes it uses its default documents and gets as far as the driver.
    CHECK(gdnc("check " + src("examples/n.json")).code == 6);
  }

  TEST_CASE("check's input and segment overrides are validated before any GPU work") {
    Run r = gdnc("check " + src("examples/n.json") + " --gate 1");
    CHECK(r.code == 2);
    CHECK(r.out.find("--gate: Value 1 not in range") != std::string::npos);
    r = gdnc("check " + src("examples/n.json") + " --beta 1.5");
    CHECK(r.code == 2);
    CHECK(r.out.find("--beta") != std::string::npos);
    r = gdnc("check " + src("examples/n.json") + " --segments 65");
    CHECK(r.code == 3);
    CHECK(r.out.find("/cp/segments: 65 is not supported (supported: 1 to 64)") != std::string::npos);
    if (!fs::exists("/dev/nvidia0"))  // valid overrides get as far as the driver
      CHECK(gdnc("check " + src("examples/n.json") + " --docs 3000 --gate 0 --beta 1 --segments 4").code == 6);
  }

  TEST_CASE("check with --tokens but no --n-docs (or the reverse) is a usage error naming both") {
    for (const char* sizes : {" --tokens 1000", " --n-docs 3"}) {
      const Run r = gdnc("check " + src("examples/n.json") + sizes);
      CHECK(r.code == 2);
      CHECK(r.out.find("--tokens T and --n-docs N") != std::string::npos);
    }
  }
}
