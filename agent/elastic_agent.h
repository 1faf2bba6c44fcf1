// The elastic agent of one node: forms the job through the rendezvous, starts this
// node's workers with torchrun's environment contract, watches them (event-driven:
// SIGCHLD, not polling), forwards signals, restarts the local group on failure while
// restarts remain, and prints the failure report when they run out.
#pragma once

#include <memory>

#include "agent/agent_config.h"

namespace ddprun::agent {

class OrphanGuard;

// Exit codes of a run (the README's table).
inline constexpr int kExitOk = 0;
inline constexpr int kExitWorkersFailed = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitRendezvous = 3;

class ElasticAgent {
 public:
  // `guard` must outlive the agent. Does not start anything yet.
  ElasticAgent(AgentConfig config, OrphanGuard& guard);
  ~ElasticAgent();

  // Runs the job to its end and returns the exit code: 0 when every worker exited 0,
  // 1 when workers failed after the last restart, 128+N when signal N stopped the job.
  // Blocks. Throws RendezvousError (exit 3) or SystemError for what is not the workers'
  // fault. Call from the main thread, once.
  int run();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun::agent
