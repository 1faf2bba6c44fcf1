// Containment of this node's workers: nothing they start may outlive their attempt, or
// ddprun. Workers are contained by cgroups where the kernel allows (worker_cgroups.h),
// else by their process groups; either can be left (setsid; a write to another cgroup's
// cgroup.procs), so the agent also looks for descendants that left their group and tells
// the orphan guard, and at the end of each attempt stops what is left: the groups, the
// orphans adopted as subreaper, the cgroups. Thread-safety: none; the agent's thread only.
#pragma once

#include <memory>
#include <set>
#include <string>

#include <boost/asio/steady_timer.hpp>

#include "agent/agent_config.h"
#include "agent/agent_env.h"
#include "agent/process/escaped_processes.h"
#include "agent/process/worker_cgroups.h"
#include "agent/worker_group.h"
#include "common/logging.h"

namespace ddprun::agent {

class OrphanGuard;

class Containment {
 public:
  // `env`, `group` and `guard` (may be null: no guard, no scan for escaped processes) must
  // outlive this.
  Containment(const AgentConfig& config, AgentEnv& env, const WorkerGroup& group, OrphanGuard* guard);
  // Leaves a cgroup it could not remove to the guard.
  ~Containment();
  Containment(const Containment&) = delete;
  Containment& operator=(const Containment&) = delete;

  // Makes the cgroups (when allowed) and starts looking for escaped processes.
  void setUp();
  // The cgroup worker `local_rank` of `attempt` starts in; empty: none.
  std::string cgroupFor(int local_rank, int attempt);
  // --recovery=in-job: `failed` (reaped) of `attempt` is replaced alone while the others run.
  // What it left in its process group and its cgroup gets SIGKILL now (it belongs to a process
  // that is gone, and must not meet the newcomer), the guard forgets its pid (which the kernel
  // may hand to anyone), and the newcomer's cgroup is returned: the same one. Does not block.
  std::string replacing(const Worker& failed, int attempt);
  // Ends what is left of the attempt's processes once its workers are stopped: their process
  // groups (SIGTERM, SIGKILL after --term_timeout), the orphans adopted meanwhile, the
  // cgroups; then forgets them at the guard. Blocks up to a few timeouts.
  void clear();

 private:
  void armEscapeScan();
  void scanEscaped();
  void forgetEscaped();
  void stopAdoptedOrphans();
  void removeWorkerCgroups();
  bool groupAlive(pid_t pgid);
  Clock::Duration killWait() const { return group_.killWait(); }

  const AgentConfig& config_;
  AgentEnv& env_;
  const WorkerGroup& group_;
  OrphanGuard* guard_;
  std::shared_ptr<spdlog::logger> log_;
  std::unique_ptr<WorkerCgroups> cgroups_;
  boost::asio::steady_timer escape_scan_;
  std::set<ProcessStamp> escaped_;  // told to the guard: outside every worker's group
};

}  // namespace ddprun::agent
