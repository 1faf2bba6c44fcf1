// The round loop's state and steps (agent/elastic_agent.cc): the parts it owns and drives,
// kept in a header of their own so that the loop's file holds only the loop. Private to the
// agent: nothing outside agent/elastic_agent.cc includes it.
#pragma once

#include <signal.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agent/agent_config.h"
#include "agent/agent_env.h"
#include "agent/agent_rendezvous.h"
#include "agent/containment.h"
#include "agent/elastic_agent.h"
#include "agent/hang_watch.h"
#include "agent/in_job_recovery.h"
#include "agent/job_reporter.h"
#include "agent/output/log_layout.h"
#include "agent/placement/gpu_watch.h"
#include "agent/process/orphan_guard.h"
#include "agent/progress_watch.h"
#include "agent/restart_policy.h"
#include "agent/round_hang_ports.h"
#include "agent/worker_group.h"
#include "common/logging.h"
#include "rendezvous/rounds/dynamic_rendezvous.h"

namespace ddprun::agent {

class ElasticAgent::Impl {
 public:
  Impl(AgentConfig config, OrphanGuard* guard, AgentEnv& env,
       std::function<std::unique_ptr<AgentRendezvous>()> make_rendezvous);

  int run();

 private:
  // How an attempt ended. kSucceeded: this node's workers did (then the job is done, or one
  // of the others follows).
  enum class Outcome { kSucceeded, kJobDone, kStartFailed, kFailed, kStoppedBySignal, kRoundEnded, kStoreLost };
  // How the attempt's workers stop and its round ends (endOfAttempt).
  struct AttemptEnd {
    int signal = SIGTERM;                      // to the workers
    std::optional<rendezvous::RoundEnd> mine;  // the end this node writes; none: another node's, or no store
    bool round_first = false;                  // written before the workers stop, not after
    bool say_stopping = true;                  // the state "stopping" meanwhile
    // A final failure is told as this node's end (round_end's by_this_node) even when another
    // node's end stood: as before this ending was one place (a fix would be a change of its own).
    bool told_as_mine = false;
  };

  void onStopSignal(int signal);
  void setUp();
  int runRounds();
  // Starts the attempt's workers; throws what a start throws.
  void startWorkers(const rendezvous::RendezvousResult& rdzv);
  // Starts the attempt's workers (none when `sick_gpus` names a sick GPU) and watches them
  // until the attempt's outcome is known.
  Outcome runAttempt(const rendezvous::RendezvousResult& rdzv, const std::string& sick_gpus);
  Outcome waitForWorkers();
  // A stop signal, or the round's end or loss of its store, once one came: the outcome.
  std::optional<Outcome> signalOrRoundEvent() const;
  // Ends the attempt after `outcome` (endOfAttempt, elastic_agent.cc); returns the exit code
  // when the job ends for this node, nothing when another attempt follows.
  std::optional<int> endOfAttempt(Outcome outcome, const rendezvous::RendezvousResult& rdzv);
  // Stops the workers and ends the round as `end` says; returns the round's end as it stands
  // (empty when this node wrote none).
  std::string stopAndEndRound(const AttemptEnd& end);
  // After a local failure: restart, re-form (nothing returned), or end the job with the report.
  std::optional<int> afterFailure(std::vector<WorkerFailure>& failures, const rendezvous::RoundEnd& mine,
                                  const std::string& standing, const rendezvous::RendezvousResult& rdzv);
  std::optional<rendezvous::RendezvousResult> formRound();
  void watchRound(int round);
  // Stops the workers with `signal` and clears the attempt.
  void stopAttempt(int signal);
  void endAttempt();
  int finishJob(int exit_code);
  void afterSuccess();
  // The cooldown of a flapping node: sits out for `duration` (or until the job ends).
  // Returns the exit code when ddprun should end now, nothing when it should rejoin.
  // `why`: the reason to log (default: this node's workers failed again and again).
  std::optional<int> sitOut(std::chrono::milliseconds duration, const std::string& why = {});
  int jobEndedAway(const std::string& reason);
  void runFor(Clock::Duration d) { env_.runFor(d); }
  Clock::TimePoint now() const { return env_.clock().now(); }

  AgentConfig config_;
  OrphanGuard* guard_;
  AgentEnv& env_;
  std::function<std::unique_ptr<AgentRendezvous>()> make_rendezvous_;
  std::shared_ptr<spdlog::logger> log_;
  std::string host_;
  std::unique_ptr<LogLayout> layout_;
  std::unique_ptr<AgentRendezvous> rendezvous_;
  rendezvous::RendezvousSettings settings_;
  RestartPolicy policy_;
  // The parts: the workers, what others see, the hang and progress watches, what is left of an attempt.
  WorkerGroup group_;
  JobReporter reporter_;
  // The worker group and the job reporter as the hang watch sees them (round_hang_ports.h).
  GroupHangWorkers hang_workers_{group_};
  ReporterHangReports hang_reports_{reporter_};
  HangWatch hang_;
  ProgressWatch progress_;  // stragglers and status --trace, from the same rings
  Containment containment_;
  std::unique_ptr<GpuWatch> gpu_watch_;  // GPU health before each start, GPU faults after a failure
  InJobRecovery recovery_;               // --recovery=in-job: a failed worker replaced alone

  int stop_signal_ = 0;  // the first of config_.stop_signals received.
  int round_ = -1;
  std::optional<rendezvous::RoundEvent> round_event_;  // of round_, from the watcher thread
  int attempt_ = 0;                                    // worker group starts on this node: names attempt_<k> log dirs
};

}  // namespace ddprun::agent
