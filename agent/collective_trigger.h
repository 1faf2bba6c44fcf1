// Once a worker of an attempt failed: what says that a torch collective failed, which makes
// the hang watch (hang_watch.h) judge where every rank stands and stop the others as hung.
// In order: a worker's stderr line seen while the workers ran; a failure's message (its error
// file's, its saved Python exception, its stderr's tail) naming a timed-out or failed
// collective; a Python or torch-dumping worker killed by SIGABRT with no error file, as NCCL's
// watchdog does, though so does any abort (`maybe`, unless a dump was written, which ties it
// to a collective); a worker's flight-recorder dump. A failure of a worker stopped as hung is
// no trigger. Pure but for `dumped`. While the workers run, CollectiveWatch keeps the first
// thing that said so, on the agent's clock.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "agent/ops/failure_report.h"
#include "agent/worker.h"
#include "common/clock.h"

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

// While an attempt's workers run: the first thing that says a torch collective failed, a
// worker's stderr line naming one (python_stacks.h's collectiveFailureIn) or a torch
// flight-recorder dump appearing (looked for every kDumpLook), logged once; and the grace the
// workers then get to end by themselves (gloo raises at once; NCCL's watchdog aborts the
// process) before the attempt is stopped. Thread-safety: none; the agent's thread.
class CollectiveWatch {
 public:
  static constexpr std::chrono::seconds kGrace{5};
  static constexpr std::chrono::milliseconds kDumpLook{250};

  // `clock` must outlive the watch.
  explicit CollectiveWatch(const Clock& clock) : clock_(clock) {}

  // What said it ("rank 0: <line>"); empty: nothing yet in this attempt.
  const std::string& line() const { return line_; }
  // The attempt's workers started: the first look for a dump is due kDumpLook from now.
  void started() { next_dump_look_ = clock_.now() + kDumpLook; }
  // A line of rank `rank`'s stderr; only the first that names a failed collective counts.
  void onStderrLine(int rank, std::string_view line);
  // The earliest of `at`, the grace's end once something said it, and, when `watch_dumps`,
  // the next look for a dump.
  Clock::TimePoint wake(Clock::TimePoint at, bool watch_dumps) const;
  // When a look is due: a dump of `dumps` written by one of `workers` says it.
  void lookForDumps(const TorchDumps& dumps, const std::vector<Worker>& workers);
  // Something said it and the grace is over: logged, true.
  bool graceOver();
  // The attempt is over.
  void forget() { line_.clear(); }

 private:
  void notice(const std::string& what);

  const Clock& clock_;
  std::string line_;
  Clock::TimePoint line_at_{};
  Clock::TimePoint next_dump_look_{};
};

}  // namespace ddprun::agent
