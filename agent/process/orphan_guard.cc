#include "agent/process/orphan_guard.h"

#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <set>
#include <string>
#include <thread>

#include "agent/process/cgroup_v2.h"
#include "agent/process/process_signals.h"
#include "common/error.h"
#include "common/logging.h"
#include "common/unique_fd.h"

namespace ddprun::agent {
namespace {

// One record on the pipe: this header, then path_len bytes of path. A record is one write of at most PIPE_BUF bytes, so
// it arrives whole.
enum RecordKind : int32_t {
  kWatchGroup = 1,
  kForgetGroup,
  kWatchCgroup,
  kForgetCgroup,
  kWatchProcess,
  kForgetProcess,
  kWatchDirectory,
  kForgetDirectory
};
struct RecordHeader {
  int32_t kind;
  int32_t pid;
  uint64_t start_time;
  uint32_t path_len;
};
constexpr size_t kMaxPath = PIPE_BUF - sizeof(RecordHeader);

// Reads exactly `size` bytes; false at EOF or on error.
bool readFull(int fd, void* data, size_t size) {
  auto* p = static_cast<char*>(data);
  while (size > 0) {
    ssize_t n = ::read(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

[[noreturn]] void guardMain(int read_fd) {
  ::setsid();
  ::prctl(PR_SET_NAME, "ddprun-guard");
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGPIPE}) ::signal(sig, SIG_IGN);
  // Holding the agent's stdout/stderr would delay EOF for whoever reads them.
  if (UniqueFd devnull(::open("/dev/null", O_RDWR)); devnull) {
    ::dup2(devnull.get(), 0);
    ::dup2(devnull.get(), 1);
    ::dup2(devnull.get(), 2);
    if (devnull.get() <= 2) (void)devnull.release();  // it is one of the three now: keep it open
  }
  std::set<int32_t> groups;
  std::set<std::string> cgroups;
  std::set<ProcessStamp> processes;
  std::set<std::string> directories;
  for (;;) {
    RecordHeader header;
    if (!readFull(read_fd, &header, sizeof header)) break;  // EOF: the agent is gone (or closed the pipe).
    std::string path(header.path_len, '\0');
    if (header.path_len > kMaxPath || !readFull(read_fd, path.data(), path.size())) break;
    const ProcessStamp process{header.pid, header.start_time};
    switch (header.kind) {
      case kWatchGroup: groups.insert(header.pid); break;
      case kForgetGroup: groups.erase(header.pid); break;
      case kWatchCgroup: cgroups.insert(path); break;
      case kForgetCgroup: cgroups.erase(path); break;
      case kWatchProcess: processes.insert(process); break;
      case kForgetProcess: processes.erase(process); break;
      case kWatchDirectory: directories.insert(path); break;
      case kForgetDirectory: directories.erase(path); break;
      default: break;
    }
  }
  // Everything is killed before the guard waits for anything, so all of it dies together.
  for (const std::string& dir : cgroups) killCgroup(dir);
  for (const ProcessStamp& process : processes) killStamped(process);
  for (int32_t pgid : groups) signalGroup(pgid, SIGKILL);
  for (const std::string& dir : directories) {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  const auto deadline = std::chrono::steady_clock::now() + OrphanGuard::kCgroupRemoveTimeout;
  while (!cgroups.empty()) {
    std::erase_if(cgroups, [](const std::string& dir) { return removeCgroupTree(dir); });
    if (cgroups.empty() || std::chrono::steady_clock::now() >= deadline) break;
    // Without cgroup.kill a process forked meanwhile survives one kill: kill again.
    for (const std::string& dir : cgroups) killCgroup(dir);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::_exit(0);
}

}  // namespace

OrphanGuard::OrphanGuard() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw SystemError("pipe2() for the orphan guard", errno);
  UniqueFd read_end(fds[0]);
  UniqueFd write_end(fds[1]);
  pid_t pid = ::fork();
  if (pid < 0) {
    const int err = errno;
    throw SystemError("fork() of the orphan guard", err);
  }
  if (pid == 0) {
    write_end.reset();
    guardMain(read_end.get());
  }
  read_end.reset();
  // A guard that stops reading (stopped by a signal) must not stall the agent on a full pipe.
  ::fcntl(write_end.get(), F_SETFL, O_NONBLOCK);
  guard_pid_ = pid;
  write_fd_ = std::move(write_end);
}

OrphanGuard::~OrphanGuard() {
  write_fd_.reset();
  if (guard_pid_ <= 0) return;
  // On EOF the guard exits at once. One that cannot (stopped by a signal, or stuck) must not hold ddprun's exit: after
  // kReapTimeout it is killed and reaped.
  auto deadline = std::chrono::steady_clock::now() + kReapTimeout;
  for (;;) {
    pid_t reaped = ::waitpid(guard_pid_, nullptr, WNOHANG);
    if (reaped == guard_pid_ || (reaped < 0 && errno != EINTR)) return;
    if (std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  logger("agent")->warn(
      "orphan guard (pid {}) did not exit within {} ms of "
      "the agent's end; killing it",
      guard_pid_, kReapTimeout.count());
  signalProcess(guard_pid_, SIGKILL);
  while (::waitpid(guard_pid_, nullptr, 0) < 0 && errno == EINTR) {
  }
}

void OrphanGuard::watch(pid_t pgid) { send(kWatchGroup, pgid, 0, {}); }
void OrphanGuard::forget(pid_t pgid) { send(kForgetGroup, pgid, 0, {}); }
void OrphanGuard::watchCgroup(const std::string& dir) { send(kWatchCgroup, 0, 0, dir); }
void OrphanGuard::forgetCgroup(const std::string& dir) { send(kForgetCgroup, 0, 0, dir); }
void OrphanGuard::watchProcess(const ProcessStamp& p) { send(kWatchProcess, p.pid, p.start_time, {}); }
void OrphanGuard::forgetProcess(const ProcessStamp& p) { send(kForgetProcess, p.pid, p.start_time, {}); }
void OrphanGuard::watchDirectory(const std::string& dir) { send(kWatchDirectory, 0, 0, dir); }
void OrphanGuard::forgetDirectory(const std::string& dir) { send(kForgetDirectory, 0, 0, dir); }

void OrphanGuard::send(int kind, pid_t pid, uint64_t start_time, const std::string& path) {
  if (path.size() > kMaxPath) {
    logger("agent")->warn(
        "orphan guard cannot take path {} (over {} bytes); "
        "it is not cleaned up if ddprun is killed",
        path, kMaxPath);
    return;
  }
  char record[PIPE_BUF];
  RecordHeader header{kind, pid, start_time, static_cast<uint32_t>(path.size())};
  std::memcpy(record, &header, sizeof header);
  std::memcpy(record + sizeof header, path.data(), path.size());
  const size_t size = sizeof header + path.size();
  ssize_t n;
  do {
    n = ::write(write_fd_.get(), record, size);
  } while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(size) && !warned_) {
    warned_ = true;
    logger("agent")->warn(
        "orphan guard unreachable (pid {}): {}; workers may "
        "outlive a killed ddprun",
        guard_pid_, n < 0 ? std::strerror(errno) : "short write");
  }
}

}  // namespace ddprun::agent
