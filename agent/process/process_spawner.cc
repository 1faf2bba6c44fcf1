#include "agent/process/process_spawner.h"

#include <fcntl.h>
#include <linux/sched.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "agent/placement/cpu_topology.h"
#include "common/error.h"
#include "common/logging.h"
#include "common/unique_fd.h"
#include "rendezvous/store/descriptor_limit.h"

namespace ddprun::agent {
namespace {

// What the child reports through its error pipe when it fails before exec.
struct ChildFailure {
  int stage;  // kBindFailed or kExecFailed
  int err;
};
constexpr int kBindFailed = 1;
constexpr int kExecFailed = 2;

// What the child does between clone and exec: only async-signal-safe calls, on memory the
// parent prepared.
struct ChildPlan {
  pid_t agent_pid;
  int stdout_fd;
  int stderr_fd;
  int cgroup_procs_fd;    // fork fallback: the child moves itself into the cgroup; else -1
  const cpu_set_t* cpus;  // nullptr: keep the agent's affinity.
  size_t cpus_bytes;
  int error_fd;  // close-on-exec: gets a ChildFailure when the child fails before exec
  const char* path;
  char* const* argv;
  char* const* envp;
  rlimit nofile;        // the descriptor limit the worker gets back
  bool restore_nofile;  // whether the store raised the agent's (rendezvous/store/descriptor_limit.h)
  int inherit_fd;       // kept open across exec; -1: none
};

[[noreturn]] void runChild(const ChildPlan& plan) {
  ::setpgid(0, 0);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  // The agent may have died between clone and prctl; then nobody would reap us.
  if (::getppid() != plan.agent_pid) ::_exit(127);
  // Where Yama restricts ptrace to ancestors (ptrace_scope 1), the stack tools the agent
  // starts are the worker's cousins, not its ancestors: allow the agent and what it starts.
  // Fails harmlessly (EINVAL) without Yama.
  ::prctl(PR_SET_PTRACER, plan.agent_pid, 0, 0, 0);
  // "0" moves the writer itself; before exec, so that every descendant starts inside.
  if (plan.cgroup_procs_fd >= 0) (void)!::write(plan.cgroup_procs_fd, "0", 1);
  if (plan.cpus != nullptr && ::sched_setaffinity(0, plan.cpus_bytes, plan.cpus) != 0) {
    const ChildFailure failure{kBindFailed, errno};
    (void)!::write(plan.error_fd, &failure, sizeof failure);
    ::_exit(127);
  }
  if (plan.stdout_fd >= 0) ::dup2(plan.stdout_fd, STDOUT_FILENO);
  if (plan.stderr_fd >= 0) ::dup2(plan.stderr_fd, STDERR_FILENO);
  if (plan.inherit_fd >= 0) ::fcntl(plan.inherit_fd, F_SETFD, 0);
  // The user's descriptor limit, not the one the agent raised for its store's clients.
  if (plan.restore_nofile) (void)::setrlimit(RLIMIT_NOFILE, &plan.nofile);
  // Ignored signals stay ignored across exec; the agent ignores SIGPIPE for itself only.
  ::signal(SIGPIPE, SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::execve(plan.path, plan.argv, plan.envp);
  const ChildFailure failure{kExecFailed, errno};
  (void)!::write(plan.error_fd, &failure, sizeof failure);
  ::_exit(127);
}

// clone3 with CLONE_INTO_CGROUP starts the child inside its cgroup (Linux 5.7+). Moving a
// process in afterwards through cgroup.procs takes the kernel's cgroup threadgroup lock,
// which waits for an RCU grace period: milliseconds per worker, paid on every restart.
// Returns the child's pid in the parent (-1 with errno when clone3 or the flag is refused);
// never returns in the child.
pid_t cloneIntoCgroup(const ChildPlan& plan, int cgroup_fd) {
  clone_args args{};
  args.flags = CLONE_INTO_CGROUP;
  args.exit_signal = SIGCHLD;
  args.cgroup = static_cast<uint64_t>(cgroup_fd);
  const long pid = ::syscall(SYS_clone3, &args, sizeof args);
  if (pid == 0) runChild(plan);
  return static_cast<pid_t>(pid);
}

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

// The interpreter the #! line of the file `path` names; empty when it names none.
std::string shebangInterpreter(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!std::getline(in, line) || line.rfind("#!", 0) != 0) return {};
  const auto begin = line.find_first_not_of(" \t", 2);
  if (begin == std::string::npos) return {};
  return line.substr(begin, line.find_first_of(" \t\r", begin) - begin);
}

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

  // Everything the child needs is laid out here, before the clone: it may not allocate.
  std::vector<std::string> env_entries;
  env_entries.reserve(request.env.size());
  for (const auto& [key, value] : request.env) env_entries.push_back(key + "=" + value);
  std::vector<char*> argv, envp;
  for (const std::string& a : request.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (std::string& e : env_entries) envp.push_back(e.data());
  envp.push_back(nullptr);

  UniqueFd cgroup_dir;
  if (!request.cgroup.empty()) {
    cgroup_dir.reset(::open(request.cgroup.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (cgroup_dir.get() < 0) warnNotInCgroup(request.cgroup, errno);
  }

  CpuMask cpus(request.cpus);
  int error_pipe[2];
  if (::pipe2(error_pipe, O_CLOEXEC) != 0) throw SystemError("pipe2()", errno);
  UniqueFd error_read(error_pipe[0]), error_write(error_pipe[1]);

  ChildPlan plan{::getpid(),        out_child.get(), err_child.get(),   -1,
                 cpus.get(),        cpus.bytes(),    error_write.get(), request.argv.front().c_str(),
                 argv.data(),       envp.data(),     rlimit{},          false,
                 request.inherit_fd};
  if (const uint64_t soft = rendezvous::descriptorSoftLimitBeforeRaise();
      soft != 0 && ::getrlimit(RLIMIT_NOFILE, &plan.nofile) == 0 && plan.nofile.rlim_cur != soft) {
    plan.nofile.rlim_cur = soft;
    plan.restore_nofile = true;
  }
  pid_t pid = -1;
  bool in_cgroup = false;
  if (cgroup_dir.get() >= 0) {
    pid = cloneIntoCgroup(plan, cgroup_dir.get());
    in_cgroup = pid > 0;
  }
  UniqueFd cgroup_procs;
  if (pid < 0) {
    // No clone3 or no CLONE_INTO_CGROUP (an old kernel, a seccomp filter): fork, and the
    // child moves itself into the cgroup before exec.
    if (cgroup_dir.get() >= 0) {
      cgroup_procs.reset(::openat(cgroup_dir.get(), "cgroup.procs", O_WRONLY | O_CLOEXEC));
      if (cgroup_procs.get() < 0) warnNotInCgroup(request.cgroup, errno);
      plan.cgroup_procs_fd = cgroup_procs.get();
    }
    pid = ::fork();
    if (pid == 0) runChild(plan);
    if (pid < 0) throw SystemError("fork()", errno);
  }
  // The child's error pipe closes at its exec; before that it says why it failed.
  error_write.reset();
  ChildFailure failure{};
  ssize_t n;
  do {
    n = ::read(error_read.get(), &failure, sizeof failure);
  } while (n < 0 && errno == EINTR);
  if (n == static_cast<ssize_t>(sizeof failure)) {
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (failure.stage == kBindFailed) {
      throw SystemError(
          "bind worker " + request.argv.front() + " to CPUs " + formatCpuList(request.cpus) + " (sched_setaffinity)",
          failure.err);
    }
    // A program that is there but gives ENOENT lacks the interpreter its #! line names.
    const std::string interpreter = failure.err == ENOENT ? shebangInterpreter(request.argv.front()) : "";
    if (!interpreter.empty()) {
      throw SystemError("exec " + request.argv.front() + " (its #! interpreter " + interpreter + " is missing)",
                        failure.err);
    }
    throw SystemError("exec " + request.argv.front(), failure.err);
  }

  SpawnedProcess spawned;
  spawned.pid = pid;
  spawned.in_cgroup = in_cgroup;
  // The forked child cannot report a failed write. Moving a process into the cgroup it is in
  // already succeeds, so a second write here both checks and, failing that, retries.
  if (cgroup_procs.get() >= 0) {
    const std::string text = std::to_string(pid);
    spawned.in_cgroup = ::write(cgroup_procs.get(), text.data(), text.size()) >= 0;
    if (!spawned.in_cgroup) warnNotInCgroup(request.cgroup, errno);
  }
  spawned.stdout_pipe = out_agent.release();
  spawned.stderr_pipe = err_agent.release();
  return spawned;
}

}  // namespace ddprun::agent
