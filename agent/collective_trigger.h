// Once a worker of an attempt failed: what says that a torch collective failed, which makes
// the hang watch (hang_watch.h) judge where every rank stands and stop the others as hung.
// In order: a worker's stderr line seen while the workers ran; a failure's message (its error
// file's, its saved Python exception, its stderr's tail) naming a timed-out or failed
// collective; a Python or torch-dumping worker killed by SIGABRT with no error file, as NCCL's
// watchdog does, though so does any abort (`maybe`, unless a dump was written, which ties it
// to a collective); a worker's flight-recorder dump. A failure of a worker stopped as hung is
// no trigger. Pure but for `dumped`.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "agent/ops/failure_report.h"
#include "agent/worker.h"

namespace ddprun::agent {

struct CollectiveTrigger {
  std::string text;    // empty: nothing says a collective failed
  bool maybe = false;  // only a SIGABRT says so
};

// `collective_line`: what a stderr line said ("rank 0: <line>"; empty: none); `dumped`: a rank
// whose dump was written (asked only when nothing before it triggers).
CollectiveTrigger collectiveFailureTrigger(const std::string& collective_line,
                                           const std::vector<WorkerFailure>& failures,
                                           const std::vector<Worker>& workers,
                                           const std::function<std::optional<int>()>& dumped);

}  // namespace ddprun::agent
