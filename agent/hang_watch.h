// The hang watch of this node's workers: it finds hung workers and says where the job
// stands before anyone is stopped. Its triggers: a file timer that expired
// (TORCHELASTIC_ENABLE_FILE_TIMER=1), --hang_timeout over the flight recorder rings, and a
// collective that failed (a worker's stderr line, its error file, torch's flight-recorder
// dump). Its verdicts (hang_verdict.h, python_stacks.h, dump_judgement.h) go to the log and
// the events file, name the culprits that the failure report puts first, and take in the
// other nodes' hang summaries (node_summaries.h). It stops hung workers stacks first
// (hung_worker_stop.h, through the AgentEnv). The round loop ticks it while the workers run
// and asks it for the failures once a worker failed. What it needs of the workers and the
// reports comes through hang_watch_ports.h; the file timers are worker_timers.h's; what it
// learns of an attempt is one HangAttempt (hang_attempt.h). Thread-safety: none; the
// agent's thread only.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "agent/agent_config.h"
#include "agent/agent_env.h"
#include "agent/hang/nodes/node_summaries.h"
#include "agent/hang/rings/flight_dir.h"
#include "agent/hang/rings/hang_verdict.h"
#include "agent/hang_attempt.h"
#include "agent/hang_watch_ports.h"
#include "agent/ops/failure_report.h"
#include "agent/output/log_layout.h"
#include "agent/worker_timers.h"
#include "common/logging.h"

namespace ddprun::agent {

class AgentRendezvous;
class JobReporter;
class OrphanGuard;
class WorkerGroup;

class HangWatch {
 public:
  // Everything given must outlive the watch; `guard` may be null. The round loop's: over its
  // worker group and job reporter (hang_watch_ports.h's adapters).
  HangWatch(const AgentConfig& config, AgentEnv& env, WorkerGroup& group, JobReporter& reporter, OrphanGuard* guard);
  // Over any workers and reports (a test's).
  HangWatch(const AgentConfig& config, AgentEnv& env, HangWorkers& workers, HangReports& reports, OrphanGuard* guard);
  ~HangWatch();
  HangWatch(const HangWatch&) = delete;
  HangWatch& operator=(const HangWatch&) = delete;

  // Starts the file timers' server (with --file_timer) and makes the flight recorder's
  // directory; names both in `base_env`, the workers' environment. Throws UsageError when
  // the timers' pipe cannot be made. The other nodes are reached through `rdzv`'s job board
  // (or `board`, this node being `node`), which must outlive the watch.
  void setUp(AgentRendezvous& rdzv, std::map<std::string, std::string>& base_env);
  void setUp(rendezvous::Board& board, const std::string& node, std::map<std::string, std::string>& base_env);
  // Where stacks are kept (a temporary run directory is kept for them).
  void setLayout(LogLayout& layout) { layout_ = &layout; }

  // An attempt's workers are being started, and were.
  void attemptStarting();
  void workersStarted();
  // A worker's stderr line: says it when a torch collective failed (python_stacks.h).
  void onStderrLine(int rank, std::string_view line);

  // While the workers run, the round loop waits until wake() (at the latest `limit`), then
  // calls tick() with it: the looks at the rings, the dumps and the other nodes' requests.
  struct Wake {
    Clock::TimePoint at;
    bool watch_hang = false;
    bool several_nodes = false;
    bool watch_dumps = false;
  };
  Wake wake(Clock::TimePoint limit) const;
  void tick(const Wake& wake);
  // A collective failed and no worker ended within the grace: the attempt is to stop (said).
  bool collectiveGraceOver();
  // What a stderr line said of a failed collective ("rank 0: <line>"); empty: nothing.
  const std::string& collectiveLine() const { return attempt_.collective_line; }

  // A local worker failed: waits for the workers stopped as hung, and when a collective
  // failed, takes the Python stacks, judges where every rank stands and stops the others as
  // hung. Returns the attempt's failures, the verdict's culprits first.
  std::vector<WorkerFailure> failures(const std::string& host);

  // The attempt is over: what its processes asked for ends with them, and what the watch
  // learned of it is forgotten.
  void endAttempt();

 private:
  // Stops each (worker, pid) as hung with `signal` after capturing its stacks (and Python's
  // tracebacks), recording why and the stacks for the failure report.
  // `kill_after` > 0: SIGKILL follows `signal` after that long to whom it did not end.
  void stopHung(const std::vector<std::pair<Worker*, pid_t>>& targets, int signal, const std::string& reason,
                std::chrono::milliseconds kill_after = std::chrono::milliseconds(0));
  // --hang_timeout: when no local rank has completed an operation (a collective or a
  // point-to-point message) for that long while one is pending, judges the hang and stops
  // every running worker as hung (stacks first).
  void checkHangTimeout();
  std::vector<RankPosition> localPositions() const;
  // Another node judges a hang (looked for at `t` when due): publish where this node's ranks
  // stand (once per round).
  void answerHangRequest(Clock::TimePoint t);
  // This node's hang summary: its ranks' ring positions and, once read, their torch dumps.
  std::string ownSummary();
  // The other nodes' summaries of this attempt (node_summaries.h), gathered the first time a
  // verdict asks; none when this node is alone.
  const std::vector<std::string>& otherNodes();
  // Something says a torch collective failed while the workers run (a stderr line, a dump):
  // the stacks are taken at once and the attempt stops if no worker ends within the grace.
  void noticeCollectiveFailure(const std::string& what);
  // A worker's flight-recorder dump written since it started: says it (once per attempt).
  void lookForTorchDumps();

  // The verdicts (hang_watch_verdicts.cc).
  // Signals every running worker's Python hook and waits (kPythonStacksWait at most) for
  // their stacks; once per attempt.
  void takePythonStacks();
  // The hang verdict (hang_verdict.h) over this node's flight recorder rings, and the other
  // nodes' summaries, logged once per attempt with what triggered it, before anyone is
  // stopped. Returns it (empty: none).
  std::string judgeHang(const std::string& trigger);
  // judgeHang's verdict and, with Python workers, judgePythonHang's beside it: the rings'
  // sequence numbers decide who is behind (their culprits count), the frames say where in the
  // script. Returns both, the frames' first (empty: the rings gave none).
  std::string judgeRingsAndFrames(const std::string& trigger);
  // The verdict from the ranks' Python frames (python_stacks.h), logged and recorded like
  // judgeHang's; sets the culprits. Returns it (empty: none).
  std::string judgePythonHang(const std::string& trigger);
  // Waits (kTorchDumpWait at most, serving the workers meanwhile) until every local rank's
  // torch dump was read or found unreadable; returns how long it waited.
  std::chrono::milliseconds settleTorchDumps();
  // The verdict from torch's flight-recorder dumps (dump_judgement.h) over the local ranks'
  // dumps and live traces, after settleTorchDumps, and the other nodes' (through otherNodes);
  // logged and recorded like judgeHang's ("source":"flight_recorder"), it sets the culprits
  // (one of another node becomes a failure of the report, attempt_.remote_culprits). Returns
  // the verdict's sentences (empty: none).
  std::string judgeTorchDumps(const std::string& trigger);
  // A rank of another node that a verdict blames, from its node's summary: a failure of this
  // node's report (attempt_.remote_culprits), with its Python frames when its node sent them.
  void addRemoteCulprit(int rank, const std::string& verdict);
  // Records a verdict: its event, and the health check's (job_reporter.h).
  void recordVerdict(const std::string& trigger, const std::string& text, const char* source,
                     const std::vector<int>& culprits);

  Clock::TimePoint now() const { return env_.clock().now(); }

  // Once a collective failed, how long the agent waits for every local rank's torch dump: the
  // ranks still running write theirs when torch signals the timeout dump through the store
  // (their watchdogs look about once a second), not torch's ~60 s.
  static constexpr std::chrono::seconds kTorchDumpWait{3};

  // The adapters over the round loop's parts, when the watch was given those.
  struct Adapters;
  HangWatch(const AgentConfig& config, AgentEnv& env, std::unique_ptr<Adapters> adapters, OrphanGuard* guard);

  const AgentConfig& config_;
  AgentEnv& env_;
  std::unique_ptr<Adapters> adapters_;  // before group_ and reporter_, which may be theirs
  HangWorkers& group_;
  HangReports& reporter_;
  OrphanGuard* guard_;
  std::shared_ptr<spdlog::logger> log_;
  std::unique_ptr<NodeSummaries> nodes_;  // the other nodes' hang summaries (setUp)
  LogLayout* layout_ = nullptr;
  std::unique_ptr<WorkerTimers> timers_;   // TORCHELASTIC_ENABLE_FILE_TIMER=1
  std::unique_ptr<FlightDir> flight_dir_;  // the workers' flight recorder rings
  bool no_rings_warned_ = false;           // --hang_timeout found no ring to watch (said once)
  // When the next looks are due while the workers run.
  Clock::TimePoint attempt_started_{};  // when this attempt's workers were started
  Clock::TimePoint next_hang_check_{};  // --hang_timeout's at the rings
  Clock::TimePoint next_dump_look_{};   // lookForTorchDumps'
  HangAttempt attempt_;                 // what this attempt showed so far
};

}  // namespace ddprun::agent
