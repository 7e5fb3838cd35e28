/**
 * @file common/error.hpp
 * @brief The base of every error gdnc reports, and the input errors shared by several layers.
 *
 * One design for all of them: what() is the whole message, written for the user, naming the
 * field, argument, file or path it is about. Callers that only want "did gdnc refuse this" catch
 * gdn::Error; the CLI and the C ABI map the subclasses to exit codes and status codes. The Python
 * binding mirrors it (gdnc.GdncError and its subclasses).
 */
#pragma once

#include <stdexcept>
#include <string>

namespace gdn {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Invalid call arguments (shapes, sizes, pointers, command-line values); what() starts with the
/// argument's name, e.g. "T: 0 is out of range (1 to 2^31-1)".
class InputError : public Error {
 public:
  using Error::Error;
};

}  // namespace gdn
