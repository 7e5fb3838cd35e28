/**
 * @file templates.hpp
 * @brief The CUDA templates embedded in the binary at build time, and their include graph.
 */
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace gdn {

struct TemplateFile {
  std::string_view path;  ///< relative to templates/, e.g. "fwd/chunk_prep.cuh"
  std::string_view text;
};

/// Every file under templates/ (.cuh and .hpp), as it was when gdnc was built.
std::span<const TemplateFile> embedded_templates();

/// The embedded file with this path; throws std::out_of_range naming the path if absent.
const TemplateFile& find_template(std::string_view path);

/// `path` and every file it includes with `#include "..."`, transitively, sorted by path.
/// Throws std::out_of_range if an include names a file that is not embedded.
std::vector<std::string> transitive_includes(std::string_view path);

/// SHA-256 over the paths and texts of transitive_includes(path).
std::string templates_digest(std::string_view path);

}  // namespace gdn
