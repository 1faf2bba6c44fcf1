// The ranks' progress at their collectives while the workers run, for stragglers and
// `ddprun status --trace`. Every kLookInterval it reads this node's collective flight
// recorder rings (common/flight_ring.h: C++ workers on ddprun's runtime and Python workers
// through ddprun's hook write them alike), publishes the node's summary on the job's store
// (agent/hang/rings/progress_summary.h: each rank's mean wait over its last collectives, and where
// it stands now), with, for ranks whose worker's torch serves a live flight-recorder trace,
// their current collectives from it (agent/hang/python/live_positions.h: read first, off the
// event loop, within kTraceWait), and judges its own ranks against the groups' medians (agent/hang/
// straggler.h), which the round's first node computes over every node's summaries and
// publishes beside them. A rank whose lag passes --straggler_threshold gets a `straggler`
// event, one warn line and a place in the health check; a `straggler_end` event when it
// recovers. Everything here is best effort: a store that does not answer costs a look, never
// a round. The round loop ticks it beside the hang watch. Thread-safety: none; the agent's
// thread only.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "agent/agent_config.h"
#include "agent/agent_env.h"
#include "agent/agent_rendezvous.h"
#include "agent/hang/python/live_positions.h"
#include "agent/hang/rings/straggler.h"
#include "agent/job_reporter.h"
#include "agent/worker_group.h"
#include "common/flight_ring.h"
#include "common/logging.h"

namespace ddprun::agent {

class ProgressWatch {
 public:
  // How often a node looks at its rings and publishes (and the first node computes the medians):
  // a few store operations a node each time, like a keep-alive.
  static constexpr std::chrono::seconds kLookInterval{5};
  // Medians older than this are the first node's from before it stopped looking: not used.
  static constexpr std::chrono::seconds kMediansMaxAge{4 * kLookInterval};
  // How long a look waits for the workers' live traces (asked at its start, each request within
  // 2 s) before it publishes without the ones still running: within the interval.
  static constexpr std::chrono::seconds kTraceWait{4};
  // How often the loop looks whether those traces came, meanwhile.
  static constexpr std::chrono::milliseconds kTracePoll{50};
  // What the first node keeps of all nodes' summaries together in one look.
  static constexpr size_t kMaxProgressTotalBytes = size_t{64} << 20;

  // Everything given must outlive the watch.
  ProgressWatch(const AgentConfig& config, AgentEnv& env, const WorkerGroup& group, JobReporter& reporter);

  // `flight_dir`: the directory of the workers' rings (their DDPRUN_FLIGHT_DIR; empty: none,
  // and the watch does nothing).
  void setUp(AgentRendezvous& rdzv, std::string flight_dir);
  // An attempt's workers were started: the first look comes one interval later.
  void workersStarted();
  // When the next look is due (far in the future while no attempt runs).
  Clock::TimePoint nextLook() const;
  // Looks when due: asks the live traces, and once they came (or kTraceWait passed; meanwhile
  // nextLook() is kTracePoll away), reads the rings, publishes, judges. Blocks for a few store round trips
  // (the board's connection gives up within a couple of keep-alive intervals). Never throws.
  void tick();
  // The attempt is over: its stragglers are forgotten (said in the health check, not as events).
  void endAttempt();

 private:
  void look();
  // This node's collective rings of its own ranks, as read now.
  std::vector<FlightRingSnapshot> localRings() const;
  // This node's running workers with ddprun's hook, whose torch may serve a live trace.
  std::vector<LiveTraceReader::Source> traceSources() const;
  Clock::TimePoint now() const { return env_.clock().now(); }

  const AgentConfig& config_;
  AgentEnv& env_;
  const WorkerGroup& group_;
  JobReporter& reporter_;
  std::shared_ptr<spdlog::logger> log_;
  AgentRendezvous* rendezvous_ = nullptr;
  std::string flight_dir_;
  bool watching_ = false;
  Clock::TimePoint next_look_{};
  StragglerTracker tracker_;
  LiveTraceReader traces_;
  bool reading_traces_ = false;  // a look waits for the traces it asked for
  Clock::TimePoint traces_due_{};
};

}  // namespace ddprun::agent
