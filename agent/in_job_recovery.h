// --recovery=in-job, the agent's side (docs/recovery.md; the keys and variables it shares
// with ddprun's worker runtime are common/recovery_keys.h's). When a local worker fails, it
// decides whether the failed worker may be replaced alone while every other worker of the
// job runs on, and replaces it: every rank of the round said it can re-form in process (the
// runtime's `capable` key), no worker gave up on in-job recovery, none was stopped as hung,
// and --max_restarts has a restart left (a replacement counts as one, through a job-wide
// counter on the rendezvous store that every node reads). The replacement bumps the round's
// generation in the workers' store and starts only the failed rank again, with the same
// RANK and the new DDPRUN_GENERATION; one log line and a worker_replaced event say so.
// Otherwise one line says why not, and the round loop restarts the whole group as with
// --recovery=restart. The other nodes' agents do nothing: their workers re-form through
// the workers' store.
//
// The warm spare (docs/recovery.md#the-warm-spare): with --recovery_spare (the default), once
// every local worker of the round said it can re-form (so the program is on the runtime), the
// node keeps one spare process of it (worker_group.h) that a failure hands the failed rank to,
// instead of starting a process; a new spare follows a hand-over after kSpareSettle, and one
// that dies while it waits is started again (up to kMaxSpareDeaths in a row). The spare
// outlives the round it was started in (it has no rank): it ends with the job. One per node,
// not per N workers: a node rarely loses two workers at once without losing itself, and each
// spare holds a LibTorch process's memory. Thread-safety: none; the agent's thread only.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agent/agent_config.h"
#include "agent/agent_env.h"
#include "agent/agent_rendezvous.h"
#include "agent/containment.h"
#include "agent/job_reporter.h"
#include "agent/worker_group.h"
#include "common/logging.h"
#include "rendezvous/rounds/rendezvous_config.h"
#include "rendezvous/store/store.h"

namespace ddprun::agent {

class InJobRecovery {
 public:
  // How long one call to the workers' store may take before the failure takes the whole-group
  // restart instead: the store is the round's own, on a host of the job.
  static constexpr std::chrono::seconds kStoreTimeout{10};

  // Everything given must outlive this.
  InJobRecovery(const AgentConfig& config, AgentEnv& env, WorkerGroup& group, JobReporter& reporter,
                Containment& containment);
  ~InJobRecovery();
  InJobRecovery(const InJobRecovery&) = delete;
  InJobRecovery& operator=(const InJobRecovery&) = delete;

  // `flight_dir`: the workers' DDPRUN_FLIGHT_DIR (empty: none), where a replaced rank's rings
  // are removed.
  void setUp(AgentRendezvous& rdzv, std::string flight_dir);
  // The workers of round `rdzv` are about to start (generation 0); the last round's store
  // connection is dropped.
  void roundStarted(const rendezvous::RendezvousResult& rdzv);
  // A local worker failed (and the attempt would end): with --recovery=in-job and when it may,
  // replaces every failed worker alone and returns true (the attempt goes on). Otherwise
  // returns false, having said in one line why not (nothing with --recovery=restart).
  bool replaceFailed();
  // The restarts the job has used for --max_restarts: the round's `restart_count` plus the
  // job's replacements (read off the store with --recovery=in-job; the last count read when
  // the store does not answer).
  int restartsUsed(int restart_count);

  // The warm spare: when the round loop should call tick() next (time_point::max(): no need).
  Clock::TimePoint nextLook() const;
  // Starts the spare when it is wanted and may be (every local worker capable), its time come.
  void tick();

  // How often the spare's conditions are looked at while they do not hold yet (from the end of
  // the last look), and how long one look may take: it runs on the round loop's thread, so a
  // workers' store that is gone (the round ended while this node was cut off) costs the loop at
  // most this much each interval.
  static constexpr std::chrono::seconds kSpareLookInterval{1};
  static constexpr std::chrono::seconds kSpareLookTimeout{1};
  // After a hand-over, the next spare waits this long, so that its LibTorch load does not
  // compete for the CPUs with the recovery it follows.
  static constexpr std::chrono::seconds kSpareSettle{5};
  // Spares that may die in a row while waiting before the round has no more.
  static constexpr int kMaxSpareDeaths = 3;

 private:
  // Why the failed workers may not be replaced alone; nothing: they may. Takes a restart from
  // the budget and bumps the generation when they may (`generation`: the new one).
  std::optional<std::string> claim(const std::vector<const Worker*>& failed, int& generation);
  std::optional<std::string> everyRankCapable();
  void removeRings(int rank) const;
  bool spareWanted() const;
  // Whether every local worker wrote its `capable` key (nothing: the store did not answer).
  bool localRanksCapable();

  const AgentConfig& config_;
  AgentEnv& env_;
  WorkerGroup& group_;
  JobReporter& reporter_;
  Containment& containment_;
  std::shared_ptr<spdlog::logger> log_;
  AgentRendezvous* rendezvous_ = nullptr;
  std::string flight_dir_;
  std::optional<rendezvous::RendezvousResult> round_;
  std::string scope_;                                 // the round's keys (recovery::roundScope)
  std::unique_ptr<rendezvous::Store> workers_store_;  // made at the round's first failure
  std::unique_ptr<rendezvous::Store> look_store_;     // the spare's looks (kSpareLookTimeout)
  int64_t replacements_ = 0;                          // the job's, as last read
  Clock::TimePoint next_spare_look_{};                // when tick() may start the spare
  bool spare_given_up_ = false;                       // kMaxSpareDeaths reached this round
};

}  // namespace ddprun::agent
