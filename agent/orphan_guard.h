// Makes "kill -9 ddprun" leave no worker behind, grandchildren included.
// PR_SET_PDEATHSIG only reaches the workers themselves; a worker's own children would
// outlive a killed agent. So the agent forks, before anything else, a tiny guard process
// that learns each worker's process group over a pipe. When the agent dies for any
// reason the pipe reaches EOF and the guard SIGKILLs every group still registered, then
// exits. The guard ignores terminal signals and sits in its own session so that group
// signals aimed at the agent do not take it down first.
#pragma once

#include <sys/types.h>

#include <chrono>

namespace ddprun::agent {

class OrphanGuard {
 public:
  // Forks the guard. Call while the process is single-threaded. Throws SystemError.
  OrphanGuard();
  // Closes the pipe and reaps the guard (it exits at once on EOF); a guard still there
  // after kReapTimeout (stopped, say) is killed, so ddprun's exit never waits on it.
  ~OrphanGuard();
  static constexpr std::chrono::milliseconds kReapTimeout{2000};
  OrphanGuard(const OrphanGuard&) = delete;
  OrphanGuard& operator=(const OrphanGuard&) = delete;

  // Registers / forgets a worker process group. Never blocks for long (one small pipe
  // write); errors are logged, not thrown: losing the guard must not stop a job.
  void watch(pid_t pgid);
  void forget(pid_t pgid);

  pid_t pid() const { return guard_pid_; }

 private:
  void send(int record);

  pid_t guard_pid_ = -1;
  int write_fd_ = -1;
};

}  // namespace ddprun::agent
