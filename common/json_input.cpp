/**
 * @file common/json_input.cpp
 * @brief Bounded reading and parsing of untrusted JSON: a SAX handler that builds the DOM under
 *        limits, and the excerpts that keep messages short and printable.
 */
#include "common/json_input.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <limits>
#include <system_error>
#include <vector>

namespace gdn {

using nlohmann::json;

namespace {

/// Keys and file names inside pointers are cut shorter than values: a pointer holds several.
constexpr size_t kKeyExcerpt = 32;
/// value_excerpt shows containers this deep; below, "[...]" and "{...}".
constexpr int kExcerptDepth = 3;

std::string json_escaped(std::string_view text) {
  // ensure_ascii: every control character (C0, DEL and the C1 range a terminal may obey) and
  // everything else outside ASCII comes out as \uXXXX; replace turns invalid UTF-8 (e.g. a
  // multibyte character cut by the excerpt) into U+FFFD instead of throwing.
  return json(std::string(text)).dump(-1, ' ', true, json::error_handler_t::replace);
}

std::string length_note(size_t bytes) { return fmt::format("... ({} bytes in all)", bytes); }

std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

std::string file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

/// Builds the DOM like nlohmann's json_sax_dom_parser, refusing what the limits forbid as soon
/// as it is seen, so a hostile document costs at most max_depth levels and max_bytes of input.
class BoundedDomBuilder {
 public:
  BoundedDomBuilder(json& root, const JsonLimits& limits) : root_(root), limits_(limits) {}

  bool null() { return add(nullptr); }
  bool boolean(bool v) { return add(v); }
  bool number_integer(json::number_integer_t v) { return add(v); }
  bool number_unsigned(json::number_unsigned_t v) { return add(v); }
  bool number_float(json::number_float_t v, const std::string& text) {
    // nlohmann reads an integer literal that fits no 64-bit type as a double, silently
    // rounding it; a count or a version written that way is a mistake, not a float.
    if (text.find_first_of(".eE") == std::string::npos) return fail(current_pointer(), beyond_64_bits(text));
    return add(v);
  }
  bool string(std::string& v) { return add(std::move(v)); }
  bool binary(json::binary_t&) { return fail("", "binary values are not JSON"); }

  bool start_object(std::size_t) { return open(json::value_t::object); }
  bool key(std::string& k) {
    json& object = *stack_.back();
    keys_.back() = k;
    if (object.contains(k)) return fail(current_pointer(), "duplicate key (each field may appear once)");
    member_ = &object[k];
    return true;
  }
  bool end_object() { return close(); }
  bool start_array(std::size_t) { return open(json::value_t::array); }
  bool end_array() { return close(); }

  bool parse_error(std::size_t byte, const std::string& token, const nlohmann::detail::exception& e) {
    if (e.id == 406) {  // number overflow: nlohmann's message would quote the whole token
      if (token.find_first_of(".eE") == std::string::npos) return fail(current_pointer(), beyond_64_bits(token));
      return fail(current_pointer(),
                  fmt::format("number {} is out of range (it overflows a double)", printable_excerpt(token, 24)));
    }
    return fail("", syntax_problem(byte, token, e.what()));
  }

  const std::optional<JsonInputError>& error() const { return error_; }

 private:
  /// "invalid JSON at line 1, column 9: syntax error while parsing value - unexpected
  /// end of input; ..., last read: <excerpt>" from nlohmann's what(), whose "last read" would
  /// quote the token whole.
  static std::string syntax_problem(std::size_t byte, const std::string& token, std::string what) {
    if (const size_t bracket = what.find("] "); what.rfind("[json.exception.", 0) == 0 && bracket != std::string::npos)
      what.erase(0, bracket + 2);
    std::string where = fmt::format("byte {}", byte);
    if (what.rfind("parse error at ", 0) == 0) {
      const size_t colon = what.find(": ");
      if (colon != std::string::npos) {
        where = what.substr(15, colon - 15);  // "line L, column C"
        what.erase(0, colon + 2);
      }
    }
    if (const size_t last = what.find("; last read: "); last != std::string::npos) what.erase(last);
    return fmt::format("invalid JSON at {}: {}; last read: {}", where, printable_excerpt(what, 200),
                       quoted_excerpt(token, 24));
  }

  static std::string beyond_64_bits(const std::string& integer_literal) {
    return fmt::format("integer {} is out of range (it needs more than 64 bits)",
                       printable_excerpt(integer_literal, 24));
  }

  template <class Value>
  bool add(Value&& v) {
    if (stack_.empty()) {
      root_ = json(std::forward<Value>(v));
      return true;
    }
    json& parent = *stack_.back();
    if (parent.is_array())
      parent.emplace_back(std::forward<Value>(v));
    else
      *member_ = json(std::forward<Value>(v));
    return true;
  }

  bool open(json::value_t type) {
    if (static_cast<int>(stack_.size()) >= limits_.max_depth)
      return fail(current_pointer(), fmt::format("nesting deeper than {} levels", limits_.max_depth));
    json* opened;
    if (stack_.empty()) {
      root_ = json(type);
      opened = &root_;
    } else if (stack_.back()->is_array()) {
      stack_.back()->emplace_back(type);
      opened = &stack_.back()->back();
    } else {
      *member_ = json(type);
      opened = member_;
    }
    stack_.push_back(opened);
    keys_.emplace_back();
    return true;
  }

  bool close() {
    stack_.pop_back();
    keys_.pop_back();
    return true;
  }

  /// The pointer of the value being read: an object's current key, an array's next index (or,
  /// for a level with a deeper container open, the index of that container).
  std::string current_pointer() const {
    std::string p;
    for (size_t level = 0; level < stack_.size(); ++level) {
      const json& c = *stack_[level];
      if (c.is_object()) {
        p = child_pointer(p, keys_[level]);
      } else {
        const size_t index = level + 1 < stack_.size() ? c.size() - 1 : c.size();
        p += '/';
        p += std::to_string(index);
      }
    }
    return p;
  }

  bool fail(std::string pointer, std::string problem) {
    if (!error_) error_.emplace(std::move(pointer), std::move(problem));
    return false;
  }

  json& root_;
  const JsonLimits& limits_;
  std::vector<json*> stack_;
  std::vector<std::string> keys_;  // per open level; meaningful for objects
  json* member_ = nullptr;         // the object member whose value comes next
  std::optional<JsonInputError> error_;
};

void append_excerpt(const json& v, std::string& out, size_t budget, int depth) {
  if (out.size() > budget) return;
  switch (v.type()) {
    case json::value_t::string: {
      const auto& s = v.get_ref<const std::string&>();
      out += quoted_excerpt(s, std::max<size_t>(8, budget - std::min(budget, out.size())));
      return;
    }
    case json::value_t::array:
    case json::value_t::object: {
      const bool object = v.is_object();
      if (depth >= kExcerptDepth && !v.empty()) {
        out += object ? "{...}" : "[...]";
        return;
      }
      out += object ? '{' : '[';
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (out.size() > budget) {
          out += ",...";
          break;
        }
        if (!first) out += ',';
        first = false;
        if (object) out += quoted_excerpt(it.key(), kKeyExcerpt) + ":";
        append_excerpt(*it, out, budget, depth + 1);
      }
      out += object ? '}' : ']';
      return;
    }
    case json::value_t::binary: out += "<binary>"; return;
    default: out += v.dump(); return;
  }
}

}  // namespace

JsonInputError::JsonInputError(std::string pointer, std::string problem, int system_error)
    : Error(pointer.empty() ? problem : pointer + ": " + problem),
      pointer_(std::move(pointer)),
      problem_(std::move(problem)),
      system_error_(system_error) {}

json parse_bounded_json(std::string_view text, const JsonLimits& limits) {
  if (text.size() > limits.max_bytes)
    throw JsonInputError("", fmt::format("{} bytes, more than the {} allowed", text.size(), limits.max_bytes));
  json root;
  BoundedDomBuilder builder(root, limits);
  const bool ok = json::sax_parse(text.begin(), text.end(), &builder);
  if (builder.error()) throw *builder.error();
  if (!ok) throw JsonInputError("", "invalid JSON");
  return root;
}

std::string read_bounded_file(const std::filesystem::path& path, size_t max_bytes) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    throw JsonInputError("", fmt::format("cannot open: {}", errno_text(e)), e);
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    throw JsonInputError("", fmt::format("cannot stat: {}", errno_text(e)), e);
  }
  if (!S_ISREG(st.st_mode)) throw JsonInputError("", fmt::format("{}, not a regular file", file_kind(st.st_mode)));
  if (static_cast<uint64_t>(st.st_size) > max_bytes)
    throw JsonInputError("", fmt::format("{} bytes, more than the {} allowed", st.st_size, max_bytes));
  // Sized by the file, not by the limit (which for an artifact comes from its manifest and may
  // be anything); one byte more tells a file that grew after fstat from one that fits.
  const size_t limit = max_bytes == SIZE_MAX ? max_bytes : max_bytes + 1;
  std::string out(std::min<size_t>(static_cast<size_t>(st.st_size) + 1, limit), '\0');
  size_t got = 0;
  for (;;) {
    if (got == out.size()) {
      if (out.size() >= limit) break;
      out.resize(std::min(limit, std::max<size_t>(2 * out.size(), 4096)));
    }
    const ssize_t n = ::read(fd, out.data() + got, out.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      throw JsonInputError("", fmt::format("cannot read: {}", errno_text(e)), e);
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  if (got > max_bytes) throw JsonInputError("", fmt::format("more than the {} bytes allowed", max_bytes));
  out.resize(got);
  return out;
}

std::optional<int64_t> as_int64(const json& value) {
  if (value.is_number_unsigned()) {
    const auto u = value.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(u);
  }
  if (value.is_number_integer()) return value.get<int64_t>();
  return std::nullopt;
}

std::string printable_excerpt(std::string_view text, size_t max_chars) {
  if (text.size() <= max_chars) {
    std::string q = json_escaped(text);
    return q.substr(1, q.size() - 2);
  }
  std::string q = json_escaped(text.substr(0, max_chars));
  return q.substr(1, q.size() - 2) + length_note(text.size());
}

std::string quoted_excerpt(std::string_view text, size_t max_chars) {
  if (text.size() <= max_chars) return json_escaped(text);
  return json_escaped(text.substr(0, max_chars)) + length_note(text.size());
}

std::string value_excerpt(const json& value, size_t max_chars) {
  std::string out;
  append_excerpt(value, out, max_chars, 0);
  return out;
}

std::string child_pointer(std::string_view parent, std::string_view key) {
  std::string token;
  for (char c : key.substr(0, std::min(key.size(), kKeyExcerpt))) {
    if (c == '~')
      token += "~0";
    else if (c == '/')
      token += "~1";
    else
      token += c;
  }
  token = printable_excerpt(token, std::numeric_limits<size_t>::max());
  if (key.size() > kKeyExcerpt) token += length_note(key.size());
  return std::string(parent) + "/" + token;
}

FieldReader::FieldReader(const json& value, std::string pointer) : object_(value), pointer_(std::move(pointer)) {
  if (!object_.is_object())
    throw JsonInputError(pointer_.empty() ? "/" : pointer_,
                         fmt::format("expected an object, got {}", value_excerpt(object_)));
}

void FieldReader::only(std::initializer_list<std::string_view> known) const {
  for (auto it = object_.begin(); it != object_.end(); ++it) {
    if (std::find(known.begin(), known.end(), it.key()) != known.end()) continue;
    std::string list;
    for (std::string_view k : known) list += (list.empty() ? "" : ", ") + std::string(k);
    throw JsonInputError(pointer(it.key()), fmt::format("unknown field (known fields: {})", list));
  }
}

const json* FieldReader::find(std::string_view key) const {
  const auto it = object_.find(key);
  return it == object_.end() ? nullptr : &*it;
}

const json& FieldReader::require(std::string_view key) const {
  if (const json* v = find(key)) return *v;
  throw JsonInputError(pointer(key), "is required");
}

int64_t FieldReader::integer(std::string_view key, int64_t min, int64_t max) const {
  const json& v = require(key);
  if (!v.is_number_integer())
    throw JsonInputError(pointer(key), fmt::format("expected an integer, got {}", value_excerpt(v)));
  const auto x = as_int64(v);
  if (!x || *x < min || *x > max)
    throw JsonInputError(pointer(key), fmt::format("{} is out of range ({} to {})", value_excerpt(v), min, max));
  return *x;
}

std::string FieldReader::string(std::string_view key) const {
  const json& v = require(key);
  if (!v.is_string()) throw JsonInputError(pointer(key), fmt::format("expected a string, got {}", value_excerpt(v)));
  return v.get<std::string>();
}

}  // namespace gdn
