// What tells the hang watch that a torch collective failed once a worker did
// (agent/collective_trigger.h), on plain workers and failures: each kind of evidence in
// its order, an abort that only may be a collective's, and failures of workers stopped as
// hung, which are no evidence. And while the workers run (CollectiveWatch, on a manual
// clock): the first stderr line or dump that says so, and the grace it starts.
#include "agent/collective_trigger.h"

#include <signal.h>

#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "tests/support/agent_log.h"
#include "tests/support/manual_clock.h"
#include "tests/support/test_process.h"

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

TEST_CASE("collective watch: the first stderr line naming a failed collective is said once and starts the grace",
          "[unit]") {
  testing::AgentLog log;
  testing::ManualClock clock;
  CollectiveWatch watch(clock);
  const auto far = clock.now() + std::chrono::hours(1);

  watch.onStderrLine(1, "hello from rank 1");
  CHECK(watch.line().empty());
  CHECK(watch.wake(far, false) == far);
  CHECK_FALSE(watch.graceOver());

  const auto said = clock.now();
  const std::string timeout = "RuntimeError: [x.cc:81] Timed out waiting 5000ms for recv operation to complete";
  watch.onStderrLine(1, timeout);
  watch.onStderrLine(0, "RuntimeError: NCCL error in: y");  // not the first
  CHECK(watch.line() == "rank 1: " + timeout);
  CHECK(log.count("a collective failed (rank 1: " + timeout + "); taking the Python stacks") == 1);
  CHECK(log.count("NCCL error") == 0);

  // The workers get five seconds to end by themselves.
  CHECK(watch.wake(far, false) == said + std::chrono::seconds(5));
  clock.advance(std::chrono::milliseconds(4999));
  CHECK_FALSE(watch.graceOver());
  clock.advance(std::chrono::milliseconds(1));
  CHECK(watch.graceOver());
  CHECK(log.count("no worker ended within 5 s of 'rank 1: " + timeout + "'; stopping the attempt") == 1);

  // The next attempt starts afresh.
  watch.forget();
  CHECK(watch.line().empty());
  CHECK_FALSE(watch.graceOver());
  CHECK(watch.wake(far, false) == far);
}

TEST_CASE("collective watch: torch's dumps are looked for every 250 ms, and one written says it", "[unit]") {
  testing::AgentLog log;
  testing::TempDir dir;
  testing::ManualClock clock;
  std::vector<Worker> all = workers();
  std::vector<ExpectedDump> expected;
  for (int r = 0; r < 2; ++r) {
    all[r].torch_dump = dir.file("torch_trace_rank_" + std::to_string(r));
    expected.push_back(ExpectedDump{r, all[r].torch_dump, stampOf(all[r].torch_dump)});
  }
  TorchDumps dumps(expected);
  CollectiveWatch watch(clock);
  const auto far = clock.now() + std::chrono::hours(1);
  const auto start = clock.now();
  watch.started();
  CHECK(watch.wake(far, true) == start + std::chrono::milliseconds(250));
  CHECK(watch.wake(far, false) == far);  // dumps not watched: no look

  clock.advance(std::chrono::milliseconds(250));
  watch.lookForDumps(dumps, all);  // none written yet
  CHECK(watch.line().empty());
  CHECK(watch.wake(far, true) == start + std::chrono::milliseconds(500));

  std::ofstream(all[1].torch_dump) << "rank 1's dump";
  clock.advance(std::chrono::milliseconds(100));
  watch.lookForDumps(dumps, all);  // not due
  CHECK(watch.line().empty());
  clock.advance(std::chrono::milliseconds(150));
  watch.lookForDumps(dumps, all);
  CHECK(watch.line() == "rank 1: wrote torch's flight-recorder dump " + all[1].torch_dump);
  CHECK(log.count("a collective failed (rank 1: wrote torch's flight-recorder dump") == 1);
  CHECK(watch.wake(far, false) == clock.now() + std::chrono::seconds(5));
}

}  // namespace ddprun::agent
