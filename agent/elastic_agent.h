// The elastic agent of one node: forms the job through the rendezvous, starts this
// node's workers with torchrun's environment contract, watches them (event-driven:
// SIGCHLD, not polling), forwards signals, restarts the local group on failure while
// restarts remain, and prints the failure report when they run out.
#pragma once

#include <functional>
#include <memory>

#include "agent/agent_config.h"

namespace ddprun::agent {

class AgentEnv;
class AgentRendezvous;
class OrphanGuard;

// Exit codes of a run (the README's table).
inline constexpr int kExitOk = 0;
inline constexpr int kExitWorkersFailed = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitRendezvous = 3;

class ElasticAgent {
 public:
  // `guard` must outlive the agent. Does not start anything yet.
  // Real processes (AgentEnv::real()) and the job's DynamicRendezvous.
  ElasticAgent(AgentConfig config, OrphanGuard& guard);
  // The round loop in `env` (which must outlive the agent), with the rendezvous that
  // `rendezvous()` makes when run() starts, and no orphan guard when `guard` is null: the
  // round loop's tests run it on fake workers and scripted rounds.
  ElasticAgent(AgentConfig config, OrphanGuard* guard, AgentEnv& env,
               std::function<std::unique_ptr<AgentRendezvous>()> rendezvous);
  ~ElasticAgent();

  // Runs the job to its end and returns the exit code: 0 when every worker exited 0,
  // 1 when workers failed after the last restart, 128+N when signal N stopped the job.
  // Blocks. Throws RendezvousError (exit 3) or SystemError for what is not the workers'
  // fault. Call from the main thread, once.
  int run();

 private:
  class Impl;
  std::unique_ptr<AgentEnv> own_env_;  // the real one; outlives impl_
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun::agent
