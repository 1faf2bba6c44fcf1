// The hang watch of this node's workers: it finds hung workers and says where the job
// stands before anyone is stopped. It orchestrates parts of its own, each tested alone. Its
// triggers: a file timer that expired (TORCHELASTIC_ENABLE_FILE_TIMER=1: worker_timers.h),
// --hang_timeout over the flight recorder rings (hang_timeout.h), and a collective that failed
// (a worker's stderr line or torch's flight-recorder dump while they run, collective_trigger.h's
// CollectiveWatch; once one failed, collectiveFailureTrigger). It takes the Python stacks first
// (stack_taking.h); its verdicts (ring_judgement.h, dump_judgement.h, python_frames.h) go to
// the log and the events file, name the culprits that the failure report puts first, and take
// in the other nodes' hang summaries (node_summaries.h, local_summary.h). It stops hung
// workers stacks first (hung_worker_stop.h, through the AgentEnv). The round loop ticks it
// while the workers run and asks it for the failures once a worker failed. What it needs of
// the workers and the reports comes through hang_watch_ports.h; what it learns of an attempt
// is one HangAttempt (hang_attempt.h). Thread-safety: none; the agent's thread only.
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
#include "agent/collective_trigger.h"
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
class OrphanGuard;

class HangWatch {
 public:
  // Everything given must outlive the watch; `guard` may be null. The round loop's workers
  // and reports are its worker group and job reporter (round_hang_ports.h); a test's, its own.
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
  bool collectiveGraceOver() { return collective_.graceOver(); }
  // What said a collective failed ("rank 0: <line>"); empty: nothing.
  const std::string& collectiveLine() const { return collective_.line(); }

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

  // The verdicts (hang_watch_verdicts.cc), each logged and recorded once with what triggered
  // it, before anyone is stopped; each returns its text (empty: none) and sets the culprits.
  // The Python stacks (stack_taking.h), once per attempt.
  void takePythonStacks();
  // The rings' (ring_judgement.h), with the other nodes' summaries; once per attempt.
  std::string judgeHang(const std::string& trigger);
  // judgeHang's and, with Python workers, judgePythonHang's beside it: the rings' sequence
  // numbers decide who is behind (their culprits count), the frames say where in the script.
  // Both, the frames' first (empty: the rings gave none).
  std::string judgeRingsAndFrames(const std::string& trigger);
  // The ranks' Python frames' (python_frames.h, python_stacks.h).
  std::string judgePythonHang(const std::string& trigger);
  // Waits for every local rank's torch dump (dump_settling.h); returns how long it waited.
  std::chrono::milliseconds settleTorchDumps();
  // torch's dumps' and live traces' (dump_judgement.h), after settleTorchDumps, with the other
  // nodes' ("source":"flight_recorder"); returns the verdict's sentences.
  std::string judgeTorchDumps(const std::string& trigger);
  // Records a verdict: its event, and the health check's (job_reporter.h).
  void recordVerdict(const std::string& trigger, const std::string& text, const char* source,
                     const std::vector<int>& culprits);
  // Ranks of other nodes a verdict blamed: failures of this node's report.
  void addRemoteCulprits(std::vector<WorkerFailure> culprits);
  std::vector<int> localRanks() const;

  Clock::TimePoint now() const { return env_.clock().now(); }

  const AgentConfig& config_;
  AgentEnv& env_;
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
  CollectiveWatch collective_;          // what said a collective failed, and the grace
  HangAttempt attempt_;                 // what this attempt showed so far
};

}  // namespace ddprun::agent
