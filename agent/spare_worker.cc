#include "agent/spare_worker.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include "common/env_names.h"
#include "common/error.h"
#include "common/recovery_keys.h"

namespace ddprun::agent {

std::map<std::string, std::string> spareEnvironment(std::map<std::string, std::string> worker_env,
                                                    const std::map<std::string, std::string>& base, int assignment_fd) {
  for (const char* name : {env::kRank, env::kLocalRank, env::kRoleRank, env::kErrorFile, recovery::kGenerationEnv}) {
    worker_env.erase(name);
  }
  // --virtual_local_rank gives each local rank its own device list: the spare has none yet.
  if (const auto it = base.find(env::kCudaVisibleDevices); it != base.end()) {
    worker_env[env::kCudaVisibleDevices] = it->second;
  } else {
    worker_env.erase(env::kCudaVisibleDevices);
  }
  worker_env[recovery::kSpareEnv] = "1";
  worker_env[recovery::kSpareFdEnv] = std::to_string(assignment_fd);
  return worker_env;
}

void makeAssignmentPipe(UniqueFd ends[2]) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw SystemError("pipe2() for a spare worker", errno);
  ends[0].reset(fds[0]);
  ends[1].reset(fds[1]);
  // The worker's stdout and stderr are put at 1 and 2 after the fork: its read end must be elsewhere.
  if (ends[0].get() <= STDERR_FILENO) {
    const int moved = ::fcntl(ends[0].get(), F_DUPFD_CLOEXEC, STDERR_FILENO + 1);
    if (moved < 0) throw SystemError("fcntl(F_DUPFD_CLOEXEC) for a spare worker", errno);
    ends[0].reset(moved);
  }
  if (::fcntl(ends[1].get(), F_SETFL, O_NONBLOCK) != 0) throw SystemError("fcntl(O_NONBLOCK) for a spare", errno);
}

void sendAssignment(int fd, const std::string& bytes) {
  const int capacity = ::fcntl(fd, F_GETPIPE_SZ);
  if (capacity >= 0 && static_cast<size_t>(capacity) < bytes.size() &&
      ::fcntl(fd, F_SETPIPE_SZ, static_cast<int>(bytes.size())) < 0) {
    throw SystemError("grow a spare worker's pipe to " + std::to_string(bytes.size()) + " bytes", errno);
  }
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw SystemError("write a spare worker's assignment", errno);
    done += static_cast<size_t>(n);
  }
}

void moveIntoCgroup(const std::string& cgroup, pid_t pid) {
  UniqueFd procs(::open((cgroup + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC));
  if (!procs) throw SystemError("open " + cgroup + "/cgroup.procs", errno);
  const std::string text = std::to_string(pid);
  if (::write(procs.get(), text.data(), text.size()) < 0) throw SystemError("move the spare into " + cgroup, errno);
}

}  // namespace ddprun::agent
