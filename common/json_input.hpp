/**
 * @file common/json_input.hpp
 * @brief The one reader of untrusted JSON (layer specs, cache manifests): bounded in size, depth
 *        and file type, strict about duplicate keys and number ranges, with short, escaped excerpts
 *        in every message.
 *
 * A spec or a manifest can be anything a user or a damaged disk hands us: a FIFO, /dev/zero, a
 * 60000-deep array, a key given twice, a 1,000,000-digit number, a name with a NUL or an ANSI escape
 * sequence. Everything here refuses such input with an error that names the file, the JSON pointer
 * and a bounded excerpt of the value, and nothing here recurses deeper than the depth limit.
 */
#pragma once

#include "common/error.hpp"

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

namespace gdn {

struct JsonLimits {
  size_t max_bytes;
  int max_depth;  ///< containers inside containers: `{"a": [1]}` has depth 2
};

/// A JSON document or file that gdnc refuses. what() is "<pointer>: <problem>", or "<problem>"
/// for errors that concern no single value (syntax, file type, size).
class JsonInputError : public Error {
 public:
  JsonInputError(std::string pointer, std::string problem, int system_error = 0);
  /// The JSON pointer of the offending value; empty when there is none.
  const std::string& pointer() const noexcept { return pointer_; }
  const std::string& problem() const noexcept { return problem_; }
  /// The errno of a failed open or read, else 0.
  int system_error() const noexcept { return system_error_; }

 private:
  std::string pointer_;
  std::string problem_;
  int system_error_;
};

/// Parses @p text into a DOM. Refuses (JsonInputError): syntax errors (with line, column and an
/// excerpt of the offending token), text longer than limits.max_bytes, containers nested deeper
/// than limits.max_depth, an object key given twice, integer literals that need more than 64 bits
/// and numbers that overflow a double; the last three name the JSON pointer.
nlohmann::json parse_bounded_json(std::string_view text, const JsonLimits& limits);

/// The bytes of the regular file at @p path, at most @p max_bytes of them. Never blocks on a FIFO
/// and never reads a device: anything but a regular file is refused before a byte is read.
std::string read_bounded_file(const std::filesystem::path& path, size_t max_bytes);

/// The value as a 64-bit signed integer, if it is an integer that fits: nullopt for floats,
/// strings and unsigned values above INT64_MAX (which a plain get<int64_t>() would wrap).
std::optional<int64_t> as_int64(const nlohmann::json& value);

/// Text made safe and short for a message: control characters (NUL, ESC, ...) escaped as in
/// JSON, invalid UTF-8 replaced, cut after @p max_chars with the full length noted.
std::string printable_excerpt(std::string_view text, size_t max_chars = 48);
/// The same in JSON string quotes: `"my layer"`, `"shape\u0000n"`, `"xxxx"... (10485760 bytes in all)`.
std::string quoted_excerpt(std::string_view text, size_t max_chars = 48);
/// A JSON value as it would be written, compactly, cut after about @p max_chars; containers are
/// shown to a small depth only, so this never recurses deeply (the value may come from C++).
std::string value_excerpt(const nlohmann::json& value, size_t max_chars = 48);
/// "/heads" + "qk" = "/heads/qk", with RFC 6901 escapes (~0, ~1) and the key excerpted.
std::string child_pointer(std::string_view parent, std::string_view key);

/// Typed, checked access to the fields of one JSON object. Every failure is a JsonInputError
/// naming the field's pointer and an excerpt of the value.
class FieldReader {
 public:
  /// Throws unless @p value is an object ("<pointer>: expected an object, got ...").
  FieldReader(const nlohmann::json& value, std::string pointer);
  /// Throws for the first field not in @p known ("unknown field (known fields: ...)").
  void only(std::initializer_list<std::string_view> known) const;
  const nlohmann::json* find(std::string_view key) const;
  /// Throws "is required" when the field is absent.
  const nlohmann::json& require(std::string_view key) const;
  /// An integer in [min, max], checked on the value as written, before any narrowing.
  int64_t integer(std::string_view key, int64_t min, int64_t max) const;
  std::string string(std::string_view key) const;
  std::string pointer(std::string_view key) const { return child_pointer(pointer_, key); }
  const std::string& pointer() const noexcept { return pointer_; }

 private:
  const nlohmann::json& object_;
  std::string pointer_;
};

}  // namespace gdn
