// An AgentEnv (agent/agent_env.h) of fake workers on a manual clock, for the round loop's
// tests: nothing is spawned and nothing sleeps. Each "spawn" is a scripted process with a
// pid of its own: it exits by itself after a while with a code, or not; a signal ends it
// unless it ignores that signal (SIGTERM and the other stop signals) or cannot be ended at
// all (uninterruptible sleep: not even SIGKILL). Its exit arrives as SIGCHLD does, through
// the event loop, and waitpid reaps it. Time moves only when the loop waits with nothing
// to run: then it jumps to the next thing due (an exit, a scheduled action) or the wait's end.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "agent/agent_env.h"
#include "common/unique_fd.h"
#include "tests/support/in_memory_store.h"
#include "tests/support/manual_clock.h"

namespace ddprun::agent::testing {

class ManualAgentEnv final : public AgentEnv {
 public:
  // What one fake worker does.
  struct Script {
    std::optional<std::chrono::milliseconds> exit_after;  // ends by itself this long after its start
    int exit_code = 0;                                    // with this code
    bool ignores_term = false;                            // SIGTERM, SIGINT, SIGHUP, SIGQUIT do nothing
    bool unkillable = false;                              // nothing ends it, SIGKILL included
    bool spawn_fails = false;                             // its spawn throws SystemError
    std::string error_file;                               // written to its TORCHELASTIC_ERROR_FILE at its start
  };
  // Called at each spawn, in order, with the worker's request (its environment says its
  // rank and restart count).
  using Scripter = std::function<Script(const SpawnRequest&)>;

  // One fake process, as the test sees it.
  struct Process {
    pid_t pid = -1;
    SpawnRequest request;
    Script script;
    std::vector<int> signals;  // every signal sent to it (or its group), 0 excluded, in order
    bool exited = false;
    bool reaped = false;
    std::optional<Clock::TimePoint> exit_at;  // when it ends by itself
    int status = 0;                           // waitpid's, once exited
    // A copy of the descriptor it inherited (SpawnRequest::inherit_fd): a spare's assignment
    // pipe, read as the spare would; null: none.
    std::shared_ptr<UniqueFd> inherited;
    // What the agent wrote there so far (without blocking); `eof`: every writer is gone.
    std::string readInherited(bool* eof) const;
    int rank() const;
    int restartCount() const;
    bool got(int signal) const;
  };
  // A hung stop the hang watch asked for.
  struct HungStopRequest {
    std::vector<HungWorker> workers;
    int signal = 0;
    std::string reason;
  };

  explicit ManualAgentEnv(Scripter scripter);
  ~ManualAgentEnv() override;

  boost::asio::io_context& io() override { return io_; }
  Clock& clock() override { return clock_; }
  void runFor(Clock::Duration limit) override;
  void onSignals(const std::vector<int>& signals, std::function<void(int)> handler) override;
  SpawnedProcess spawn(const SpawnRequest& request) override;
  int signalProcess(pid_t pid, int signal) override;
  int signalGroup(pid_t pgid, int signal) override;
  std::optional<ReapedChild> reap() override;
  std::string processState(pid_t pid) override;
  std::vector<pid_t> adoptedChildren(const std::vector<pid_t>&) override { return {}; }
  // A client of `workers_store` (set by the test); StoreError when it set none.
  std::unique_ptr<rendezvous::Store> connectStore(const std::string& host, int port,
                                                  std::chrono::milliseconds timeout) override;
  std::vector<HungStop> stopHung(const std::vector<HungWorker>& workers, int signal, const std::string& reason,
                                 std::chrono::milliseconds kill_after) override;
  void cancelHungStops() override {}

  // The test's side. A signal to the agent (as the kernel would deliver it).
  void sendToAgent(int signal);
  // Runs `action` once the clock reaches `at` (on the agent's thread, while it waits).
  void at(Clock::TimePoint at, std::function<void()> action);
  // Another thread will post to the event loop (the rendezvous' nextRound): until it has,
  // waiting means waiting for it, not moving time on.
  void expectPost() { expected_posts_++; }

  // The store that connectStore() reaches (in-job recovery's workers' store); none: unreachable.
  rendezvous::InMemoryStore* workers_store = nullptr;
  // With none: whether connectStore() takes its whole timeout of the clock before it throws, as
  // the real client does, retrying a refused connection (a store whose host moved on) until then.
  bool unreachable_store_waits = false;

  const std::vector<Process>& processes() const { return processes_; }
  const std::vector<HungStopRequest>& hungStops() const { return hung_stops_; }
  ddprun::testing::ManualClock& manualClock() { return clock_; }
  Clock::TimePoint started() const { return started_; }

 private:
  Process* find(pid_t pid);
  void exit(Process& p, int status);
  // Runs what is due now: scheduled actions and exits.
  bool fireDue();
  size_t poll();

  Scripter scripter_;
  ddprun::testing::ManualClock clock_;
  Clock::TimePoint started_;
  boost::asio::io_context io_;
  std::vector<std::pair<std::vector<int>, std::function<void(int)>>> handlers_;
  std::vector<Process> processes_;
  std::deque<ReapedChild> exits_;  // exited, not yet reaped
  std::multimap<Clock::TimePoint, std::function<void()>> actions_;
  std::vector<HungStopRequest> hung_stops_;
  std::atomic<int> expected_posts_{0};
  size_t own_handlers_run_ = 0;  // of the handlers this env posted (signals to the agent)
  pid_t next_pid_ = 40000;
};

}  // namespace ddprun::agent::testing
