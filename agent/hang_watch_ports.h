// What the hang watch (hang_watch.h) needs from the agent around it, as three small
// interfaces: the workers it watches (their pids, places and ends: the worker group), where
// its findings go (the events file and the status record: the job reporter) with the size of
// the round they belong to, and the other nodes of the round (hang summaries exchanged
// through the rendezvous' job board). The round loop gives it adapters over its parts
// (made here); tests give it their own, so that a multi-node exchange or a round of several
// nodes runs without a rendezvous. Thread-safety: none; the agent's thread only.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "agent/job_reporter.h"
#include "agent/ops/failure_report.h"
#include "agent/worker.h"
#include "common/clock.h"
#include "common/json_writer.h"

namespace ddprun::agent {

class AgentRendezvous;
class WorkerGroup;

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

// The other nodes of the round: a node judging a hang asks every other node for its hang
// summary (where its ranks stand, their Python frames, their torch dumps) and gets them back.
class HangExchange {
 public:
  virtual ~HangExchange() = default;
  // This node's name, as the summaries carry it.
  virtual const std::string& nodeName() const = 0;
  // Another node judges a hang and waits for this node's summary.
  virtual bool hangSummaryRequested() = 0;
  virtual void publishHangSummary(const std::string& summary) = 0;
  // Asks the other nodes for theirs (posting `mine` beside, for a node judging too) and
  // returns those that came within `wait`.
  virtual std::vector<std::string> gatherHangSummaries(std::chrono::milliseconds wait, const std::string& mine) = 0;
};

// The adapters the round loop's hang watch uses over its parts; each holds a reference to a
// part that must outlive it.
class GroupHangWorkers final : public HangWorkers {
 public:
  explicit GroupHangWorkers(WorkerGroup& group) : group_(group) {}
  std::vector<Worker>& workers() override;
  const std::vector<Worker>& workers() const override;
  int attempt() const override;
  bool anyRunning() const override;
  bool stopping() const override;
  Clock::Duration killWait() const override;
  std::vector<WorkerFailure> collectFailures(const std::string& host, const std::vector<int>& culprits) const override;

 private:
  WorkerGroup& group_;
};

class ReporterHangReports final : public HangReports {
 public:
  explicit ReporterHangReports(JobReporter& reporter) : reporter_(reporter) {}
  void emit(const std::string& event, const JsonObject& fields) override;
  void setHangVerdict(JobReporter::Verdict verdict) override;
  std::optional<Round> round() const override;

 private:
  JobReporter& reporter_;
};

class RendezvousHangExchange final : public HangExchange {
 public:
  explicit RendezvousHangExchange(AgentRendezvous& rdzv) : rdzv_(rdzv) {}
  const std::string& nodeName() const override;
  bool hangSummaryRequested() override;
  void publishHangSummary(const std::string& summary) override;
  std::vector<std::string> gatherHangSummaries(std::chrono::milliseconds wait, const std::string& mine) override;

 private:
  AgentRendezvous& rdzv_;
};

}  // namespace ddprun::agent
