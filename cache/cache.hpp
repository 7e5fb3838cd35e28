/**
 * @file cache/cache.hpp
 * @brief On-disk cache of compiled kernels: one verified, self-describing directory per key.
 *
 * Layout, manifest schema and the publish/lock protocol are described in docs/cache.md.
 * Summary: readers never lock and only ever open published directories under
 * `<root>/entries/`; writers serialise per key through an OFD `fcntl` lock, build into a
 * unique directory under `<root>/tmp/`, fsync, and publish with one `rename()`.
 */
#pragma once

#include "common/error.hpp"

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace gdn::cache {

/// Lower-case hex SHA-256 of @p bytes (64 characters). Throws std::runtime_error only if
/// libcrypto itself fails.
std::string sha256_hex(std::string_view bytes);

/// Default cache root: `$GDNC_CACHE_DIR`, else `$XDG_CACHE_HOME/gdnc`, else `$HOME/.cache/gdnc`.
/// Empty variables count as unset. Throws CacheError if none of the three is set.
/// The directory is not created here; DiskCache creates it on the first write.
std::filesystem::path default_root();

/// Version of the on-disk layout and manifest schema. It is part of every key digest, so
/// bumping it makes every old entry a plain miss (never garbage).
inline constexpr int kFormatVersion = 1;

/// Identity of one cache entry.
struct Key {
  /// SHA-256 hex of the canonical dump of `{"format_version": kFormatVersion, "key_inputs": inputs}`.
  std::string digest;
  /// Human-readable tag, sanitized to `[A-Za-z0-9._-]` (e.g. "m_layer.fwd_wu.sm_90a").
  std::string readable;
  /// The key inputs exactly as hashed; stored in the manifest so an entry explains itself.
  nlohmann::json inputs;

  /// `"<first 16 hex of digest>.<readable>"`: the entry's directory name and the `<key>`
  /// that `gdnc cache rm` accepts.
  std::string dir_name() const;
};

/// Builds a Key. The digest is a pure function of @p key_inputs and kFormatVersion: object
/// key order does not matter (nlohmann's default object is a sorted map, so dump() is
/// canonical), every value does. @p readable is only a label and is not hashed; characters
/// outside `[A-Za-z0-9._-]` become '_', it is cut to 96 characters, and empty becomes "entry".
/// Precondition: @p key_inputs holds only valid UTF-8 strings (else nlohmann's type_error 316).
Key make_key(nlohmann::json key_inputs, std::string readable);

/// One artifact of an entry, e.g. {"program.cubin", <bytes>}.
struct File {
  std::string name;  ///< plain file name: `[A-Za-z0-9._-]`, not "manifest.json", not "."/".."
  std::string bytes;
};

/// What a build callback returns.
struct BuildResult {
  std::vector<File> files;
  nlohmann::json info;  ///< free-form metadata: entry names, registers, shared memory, ...
};

/// Thrown for cache I/O failures and for corrupt entries that cannot be repaired in place.
/// what() names the path and, where an entry is involved, the remedy `gdnc cache rm <key>`.
class CacheError : public Error {
 public:
  CacheError(const std::string& message, std::filesystem::path path);
  /// The file or directory the error is about.
  const std::filesystem::path& path() const noexcept { return path_; }

  /// Error about entry directory @p entry_dir (or a file in it, @p path): appends
  /// "; remove it with `gdnc cache rm <dir name>`".
  static CacheError corrupt(const std::string& problem, const std::filesystem::path& path,
                            const std::filesystem::path& entry_dir);

 private:
  std::filesystem::path path_;
};

/// A published entry. Holding an Entry does not pin it: `gdnc cache rm`/gc may delete the
/// directory afterwards, in which case read_file() throws CacheError.
struct Entry {
  std::filesystem::path dir;
  /// {format_version, key_digest, readable, key_inputs, info, files:[{name, bytes, sha256}],
  ///  created_unix, created_by:{pid, host}, manifest_sha256}; see docs/cache.md.
  nlohmann::json manifest;

  /// Contents of file @p name, checked against the manifest's size and sha256 again (the
  /// entry may have been damaged or removed since it was found). Throws CacheError if the
  /// name is not in the manifest, the file is missing or unreadable, or it does not match.
  std::string read_file(std::string_view name) const;
};

/// How get_or_build() satisfied a request.
enum class Outcome { hit, built, rebuilt_corrupt };

struct Fetched {
  Entry entry;
  Outcome outcome;
  std::string corrupt_reason;  ///< set for Outcome::rebuilt_corrupt; names the bad path
};

/// The cache rooted at one directory. Cheap to construct; holds no open files. Safe to use
/// from several threads and processes at once (see docs/cache.md for the protocol).
class DiskCache {
 public:
  /// Does not touch the filesystem; directories are created on the first write.
  explicit DiskCache(std::filesystem::path root = default_root());

  const std::filesystem::path& root() const noexcept { return root_; }

  /// Verified lookup: the manifest parses, its manifest_sha256 matches, its format version
  /// and key digest match @p key, and every listed file is present with the right size and
  /// sha256. Readers never lock. On a hit the entry directory's mtime is bumped (best effort)
  /// so gc() sees it as recently used. On a miss, @p why_not (if given) receives the reason:
  /// "no entry at <path>" or the corruption found, naming the path. Never throws for a
  /// missing or corrupt entry; throws CacheError only for unexpected I/O failures.
  std::optional<Entry> find(const Key& key, std::string* why_not = nullptr) const;

  /// find(); on a miss take the per-key lock, look again, and otherwise call @p build() and
  /// publish its result atomically. A corrupt entry is moved aside, removed and rebuilt
  /// (Outcome::rebuilt_corrupt, with the reason). Exceptions from @p build() propagate after
  /// the temporary directory is removed; no entry is published then. Throws
  /// std::invalid_argument for a BuildResult with an invalid or duplicate file name, and
  /// CacheError for I/O failures (no temporary files are left behind in either case).
  Fetched get_or_build(const Key& key, const std::function<BuildResult()>& build);

  struct VerifyReport {
    std::filesystem::path dir;
    bool ok;
    std::string problem;  ///< empty when ok, except for entries of another format version
  };

  /// Every directory under entries/ whose manifest is intact: it parses within the reader's
  /// limits, its manifest_sha256 matches and, for this kFormatVersion, every field has the
  /// schema's type (entries of other versions are listed as they are). Sorted by directory
  /// name. File contents are not checked (use verify()). Directories with a damaged manifest are
  /// left out and, if @p skipped is given, reported there with the reason.
  std::vector<Entry> list(std::vector<VerifyReport>* skipped = nullptr) const;
  /// Fully checks every directory under entries/, including that its name and digest agree
  /// with the stored key inputs. Entries of another kFormatVersion are reported ok with a
  /// "skipped" note: they belong to another gdnc build sharing the directory.
  std::vector<VerifyReport> verify() const;

  /// Removes every entry whose directory name, or manifest key_digest, starts with
  /// @p key_prefix; returns how many. Throws InputError if the prefix is shorter than 6
  /// characters, CacheError if nothing matches.
  size_t remove(std::string_view key_prefix);

  /// Removes least recently used entries (oldest directory mtime first; find() hits bump it)
  /// until the total size of entries is <= @p max_bytes. Also removes temporary directories
  /// older than one hour, left by crashed writers. Returns the removed entry directories.
  std::vector<std::filesystem::path> gc(uint64_t max_bytes);

  /// Bytes on disk of the entry (all regular files in its directory, manifest included);
  /// falls back to the sizes in the manifest if the directory is gone.
  static uint64_t entry_bytes(const Entry& entry);

 private:
  std::filesystem::path entries_dir() const { return root_ / "entries"; }
  std::filesystem::path locks_dir() const { return root_ / "locks"; }
  std::filesystem::path tmp_dir() const { return root_ / "tmp"; }
  /// Renames an entry directory into tmp/ and deletes it, under the per-key lock.
  void remove_entry_dir(const std::filesystem::path& dir);

  std::filesystem::path root_;
};

}  // namespace gdn::cache
