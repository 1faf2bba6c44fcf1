// This node's workers in one attempt: starting them (environment, log files, output
// forwarding, CPUs), reaping them, signalling and stopping them (SIGTERM, then SIGKILL after
// --term_timeout; one that even SIGKILL does not end is reported and left behind), and the
// failures they leave for the report. It reports upward by return values: what it reaped,
// whom it could not stop; the round loop (elastic_agent.cc) turns those into events.
// Everything touching processes goes through the AgentEnv. Thread-safety: none; the agent's
// thread only.
#pragma once

#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "agent/agent_config.h"
#include "agent/agent_env.h"
#include "agent/ops/failure_report.h"
#include "agent/output/filtered_log.h"
#include "agent/output/line_forwarder.h"
#include "agent/output/log_layout.h"
#include "agent/spare_worker.h"
#include "agent/worker.h"
#include "common/logging.h"
#include "rendezvous/rounds/rendezvous_config.h"

namespace ddprun::agent {

class OrphanGuard;

// A worker that SIGKILL has not ended after --term_timeout (at least this long) sleeps
// uninterruptibly in the kernel: ddprun reports it and goes on without it.
inline constexpr auto kMinKillWait = std::chrono::seconds(1);

// A worker that still ran after SIGKILL: ddprun went on without it.
struct UnkillableWorker {
  int rank = 0;
  pid_t pid = -1;
  std::string state;  // its process state (process_state.h)
  bool sigkill_sent = false;
};

// What every worker's start needs besides the round: set once before the first start.
struct WorkerGroupSetup {
  const LogLayout* layout = nullptr;
  std::map<std::string, std::string> base_env;  // ddprun's environment, with the agent's additions
  std::string prefix_template;                  // the console lines' prefix (TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE)
  std::string python_hook_dir;                  // ddprun's sitecustomize.py; empty: no hook
};

class WorkerGroup {
 public:
  // `guard` (may be null: nothing is registered) and `env` must outlive the group.
  // `on_stderr_line(rank, line)` sees each line of a worker's stderr that goes through the
  // agent, on the event loop.
  WorkerGroup(const AgentConfig& config, AgentEnv& env, OrphanGuard* guard,
              std::function<void(int, std::string_view)> on_stderr_line);
  ~WorkerGroup();
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  void setUp(WorkerGroupSetup setup) { setup_ = std::move(setup); }

  // A new attempt in round `rdzv`: forgets the last one's workers, places this one's (not yet
  // started) and says so. Then startOne(i) for each, in order.
  void begin(int attempt, const rendezvous::RendezvousResult& rdzv);
  // Starts worker `i` of the attempt (in `cgroup` unless empty). Throws SystemError or
  // UsageError (it is not started then).
  void startOne(size_t i, const std::string& cgroup);
  // --recovery=in-job: starts failed worker `i` again, alone, while the others run on, in
  // `generation` (DDPRUN_GENERATION; common/recovery_keys.h) at the same place (RANK, ...).
  // Its log files are appended to: the failed process's lines stay above the newcomer's.
  // Its error file is removed first, so that the newcomer's failure report never shows the
  // failed process's error. Returns the failed worker as it ended. Throws as startOne.
  Worker replaceOne(size_t i, const std::string& cgroup, int generation);

  // --recovery=in-job's warm spare (spare_worker.h): one process of the job's program with no
  // rank, waiting for one; it outlives attempts (begin keeps it) until retired. startSpare
  // starts it (false: there is one already, or no worker to take the environment from; throws
  // SystemError when it cannot start).
  bool startSpare();
  // The spare's pid; -1: none.
  pid_t sparePid() const;
  // Hands failed worker `i`'s place to the spare, in `generation` and `cgroup` (unless empty),
  // as replaceOne would start a newcomer there: the spare's pid becomes the worker's, its
  // output goes where the worker's does (log files appended to). Returns the failed worker
  // as it ended. Throws DdprunError when there is no spare or it cannot take the assignment
  // (it is retired then; the caller starts a newcomer instead).
  Worker adoptSpare(size_t i, const std::string& cgroup, int generation);
  // Ends the spare (its pipe closed, SIGKILL: it has no state) and reaps it, waiting up to
  // killWait(). Nothing without one.
  void retireSpare();
  // Spares that died while waiting since the last hand-over.
  int spareDeaths() const { return spare_deaths_; }

  std::vector<Worker>& workers() { return workers_; }
  const std::vector<Worker>& workers() const { return workers_; }
  int attempt() const { return attempt_; }
  bool anyRunning() const;
  // Workers are being stopped (stop() runs): a second stop signal means kill, and the hang
  // watch lets them go.
  bool stopping() const { return stopping_; }

  // Reaps every child that has exited (workers, and orphans adopted as subreaper); returns
  // the workers among them, with their ends recorded.
  std::vector<const Worker*> reap();
  // Sends `signal` to the worker's process group and to the worker itself (which may have
  // left its group). Returns whether the worker was reached; says why not when it was not.
  bool signalWorker(Worker& w, int signal);
  void signalRunning(int signal);
  // Sends `signal` to every running worker, waits --term_timeout for them to exit, then
  // SIGKILLs what is left; returns those that even SIGKILL did not end (no longer running).
  std::vector<UnkillableWorker> stop(int signal);
  // How long stop() waits after SIGKILL.
  Clock::Duration killWait() const;

  // The attempt's failures, root cause first (then the ranks in `culprits` first).
  std::vector<WorkerFailure> collectFailures(const std::string& host, const std::vector<int>& culprits) const;
  // Adds each failure's stderr tail: call once the output is drained.
  void addStderrTails(std::vector<WorkerFailure>& failures) const;
  // Waits (briefly) for the output still in the pipes, then closes the forwarders.
  void drainOutput();

 private:
  struct StreamPlan;
  // startOne's work; `append`: the worker's log files are appended to, not truncated.
  void start(size_t i, const std::string& cgroup, bool append);
  // What starting `worker` takes (its environment, output targets, CPUs); sets its error file,
  // directory and what it learns of them (Python hook, torch's dump file), writes its RPC
  // secret file.
  SpawnRequest request(Worker& worker);
  std::pair<StreamPlan, StreamPlan> streamPlans(const Worker& worker) const;
  // Forwards a started worker's output pipes (-1: none) as its plans say.
  void forwardOutput(Worker& worker, int stdout_pipe, int stderr_pipe, bool append);
  void spareEnded(int status);

  const AgentConfig& config_;
  AgentEnv& env_;
  OrphanGuard* guard_;
  std::function<void(int, std::string_view)> on_stderr_line_;
  std::shared_ptr<spdlog::logger> log_;
  WorkerGroupSetup setup_;
  int attempt_ = 0;
  rendezvous::RendezvousResult rdzv_;
  std::vector<Worker> workers_;
  std::vector<std::unique_ptr<LineForwarder>> forwarders_;
  std::shared_ptr<FilteredLog> filtered_stdout_;  // this attempt's, with --duplicate_stdout_filters
  std::shared_ptr<FilteredLog> filtered_stderr_;
  bool stopping_ = false;
  std::unique_ptr<SpareProcess> spare_;  // the node's spare, until handed over or retired
  int spare_deaths_ = 0;
};

}  // namespace ddprun::agent
