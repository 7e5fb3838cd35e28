/**
 * @file common/env.hpp
 * @brief gdnc's environment variables: one prefix, GDNC_, with the older GDN_ names still read.
 */
#pragma once

#include <string>

namespace gdn {

/// The value of `GDNC_<name>`, else of the deprecated `GDN_<name>` (with a one-time note on stderr
/// that names the new variable), else nullptr. `used` (if not null) receives the variable read, so
/// a message about a bad value names what the user set.
const char* env_value(const char* name, std::string* used = nullptr);

}  // namespace gdn
