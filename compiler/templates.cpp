/**
 * @file templates.cpp
 * @brief Lookup and include-graph walk over the embedded templates.
 */
#include "compiler/templates.hpp"

#include "cache/cache.hpp"

#include <fmt/format.h>

#include <set>
#include <stdexcept>

namespace gdn {

const TemplateFile& find_template(std::string_view path) {
  for (const TemplateFile& f : embedded_templates())
    if (f.path == path) return f;
  throw std::out_of_range(fmt::format("template '{}' is not embedded in this gdnc build", path));
}

std::vector<std::string> transitive_includes(std::string_view path) {
  std::set<std::string> seen;
  std::vector<std::string> todo = {std::string(path)};
  while (!todo.empty()) {
    std::string cur = todo.back();
    todo.pop_back();
    if (!seen.insert(cur).second) continue;
    const std::string_view text = find_template(cur).text;
    size_t pos = 0;
    while ((pos = text.find("#include \"", pos)) != std::string_view::npos) {
      pos += 10;
      const size_t end = text.find('"', pos);
      if (end == std::string_view::npos) break;
      todo.emplace_back(text.substr(pos, end - pos));
      pos = end;
    }
  }
  return {seen.begin(), seen.end()};
}

std::string templates_digest(std::string_view path) {
  std::string all;
  for (const std::string& p : transitive_includes(path)) {
    const std::string_view text = find_template(p).text;
    all += fmt::format("{}\n{}\n", p, text.size());
    all += text;
  }
  return cache::sha256_hex(all);
}

}  // namespace gdn
