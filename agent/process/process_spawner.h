// Starting one worker process. Each worker leads its own process group (so signals reach
// its children too), dies with the agent (PR_SET_PDEATHSIG) and lets the agent's stack
// tools attach to it where Yama restricts ptrace (PR_SET_PTRACER). Given a cgroup, it starts
// inside it (clone3 with CLONE_INTO_CGROUP; where the kernel refuses that, fork and a move
// before exec), so that nothing it starts is ever outside; given CPUs (--numa-binding),
// it is bound to them before exec too, so its first thread already runs there. Its stdout
// and stderr are either inherited, written straight to a file, or a pipe the agent reads.
#pragma once

#include <sys/types.h>

#include <map>
#include <set>
#include <string>
#include <vector>

namespace ddprun::agent {

struct StdioTarget {
  enum class Kind { kInherit, kFile, kPipe };
  Kind kind = Kind::kInherit;
  std::string path;  // for kFile: created or truncated.
};

struct SpawnRequest {
  std::vector<std::string> argv;           // argv[0]: absolute path of the program.
  std::map<std::string, std::string> env;  // the worker's whole environment.
  StdioTarget out;
  StdioTarget err;
  std::string cgroup;  // a cgroup v2 directory to start the worker in; empty: none.
  std::set<int> cpus;  // the CPUs to bind the worker to (sched_setaffinity); empty: inherited.
  // A descriptor of the agent's (close-on-exec there) that the worker inherits under the same
  // number: a spare worker's assignment pipe (agent/spare_worker.h); -1: none.
  int inherit_fd = -1;
};

struct SpawnedProcess {
  pid_t pid = -1;        // also the process group id.
  int stdout_pipe = -1;  // read end (close-on-exec) for kPipe, else -1; caller owns it.
  int stderr_pipe = -1;
  bool in_cgroup = false;  // whether it entered the requested cgroup
};

// Forks and execs the worker; returns once exec has succeeded. Must be called from the
// thread that will outlive the worker (PR_SET_PDEATHSIG follows the forking thread).
// Throws SystemError naming the program when a file cannot be opened or exec fails, and
// naming the CPUs when the worker cannot be bound to them (it is not started unbound). A
// cgroup that cannot be entered is logged as a warning: the worker then runs outside it.
SpawnedProcess spawnWorker(const SpawnRequest& request);

}  // namespace ddprun::agent
