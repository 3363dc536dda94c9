// The core's one error type.  Messages name the op, dtype, sizes and rank so
// that a failure on rank 5 of 48 can be read without a debugger.
#pragma once

#include <stdexcept>
#include <string>

namespace hcomm {

enum class ErrorKind : int {
  kInvalidArgument = 0,  // caller's fault, raised before any communication
  kRuntime,              // communication failed (peer died, link cut, mismatch)
  kTimeout,              // the group timeout passed
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

// Throws an invalid-argument Error with `message` when `cond` is false.
#define HCOMM_CHECK_ARG(cond, message)                                            \
  do {                                                                            \
    if (!(cond)) throw ::hcomm::Error(::hcomm::ErrorKind::kInvalidArgument, (message)); \
  } while (0)

}  // namespace hcomm
