// What tells the hang watch that a torch collective failed once a worker did
// (agent/collective_trigger.h), on plain workers and failures: each kind of evidence in
// its order, an abort that only may be a collective's, and failures of workers stopped as
// hung, which are no evidence.
#include "agent/collective_trigger.h"

#include <signal.h>

#include <optional>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

namespace ddprun::agent {
namespace {

// Python workers 0 and 1 (pids 100, 101) and a C++ worker 2 (pid 102) without a dump file.
std::vector<Worker> workers() {
  std::vector<Worker> all(3);
  for (int r = 0; r < 3; ++r) {
    all[r].pid = 100 + r;
    all[r].place.rank = r;
    all[r].python_hook = r < 2;
  }
  return all;
}

WorkerFailure failure(int rank, int signal) {
  WorkerFailure f;
  f.rank = rank;
  f.pid = 100 + rank;
  f.signal = signal;
  f.exit_code = signal == 0 ? 1 : 0;
  return f;
}

struct Dumped {
  std::optional<int> rank;
  int asked = 0;
  std::optional<int> operator()() {
    ++asked;
    return rank;
  }
};

CollectiveTrigger trigger(const std::string& line, const std::vector<WorkerFailure>& failures, Dumped& dumped) {
  return collectiveFailureTrigger(line, failures, workers(), [&] { return dumped(); });
}

}  // namespace

TEST_CASE("collective trigger: a stderr line first, then a failure's own words, with no dump looked for", "[unit]") {
  Dumped dumped{1};
  WorkerFailure timed_out = failure(1, 0);
  timed_out.error = WorkerErrorRecord{};
  timed_out.error->message = "RuntimeError: [Rank 1] Watchdog caught collective operation timeout";
  WorkerFailure aborted = failure(0, 0);
  aborted.python_exception = "RuntimeError: NCCL communicator was aborted on rank 0.\n";

  CHECK(trigger("rank 0: NCCL error in: x", {timed_out}, dumped).text ==
        "a collective failed (rank 0: NCCL error in: x)");
  CHECK(trigger("", {timed_out, aborted}, dumped).text == "rank 1 failed: a collective timed out");
  const CollectiveTrigger said = trigger("", {aborted}, dumped);
  CHECK(said.text == "rank 0 failed: a collective failed (RuntimeError: NCCL communicator was aborted on rank 0.)");
  CHECK_FALSE(said.maybe);
  CHECK(dumped.asked == 0);
}

TEST_CASE("collective trigger: an abort without an error file only may be a collective's, unless a dump was written",
          "[unit]") {
  Dumped none;
  const CollectiveTrigger abort = trigger("", {failure(1, SIGABRT)}, none);
  CHECK(abort.text == "rank 1 was killed by SIGABRT and wrote no error file, as torch's NCCL watchdog does");
  CHECK(abort.maybe);
  Dumped dumped{0};
  const CollectiveTrigger tied = trigger("", {failure(1, SIGABRT)}, dumped);
  CHECK(tied.text == abort.text);
  CHECK_FALSE(tied.maybe);

  // A worker with no Python hook and no dump file: its abort says nothing of a collective.
  CHECK(trigger("", {failure(2, SIGABRT)}, none).text.empty());
  // An abort with an error file is an ordinary crash.
  WorkerFailure with_file = failure(1, SIGABRT);
  with_file.error = WorkerErrorRecord{};
  with_file.error->message = "ValueError: bad batch";
  CHECK(trigger("", {with_file}, none).text.empty());
}

TEST_CASE("collective trigger: a dump alone says so, and a worker stopped as hung is no evidence", "[unit]") {
  Dumped dumped{2};
  WorkerFailure stopped = failure(1, SIGABRT);
  stopped.hang_reason = "timer 'step' expired";
  stopped.python_exception = "RuntimeError: NCCL error in: x";
  const CollectiveTrigger t = trigger("", {stopped, failure(0, 0)}, dumped);
  CHECK(t.text == "rank 2 wrote torch's flight-recorder dump");
  CHECK_FALSE(t.maybe);
  Dumped none;
  CHECK(trigger("", {stopped, failure(0, 0)}, none).text.empty());
}

}  // namespace ddprun::agent
