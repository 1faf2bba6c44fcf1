// The round loop's parts as the hang parts' ports (hang_watch_ports.h): its worker group as
// the workers the hang watch and the file timers watch, its job reporter as where their
// findings go. Each adapter holds a reference to a part that must outlive it. Thread-safety:
// none; the agent's thread only.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "agent/hang_watch_ports.h"

namespace ddprun::agent {

class WorkerGroup;

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

}  // namespace ddprun::agent
