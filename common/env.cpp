#include "common/env.hpp"

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>

namespace gdn {

const char* env_value(const char* name, std::string* used) {
  const std::string current = std::string("GDNC_") + name, old = std::string("GDN_") + name;
  if (const char* v = std::getenv(current.c_str())) {
    if (used) *used = current;
    return v;
  }
  const char* v = std::getenv(old.c_str());
  if (v == nullptr) return nullptr;
  if (used) *used = old;
  static std::mutex mutex;
  static std::set<std::string> noted;
  std::lock_guard<std::mutex> lock(mutex);
  if (noted.insert(old).second)
    std::fprintf(stderr, "gdnc: %s is deprecated and will stop working; set %s instead\n", old.c_str(),
                 current.c_str());
  return v;
}

}  // namespace gdn
