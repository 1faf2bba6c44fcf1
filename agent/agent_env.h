// What the agent's round loop needs from the world around it, in one seam as
// rendezvous/rounds/rendezvous_env.h is for the rendezvous (and leveldb's Env for leveldb): the
// event loop it waits on and the clock its timeouts run on, the signals it is sent, and the
// processes it starts, signals, reaps and stops as hung. The real one (AgentEnv::real()) is
// process_spawner.h, process_signals.h, waitpid(2), Asio's signal sets and the steady
// clock; the round loop's tests give it fake workers on a manual clock
// (tests/agent/manual_agent_env.h), so that no process is spawned and nothing sleeps.
// Thread-safety: none; everything is called from the agent's thread (its event loop).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agent/hang/stop/hung_worker_stop.h"
#include "agent/process/process_spawner.h"
#include "common/clock.h"
#include "rendezvous/store/store.h"

namespace ddprun::agent {

// A child that exited: its pid and its waitpid(2) status (WIFSIGNALED and the like read it).
struct ReapedChild {
  pid_t pid = -1;
  int status = 0;
};

class AgentEnv {
 public:
  virtual ~AgentEnv() = default;

  // The agent's event loop: line forwarders, file timers and the handlers below run on it.
  virtual boost::asio::io_context& io() = 0;
  // The clock every timeout of the round loop runs on; it outlives the env.
  virtual Clock& clock() = 0;
  // Runs the event loop for at most `limit`, or until a handler has run, whichever is first; a
  // `limit` of zero or less runs the handlers that are ready now, without waiting.
  virtual void runFor(Clock::Duration limit) = 0;
  // Runs `handler(signal)` on the event loop each time one of `signals` arrives (SIGCHLD:
  // children may have exited). Call once per set of signals, before the loop runs.
  virtual void onSignals(const std::vector<int>& signals, std::function<void(int)> handler) = 0;

  // Starts a worker (process_spawner.h's spawnWorker): throws SystemError when it cannot.
  virtual SpawnedProcess spawn(const SpawnRequest& request) = 0;
  // kill(2) to a process and to a process group (process_signals.h): 0 or errno.
  virtual int signalProcess(pid_t pid, int signal) = 0;
  virtual int signalGroup(pid_t pgid, int signal) = 0;
  // One child that has exited, reaped (waitpid(-1, WNOHANG)); nothing when none has.
  virtual std::optional<ReapedChild> reap() = 0;
  // A process's state for a log line ("D (disk sleep)"; process_state.h).
  virtual std::string processState(pid_t pid) = 0;
  // The agent's live children that are none of `ours` (adopted_children.h).
  virtual std::vector<pid_t> adoptedChildren(const std::vector<pid_t>& ours) = 0;

  // A connection to the workers' store at `host`:`port` (no token: each round's is fresh and
  // open, rendezvous/rounds/dynamic_rendezvous.h), each call bounded by `timeout`: in-job
  // recovery reads and bumps its keys there (agent/in_job_recovery.h). Throws StoreError.
  virtual std::unique_ptr<rendezvous::Store> connectStore(const std::string& host, int port,
                                                          std::chrono::milliseconds timeout) = 0;

  // Stops hung workers, stacks first (hung_worker_stop.h's HungWorkerStopper::stop), and
  // forgets the signals it still has to send (cancel).
  virtual std::vector<HungStop> stopHung(const std::vector<HungWorker>& workers, int signal, const std::string& reason,
                                         std::chrono::milliseconds kill_after) = 0;
  virtual void cancelHungStops() = 0;

  // Real processes and signals on the steady clock, with an event loop of its own.
  static std::unique_ptr<AgentEnv> real();
};

}  // namespace ddprun::agent

namespace ddprun::agent {

// Runs `env`'s event loop while `busy()` holds, for at most `limit` of its clock.
template <typename Busy>
void runWhile(AgentEnv& env, Busy busy, Clock::Duration limit) {
  for (const auto deadline = env.clock().now() + limit; busy() && env.clock().now() < deadline;)
    env.runFor(deadline - env.clock().now());
}

}  // namespace ddprun::agent
