#include "agent/process_spawner.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <boost/process/args.hpp>
#include <boost/process/child.hpp>
#include <boost/process/env.hpp>
#include <boost/process/environment.hpp>
#include <boost/process/exe.hpp>
#include <boost/process/extend.hpp>

#include "agent/cpu_topology.h"
#include "common/error.h"
#include "common/logging.h"
#include "common/unique_fd.h"

namespace ddprun::agent {
namespace bp = boost::process;
namespace {

// Runs in the forked child between fork and exec: only async-signal-safe calls.
struct WorkerChildSetup : bp::extend::handler {
  pid_t agent_pid;
  int stdout_fd;
  int stderr_fd;
  int cgroup_procs_fd;
  const cpu_set_t* cpus;  // nullptr: keep the agent's affinity.
  size_t cpus_bytes;
  int bind_error_fd;  // gets the errno of a failed sched_setaffinity.

  template <class Executor>
  void on_exec_setup(Executor&) const {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    // The agent may have died between fork and prctl; then nobody would reap us.
    if (::getppid() != agent_pid) ::_exit(127);
    // Where Yama restricts ptrace to ancestors (ptrace_scope 1), the stack tools the agent
    // starts are the worker's cousins, not its ancestors: allow the agent and what it starts.
    // Fails harmlessly (EINVAL) without Yama.
    ::prctl(PR_SET_PTRACER, agent_pid, 0, 0, 0);
    // "0" moves the writer itself; before exec, so that every descendant starts inside.
    if (cgroup_procs_fd >= 0) (void)!::write(cgroup_procs_fd, "0", 1);
    if (cpus != nullptr && ::sched_setaffinity(0, cpus_bytes, cpus) != 0) {
      const int err = errno;
      (void)!::write(bind_error_fd, &err, sizeof err);
      ::_exit(127);
    }
    if (stdout_fd >= 0) ::dup2(stdout_fd, STDOUT_FILENO);
    if (stderr_fd >= 0) ::dup2(stderr_fd, STDERR_FILENO);
    // Ignored signals stay ignored across exec; the agent ignores SIGPIPE for itself only.
    ::signal(SIGPIPE, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
  }
};

// A cpu_set_t sized for the highest CPU in `cpus` (hosts may have more than 1024).
class CpuMask {
 public:
  explicit CpuMask(const std::set<int>& cpus) {
    if (cpus.empty()) return;
    const int count = *cpus.rbegin() + 1;
    set_ = CPU_ALLOC(count);
    bytes_ = CPU_ALLOC_SIZE(count);
    CPU_ZERO_S(bytes_, set_);
    for (int cpu : cpus) CPU_SET_S(cpu, bytes_, set_);
  }
  ~CpuMask() {
    if (set_) CPU_FREE(set_);
  }
  CpuMask(const CpuMask&) = delete;
  CpuMask& operator=(const CpuMask&) = delete;
  const cpu_set_t* get() const { return set_; }
  size_t bytes() const { return bytes_; }

 private:
  cpu_set_t* set_ = nullptr;
  size_t bytes_ = 0;
};

void warnNotInCgroup(const std::string& cgroup, int err) {
  logger("agent")->warn("cannot start a worker in cgroup {}: {}; it is contained by its process group only", cgroup,
                        std::strerror(err));
}

// Prepares the child's end of one stream; for a pipe also the agent's read end.
void openTarget(const StdioTarget& target, UniqueFd& child_end, UniqueFd& agent_end) {
  switch (target.kind) {
    case StdioTarget::Kind::kInherit: return;
    case StdioTarget::Kind::kFile: {
      int fd = ::open(target.path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd < 0) throw SystemError("open(" + target.path + ")", errno);
      child_end.reset(fd);
      return;
    }
    case StdioTarget::Kind::kPipe: {
      int fds[2];
      if (::pipe2(fds, O_CLOEXEC) != 0) throw SystemError("pipe2()", errno);
      agent_end.reset(fds[0]);
      child_end.reset(fds[1]);
      return;
    }
  }
}

}  // namespace

SpawnedProcess spawnWorker(const SpawnRequest& request) {
  UniqueFd out_child, out_agent, err_child, err_agent;
  openTarget(request.out, out_child, out_agent);
  openTarget(request.err, err_child, err_agent);

  bp::environment env;
  for (const auto& [key, value] : request.env) env[key] = value;
  std::vector<std::string> args(request.argv.begin() + 1, request.argv.end());

  UniqueFd cgroup_procs;
  if (!request.cgroup.empty()) {
    cgroup_procs.reset(::open((request.cgroup + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC));
    if (cgroup_procs.get() < 0) warnNotInCgroup(request.cgroup, errno);
  }

  // The child tells a failed binding apart from a failed exec through its own pipe.
  CpuMask cpus(request.cpus);
  UniqueFd bind_error_read, bind_error_write;
  if (cpus.get()) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) throw SystemError("pipe2()", errno);
    bind_error_read.reset(fds[0]);
    bind_error_write.reset(fds[1]);
  }

  std::error_code ec;
  bp::child child(bp::exe = request.argv.front(), bp::args = args, env,
                  WorkerChildSetup{{},
                                   ::getpid(),
                                   out_child.get(),
                                   err_child.get(),
                                   cgroup_procs.get(),
                                   cpus.get(),
                                   cpus.bytes(),
                                   bind_error_write.get()},
                  ec);
  if (ec) throw SystemError("exec " + request.argv.front(), ec.value());
  // A child that could not bind wrote its errno and exited before its exec pipe closed,
  // so the number is here by now.
  int bind_errno = 0;
  if (cpus.get() && ::read(bind_error_read.get(), &bind_errno, sizeof bind_errno) == sizeof bind_errno) {
    std::error_code ignored;
    child.wait(ignored);
    throw SystemError(
        "bind worker " + request.argv.front() + " to CPUs " + formatCpuList(request.cpus) + " (sched_setaffinity)",
        bind_errno);
  }

  SpawnedProcess spawned;
  spawned.pid = child.id();
  // The child cannot report a failed write. Moving a process into the cgroup it is in
  // already succeeds, so a second write here both checks and, failing that, retries.
  if (cgroup_procs.get() >= 0) {
    const std::string pid = std::to_string(spawned.pid);
    spawned.in_cgroup = ::write(cgroup_procs.get(), pid.data(), pid.size()) >= 0;
    if (!spawned.in_cgroup) warnNotInCgroup(request.cgroup, errno);
  }
  // The agent reaps its workers itself (SIGCHLD + waitpid) so Boost must let go.
  child.detach();
  spawned.stdout_pipe = out_agent.release();
  spawned.stderr_pipe = err_agent.release();
  return spawned;
}

}  // namespace ddprun::agent
