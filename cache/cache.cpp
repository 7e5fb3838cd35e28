/**
 * @file cache/cache.cpp
 * @brief DiskCache: verified lookup, per-key OFD locking, atomic directory publish, gc.
 *
 * The protocol (see docs/cache.md) follows jitify2's LRUFileCache and DeepGEMM's
 * Compiler::build: readers open only published directories and never lock; a writer takes
 * `<root>/locks/<dir_name>.lock`, looks again, builds, writes into a unique directory under
 * `<root>/tmp/`, fsyncs, and publishes with a single rename(). A crash at any point leaves
 * either no entry or a complete one, plus at worst a stale tmp/ directory that gc() removes.
 */
#include "cache/cache.hpp"

#include "common/json_input.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <set>
#include <system_error>
#include <utility>

#include <fmt/format.h>
#include <openssl/evp.h>

namespace gdn::cache {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr std::string_view kManifestName = "manifest.json";
constexpr size_t kReadableMax = 96;
constexpr size_t kMinRemovePrefix = 6;
// A writer's tmp/ directory lives only for the few milliseconds between build() returning
// and rename(): anything this old belongs to a crashed process.
constexpr auto kStaleTmpAge = std::chrono::hours(1);

bool allowed_name_char(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
}

std::string sanitize_readable(std::string_view s) {
  std::string out;
  out.reserve(std::min(s.size(), kReadableMax));
  for (char c : s.substr(0, std::min(s.size(), kReadableMax))) out += allowed_name_char(c) ? c : '_';
  return out.empty() ? std::string("entry") : out;
}

bool valid_file_name(std::string_view n) {
  if (n.empty() || n.size() > 128 || n == "." || n == ".." || n == kManifestName) return false;
  return std::all_of(n.begin(), n.end(), allowed_name_char);
}

std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

/// The digest of a key: version and inputs together, so a format bump is a plain miss.
std::string key_digest_of(const json& key_inputs) {
  json hashed = json::object();
  hashed["format_version"] = kFormatVersion;
  hashed["key_inputs"] = key_inputs;
  return sha256_hex(hashed.dump());
}

/// The manifest's own checksum: sha256 of its compact dump without "manifest_sha256".
/// nlohmann's dump() is stable across parse/dump round trips (sorted keys, shortest
/// round-trip doubles), which is what makes this comparable after reading the file back.
std::string manifest_digest_of(json m) {
  m.erase("manifest_sha256");
  return sha256_hex(m.dump());
}

/// A manifest is a few kilobytes (key inputs, the info of one program, a few files); the
/// limits keep a damaged or planted one from costing more than that to refuse.
constexpr JsonLimits kManifestJsonLimits{1 << 20, 32};

/// Is 64 lower-case hex digits, as sha256_hex() writes.
bool is_sha256_hex(std::string_view s) {
  return s.size() == 64 &&
         std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

/// Creates @p p exclusively, writes @p bytes and fsyncs, so that the later rename() never
/// publishes a directory whose files are still only in the page cache.
void write_durable(const fs::path& p, std::string_view bytes) {
  int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int e = errno;
    throw CacheError(fmt::format("cannot create {}: {}", p.string(), errno_text(e)), p);
  }
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int e = errno;
      ::close(fd);
      throw CacheError(fmt::format("cannot write {}: {}", p.string(), errno_text(e)), p);
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    int e = errno;
    ::close(fd);
    throw CacheError(fmt::format("cannot fsync {}: {}", p.string(), errno_text(e)), p);
  }
  if (::close(fd) != 0) {
    const int e = errno;
    throw CacheError(fmt::format("cannot close {}: {}", p.string(), errno_text(e)), p);
  }
}

/// fsync of a directory makes the names in it (new files, a rename) durable. Returns errno or 0.
int fsync_dir(const fs::path& p) {
  int fd = ::open(p.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return errno;
  int rc = ::fsync(fd) == 0 ? 0 : errno;
  ::close(fd);
  return rc;
}

void make_dirs(const fs::path& p) {
  std::error_code ec;
  fs::create_directories(p, ec);
  if (ec)
    throw CacheError(fmt::format("cannot create cache directory {}: {} (set GDNC_CACHE_DIR to a "
                                 "writable directory)",
                                 p.string(), ec.message()),
                     p);
}

/// A name no other thread or process will pick: pid plus 64 random bits.
std::string unique_name(std::string_view stem) {
  thread_local std::mt19937_64 rng{(static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}()};
  return fmt::format("{}.{}.{:016x}", stem, ::getpid(), rng());
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

/// Exclusive per-key lock on an open file description (fcntl F_OFD_SETLKW). OFD locks,
/// unlike classic POSIX record locks, belong to the open file description, so two threads
/// of one process exclude each other too, and closing an unrelated fd of the same file does
/// not drop the lock.
class FileLock {
 public:
  explicit FileLock(const fs::path& path) {
    for (;;) {
      int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
      if (fd < 0) {
        const int e = errno;
        throw CacheError(fmt::format("cannot open lock file {}: {}", path.string(), errno_text(e)), path);
      }
      struct flock fl {};
      fl.l_type = F_WRLCK;
      fl.l_whence = SEEK_SET;  // l_start = l_len = 0: the whole file; l_pid must be 0 for OFD
      int rc;
      do rc = ::fcntl(fd, F_OFD_SETLKW, &fl);
      while (rc != 0 && errno == EINTR);
      if (rc != 0) {
        int e = errno;
        ::close(fd);
        throw CacheError(fmt::format("cannot lock {}: {}", path.string(), errno_text(e)), path);
      }
      // remove()/gc() unlink the lock file while holding it. A waiter that opened the old
      // inode then wins a lock nobody else will ever contend for, so it must start over on
      // the current file (same check as jitify2's FileLock).
      struct stat held {
      }, current{};
      if (::fstat(fd, &held) == 0 && ::stat(path.c_str(), &current) == 0 && held.st_ino == current.st_ino &&
          held.st_dev == current.st_dev) {
        fd_ = fd;
        return;
      }
      ::close(fd);
    }
  }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  ~FileLock() { ::close(fd_); }  // closing the only fd of the description releases the lock

 private:
  int fd_ = -1;
};

/// Removes a directory tree on scope exit unless released; used so that neither a build()
/// exception nor an I/O error leaves anything under tmp/.
class RemoveOnExit {
 public:
  explicit RemoveOnExit(fs::path p) : path_(std::move(p)) {}
  RemoveOnExit(const RemoveOnExit&) = delete;
  RemoveOnExit& operator=(const RemoveOnExit&) = delete;
  ~RemoveOnExit() {
    if (armed_) {
      std::error_code ec;
      fs::remove_all(path_, ec);
    }
  }
  void release() { armed_ = false; }

 private:
  fs::path path_;
  bool armed_ = true;
};

enum class State { ok, absent, corrupt, other_version };

struct Check {
  State state;
  std::string reason;  // empty when ok; always names a path otherwise
  json manifest;
};

struct ListedFile {
  std::string name;
  uint64_t bytes;
  std::string sha256;
};

/// The fields of a manifest of this kFormatVersion, each checked for its type and form
/// (docs/cache.md's schema table); throws JsonInputError naming the field's pointer.
struct ManifestFields {
  std::string key_digest;
  std::string readable;
  std::vector<ListedFile> files;
};

ManifestFields read_manifest_fields(const json& m) {
  const FieldReader r(m, "");
  r.only({"format_version", "key_digest", "readable", "key_inputs", "info", "files", "created_unix", "created_by",
          "manifest_sha256"});
  ManifestFields out;
  out.key_digest = r.string("key_digest");
  if (!is_sha256_hex(out.key_digest))
    throw JsonInputError("/key_digest",
                         fmt::format("{} is not 64 lower-case hex digits", quoted_excerpt(out.key_digest)));
  out.readable = r.string("readable");
  if (out.readable != sanitize_readable(out.readable))
    throw JsonInputError("/readable", fmt::format("{} is not a sanitized label", quoted_excerpt(out.readable)));
  r.require("key_inputs");
  r.require("info");
  const json& files = r.require("files");
  if (!files.is_array()) throw JsonInputError("/files", fmt::format("expected an array, got {}", value_excerpt(files)));
  std::set<std::string> seen;
  for (size_t i = 0; i < files.size(); ++i) {
    const FieldReader f(files[i], fmt::format("/files/{}", i));
    f.only({"name", "bytes", "sha256"});
    ListedFile listed{f.string("name"), static_cast<uint64_t>(f.integer("bytes", 0, INT64_MAX)), f.string("sha256")};
    if (!valid_file_name(listed.name) || !seen.insert(listed.name).second)
      throw JsonInputError(f.pointer("name"),
                           fmt::format("{} is an invalid or duplicate file name", quoted_excerpt(listed.name)));
    if (!is_sha256_hex(listed.sha256))
      throw JsonInputError(f.pointer("sha256"),
                           fmt::format("{} is not 64 lower-case hex digits", quoted_excerpt(listed.sha256)));
    out.files.push_back(std::move(listed));
  }
  r.integer("created_unix", INT64_MIN, INT64_MAX);
  const FieldReader by(r.require("created_by"), "/created_by");
  by.only({"pid", "host"});
  by.integer("pid", INT64_MIN, INT64_MAX);
  by.string("host");
  return out;
}

/// Reads and checks one file listed in a manifest. Returns the problem, or "" if it matches.
std::string check_listed_file(const fs::path& p, uint64_t want_size, const std::string& want_sha) {
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0) {
    const int e = errno;
    return e == ENOENT ? fmt::format("{}: file listed in manifest is missing", p.string())
                       : fmt::format("{}: cannot stat: {}", p.string(), errno_text(e));
  }
  // Size first: a truncated cubin is the common failure, and this avoids hashing it.
  if (S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_size) != want_size)
    return fmt::format("{}: size {} bytes, manifest says {} (truncated or overwritten)", p.string(),
                       static_cast<uint64_t>(st.st_size), want_size);
  std::string bytes;
  try {
    bytes = read_bounded_file(p, want_size);
  } catch (const JsonInputError& e) {
    return fmt::format("{}: {}", p.string(), e.problem());
  }
  if (bytes.size() != want_size)
    return fmt::format("{}: size {} bytes, manifest says {}", p.string(), bytes.size(), want_size);
  if (std::string got = sha256_hex(bytes); got != want_sha)
    return fmt::format("{}: sha256 {} does not match manifest {}", p.string(), got, want_sha);
  return {};
}

/// The manifest of one entry directory, read under kManifestJsonLimits and checked up to, not
/// including, the files it lists: it parses, its manifest_sha256 matches, its format_version is
/// ours (else State::other_version) and, then, every field follows the schema.
Check read_manifest(const fs::path& dir, ManifestFields* fields) {
  auto bad = [](std::string r) { return Check{State::corrupt, std::move(r), {}}; };
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) {
    const int e = errno;
    if (e == ENOENT) return {State::absent, fmt::format("no entry at {}", dir.string()), {}};
    return bad(fmt::format("{}: cannot stat: {}", dir.string(), errno_text(e)));
  }
  if (!S_ISDIR(st.st_mode)) return bad(fmt::format("{}: entry is not a directory", dir.string()));

  const fs::path mpath = dir / kManifestName;
  std::string text;
  try {
    text = read_bounded_file(mpath, kManifestJsonLimits.max_bytes);
  } catch (const JsonInputError& e) {
    if (e.system_error() == ENOENT) return bad(fmt::format("{}: manifest is missing", mpath.string()));
    return bad(fmt::format("{}: cannot read manifest: {}", mpath.string(), e.problem()));
  }
  json m;
  try {
    m = parse_bounded_json(text, kManifestJsonLimits);
  } catch (const JsonInputError& e) {
    return bad(fmt::format("{}: manifest is not a valid JSON object: {}", mpath.string(), e.what()));
  }
  if (!m.is_object()) return bad(fmt::format("{}: manifest is not a valid JSON object", mpath.string()));

  // Integrity before anything else, so a flipped bit in format_version reads as corruption and
  // not as "another gdnc version". Every format version must keep manifest_sha256 with this
  // definition (docs/cache.md).
  const auto it = m.find("manifest_sha256");
  if (it == m.end() || !it->is_string()) return bad(fmt::format("{}: manifest has no manifest_sha256", mpath.string()));
  if (const std::string got = manifest_digest_of(m); got != it->get_ref<const std::string&>())
    return bad(fmt::format("{}: manifest integrity check failed (manifest_sha256 {} != computed {})", mpath.string(),
                           quoted_excerpt(it->get_ref<const std::string&>(), 64), got));

  // Compared as written: a version that does not fit in int (4294967297) must not wrap to ours.
  const auto version_field = m.find("format_version");
  const std::optional<int64_t> version = version_field == m.end() ? std::nullopt : as_int64(*version_field);
  if (!version)
    return bad(fmt::format("{}: manifest does not follow the schema: /format_version: expected an integer, got {}",
                           mpath.string(), version_field == m.end() ? "nothing" : value_excerpt(*version_field)));
  if (*version != kFormatVersion)
    return {State::other_version,
            fmt::format("{}: format_version {} (this gdnc reads {})", mpath.string(), *version, kFormatVersion),
            std::move(m)};
  try {
    ManifestFields f = read_manifest_fields(m);
    if (fields) *fields = std::move(f);
  } catch (const JsonInputError& e) {
    return bad(fmt::format("{}: manifest does not follow the schema: {}", mpath.string(), e.what()));
  }
  return {State::ok, {}, std::move(m)};
}

/// Full check of one entry directory. With @p expected_digest (find), the manifest must be
/// for that key; without it (verify), the digest is recomputed from the stored key inputs
/// and the directory name must agree with it.
Check check_entry(const fs::path& dir, const std::string* expected_digest) {
  auto bad = [](std::string r) { return Check{State::corrupt, std::move(r), {}}; };
  ManifestFields fields;
  Check c = read_manifest(dir, &fields);
  if (c.state != State::ok) return c;
  const fs::path mpath = dir / kManifestName;
  if (expected_digest) {
    if (fields.key_digest != *expected_digest)
      return bad(fmt::format("{}: key_digest {} is not the requested key {}", mpath.string(), fields.key_digest,
                             *expected_digest));
  } else {
    if (const std::string recomputed = key_digest_of(c.manifest.at("key_inputs")); recomputed != fields.key_digest)
      return bad(fmt::format("{}: key_digest {} does not match key_inputs (digest {})", mpath.string(),
                             fields.key_digest, recomputed));
    const std::string want_dir = fmt::format("{}.{}", fields.key_digest.substr(0, 16), fields.readable);
    if (dir.filename().string() != want_dir)
      return bad(fmt::format("{}: directory name does not match manifest (expected {})", dir.string(), want_dir));
  }
  for (const ListedFile& f : fields.files)
    if (std::string p = check_listed_file(dir / f.name, f.bytes, f.sha256); !p.empty()) return bad(std::move(p));
  return c;
}

/// Marks an entry as used for gc()'s LRU order. Best effort: the entry may be read-only or
/// removed concurrently, and neither must fail a lookup.
void touch(const fs::path& dir) { ::utimensat(AT_FDCWD, dir.c_str(), nullptr, 0); }

/// Sum of regular file sizes below @p dir; nullopt if it cannot be listed.
std::optional<uint64_t> dir_bytes(const fs::path& dir) {
  std::error_code ec;
  uint64_t total = 0;
  fs::recursive_directory_iterator it(dir, ec), end;
  if (ec) return std::nullopt;
  for (; it != end; it.increment(ec)) {
    if (ec) return std::nullopt;
    std::error_code ec2;
    if (it->is_regular_file(ec2)) {
      const auto sz = it->file_size(ec2);
      if (!ec2) total += sz;
    }
  }
  if (ec) return std::nullopt;
  return total;
}

/// Directory entries of @p dir (empty if it does not exist), sorted by name for stable output.
std::vector<fs::path> children(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  fs::directory_iterator it(dir, ec), end;
  if (ec) {
    if (ec == std::errc::no_such_file_or_directory) return out;
    throw CacheError(fmt::format("cannot list {}: {}", dir.string(), ec.message()), dir);
  }
  for (; it != end; it.increment(ec)) {
    if (ec) throw CacheError(fmt::format("cannot list {}: {}", dir.string(), ec.message()), dir);
    out.push_back(it->path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------

std::string sha256_hex(std::string_view bytes) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(bytes.data(), bytes.size(), md, &len, EVP_sha256(), nullptr) != 1)
    throw std::runtime_error("gdnc cache: EVP_Digest(SHA-256) failed");
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out(2 * len, '0');
  for (unsigned int i = 0; i < len; ++i) {
    out[2 * i] = kHex[md[i] >> 4];
    out[2 * i + 1] = kHex[md[i] & 0xf];
  }
  return out;
}

fs::path default_root() {
  auto env = [](const char* name) -> const char* {
    const char* v = std::getenv(name);
    return (v && *v) ? v : nullptr;
  };
  if (const char* d = env("GDNC_CACHE_DIR")) return fs::path(d);
  if (const char* x = env("XDG_CACHE_HOME")) return fs::path(x) / "gdnc";
  if (const char* h = env("HOME")) return fs::path(h) / ".cache" / "gdnc";
  throw CacheError("no cache directory: set GDNC_CACHE_DIR (or XDG_CACHE_HOME or HOME)", fs::path());
}

std::string Key::dir_name() const {
  return fmt::format("{}.{}", std::string_view(digest).substr(0, 16), sanitize_readable(readable));
}

Key make_key(json key_inputs, std::string readable) {
  Key k;
  k.digest = key_digest_of(key_inputs);
  k.readable = sanitize_readable(readable);
  k.inputs = std::move(key_inputs);
  return k;
}

CacheError::CacheError(const std::string& message, fs::path path)
    : Error("gdnc cache: " + message), path_(std::move(path)) {}

CacheError CacheError::corrupt(const std::string& problem, const fs::path& path, const fs::path& entry_dir) {
  return CacheError(fmt::format("{}; remove the entry with `gdnc cache rm {}` (it is rebuilt on next "
                                "use)",
                                problem, entry_dir.filename().string()),
                    path);
}

std::string Entry::read_file(std::string_view name) const {
  const fs::path p = dir / std::string(name);
  const json* listed = nullptr;
  if (auto files = manifest.find("files"); files != manifest.end() && files->is_array())
    for (const json& f : *files)
      if (f.is_object() && f.value("name", std::string()) == name) listed = &f;
  if (!listed)
    throw CacheError::corrupt(fmt::format("{}: no file '{}' in this entry's manifest", dir.string(), name), p, dir);
  uint64_t want_size = 0;
  std::string want_sha;
  try {
    const FieldReader f(*listed, "/files");
    want_size = static_cast<uint64_t>(f.integer("bytes", 0, INT64_MAX));
    want_sha = f.string("sha256");
  } catch (const JsonInputError& e) {
    throw CacheError::corrupt(fmt::format("{}: manifest entry for '{}' is malformed: {}", dir.string(), name, e.what()),
                              p, dir);
  }
  std::string bytes;
  try {
    bytes = read_bounded_file(p, want_size);
  } catch (const JsonInputError& e) {
    throw CacheError::corrupt(fmt::format("{}: {}", p.string(), e.problem()), p, dir);
  }
  if (bytes.size() != want_size)
    throw CacheError::corrupt(fmt::format("{}: size {} bytes, manifest says {}", p.string(), bytes.size(), want_size),
                              p, dir);
  if (sha256_hex(bytes) != want_sha)
    throw CacheError::corrupt(fmt::format("{}: sha256 does not match manifest", p.string()), p, dir);
  return bytes;
}

// ---------------------------------------------------------------------------------------

DiskCache::DiskCache(fs::path root) : root_(std::move(root)) {}

std::optional<Entry> DiskCache::find(const Key& key, std::string* why_not) const {
  const fs::path dir = entries_dir() / key.dir_name();
  Check c = check_entry(dir, &key.digest);
  if (c.state == State::ok) {
    touch(dir);
    return Entry{dir, std::move(c.manifest)};
  }
  if (why_not) *why_not = std::move(c.reason);
  return std::nullopt;
}

Fetched DiskCache::get_or_build(const Key& key, const std::function<BuildResult()>& build) {
  if (key.digest.size() != 64)
    throw std::invalid_argument("gdn::cache::DiskCache::get_or_build: key was not made by make_key()");
  const std::string name = key.dir_name();
  const fs::path final_dir = entries_dir() / name;

  if (Check c = check_entry(final_dir, &key.digest); c.state == State::ok) {
    touch(final_dir);
    return {Entry{final_dir, std::move(c.manifest)}, Outcome::hit, {}};
  }

  make_dirs(entries_dir());
  make_dirs(locks_dir());
  make_dirs(tmp_dir());
  FileLock lock(locks_dir() / (name + ".lock"));

  // Double-checked: whoever held the lock before us has probably just built it.
  Check c = check_entry(final_dir, &key.digest);
  if (c.state == State::ok) {
    touch(final_dir);
    return {Entry{final_dir, std::move(c.manifest)}, Outcome::hit, {}};
  }
  std::string corrupt_reason;
  if (c.state != State::absent) {
    corrupt_reason = std::move(c.reason);
    // Rename first so readers switch atomically from "corrupt" to "absent", never to a
    // half-deleted directory.
    const fs::path aside = tmp_dir() / unique_name(name + ".corrupt");
    if (::rename(final_dir.c_str(), aside.c_str()) != 0 && errno != ENOENT) {
      const int e = errno;
      throw CacheError::corrupt(fmt::format("{} (and moving it aside failed: {})", corrupt_reason, errno_text(e)),
                                final_dir, final_dir);
    }
    std::error_code ec;
    fs::remove_all(aside, ec);
  }

  // build() runs before anything is created in tmp/, so its exceptions need no cleanup.
  BuildResult result = build();

  json files = json::array();
  std::set<std::string> seen;
  for (const File& f : result.files) {
    if (!valid_file_name(f.name) || !seen.insert(f.name).second)
      throw std::invalid_argument(
          fmt::format("gdn::cache: build() returned invalid or duplicate file name '{}' (allowed: [A-Za-z0-9._-], "
                      "not '{}')",
                      f.name, kManifestName));
    files.push_back({{"name", f.name}, {"bytes", f.bytes.size()}, {"sha256", sha256_hex(f.bytes)}});
  }
  json manifest = {
      {"format_version", kFormatVersion},
      {"key_digest", key.digest},
      {"readable", sanitize_readable(key.readable)},
      {"key_inputs", key.inputs},
      {"info", result.info},
      {"files", std::move(files)},
      {"created_unix",
       std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count()},
      {"created_by", {{"pid", ::getpid()}, {"host", host_name()}}},
  };
  manifest["manifest_sha256"] = manifest_digest_of(manifest);

  const fs::path work = tmp_dir() / unique_name(name);
  if (::mkdir(work.c_str(), 0755) != 0) {
    const int e = errno;
    throw CacheError(fmt::format("cannot create {}: {}", work.string(), errno_text(e)), work);
  }
  RemoveOnExit cleanup(work);
  for (const File& f : result.files) write_durable(work / f.name, f.bytes);
  // Manifest last: it is what readers trust, so it must describe files already on disk.
  write_durable(work / kManifestName, manifest.dump(2) + "\n");
  if (int e = fsync_dir(work); e != 0)
    throw CacheError(fmt::format("cannot fsync {}: {}", work.string(), errno_text(e)), work);

  if (::rename(work.c_str(), final_dir.c_str()) != 0) {
    const int e = errno;
    // Only a writer that bypasses the lock (another tool, an older gdnc) can get here.
    // Its entry wins if valid; ours is discarded by `cleanup`.
    if (e == EEXIST || e == ENOTEMPTY) {
      if (Check again = check_entry(final_dir, &key.digest); again.state == State::ok)
        return {Entry{final_dir, std::move(again.manifest)}, Outcome::hit, {}};
    }
    throw CacheError(fmt::format("cannot publish {} as {}: {}", work.string(), final_dir.string(), errno_text(e)),
                     final_dir);
  }
  cleanup.release();
  // Makes the rename durable. The entry is already visible, so a failure here is not
  // worth failing the build for.
  (void)fsync_dir(entries_dir());

  const Outcome outcome = corrupt_reason.empty() ? Outcome::built : Outcome::rebuilt_corrupt;
  return {Entry{final_dir, std::move(manifest)}, outcome, std::move(corrupt_reason)};
}

std::vector<Entry> DiskCache::list(std::vector<VerifyReport>* skipped) const {
  std::vector<Entry> out;
  for (const fs::path& dir : children(entries_dir())) {
    Check c = read_manifest(dir, nullptr);
    if (c.state == State::ok || c.state == State::other_version)
      out.push_back(Entry{dir, std::move(c.manifest)});
    else if (c.state == State::corrupt && skipped)
      skipped->push_back({dir, false, std::move(c.reason)});
  }
  return out;
}

std::vector<DiskCache::VerifyReport> DiskCache::verify() const {
  std::vector<VerifyReport> out;
  for (const fs::path& dir : children(entries_dir())) {
    Check c = check_entry(dir, nullptr);
    switch (c.state) {
      case State::ok: out.push_back({dir, true, {}}); break;
      case State::other_version: out.push_back({dir, true, "skipped: " + c.reason}); break;
      case State::absent:  // removed while we were listing
        break;
      case State::corrupt:
        out.push_back(
            {dir, false, c.reason + fmt::format("; remove with `gdnc cache rm {}`", dir.filename().string())});
        break;
    }
  }
  return out;
}

void DiskCache::remove_entry_dir(const fs::path& dir) {
  make_dirs(locks_dir());
  make_dirs(tmp_dir());
  const fs::path lock_path = locks_dir() / (dir.filename().string() + ".lock");
  const fs::path aside = tmp_dir() / unique_name(dir.filename().string() + ".removed");
  {
    // Under the key's lock so a concurrent get_or_build() of this key is not in the middle
    // of publishing; unlinking the lock file here is what FileLock's inode re-check is for.
    FileLock lock(lock_path);
    if (::rename(dir.c_str(), aside.c_str()) != 0 && errno != ENOENT) {
      const int e = errno;
      throw CacheError(fmt::format("cannot remove {}: {}", dir.string(), errno_text(e)), dir);
    }
    ::unlink(lock_path.c_str());
  }
  std::error_code ec;
  fs::remove_all(aside, ec);
}

size_t DiskCache::remove(std::string_view key_prefix) {
  if (key_prefix.size() < kMinRemovePrefix)
    throw InputError(fmt::format("key: {} is shorter than {} characters (an entry name or digest prefix)",
                                 quoted_excerpt(key_prefix), kMinRemovePrefix));
  std::vector<fs::path> matches;
  for (const fs::path& dir : children(entries_dir())) {
    bool match = dir.filename().string().starts_with(key_prefix);
    if (!match) {
      // Longer-than-16-hex prefixes can only match the full digest in an intact manifest.
      const Check c = read_manifest(dir, nullptr);
      if (c.state == State::ok || c.state == State::other_version)
        if (const auto it = c.manifest.find("key_digest"); it != c.manifest.end() && it->is_string())
          match = it->get_ref<const std::string&>().starts_with(key_prefix);
    }
    if (match) matches.push_back(dir);
  }
  if (matches.empty())
    throw CacheError(fmt::format("no cache entry matches {} in {}", quoted_excerpt(key_prefix), entries_dir().string()),
                     entries_dir());
  for (const fs::path& dir : matches) remove_entry_dir(dir);
  return matches.size();
}

uint64_t DiskCache::entry_bytes(const Entry& entry) {
  if (auto b = dir_bytes(entry.dir)) return *b;
  uint64_t total = 0;
  if (auto files = entry.manifest.find("files"); files != entry.manifest.end() && files->is_array())
    for (const json& f : *files)
      if (f.is_object() && f.contains("bytes") && f["bytes"].is_number_unsigned()) total += f["bytes"].get<uint64_t>();
  return total;
}

std::vector<fs::path> DiskCache::gc(uint64_t max_bytes) {
  struct Item {
    fs::path dir;
    fs::file_time_type used;
    uint64_t bytes;
  };
  std::vector<Item> items;
  uint64_t total = 0;
  // Every directory counts, corrupt ones included: they take space too and are the first
  // candidates in practice (nobody hits them, so their mtime stays old).
  for (const fs::path& dir : children(entries_dir())) {
    std::error_code ec;
    const auto t = fs::last_write_time(dir, ec);
    if (ec) continue;
    const uint64_t b = dir_bytes(dir).value_or(0);
    items.push_back({dir, t, b});
    total += b;
  }
  std::sort(items.begin(), items.end(),
            [](const Item& a, const Item& b) { return a.used != b.used ? a.used < b.used : a.dir < b.dir; });
  std::vector<fs::path> removed;
  for (const Item& it : items) {
    if (total <= max_bytes) break;
    remove_entry_dir(it.dir);
    total -= it.bytes;
    removed.push_back(it.dir);
  }

  const auto cutoff = fs::file_time_type::clock::now() - kStaleTmpAge;
  for (const fs::path& p : children(tmp_dir())) {
    std::error_code ec;
    const auto t = fs::last_write_time(p, ec);
    if (!ec && t < cutoff) fs::remove_all(p, ec);
  }
  return removed;
}

}  // namespace gdn::cache
