// Makes "kill -9 ddprun" leave no worker behind, grandchildren and daemons included. PR_SET_PDEATHSIG only reaches the
// workers themselves; a worker's own children would outlive a killed agent. So the agent forks, before anything else, a
// tiny guard process that learns over a pipe what to kill: each worker's process group, the agent's cgroup directory
// (all workers' cgroups are below it), and each process that left its worker's group (by pid and start time; with
// cgroups too, since a process can leave its cgroup as well); and what to remove: the flight recorder's directory on
// /dev/shm, a temporary run directory, the workers' rpc_secret files and Python hook (which go even from a run
// directory that stays) and the file timers' pipe. When the agent dies for any reason the pipe reaches EOF and the
// guard SIGKILLs all of it still registered, removes the directories and the cgroups, then exits. The guard ignores
// terminal signals and sits in its own session so that group signals aimed at the agent do not take it down first.
// Thread-safety: none; only the agent's main thread (its event loop) registers and forgets.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>

#include "agent/process/escaped_processes.h"
#include "common/unique_fd.h"

namespace ddprun::agent {

class OrphanGuard {
 public:
  // Forks the guard. Call while the process is single-threaded. Throws SystemError.
  OrphanGuard();
  // Closes the pipe and reaps the guard (it exits at once on EOF when nothing is left registered); a guard still there
  // after kReapTimeout (stopped, say) is killed, so ddprun's exit never waits on it.
  ~OrphanGuard();
  static constexpr std::chrono::milliseconds kReapTimeout{2000};
  // How long the guard, once the agent died, waits for killed processes to leave the cgroups it is to remove.
  static constexpr std::chrono::milliseconds kCgroupRemoveTimeout{5000};
  OrphanGuard(const OrphanGuard&) = delete;
  OrphanGuard& operator=(const OrphanGuard&) = delete;

  // Register / forget what the guard kills. None blocks (one small non-blocking pipe write); errors are logged once,
  // not thrown: losing the guard must not stop a job.
  void watch(pid_t pgid);
  void forget(pid_t pgid);
  // A cgroup directory: killed, with its descendants, and removed.
  void watchCgroup(const std::string& dir);
  void forgetCgroup(const std::string& dir);
  // A directory the agent removes when it exits (the flight recorder's on /dev/shm, a temporary run directory), or a
  // single file (the file timers' pipe): removed, with its contents, if the agent dies first.
  void watchDirectory(const std::string& dir);
  void forgetDirectory(const std::string& dir);
  // A process outside every watched group: killed (with the group it leads) if it still is the process stamped.
  void watchProcess(const ProcessStamp& process);
  void forgetProcess(const ProcessStamp& process);

  pid_t pid() const { return guard_pid_; }

 private:
  void send(int kind, pid_t pid, uint64_t start_time, const std::string& path);

  pid_t guard_pid_ = -1;
  UniqueFd write_fd_;
  bool warned_ = false;  // "unreachable" is said once
};

}  // namespace ddprun::agent
