#include "agent/collective_trigger.h"

#include <signal.h>

#include <fmt/format.h>

#include "agent/hang/python/python_stacks.h"
#include "agent/hang/rings/hang_verdict.h"
#include "agent/ops/error_file.h"
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

}  // namespace ddprun::agent
