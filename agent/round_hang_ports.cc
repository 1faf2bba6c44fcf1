#include "agent/round_hang_ports.h"

#include "agent/worker_group.h"

namespace ddprun::agent {

std::vector<Worker>& GroupHangWorkers::workers() { return group_.workers(); }
const std::vector<Worker>& GroupHangWorkers::workers() const { return group_.workers(); }
int GroupHangWorkers::attempt() const { return group_.attempt(); }
bool GroupHangWorkers::anyRunning() const { return group_.anyRunning(); }
bool GroupHangWorkers::stopping() const { return group_.stopping(); }
Clock::Duration GroupHangWorkers::killWait() const { return group_.killWait(); }
std::vector<WorkerFailure> GroupHangWorkers::collectFailures(const std::string& host,
                                                             const std::vector<int>& culprits) const {
  return group_.collectFailures(host, culprits);
}

void ReporterHangReports::emit(const std::string& event, const JsonObject& fields) { reporter_.emit(event, fields); }
void ReporterHangReports::setHangVerdict(JobReporter::Verdict verdict) { reporter_.setHangVerdict(std::move(verdict)); }
std::optional<HangReports::Round> ReporterHangReports::round() const {
  const auto& current = reporter_.round();
  if (!current) return std::nullopt;
  return Round{current->world_size, current->group_world_size};
}

}  // namespace ddprun::agent
