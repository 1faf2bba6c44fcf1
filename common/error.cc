#include "common/error.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace ddprun {

SystemError::SystemError(const std::string& what, int err, const std::string& detail)
    : DdprunError(what + ": " + std::strerror(err) + detail), code_(err) {}

void checkFailed(const char* expr, const char* file, int line, const std::string& detail) {
  std::fprintf(stderr, "ddprun: internal check failed: %s at %s:%d%s%s\n", expr, file, line, detail.empty() ? "" : ": ",
               detail.c_str());
  std::abort();
}

}  // namespace ddprun
