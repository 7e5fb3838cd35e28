/**
 * @file test_json_input.cpp
 * @brief The bounded JSON reader against hostile input: files that are not regular files, deep
 *        nesting, huge numbers and strings, duplicate keys; messages stay short and printable.
 *        Spec-level messages of the same classes are in tests/specs/invalid (suite "spec").
 */
#include "common/json_input.hpp"
#include "compiler/spec.hpp"

#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const gdn::JsonLimits kSmall{1 << 10, 4};

/// A fresh file path under the temp directory, removed afterwards.
struct TempPath {
  fs::path path =
      fs::temp_directory_path() / ("gdn_json_input." + std::to_string(::getpid()) + "." +
                                   std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
  ~TempPath() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

std::string spec_error_of(const std::string& path) {
  try {
    gdn::spec_from_file(path);
  } catch (const gdn::SpecError& e) {
    return e.what();
  }
  return "(no error)";
}

bool printable(const std::string& s) {
  for (unsigned char c : s)
    if (c < 0x20 || c == 0x7f) return false;
  return true;
}

}  // namespace

TEST_SUITE("json_input") {
  TEST_CASE("a FIFO, a device and a directory are refused before a byte is read") {
    TempPath fifo;
    REQUIRE(::mkfifo(fifo.path.c_str(), 0600) == 0);
    // Without O_NONBLOCK and the file-type check this would wait for a writer forever.
    CHECK_THROWS_WITH_AS(gdn::read_bounded_file(fifo.path, 100), "a FIFO, not a regular file", gdn::JsonInputError);
    CHECK(spec_error_of(fifo.path.string()) == fifo.path.string() + ": a FIFO, not a regular file");
    CHECK(spec_error_of("/dev/zero") == "/dev/zero: a character device, not a regular file");
    CHECK(spec_error_of("/") == "/: a directory, not a regular file");
    const std::string missing = spec_error_of("/nonexistent/spec.json");
    CHECK(missing == "/nonexistent/spec.json: cannot open: No such file or directory");
    try {
      gdn::read_bounded_file("/nonexistent/spec.json", 100);
      FAIL("expected a JsonInputError");
    } catch (const gdn::JsonInputError& e) {
      CHECK(e.system_error() == ENOENT);
    }
  }

  TEST_CASE("a file larger than the limit is refused by its size") {
    TempPath big;
    std::ofstream(big.path) << std::string(gdn::kSpecJsonLimits.max_bytes + 1, ' ');
    CHECK(spec_error_of(big.path.string()) == big.path.string() + ": 1048577 bytes, more than the 1048576 allowed");
    CHECK_THROWS_WITH(gdn::parse_bounded_json(std::string(2000, ' '), kSmall),
                      "2000 bytes, more than the 1024 allowed");
    std::ofstream(big.path) << "{}";
    CHECK(gdn::read_bounded_file(big.path, 2) == "{}");
  }

  TEST_CASE("deep nesting stops at the limit with the pointer, without recursion") {
    // 60000 levels overflowed the stack before the limit existed.
    const std::string deep = std::string(60000, '[') + std::string(60000, ']');
    CHECK_THROWS_WITH_AS(gdn::spec_from_text(deep), "/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0: nesting deeper than 16 levels",
                         gdn::SpecError);
    CHECK_THROWS_WITH(gdn::parse_bounded_json(R"({"a":[1,{"b":[[]]}]})", kSmall),
                      "/a/1/b/0: nesting deeper than 4 levels");
    CHECK(gdn::parse_bounded_json(R"({"a":[1,{"b":[]}]})", kSmall) == json::parse(R"({"a":[1,{"b":[]}]})"));
    TempPath file;
    std::ofstream(file.path) << deep;
    CHECK(spec_error_of(file.path.string()) ==
          "/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0: nesting deeper than 16 levels (in " + file.path.string() + ")");
  }

  TEST_CASE("duplicate keys are refused at any depth, naming the key") {
    CHECK_THROWS_WITH(gdn::parse_bounded_json(R"({"a":1,"a":1})", kSmall),
                      "/a: duplicate key (each field may appear once)");
    CHECK_THROWS_WITH(gdn::parse_bounded_json(R"([{"x":{"a/b~":1,"a/b~":2}}])", kSmall),
                      "/0/x/a~1b~0: duplicate key (each field may appear once)");
    CHECK(gdn::parse_bounded_json(R"([{"a":1},{"a":1}])", kSmall).size() == 2);  // same key, two objects
  }

  TEST_CASE("numbers are range-checked as written, before any conversion") {
    CHECK_THROWS_WITH(gdn::parse_bounded_json(R"({"n":[1e400]})", kSmall),
                      "/n/0: number 1e400 is out of range (it overflows a double)");
    CHECK_THROWS_WITH(gdn::parse_bounded_json("-1e400", kSmall),
                      "number -1e400 is out of range (it overflows a double)");
    CHECK_THROWS_WITH(gdn::parse_bounded_json(R"({"n":18446744073709551616})", kSmall),
                      "/n: integer 18446744073709551616 is out of range (it needs more than 64 bits)");
    // A 100,000-digit integer is quoted by a short excerpt, not echoed whole.
    const std::string digits(100000, '7');
    try {
      gdn::spec_from_text(R"({"name":"x","heads":{"qk":)" + digits + R"(,"v":6}})");
      FAIL("expected a SpecError");
    } catch (const gdn::SpecError& e) {
      CHECK(std::string(e.what()) ==
            "/heads/qk: integer 777777777777777777777777... (100000 bytes in all) is out of range (it needs more "
            "than 64 bits)");
    }
    CHECK(gdn::as_int64(json(18446744073709551615ull)) == std::nullopt);
    CHECK(gdn::as_int64(json(9223372036854775807ull)) == 9223372036854775807LL);
    CHECK(gdn::as_int64(json(-5)) == -5);
    CHECK(gdn::as_int64(json(5.0)) == std::nullopt);
    CHECK(gdn::as_int64(json("5")) == std::nullopt);
  }

  TEST_CASE("syntax errors give line, column and a short excerpt") {
    CHECK_THROWS_WITH(gdn::parse_bounded_json("{\n  \"a\": tru }", kSmall),
                      "invalid JSON at line 2, column 11: syntax error while parsing value - invalid "
                      "literal; last read: \"\\\"a\\\": tru \"");
    const std::string long_string = "\"" + std::string(5000, 'x');  // unterminated
    try {
      gdn::parse_bounded_json(long_string, {1 << 20, 4});
      FAIL("expected a JsonInputError");
    } catch (const gdn::JsonInputError& e) {
      CHECK(std::string(e.what()).size() < 300);
      CHECK(e.pointer().empty());
    }
  }

  TEST_CASE("excerpts are short, escaped and never contain control characters") {
    CHECK(gdn::quoted_excerpt("my layer") == "\"my layer\"");
    CHECK(gdn::quoted_excerpt(std::string("a\0b", 3)) == "\"a\\u0000b\"");
    CHECK(gdn::quoted_excerpt("\x1b[31mred") == "\"\\u001b[31mred\"");
    CHECK(gdn::quoted_excerpt(std::string(10 << 20, 'n'), 4) == "\"nnnn\"... (10485760 bytes in all)");
    CHECK(gdn::quoted_excerpt("\xff\xfe") == "\"\\ufffd\\ufffd\"");  // invalid UTF-8 becomes U+FFFD
    CHECK(gdn::quoted_excerpt("\xc2\x9b"
                              "2J\x7f") == "\"\\u009b2J\\u007f\"");  // C1 CSI and DEL
    CHECK(gdn::printable_excerpt("line\nbreak") == "line\\nbreak");
    CHECK(gdn::child_pointer("/a", "b/c~d") == "/a/b~1c~0d");
    std::string long_key_pointer(33, 'k');
    long_key_pointer[0] = '/';
    long_key_pointer += "... (100 bytes in all)";
    CHECK(gdn::child_pointer("", std::string(100, 'k')) == long_key_pointer);
    CHECK(gdn::value_excerpt(json::parse("[1,2,3]")) == "[1,2,3]");
    CHECK(gdn::value_excerpt(json::parse(R"({"a":[[[[1]]]]})")) == R"({"a":[[[...]]]})");
    // A value built in C++ may be arbitrarily deep; its excerpt still is not.
    json deep = json::array();
    for (int i = 0; i < 1000; ++i) deep = json::array({deep});
    CHECK(gdn::value_excerpt(deep) == "[[[[...]]]]");
    json wide = json::array();
    for (int i = 0; i < 100000; ++i) wide.push_back(i);
    CHECK(gdn::value_excerpt(wide).size() < 80);

    const std::string huge = R"({"name":")" + std::string(10 << 20, 'n') + R"(","heads":{"qk":2,"v":6}})";
    // The 10 MB name is over the size limit; a shorter bad name is quoted by an excerpt.
    CHECK_THROWS_WITH_AS(gdn::spec_from_text(huge),
                         (std::to_string(huge.size()) + " bytes, more than the 1048576 allowed").c_str(),
                         gdn::SpecError);
    try {
      gdn::spec_from_text(R"({"name":")" + std::string(1000, 'n') + "\x1b[0m" + R"(","heads":{"qk":2,"v":6}})");
      FAIL("expected a SpecError");
    } catch (const gdn::SpecError& e) {
      const std::string what = e.what();
      CHECK(what.size() < 250);
      CHECK(printable(what));
    }
  }

  TEST_CASE("FieldReader names the field of every type and range error") {
    const json j = json::parse(R"({"n":18446744073709551615,"s":5,"x":1})");
    const gdn::FieldReader r(j, "/m");
    CHECK_THROWS_WITH_AS(r.integer("n", 0, 10), "/m/n: 18446744073709551615 is out of range (0 to 10)",
                         gdn::JsonInputError);
    CHECK_THROWS_WITH(r.string("s"), "/m/s: expected a string, got 5");
    CHECK_THROWS_WITH(r.require("absent"), "/m/absent: is required");
    CHECK_THROWS_WITH(r.only({"n", "s"}), "/m/x: unknown field (known fields: n, s)");
    CHECK(r.integer("x", 0, 1) == 1);
    CHECK_THROWS_WITH(gdn::FieldReader(json::array(), "/m"), "/m: expected an object, got []");
  }
}
