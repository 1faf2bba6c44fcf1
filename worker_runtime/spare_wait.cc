#include "worker_runtime/spare_wait.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <string_view>

#include "common/env_reader.h"
#include "common/error.h"
#include "common/recovery_keys.h"
#include "common/spare_assignment.h"
#include "common/text_escape.h"

namespace ddprun::runtime {
namespace {

[[noreturn]] void fail(const std::string& why) {
  const std::string line = "ddprun spare: " + why + "\n";
  (void)!::write(STDERR_FILENO, line.data(), line.size());
  ::_exit(2);
}

void wait() {
  const char* spare = std::getenv(recovery::kSpareEnv);
  if (spare == nullptr || std::string_view(spare) != "1") return;
  int fd = -1;
  try {
    fd = static_cast<int>(
        env::parseInteger(recovery::kSpareFdEnv, env::stringOr(recovery::kSpareFdEnv, ""), 0, 1 << 30));
  } catch (const UsageError& e) {
    fail(e.what());
  }
  recovery::SpareAssignmentReader reader;
  char buffer[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(std::string(recovery::kSpareFdEnv) + "=" + std::to_string(fd) + ": " + std::strerror(errno));
    // Retired before it was needed: nothing of the program runs.
    if (n == 0) ::_exit(0);
    std::optional<recovery::SpareAssignment> assignment;
    try {
      assignment = reader.add(std::string_view(buffer, static_cast<size_t>(n)));
    } catch (const UsageError& e) {
      fail(e.what());
    }
    if (!assignment) continue;
    ::close(fd);
    for (const auto& [name, value] : assignment->set) ::setenv(name.c_str(), value.c_str(), 1);
    for (const std::string& name : assignment->unset) ::unsetenv(name.c_str());
    return;
  }
}

// Before main: nothing of the program may run without its rank.
[[maybe_unused]] const bool kWaitedBeforeMain = (awaitSpareAssignment(), true);

}  // namespace

void awaitSpareAssignment() {
  static std::once_flag once;
  std::call_once(once, wait);
}

}  // namespace ddprun::runtime
