/**
 * @file test_cli.cpp
 * @brief The gdnc executable: documented exit codes, messages, and compile-through-cache.
 */
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "cache/cache.hpp"

#include <array>
#include <cstdlib>
#include <fstream>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

namespace fs = std::filesystem;

namespace {

struct Run {
  int code;
  std::string out;
};

Run gdnc_in(const fs::path& cache_dir, const std::string& args) {
  // timeout: a gdnc that waits on a FIFO must fail the test, not hang it.
  const std::string cmd =
      "GDNC_CACHE_DIR='" + cache_dir.string() + "' timeout 60 '" + GDN_GDNC_EXE + "' " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p);
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

Run gdnc(const std::string& args) { return gdnc_in(fs::path(GDN_BINARY_DIR) / "test-kernel-cache", args); }

/// A scratch directory for spec files and caches, removed afterwards.
struct Scratch {
  fs::path dir = fs::temp_directory_path() / ("gdnc-cli-" + std::to_string(::getpid()));
  Scratch() { fs::create_directories(dir); }
  ~Scratch() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(dir / name, std::ios::binary) << text;
    return (dir / name).string();
  }
};

bool has_control_characters(const std::string& s) {
  for (unsigned char c : s)
    if ((c < 0x20 && c != '\n') || c == 0x7f) return true;
  return false;
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
    CHECK(r.out.find("--target: \"sm_107a\" is not supported") != std::string::npos);
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
    // The default forward "auto" says what it picked and why: N's 6 value heads keep the programs
    // path, M's 48 take the fused one.
    CHECK(ir.out.find("forward: auto -> programs (") != std::string::npos);
    const Run m = gdnc("ir " + src("examples/m.json"));
    CHECK(m.out.find("forward: auto -> fused (") != std::string::npos);
    CHECK(m.out.find("launch fused_walk") != std::string::npos);
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

  TEST_CASE("digest: the same for a fresh compile and a cached one, another for another layer") {
    Scratch scratch;
    const std::string n = src("examples/n.json");
    const Run cached = gdnc("digest " + n + " --target sm_90a");
    REQUIRE(cached.code == 0);
    // A fresh cache compiles every program again: the machine code, and so the digest, is the same.
    const Run fresh = gdnc_in(scratch.dir / "cache", "digest " + n + " --target sm_90a");
    REQUIRE(fresh.code == 0);
    CHECK(fresh.out == cached.out);
    const auto first_line = [](const std::string& out) { return out.substr(0, out.find('\n')); };
    CHECK(first_line(cached.out).find("shape_n") != std::string::npos);
    CHECK(cached.out.find("  all\n") != std::string::npos);
    // Eight value heads instead of six: other constants, plans and machine code.
    std::string text;
    {
      std::ifstream in(n);
      text.assign(std::istreambuf_iterator<char>(in), {});
    }
    const size_t at = text.find("\"v\": 6");
    REQUIRE(at != std::string::npos);
    text.replace(at, 6, "\"v\": 8");
    const Run other = gdnc("digest " + scratch.write("n8.json", text) + " --target sm_90a");
    REQUIRE(other.code == 0);
    CHECK(first_line(other.out).substr(0, 16) != first_line(cached.out).substr(0, 16));
    const Run json_out = gdnc("digest --json " + n + " --target sm_90a");
    CHECK(json_out.code == 0);
    const auto j = nlohmann::json::parse(json_out.out);
    CHECK(j["layers"][0]["digest"].get<std::string>().substr(0, 16) == first_line(cached.out).substr(0, 16));
    CHECK(j["all"].get<std::string>().size() == 16);
    CHECK(gdnc("digest " + n + " --target sm_42").code == 2);
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
    CHECK(entries == 19);  // the 19 programs of shape n (the verified carry's four included), one target
    CHECK(leftovers == 0);
    int built = 0;
    for (int i = 1; i <= 8; ++i) {
      std::ifstream log(root.string() + "." + std::to_string(i) + ".log");
      std::string line;
      while (std::getline(log, line)) built += line.find(" built") != std::string::npos;
      fs::remove(root.string() + "." + std::to_string(i) + ".log");
    }
    CHECK(built == 19);  // every key compiled exactly once across the 8 processes
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

  TEST_CASE("sizes --target gives one target's workspace; without it, enough on any") {
    Scratch scratch;
    auto spec = nlohmann::json::parse(std::ifstream(src("examples/m.json")));
    spec["walk_bwd_layout"] = "fused";
    const std::string path = scratch.write("m_fused.json", spec.dump());
    auto sizes = [&](const std::string& target) {
      const Run r = gdnc("sizes " + path + " --tokens 32768 --docs 5 --json" + target);
      REQUIRE(r.code == 0);
      return nlohmann::json::parse(r.out);
    };
    const auto any = sizes(""), sm90a = sizes(" --target sm_90a"), sm100a = sizes(" --target sm_100a");
    CHECK(any["target"] == "any");
    CHECK(sm90a["target"] == "sm_90a");
    // The fused reverse walk keeps dh and dV' on chip on sm_90a: NT * HV * K * V * 2 + T * HV * V * 2.
    const long long nt = 32768 / 64 + 5;
    CHECK(any["workspace_backward"].get<long long>() - sm90a["workspace_backward"].get<long long>() ==
          nt * 48 * 128 * 128 * 2 + 32768LL * 48 * 128 * 2);
    CHECK(sm100a["workspace_backward"] == any["workspace_backward"]);
    CHECK(sm90a["workspace_forward"] == any["workspace_forward"]);
    CHECK(sm90a["saved"] == any["saved"]);
    const Run twice = gdnc("sizes " + path + " --tokens 10 --docs 1 --target sm_90a --target sm_100a");
    CHECK(twice.code == 2);
    CHECK(twice.out.find("--target: sizes takes one target") != std::string::npos);
    spec["targets"] = {"sm_100a"};
    const Run other =
        gdnc("sizes " + scratch.write("m_100.json", spec.dump()) + " --tokens 10 --docs 1 --target sm_90a");
    CHECK(other.code == 2);
    CHECK(other.out.find("--target: sm_90a is not among the targets of layer 'shape_m' (/targets)") !=
          std::string::npos);
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
    struct Refused {
      const char* args;
      int code;
      const char* says;
    };
    for (const Refused& x : std::vector<Refused>{
             {" --gate 1", 2, "--gate: 1 is not a number from -10000 to 0"},
             {" --gate nan", 2, "--gate: nan is not a number from -10000 to 0"},
             {" --beta 1.5", 2, "--beta"},
             {" --segments 65", 3, "/cp/segments: 65 is not supported (supported: \"auto\", 1 to 64)"},
             {" --segments 0", 2, "--segments: 0 is not a number of segments (give 1 to 64 or auto)"},
             {" --ranks 65", 3, "/cp/ranks: 65 is not supported (supported: 1 to 64"},
             {" --ranks 2 --segments 4", 3, "/cp/segments: 4 with cp.ranks 2"},
             {" --ranks 3 --docs 1000", 2, "T: 1000 tokens do not split into cp.ranks 3 equal parts (1 left over)"},
             {" --forward fast", 2, "--forward"},
             {" --phases", 2, "--phases: layer 'shape_n' has cp.ranks 1: give --ranks R (2 or more)"},
             {" --phases --ranks 3 --docs 1000", 2, "T: 1000 tokens do not split into cp.ranks 3 equal parts"},
             {" --max-doc-tokens 0", 2, "--max-doc-tokens: 0 is out of range (1 to 2147483647)"},
             {" --max-doc-tokens x", 2, "--max-doc-tokens"},
             {" --ranks 2 --phases --docs 1000 --max-doc-tokens 600", 2,
              "--max-doc-tokens: not used by the ranks' phases"},
         }) {
      const Run r = gdnc("check " + src("examples/n.json") + x.args);
      CAPTURE(x.args);
      CHECK(r.code == x.code);
      CHECK(r.out.find(x.says) != std::string::npos);
    }
    if (!fs::exists("/dev/nvidia0")) {  // valid overrides get as far as the driver
      CHECK(gdnc("check " + src("examples/n.json") + " --docs 3000 --gate 0 --beta 1 --segments 4").code == 6);
      CHECK(gdnc("check " + src("examples/n.json") + " --docs 3000 --forward fused").code == 6);
      CHECK(gdnc("check " + src("examples/n.json") + " --docs 3000 --forward fused --segments 4").code == 6);
      CHECK(gdnc("check " + src("examples/n.json") + " --docs 3000 --segments auto").code == 6);
      CHECK(gdnc("check " + src("examples/n.json") + " --docs 3000 --segments 1").code == 6);
      CHECK(gdnc("check " + src("examples/n.json") + " --docs 3000,2500 --max-doc-tokens 3000 --ckpt").code == 6);
      CHECK(gdnc("check " + src("examples/m.json") + " --docs 3000 --forward auto").code == 6);
      CHECK(gdnc("check " + src("examples/n.json") + " --docs 1000,2000 --ranks 3").code == 6);
      CHECK(gdnc("check " + src("examples/n.json") + " --docs 1000,2000 --ranks 3 --phases").code == 6);
    }
  }

  TEST_CASE("check with --tokens but no --n-docs (or the reverse) is a usage error naming both") {
    for (const char* sizes : {" --tokens 1000", " --n-docs 3"}) {
      const Run r = gdnc("check " + src("examples/n.json") + sizes);
      CHECK(r.code == 2);
      CHECK(r.out.find("--tokens T and --n-docs N") != std::string::npos);
    }
  }

  TEST_CASE("hostile spec files exit 3 with the file, the pointer and a short, escaped excerpt") {
    const Scratch scratch;
    struct Case {
      const char* name;
      std::string text;
      const char* message;
    };
    const std::vector<Case> cases = {
        {"deep.json", std::string(60000, '[') + std::string(60000, ']'), "nesting deeper than 16 levels"},
        {"overflow.json", R"({"name":"x","heads":{"qk":2,"v":6},"scale":1e400})",
         "/scale: number 1e400 is out of range (it overflows a double)"},
        {"digits.json", R"({"name":"x","heads":{"qk":2,"v":6},"scale":)" + std::string(1000000, '9') + "}",
         "/scale: integer 999999999999999999999999... (1000000 bytes in all) is out of range"},
        {"duplicate.json", R"({"name":"x","heads":{"qk":2,"v":6},"heads":{"qk":4,"v":8}})", "/heads: duplicate key"},
        {"wrap.json", R"({"name":"x","heads":{"qk":18446744073709551615,"v":6}})",
         "/heads/qk: 18446744073709551615 is out of range (1 to 4096)"},
        {"nul.json", R"({"name":"shape\u0000n","heads":{"qk":2,"v":6}})", R"(/name: "shape\u0000n" must be)"},
        {"ansi.json", R"({"name":"\u001b[2J\u001b[31m","heads":{"qk":2,"v":6}})",
         R"(/name: "\u001b[2J\u001b[31m" must be)"},
        {"long_name.json", R"({"name":")" + std::string(100000, 'n') + R"(","heads":{"qk":2,"v":6}})",
         "(100000 bytes in all) must be 1 to 64 characters"},
        {"ten_mb_name.json", R"({"name":")" + std::string(10 << 20, 'n') + R"(","heads":{"qk":2,"v":6}})",
         "bytes, more than the 1048576 allowed"},
        {"invalid.json", R"({"name": )", "invalid JSON at line 1, column 10"},
    };
    for (const Case& c : cases) {
      CAPTURE(c.name);
      const std::string path = scratch.write(c.name, c.text);
      const Run r = gdnc("ir " + path);
      CHECK(r.code == 3);
      CHECK(r.out.find(c.message) != std::string::npos);
      CHECK(r.out.find("gdnc: invalid spec: ") == 0);
      CHECK(r.out.size() < 400);
      CHECK_FALSE(has_control_characters(r.out));
      CHECK(r.out.find(fs::path(path).filename().string()) != std::string::npos);
    }
  }

  TEST_CASE("a FIFO or a device as the spec exits 3 at once, for every command that reads one") {
    const Scratch scratch;
    const fs::path fifo = scratch.dir / "spec.fifo";
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    for (const std::string command : {"ir ", "compile ", "sizes --tokens 10 --docs 1 ", "source --program l2norm "}) {
      CAPTURE(command);
      const Run r = gdnc(command + fifo.string());
      CHECK(r.code == 3);
      CHECK(r.out.find("spec.fifo: a FIFO, not a regular file") != std::string::npos);
    }
    const Run zero = gdnc("ir /dev/zero");
    CHECK(zero.code == 3);
    CHECK(zero.out == "gdnc: invalid spec: /dev/zero: a character device, not a regular file\n");
  }

  TEST_CASE("numbers on the command line are range-checked as typed, never wrapped or clamped") {
    const std::string n = src("examples/n.json");
    struct Case {
      std::string args;
      const char* message;
    };
    const std::vector<Case> cases = {
        {"sizes " + n + " --tokens 9223372036854775807 --docs 1",
         "--tokens: 9223372036854775807 is out of range (1 to 2147483647)"},
        {"sizes " + n + " --tokens 99999999999999999999 --docs 1", "--tokens: 99999999999999999999 is out of range"},
        {"sizes " + n + " --tokens 10 --docs 65536", "--docs: 65536 is out of range (1 to 65535)"},
        {"sizes " + n + " --tokens 1e3 --docs 1", "--tokens: 1e3 is not a whole number"},
        {"sizes " + n + " --tokens 0 --docs 1", "--tokens: 0 is out of range"},
        {"cache gc --max-bytes -1", "--max-bytes: -1 is not a whole number (0 to 18446744073709551615)"},
        {"cache gc --max-bytes 18446744073709551616", "--max-bytes: 18446744073709551616 is out of range"},
        {"compile " + n + " -j 0", "--jobs: 0 is out of range (1 to 1024)"},
        {"compile " + n + " -j " + std::string(300, '9'),
         "--jobs: 999999999999999999999999... (300 bytes in all) is out of range"},
        {"compile " + n + " --target sm_90a --target sm_90a", "--target: \"sm_90a\" is given twice"},
        {"check " + n + " --seed -1", "--seed: -1 is not a whole number"},
        {"cache rm abc", "key: \"abc\" is shorter than 6 characters"},
    };
    for (const Case& c : cases) {
      CAPTURE(c.args);
      const Run r = gdnc(c.args);
      CHECK(r.code == 2);
      CHECK(r.out.find(c.message) != std::string::npos);
      CHECK(r.out.size() < 300);
    }
    // At the largest T and N the sizes still fit in 64 bits.
    const Run big = gdnc("sizes " + n + " --tokens 2147483647 --docs 65535 --json");
    REQUIRE(big.code == 0);
    const auto j = nlohmann::json::parse(big.out);
    CHECK(j["workspace_step"].get<uint64_t>() > j["saved"].get<uint64_t>());
    CHECK(j["workspace_step"].get<uint64_t>() < (uint64_t{1} << 62));
  }

  TEST_CASE("arguments are echoed as escaped excerpts") {
    const Run r = gdnc("cache show 'a\033[31m" + std::string(1000, 'k') + "'");
    CHECK(r.code == 5);
    CHECK(r.out.find("no cache entry matches \"a\\u001b[31mkkk") != std::string::npos);
    CHECK_FALSE(has_control_characters(r.out));
    CHECK(r.out.size() < 300);
    const Run parse = gdnc("ir --frob'\033[2J" + std::string(100000, 'x') + "'");
    CHECK(parse.code == 2);
    CHECK_FALSE(has_control_characters(parse.out));
    CHECK(parse.out.size() < 700);
  }

  TEST_CASE("cache ls lists every intact entry and names the damaged ones; verify names the field") {
    const Scratch scratch;
    const fs::path root = scratch.dir / "cache";
    gdn::cache::DiskCache cache(root);
    auto build = [] { return gdn::cache::BuildResult{{{"program.cubin", "cubin"}}, {{"registers", 96}}}; };
    std::vector<fs::path> dirs;
    for (const char* name : {"a", "b", "c", "d"})
      dirs.push_back(cache.get_or_build(gdn::cache::make_key({{"k", name}}, name), build).entry.dir);
    auto resign = [](const fs::path& manifest, auto edit) {
      nlohmann::json m = nlohmann::json::parse(std::ifstream(manifest));
      edit(m);
      m.erase("manifest_sha256");
      m["manifest_sha256"] = gdn::cache::sha256_hex(m.dump());
      std::ofstream(manifest) << m.dump(2);
    };
    // "info" is free-form, so an array there and a string for registers are valid; created_unix is not.
    resign(dirs[0] / "manifest.json", [](nlohmann::json& m) { m["info"] = nlohmann::json::array(); });
    resign(dirs[1] / "manifest.json", [](nlohmann::json& m) { m["info"]["registers"] = "many"; });
    resign(dirs[2] / "manifest.json", [](nlohmann::json& m) { m["created_unix"] = "yesterday"; });
    fs::remove(dirs[3] / "manifest.json");
    REQUIRE(::mkfifo((dirs[3] / "manifest.json").c_str(), 0600) == 0);

    const Run ls = gdnc_in(root, "cache ls");
    CHECK(ls.code == 0);
    CHECK(ls.out.find("2 entries") != std::string::npos);
    CHECK(ls.out.find("regs=-") != std::string::npos);
    CHECK(ls.out.find((dirs[2] / "manifest.json").string() +
                      ": manifest does not follow the schema: /created_unix: expected an integer, got \"yesterday\"") !=
          std::string::npos);
    CHECK(ls.out.find((dirs[3] / "manifest.json").string() + ": cannot read manifest: a FIFO") != std::string::npos);
    CHECK(ls.out.find("2 damaged entries not listed") != std::string::npos);
    const Run json_ls = gdnc_in(root, "cache ls --json");
    CHECK(json_ls.code == 0);
    CHECK(nlohmann::json::parse(json_ls.out).size() == 4);
    const Run verify = gdnc_in(root, "cache verify");
    CHECK(verify.code == 5);
    CHECK(verify.out.find("CORRUPT " + dirs[2].string()) != std::string::npos);
    CHECK(verify.out.find("CORRUPT " + dirs[3].string()) != std::string::npos);
    CHECK(verify.out.find("ok      " + dirs[0].string()) != std::string::npos);
    CHECK(gdnc_in(root, "cache show " + dirs[0].filename().string()).code == 0);
    CHECK(gdnc_in(root, "cache rm " + dirs[3].filename().string()).code == 0);
  }
}
