/**
 * @file nccl.cpp
 * @brief dlopen of NCCL (see nccl.hpp).
 */
#include "runtime/nccl.hpp"

#include "common/env.hpp"

#include <dlfcn.h>
#include <fmt/format.h>

#include <map>
#include <memory>
#include <mutex>
#include <type_traits>

namespace gdn::rt {

std::vector<std::string> nccl_search_list(const std::string& path) {
  if (!path.empty()) return {path};  // a path the caller chose is the only one tried
  std::vector<std::string> list;
  if (const char* env = env_value("NCCL_LIBRARY"); env && *env) list.emplace_back(env);
  list.emplace_back("libnccl.so.2");
  return list;
}

std::string Nccl::version_text() const {
  // NCCL >= 2.9 encodes major * 10000 + minor * 100 + patch.
  return fmt::format("{}.{}.{}", version_ / 10000, version_ / 100 % 100, version_ % 100);
}

void Nccl::check(nccl_abi::Result rc, const std::string& what) const {
  if (rc == nccl_abi::kSuccess) return;
  const char* text = get_error_string ? get_error_string(rc) : nullptr;
  throw NcclError(fmt::format("{}: {} (ncclResult_t {})", what, text ? text : "unknown error", rc));
}

namespace {

/// Resolves every entry point of `lib`; returns the first missing one's name, or empty.
std::string resolve(void* lib, Nccl& n) {
  const auto sym = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
    return fn != nullptr;
  };
  if (!sym(n.get_version, "ncclGetVersion")) return "ncclGetVersion";
  if (!sym(n.get_unique_id, "ncclGetUniqueId")) return "ncclGetUniqueId";
  if (!sym(n.comm_init_rank, "ncclCommInitRank")) return "ncclCommInitRank";
  if (!sym(n.comm_destroy, "ncclCommDestroy")) return "ncclCommDestroy";
  if (!sym(n.comm_count, "ncclCommCount")) return "ncclCommCount";
  if (!sym(n.comm_user_rank, "ncclCommUserRank")) return "ncclCommUserRank";
  if (!sym(n.all_gather, "ncclAllGather")) return "ncclAllGather";
  if (!sym(n.get_error_string, "ncclGetErrorString")) return "ncclGetErrorString";
  return {};
}

}  // namespace

const Nccl& Nccl::load(const std::string& path) {
  // One entry per requested path (empty = the search order); a failure is remembered too, so a
  // caller retrying in a loop gets the same message without touching the loader again.
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<Nccl>> loaded;
  static std::map<std::string, std::string> failed;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = loaded.find(path); it != loaded.end()) return *it->second;
  if (auto it = failed.find(path); it != failed.end()) throw NcclError(it->second);

  std::string tried;
  for (const std::string& candidate : nccl_search_list(path)) {
    void* lib = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char* e = dlerror();
      tried += fmt::format("\n  {}: {}", candidate, e ? e : "not loadable");
      continue;
    }
    auto n = std::make_unique<Nccl>();
    n->library_ = candidate;
    std::string error;
    if (const std::string missing = resolve(lib, *n); !missing.empty()) {
      error = fmt::format("NCCL library {} has no entry point {} (not NCCL 2?)", candidate, missing);
    } else if (const nccl_abi::Result rc = n->get_version(&n->version_); rc != nccl_abi::kSuccess) {
      error = fmt::format("NCCL library {}: ncclGetVersion failed (ncclResult_t {})", candidate, rc);
    } else if (n->version_ < kNcclMinVersion) {
      error = fmt::format("NCCL library {} is version {} ({}): gdnc needs 2.18 or newer", candidate, n->version_text(),
                          n->version_);
    }
    if (!error.empty()) {  // a library that loads but cannot serve is an error, not a reason to look further
      dlclose(lib);
      failed[path] = error;
      throw NcclError(error);
    }
    return *(loaded[path] = std::move(n));
  }
  const std::string error = fmt::format(
      "cannot load NCCL; tried:{}\nSet GDNC_NCCL_LIBRARY to libnccl.so.2 (torch's nvidia-nccl wheel has it: python3 -c "
      "\"import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__) + '/lib/libnccl.so.2')\"), or pass "
      "the collective's gathered buffer yourself through the KCP phases",
      tried);
  failed[path] = error;
  throw NcclError(error);
}

}  // namespace gdn::rt
