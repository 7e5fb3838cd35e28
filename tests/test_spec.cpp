/**
 * @file test_spec.cpp
 * @brief Spec validation: one JSON file per mistake, each with its exact expected message;
 *        the C++ struct runs the same checks; the canonical form round-trips.
 */
#include "compiler/spec.hpp"

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace fs = std::filesystem;

static std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  std::string t = s.str();
  while (!t.empty() && t.back() == '\n') t.pop_back();
  return t;
}

TEST_SUITE("spec") {
  TEST_CASE("every invalid spec fails with its exact message") {
    const fs::path dir = fs::path(GDN_SOURCE_DIR) / "tests/specs/invalid";
    int cases = 0;
    for (const auto& e : fs::directory_iterator(dir)) {
      if (e.path().extension() != ".json") continue;
      ++cases;
      fs::path expected = e.path();
      expected.replace_extension(".expected");
      CAPTURE(e.path().filename().string());
      const std::string want = slurp(expected);
      std::string got = "(no error)";
      try {
        gdn::spec_from_text(slurp(e.path()));
      } catch (const gdn::SpecError& err) {
        got = err.what();
      }
      CHECK(got == want);
    }
    CHECK(cases >= 40);
  }

  TEST_CASE("the example specs are valid and round-trip through the canonical form") {
    for (const char* name : {"n", "m", "g", "a"}) {
      const auto path = fs::path(GDN_SOURCE_DIR) / "examples" / (std::string(name) + ".json");
      const gdn::Spec s = gdn::spec_from_file(path.string());
      CHECK(s.heads_v % s.heads_qk == 0);
      const gdn::Spec back = gdn::spec_from_json(gdn::to_json(s));
      CHECK(gdn::to_json(back) == gdn::to_json(s));
    }
  }

  TEST_CASE("the C++ struct is validated like the JSON") {
    gdn::Spec s;
    s.name = "layer";
    s.heads_qk = 16;
    s.heads_v = 50;
    CHECK_THROWS_WITH_AS(gdn::validate(s), "/heads/v: 50 is not a multiple of /heads/qk (16)", gdn::SpecError);
    s.heads_v = 48;
    s.head_dim_k = 96;
    CHECK_THROWS_WITH_AS(gdn::validate(s), "/head_dim/k: 96 is not supported (supported: 128)", gdn::SpecError);
    s.head_dim_k = 128;
    CHECK_NOTHROW(gdn::validate(s));
  }

  TEST_CASE("defaults are filled in and a bad file names its path") {
    const gdn::Spec s = gdn::spec_from_json(nlohmann::json::parse(R"({"name":"x","heads":{"qk":2,"v":6}})"));
    CHECK(s.chunk == 64);
    CHECK(s.save_mode == gdn::SaveMode::light);
    CHECK(s.targets.size() == 3);
    CHECK(s.effective_scale() == doctest::Approx(1.0 / std::sqrt(128.0)));
    const auto tmp = fs::temp_directory_path() / "gdn_bad_spec.json";
    std::ofstream(tmp) << "{\"name\": ";
    CHECK_THROWS_WITH(gdn::spec_from_file(tmp.string()), doctest::Contains(tmp.string().c_str()));
    fs::remove(tmp);
  }
}

#include "runtime/gdn.h"

TEST_SUITE("spec") {
  TEST_CASE("the C ABI reports spec errors with the pointer and needs no GPU to do so") {
    gdn_layer* layer = nullptr;
    CHECK(gdn_layer_create(R"({"name":"x","heads":{"qk":16,"v":50}})", 0, nullptr, &layer) == GDN_ERR_SPEC);
    CHECK(std::string(gdn_last_error()) == "/heads/v: 50 is not a multiple of /heads/qk (16)");
    CHECK(layer == nullptr);
    CHECK(gdn_layer_create("{", 0, nullptr, &layer) == GDN_ERR_SPEC);
    CHECK(std::string(gdn_last_error()).find("invalid JSON") != std::string::npos);
  }

  TEST_CASE("the C ABI validates specs and returns the canonical form") {
    char buf[2048];
    CHECK(gdn_spec_validate(R"({"name":"x","heads":{"qk":2,"v":6}})", buf, sizeof buf) == GDN_OK);
    const auto j = nlohmann::json::parse(buf);
    CHECK(j["chunk"] == 64);
    CHECK(j["save_mode"] == "light");
    CHECK(gdn_spec_validate(R"({"name":"x","heads":{"qk":2,"v":6}})", buf, 10) == GDN_ERR_INPUT);
    CHECK(std::string(gdn_last_error()).find("canonical: 10 bytes given") == 0);
    CHECK(gdn_spec_validate(R"({"name":"x","heads":{"qk":2,"v":6},"chunk":48})", nullptr, 0) == GDN_ERR_SPEC);
    CHECK(std::string(gdn_last_error()) == "/chunk: 48 is not supported (supported: 64)");
    gdn_workspace* ws = nullptr;
    CHECK(gdn_workspace_create(nullptr, 0, &ws) == GDN_OK);
    CHECK(gdn_workspace_set_max_doc_tokens(ws, 4096) == GDN_OK);
    CHECK(gdn_workspace_set_max_doc_tokens(ws, 0) == GDN_OK);
    CHECK(gdn_workspace_set_max_doc_tokens(ws, -2) == GDN_ERR_INPUT);
    CHECK(std::string(gdn_last_error()) == "max_doc_tokens: -2 is negative (0: no bound)");
    CHECK(gdn_workspace_set_max_doc_tokens(nullptr, 1) == GDN_ERR_INPUT);
    CHECK(std::string(gdn_last_error()) == "workspace: is null");
    gdn_workspace_destroy(ws);
  }
}
