// Waiting for a child of this process to end on the event itself, not by looking every few
// milliseconds: a pidfd (Linux 5.3) turns readable when the process it names has ended, so
// a bounded wait for a child is one poll() whose timeout is only the failure guard.
// Header-only: the bounded-call and capped-child helpers use it from programs that link no
// test-support library.
#pragma once

#include <poll.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>

namespace ddprun::testing {

// Reaps `pid` (a child of this process, not yet reaped) once it has ended, waiting at most
// `timeout`; its wait status goes to *status. Returns false when it is still running at the
// deadline (it is left alone: the caller kills it or waits on). Throws where the kernel has
// no pidfd (before Linux 5.3), rather than waiting without a bound.
inline bool reapWithin(pid_t pid, int* status, std::chrono::milliseconds timeout) {
  const pid_t done = ::waitpid(pid, status, WNOHANG);
  if (done == pid) return true;
  if (done < 0) throw std::runtime_error("waitpid(" + std::to_string(pid) + "): " + std::strerror(errno));
  // The system call, not glibc's wrapper: Debian 12's <sys/pidfd.h> declares it without C
  // linkage, so a C++ program cannot link against it.
  const int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) throw std::runtime_error("pidfd_open(" + std::to_string(pid) + "): " + std::strerror(errno));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  bool ended = false;
  for (;;) {
    // Checked after the pidfd was opened too: a child that ended before it is a zombie, and
    // the pidfd of a zombie is readable at once.
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    pollfd p{fd, POLLIN, 0};
    const int n = ::poll(&p, 1, left > 0 ? static_cast<int>(left) : 0);
    if (n > 0) {
      ended = true;
      break;
    }
    if (n == 0 || (n < 0 && errno != EINTR)) break;
  }
  ::close(fd);
  return ended && ::waitpid(pid, status, 0) == pid;
}

}  // namespace ddprun::testing
