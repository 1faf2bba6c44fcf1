// A cgroup (v2) for each worker, so that the worker and everything it starts, daemons that left its process group and
// session included, can be killed at once. The agent's workers go below one directory of its own, <its own
// cgroup>/ddprun-<agent pid>, a worker in w<local rank>-a<attempt>. Where cgroups cannot be written (no cgroup2 mount,
// not root and no delegated subtree, a read-only container) or DDPRUN_NO_CGROUPS=1 asks so, the agent works without
// them: enabled() is false and every other call does nothing. Not thread-safe: the agent's main thread owns it.
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

namespace ddprun::agent {

class WorkerCgroups {
 public:
  // Called with the agent's directory before it is made (and whether or not it then can be).
  using BeforeCreate = std::function<void(const std::string& root)>;
  // Creates <own cgroup>/ddprun-<agent_pid> when allowed and possible; never throws. `before_create` (may be empty)
  // learns the directory's path before the directory exists, so that whoever removes it should the agent die (the
  // orphan guard) knows it first: a kill -9 at any moment after it is made leaves nobody unaware of it.
  WorkerCgroups(pid_t agent_pid, bool allowed, const BeforeCreate& before_create = {});
  // Kills what is left in the workers' cgroups (waiting up to kRemoveTimeout for it to go) and removes them, and the
  // agent's directory.
  ~WorkerCgroups();
  WorkerCgroups(const WorkerCgroups&) = delete;
  WorkerCgroups& operator=(const WorkerCgroups&) = delete;

  bool enabled() const { return !root_.empty(); }
  // The agent's directory (empty when not enabled).
  const std::string& root() const { return root_; }
  // Why the workers are not contained by cgroups (empty when they are).
  const std::string& whyNot() const { return why_not_; }

  // Creates the cgroup of one worker and returns its directory; empty when not enabled or when it cannot be created
  // (logged as a warning: that worker has process groups only).
  std::string create(int local_rank, int attempt);

  // SIGKILLs every process in the workers' cgroups. Does not block.
  void killAll();
  // Removes the workers' cgroups that are empty; returns whether none is left.
  bool removeEmpty();

 private:
  std::string root_;
  std::string why_not_;
  std::vector<std::string> workers_;
};

}  // namespace ddprun::agent
