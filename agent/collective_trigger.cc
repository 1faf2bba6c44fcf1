#include "agent/collective_trigger.h"

#include <signal.h>

#include <algorithm>

#include <fmt/format.h>

#include "agent/hang/python/python_stacks.h"
#include "agent/hang/rings/hang_verdict.h"
#include "agent/ops/error_file.h"
#include "common/logging.h"
#include "common/text_escape.h"

namespace ddprun::agent {

CollectiveTrigger collectiveFailureTrigger(const std::string& collective_line,
                                           const std::vector<WorkerFailure>& failures,
                                           const std::vector<Worker>& workers,
                                           const std::function<std::optional<int>()>& dumped) {
  if (!collective_line.empty()) return {"a collective failed (" + collective_line + ")"};
  for (const WorkerFailure& f : failures) {
    if (!f.hang_reason.empty()) continue;
    if (f.error && reportsCollectiveTimeout(f.error->message)) {
      return {fmt::format("rank {} failed: a collective timed out", f.rank)};
    }
    std::string said = f.python_exception;
    for (const Worker& w : workers) {
      if (w.pid == f.pid && w.stderr_record) said += "\n" + w.stderr_record->tail.text();
    }
    if (auto line = collectiveFailureIn(said)) {
      return {fmt::format("rank {} failed: a collective failed ({})", f.rank, printable(*line))};
    }
  }
  const std::optional<int> dump = dumped();
  // NCCL's watchdog aborts the process from a C++ thread: no error file, no exception, and
  // its words on stderr reach ddprun only when stderr goes through it.
  for (const WorkerFailure& f : failures) {
    if (!f.hang_reason.empty() || f.signal != SIGABRT || f.error || !f.python_exception.empty()) continue;
    for (const Worker& w : workers) {
      if (w.pid == f.pid && (w.python_hook || !w.torch_dump.empty())) {
        return {
            fmt::format("rank {} was killed by SIGABRT and wrote no error file, as torch's NCCL watchdog does", f.rank),
            !dump};  // a dump ties it to a collective
      }
    }
  }
  if (dump) return {fmt::format("rank {} wrote torch's flight-recorder dump", *dump)};
  return {};
}

void CollectiveWatch::onStderrLine(int rank, std::string_view line) {
  if (!line_.empty()) return;
  auto failure = collectiveFailureIn(line);
  if (!failure) return;
  notice(fmt::format("rank {}: {}", rank, printable(*failure)));
}

Clock::TimePoint CollectiveWatch::wake(Clock::TimePoint at, bool watch_dumps) const {
  if (!line_.empty()) at = std::min(at, line_at_ + kGrace);
  if (watch_dumps) at = std::min(at, next_dump_look_);
  return at;
}

void CollectiveWatch::lookForDumps(const TorchDumps& dumps, const std::vector<Worker>& workers) {
  if (clock_.now() < next_dump_look_) return;
  next_dump_look_ = clock_.now() + kDumpLook;
  const std::optional<int> rank = dumps.written();
  if (!rank) return;
  for (const Worker& w : workers) {
    if (w.place.rank == *rank) {
      notice(fmt::format("rank {}: wrote torch's flight-recorder dump {}", *rank, printable(w.torch_dump)));
    }
  }
}

bool CollectiveWatch::graceOver() {
  if (line_.empty() || clock_.now() < line_at_ + kGrace) return false;
  logger("agent")->warn("no worker ended within {} s of '{}'; stopping the attempt",
                        std::chrono::duration_cast<std::chrono::seconds>(kGrace).count(), line_);
  return true;
}

void CollectiveWatch::notice(const std::string& what) {
  line_ = what;
  line_at_ = clock_.now();
  logger("agent")->warn("a collective failed ({}); taking the Python stacks of the workers still running", line_);
}

}  // namespace ddprun::agent
