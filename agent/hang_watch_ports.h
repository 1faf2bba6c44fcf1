// What the hang watch (hang_watch.h) needs from the agent around it, as two small
// interfaces: the workers it watches (their pids, places and ends: the worker group), and
// where its findings go (the events file and the status record: the job reporter) with the
// size of the round they belong to. (The other nodes it reaches through the job board,
// agent/hang/nodes/node_summaries.h.) The round loop gives it adapters over its parts
// (round_hang_ports.h); tests give it their own, so that a round of several nodes runs
// without a rendezvous. Thread-safety: none; the agent's thread only.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "agent/job_reporter.h"
#include "agent/ops/failure_report.h"
#include "agent/worker.h"
#include "common/clock.h"
#include "common/json_writer.h"

namespace ddprun::agent {

// The workers of the current attempt, as the hang watch sees and marks them (a worker it
// stops as hung gets its reason and stacks; one it took the Python stacks of gets those).
class HangWorkers {
 public:
  virtual ~HangWorkers() = default;
  virtual std::vector<Worker>& workers() = 0;
  virtual const std::vector<Worker>& workers() const = 0;
  virtual int attempt() const = 0;
  virtual bool anyRunning() const = 0;
  // The workers are being stopped anyway: the watch lets them go.
  virtual bool stopping() const = 0;
  // How long a worker sent SIGKILL may take to be reaped.
  virtual Clock::Duration killWait() const = 0;
  // The attempt's failures, root cause first (then the ranks in `culprits`).
  virtual std::vector<WorkerFailure> collectFailures(const std::string& host,
                                                     const std::vector<int>& culprits) const = 0;
};

// Where the watch's findings go, and the round they belong to.
class HangReports {
 public:
  // The round's size: every rank of the job, and its nodes.
  struct Round {
    int world_size = 0;
    int group_world_size = 0;
  };
  virtual ~HangReports() = default;
  // An event of the events file ("hang_verdict", "timer_expired").
  virtual void emit(const std::string& event, const JsonObject& fields) = 0;
  // The verdict the status record and the health check show (job_reporter.h).
  virtual void setHangVerdict(JobReporter::Verdict verdict) = 0;
  // The current round; none before the first.
  virtual std::optional<Round> round() const = 0;
};

}  // namespace ddprun::agent
