// Errors shared by every layer. Recoverable failures (I/O, timeouts, a peer that
// failed, a usage mistake) derive from DdprunError; bugs and misuse fail DDPRUN_CHECK,
// which names the expression so the report is actionable without a debugger.
#pragma once

#include <stdexcept>
#include <string>

namespace ddprun {

class DdprunError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Bad command-line input or configuration; the launcher exits 2 on it.
class UsageError : public DdprunError {
 public:
  using DdprunError::DdprunError;
};

// The rendezvous could not form a job (timeout, closed, unsupported); exit 3.
class RendezvousError : public DdprunError {
 public:
  using DdprunError::DdprunError;
};

// A system call failed; the message carries the call, its subject and strerror.
class SystemError : public DdprunError {
 public:
  // "what: strerror(err)" and then `detail` (for example who holds a port in use).
  SystemError(const std::string& what, int err, const std::string& detail = "");
  int code() const { return code_; }

 private:
  int code_;
};

[[noreturn]] void checkFailed(const char* expr, const char* file, int line, const std::string& detail);

}  // namespace ddprun

#define DDPRUN_CHECK(cond, ...)                                                              \
  do {                                                                                       \
    if (!(cond)) ::ddprun::checkFailed(#cond, __FILE__, __LINE__, std::string{__VA_ARGS__}); \
  } while (0)
