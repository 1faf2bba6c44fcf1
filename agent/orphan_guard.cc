#include "agent/orphan_guard.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <set>
#include <thread>

#include "common/error.h"
#include "common/logging.h"

namespace ddprun::agent {
namespace {

[[noreturn]] void guardMain(int read_fd) {
  ::setsid();
  ::prctl(PR_SET_NAME, "ddprun-guard");
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGPIPE}) ::signal(sig, SIG_IGN);
  // Holding the agent's stdout/stderr would delay EOF for whoever reads them.
  int devnull = ::open("/dev/null", O_RDWR);
  if (devnull >= 0) {
    ::dup2(devnull, 0);
    ::dup2(devnull, 1);
    ::dup2(devnull, 2);
    if (devnull > 2) ::close(devnull);
  }
  std::set<int32_t> groups;
  int32_t record = 0;
  for (;;) {
    ssize_t n = ::read(read_fd, &record, sizeof record);
    if (n == static_cast<ssize_t>(sizeof record)) {
      if (record > 0) groups.insert(record);
      if (record < 0) groups.erase(-record);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    break;  // EOF: the agent is gone (or closed the pipe on its way out).
  }
  for (int32_t pgid : groups) ::kill(-pgid, SIGKILL);
  ::_exit(0);
}

}  // namespace

OrphanGuard::OrphanGuard() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw SystemError("pipe2() for the orphan guard", errno);
  pid_t pid = ::fork();
  if (pid < 0) {
    int err = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    throw SystemError("fork() of the orphan guard", err);
  }
  if (pid == 0) {
    ::close(fds[1]);
    guardMain(fds[0]);
  }
  ::close(fds[0]);
  guard_pid_ = pid;
  write_fd_ = fds[1];
}

OrphanGuard::~OrphanGuard() {
  if (write_fd_ >= 0) ::close(write_fd_);
  if (guard_pid_ <= 0) return;
  // On EOF the guard exits at once. One that cannot (stopped by a signal, or stuck) must not
  // hold ddprun's exit: after kReapTimeout it is killed and reaped.
  auto deadline = std::chrono::steady_clock::now() + kReapTimeout;
  for (;;) {
    pid_t reaped = ::waitpid(guard_pid_, nullptr, WNOHANG);
    if (reaped == guard_pid_ || (reaped < 0 && errno != EINTR)) return;
    if (std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  logger("agent")->warn("orphan guard (pid {}) did not exit within {} ms of the agent's end; killing it", guard_pid_,
                        kReapTimeout.count());
  ::kill(guard_pid_, SIGKILL);
  while (::waitpid(guard_pid_, nullptr, 0) < 0 && errno == EINTR) {
  }
}

void OrphanGuard::watch(pid_t pgid) { send(static_cast<int>(pgid)); }
void OrphanGuard::forget(pid_t pgid) { send(-static_cast<int>(pgid)); }

void OrphanGuard::send(int record) {
  int32_t value = record;
  ssize_t n;
  do {
    n = ::write(write_fd_, &value, sizeof value);
  } while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(sizeof value)) {
    logger("agent")->warn("orphan guard unreachable (pid {}); workers may outlive a killed ddprun", guard_pid_);
  }
}

}  // namespace ddprun::agent
