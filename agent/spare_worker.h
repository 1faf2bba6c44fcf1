// --recovery=in-job's warm spare, the process side (docs/recovery.md#the-warm-spare; the
// contract in common/recovery_keys.h): the spare's environment, its assignment pipe and the
// hand-over of a failed rank's identity. The worker group (worker_group.h) owns the node's one
// spare, kept across attempts; in_job_recovery.h decides when there is one. Thread-safety: none.
#pragma once

#include <sys/types.h>

#include <map>
#include <string>

#include "common/unique_fd.h"

namespace ddprun::agent {

// The node's spare, started and not yet handed over.
struct SpareProcess {
  pid_t pid = -1;
  UniqueFd assignment;   // the write end of its assignment pipe
  UniqueFd stdout_pipe;  // its output, read only once it becomes a worker (-1: none)
  UniqueFd stderr_pipe;
  std::map<std::string, std::string> env;  // the environment it started with
  bool retiring = false;                   // the agent is ending it: its exit is no failure
};

// The spare's environment, from `worker_env` (the environment any local worker of the attempt
// gets: workerEnvironment) and `base` (what the agent itself runs with): every per-rank value
// removed (RANK, LOCAL_RANK, ROLE_RANK, DDPRUN_GENERATION, TORCHELASTIC_ERROR_FILE; a virtual
// local rank's CUDA_VISIBLE_DEVICES goes back to `base`'s), DDPRUN_SPARE=1 and
// DDPRUN_SPARE_FD=`assignment_fd` added.
std::map<std::string, std::string> spareEnvironment(std::map<std::string, std::string> worker_env,
                                                    const std::map<std::string, std::string>& base, int assignment_fd);

// A pipe for a spare's assignment: [0] the spare's read end (never 0-2, whatever the agent's
// standard streams are), [1] the agent's write end; both close-on-exec. Throws SystemError.
void makeAssignmentPipe(UniqueFd ends[2]);

// Writes `bytes` (common/spare_assignment.h) whole to the spare's pipe without blocking (the
// pipe is grown to fit when needed: a spare still loading does not read it yet). Throws
// SystemError when it cannot: the spare died (EPIPE), or the pipe cannot hold it.
void sendAssignment(int fd, const std::string& bytes);

// Moves `pid` (every thread of it) into cgroup directory `cgroup`. Throws SystemError.
void moveIntoCgroup(const std::string& cgroup, pid_t pid);

}  // namespace ddprun::agent
