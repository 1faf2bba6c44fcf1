#include "agent/process/process_signals.h"

#include <signal.h>

#include <cerrno>

namespace ddprun::agent {

int signalProcess(pid_t pid, int signal) noexcept {
  if (pid <= 1) return EINVAL;
  return ::kill(pid, signal) == 0 ? 0 : errno;
}

int signalGroup(pid_t pgid, int signal) noexcept {
  if (pgid <= 1) return EINVAL;
  return ::kill(-pgid, signal) == 0 ? 0 : errno;
}

}  // namespace ddprun::agent
