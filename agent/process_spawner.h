// Starting one worker process. Each worker leads its own process group (so signals reach
// its children too) and dies with the agent (PR_SET_PDEATHSIG). Given a cgroup, it enters
// it before exec, so that nothing it starts is ever outside. Its stdout and stderr are
// either inherited, written straight to a file, or a pipe the agent reads.
#pragma once

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

namespace ddprun::agent {

struct StdioTarget {
  enum class Kind { kInherit, kFile, kPipe };
  Kind kind = Kind::kInherit;
  std::string path;  // for kFile: created or truncated.
};

struct SpawnRequest {
  std::vector<std::string> argv;                // argv[0]: absolute path of the program.
  std::map<std::string, std::string> env;       // the worker's whole environment.
  StdioTarget out;
  StdioTarget err;
  std::string cgroup;  // a cgroup v2 directory to start the worker in; empty: none.
};

struct SpawnedProcess {
  pid_t pid = -1;        // also the process group id.
  int stdout_pipe = -1;  // read end (close-on-exec) for kPipe, else -1; caller owns it.
  int stderr_pipe = -1;
  bool in_cgroup = false;  // whether it entered the requested cgroup
};

// Forks and execs the worker; returns once exec has succeeded. Must be called from the
// thread that will outlive the worker (PR_SET_PDEATHSIG follows the forking thread).
// Throws SystemError naming the program when a file cannot be opened or exec fails. A cgroup
// that cannot be entered is logged as a warning: the worker then runs outside it.
SpawnedProcess spawnWorker(const SpawnRequest& request);

}  // namespace ddprun::agent
