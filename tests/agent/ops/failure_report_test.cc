#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include <catch2/catch.hpp>

#include "agent/ops/error_file.h"
#include "agent/ops/failure_report.h"
#include "tests/support/bounded_call.h"
#include "tests/support/test_process.h"

using namespace ddprun::agent;
using Clock = std::chrono::system_clock;

namespace {

WorkerFailure failure(int rank, Clock::time_point when, int exit_code = 1, int signal = 0) {
  WorkerFailure f;
  f.rank = rank;
  f.local_rank = rank;
  f.host = "nodeA";
  f.pid = 1000 + rank;
  f.exit_code = exit_code;
  f.signal = signal;
  f.time = when;
  return f;
}

}  // namespace

TEST_CASE("torch's @record error file is read", "[error_file]") {
  ddprun::testing::TempDir dir;
  std::string path = dir.file("error.json");
  std::ofstream(path)
      << R"({"message": {"message": "ValueError: bad batch", "extraInfo": )"
         R"({"py_callstack": "Traceback (most recent call last):\n  File \"t.py\", line 3\nValueError: bad batch\n", )"
         R"("timestamp": "1700000123"}}})";
  auto record = readErrorFile(path);
  REQUIRE(record);
  CHECK(record->message == "ValueError: bad batch");
  CHECK_THAT(record->traceback, Catch::StartsWith("Traceback (most recent call last):\n  File \"t.py\""));
  CHECK(record->timestamp == 1700000123.0);
}

TEST_CASE("missing, empty, bare and broken error files", "[error_file]") {
  ddprun::testing::TempDir dir;
  CHECK_FALSE(readErrorFile(dir.file("none.json")));
  std::ofstream(dir.file("empty.json")).flush();
  CHECK_FALSE(readErrorFile(dir.file("empty.json")));
  std::ofstream(dir.file("bare.json")) << R"({"message": "plain text"})";
  auto bare = readErrorFile(dir.file("bare.json"));
  REQUIRE(bare);
  CHECK(bare->message == "plain text");
  CHECK_FALSE(bare->timestamp);
  std::ofstream(dir.file("broken.json")) << "{not json";
  auto broken = readErrorFile(dir.file("broken.json"));
  REQUIRE(broken);
  CHECK_THAT(broken->message, Catch::Contains("not valid JSON"));
}

TEST_CASE("an error file that is a FIFO, a link or too large is reported, never read into a hang", "[error_file]") {
  using namespace std::chrono_literals;
  ddprun::testing::TempDir dir;
  const std::string fifo = dir.file("error.json");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  auto says = [](const std::string& needle) {
    return [needle](const std::optional<WorkerErrorRecord>& r) {
      return r && r->message.find(needle) != std::string::npos;
    };
  };
  CHECK(ddprun::testing::callWithin(
            10s, [&] { return readErrorFile(fifo); }, says("a FIFO, not a regular file")) ==
        ddprun::testing::BoundedCall::kReturned);
  auto record = readErrorFile(fifo);
  REQUIRE(record);
  CHECK(record->message == "(error file " + fifo + ": a FIFO, not a regular file; not read)");
  REQUIRE(::symlink("/dev/zero", dir.file("zero.json").c_str()) == 0);
  CHECK(ddprun::testing::callWithin(
            10s, [&] { return readErrorFile(dir.file("zero.json")); }, says("a symbolic link, not followed")) ==
        ddprun::testing::BoundedCall::kReturned);
  std::ofstream(dir.file("huge.json")) << "{\"message\": \"" << std::string(kMaxErrorFileBytes, 'x') << "\"}";
  auto huge = readErrorFile(dir.file("huge.json"));
  REQUIRE(huge);
  CHECK_THAT(huge->message, Catch::Contains("more than the 4194304 bytes an error file may have"));
}

TEST_CASE("the earliest failure is the root cause and error-file timestamps decide", "[failure_report]") {
  auto t0 = Clock::from_time_t(1700000100);
  std::vector<WorkerFailure> failures = {failure(0, t0 + std::chrono::seconds(5)),
                                         failure(1, t0 + std::chrono::seconds(2)),
                                         failure(2, t0 + std::chrono::seconds(9))};
  sortRootCauseFirst(failures);
  CHECK(failures[0].rank == 1);
  CHECK(failures[1].rank == 0);
  CHECK(failures[2].rank == 2);
  // Rank 2 exited last but wrote its error first.
  failures[2].error = WorkerErrorRecord{"RuntimeError: first", "", 1700000101.0};
  sortRootCauseFirst(failures);
  CHECK(failures[0].rank == 2);
}

TEST_CASE("after a hang stop the ranks the verdict blamed come first", "[failure_report]") {
  auto t0 = Clock::from_time_t(1700000100);
  std::vector<WorkerFailure> failures = {
      failure(0, t0 + std::chrono::seconds(1)), failure(1, t0 + std::chrono::seconds(2)),
      failure(2, t0 + std::chrono::seconds(3)), failure(3, t0 + std::chrono::seconds(4))};
  putRanksFirst(failures, {3, 1});
  std::vector<int> order;
  for (const auto& f : failures) order.push_back(f.rank);
  CHECK(order == std::vector<int>{1, 3, 0, 2});  // each part keeps its order
  putRanksFirst(failures, {});
  order.clear();
  for (const auto& f : failures) order.push_back(f.rank);
  CHECK(order == std::vector<int>{1, 3, 0, 2});  // no verdict: nothing moves
}

TEST_CASE("the report names rank, host, pid, exit and the worker's message", "[failure_report]") {
  auto t0 = Clock::from_time_t(1700000100);
  std::vector<WorkerFailure> failures = {failure(3, t0, 7), failure(1, t0 + std::chrono::seconds(1), 0, 9)};
  failures[0].error_file = "/logs/attempt_0/3/error.json";
  failures[0].error = WorkerErrorRecord{"ValueError: bad batch", "Traceback:\n  line 1\n", 1700000100.0};
  std::string report = formatFailureReport("train.py", failures);
  CHECK_THAT(report, Catch::Contains("train.py FAILED: 2 workers failed"));
  auto root = report.find("Root cause");
  auto others = report.find("Other failures");
  REQUIRE(root != std::string::npos);
  REQUIRE(others != std::string::npos);
  std::string root_part = report.substr(root, others - root);
  CHECK_THAT(root_part, Catch::Contains("rank      : 3 (local_rank: 3)"));
  CHECK_THAT(root_part, Catch::Contains("host      : nodeA"));
  CHECK_THAT(root_part, Catch::Contains("pid       : 1003"));
  CHECK_THAT(root_part, Catch::Contains("exit code 7"));
  CHECK_THAT(root_part, Catch::Contains("message   : ValueError: bad batch"));
  CHECK_THAT(root_part, Catch::Contains("    Traceback:\n      line 1\n"));
  CHECK_THAT(root_part, Catch::Contains("/logs/attempt_0/3/error.json"));
  std::string other_part = report.substr(others);
  CHECK_THAT(other_part, Catch::Contains("rank      : 1"));
  CHECK_THAT(other_part, Catch::Contains("killed by SIGKILL (9)"));
  CHECK_THAT(other_part, Catch::Contains("wrote no error file"));
}

TEST_CASE("a message of several lines stays inside its field of the report", "[failure_report]") {
  // torch 2.x raises such messages (torch.compile's BackendCompilerFailed, for one); @record
  // writes them into the error file's message as they are.
  std::vector<WorkerFailure> failures = {failure(0, Clock::from_time_t(1700000100))};
  failures[0].error_file = "/logs/attempt_1/0/error.json";
  failures[0].error = WorkerErrorRecord{
      "BackendCompilerFailed: backend='inductor' raised:\nRuntimeError: bad shape\n\nSet TORCH_LOGS=+dynamo", "",
      std::nullopt};
  std::string report = formatFailureReport("train.py", failures);
  CHECK_THAT(report, Catch::Contains("  message   : BackendCompilerFailed: backend='inductor' raised:\n"
                                     "              RuntimeError: bad shape\n"
                                     "\n"
                                     "              Set TORCH_LOGS=+dynamo\n"));
  // Every line between the rules belongs to the report: none starts at column 0 but its own.
  std::string body = report.substr(report.find("Root cause"));
  for (size_t at = body.find('\n'); at != std::string::npos && at + 1 < body.size(); at = body.find('\n', at + 1)) {
    const char next = body[at + 1];
    INFO("line: " << body.substr(at + 1, body.find('\n', at + 1) - at - 1));
    CHECK((next == ' ' || next == '\n' || next == '=' || next == '-'));
  }
}

TEST_CASE("the report shows a worker's stderr tail when it wrote no error file or its log is incomplete",
          "[failure_report]") {
  auto t0 = Clock::from_time_t(1700000100);
  WorkerFailure f = failure(0, t0, 7);
  f.stderr_tail = "loading shard 3\nOSError: disk quota exceeded\n";
  f.stderr_file = "/logs/attempt_0/0/stderr.log";
  std::string report = formatFailureReport("train.py", {f});
  CHECK_THAT(report, Catch::Contains("(the worker wrote no error file; the end of its stderr follows)"));
  CHECK_THAT(report, Catch::Contains("  stderr    : (last 2 lines; all of it in /logs/attempt_0/0/stderr.log)\n"
                                     "    loading shard 3\n    OSError: disk quota exceeded\n"));

  f.stderr_file_error = "No space left on device";
  report = formatFailureReport("train.py", {f});
  CHECK_THAT(report,
             Catch::Contains("(last 2 lines; /logs/attempt_0/0/stderr.log is incomplete: No space left on device)"));

  // With an error file the tail is shown only when the log is incomplete.
  f.error = WorkerErrorRecord{"OSError: disk quota exceeded", "", 1700000100.0};
  CHECK_THAT(formatFailureReport("train.py", {f}), Catch::Contains("    OSError: disk quota exceeded\n"));
  f.stderr_file_error.clear();
  CHECK_THAT(formatFailureReport("train.py", {f}), !Catch::Contains("stderr    :"));
}

TEST_CASE("signal names", "[failure_report]") {
  CHECK(signalName(9) == "SIGKILL");
  CHECK(signalName(15) == "SIGTERM");
  CHECK(signalName(11) == "SIGSEGV");
}

TEST_CASE("a worker stopped as hung has why and its first stack lines in the report", "[failure_report]") {
  WorkerFailure f = failure(1, Clock::now(), 0, 9);
  f.hang_reason = "timer 'train_step' expired";
  f.stacks_tool = "gdb";
  f.stacks_file = "/logs/attempt_0/1/stacks.txt";
  for (int i = 0; i < 70; ++i) f.stacks += "#" + std::to_string(i) + " frame\n";
  std::string report = formatFailureReport("train", {f});
  CHECK_THAT(report,
             Catch::Contains("  hung      : timer 'train_step' expired; ddprun took its stacks, then stopped it\n"));
  CHECK_THAT(report,
             Catch::Contains(
                 "  stacks    : (native, by gdb; first 60 of 70 lines; all of them in /logs/attempt_0/1/stacks.txt)\n"
                 "    #0 frame\n"));
  CHECK_THAT(report, Catch::Contains("    #59 frame\n"));
  CHECK_THAT(report, !Catch::Contains("#60 frame"));

  WorkerFailure py = failure(2, Clock::now(), 0, 6);
  py.hang_reason = "timer 'py' expired";
  py.hang_python_abort = true;
  py.stacks_note = "no native stacks: neither eu-stack (Debian package elfutils) nor gdb is installed";
  report = formatFailureReport("train.py", {py});
  CHECK_THAT(report, Catch::Contains("SIGABRT first: Python printed every thread's traceback to its stderr"));
  CHECK_THAT(report, Catch::Contains("  stacks    : (no native stacks: neither eu-stack"));
  // An ordinary failure has neither line.
  CHECK_THAT(formatFailureReport("train", {failure(0, Clock::now())}),
             !Catch::Contains("hung") && !Catch::Contains("stacks"));
}

TEST_CASE("the report shows a stopped rank's Python stack and a saved exception without an error file",
          "[failure_report]") {
  const auto now = Clock::now();
  WorkerFailure behind = failure(1, now, 0, 9);
  behind.hang_reason = "hang: rank 1 is not in a collective, at /job/a.py:10 in <module>: time.sleep(60)";
  behind.python_stack = "File \"/job/a.py\", line 10, in <module>\n  time.sleep(60)\n";
  behind.python_stack_file = "/run/attempt_0/1/py_stacks.1001";
  WorkerFailure waited = failure(0, now);
  waited.python_exception =
      "Traceback (most recent call last):\n  File \"/job/a.py\", line 12, in <module>\nRuntimeError: Timed out\n";
  waited.stderr_tail = "RuntimeError: Timed out\n";
  const std::string report = formatFailureReport("a.py", {behind, waited});
  CHECK_THAT(report, Catch::Contains("  python    : (its main thread, taken before the stop; every thread in "
                                     "/run/attempt_0/1/py_stacks.1001)\n"
                                     "    File \"/job/a.py\", line 10, in <module>\n"
                                     "      time.sleep(60)\n"));
  CHECK_THAT(report, Catch::Contains("  message   : (the worker wrote no error file; its uncaught exception, saved by "
                                     "ddprun's Python hook)\n"
                                     "  traceback :\n"
                                     "    Traceback (most recent call last):\n"));
  // The saved exception stands for the stderr tail.
  CHECK_THAT(report, !Catch::Contains("  stderr    :"));
}

TEST_CASE("a worker that died of a GPU fault has its GPU line after the time, and others have none", "[report]") {
  const auto now = Clock::now();
  std::vector<WorkerFailure> failures{failure(1, now, 0, 6), failure(0, now + std::chrono::seconds(1))};
  failures[0].gpu_fault = "uncorrectable ECC error on GPU 1 (GPU-aa, PCI 00000000:20:00.0) of host nodeA: boom";
  const std::string report = formatFailureReport("train.py", failures);
  const size_t time = report.find("  time      : ");
  const size_t gpu = report.find(
      "  gpu fault : uncorrectable ECC error on GPU 1 (GPU-aa, PCI 00000000:20:00.0) of "
      "host nodeA: boom\n");
  REQUIRE(time != std::string::npos);
  REQUIRE(gpu != std::string::npos);
  CHECK(time < gpu);
  CHECK(ddprun::testing::countOf(report, "gpu fault :") == 1);
}

TEST_CASE("a rank of another node that the verdict blames is shown as such, first, with its frame and stack",
          "[failure_report]") {
  const auto t0 = Clock::now();
  WorkerFailure local = failure(0, t0, 0, 6);
  WorkerFailure remote;
  remote.rank = 1;
  remote.local_rank = 0;
  remote.host = "nodeB:42";
  remote.hang_reason = "hang: rank 1 has not called all_reduce #2 of group 0 (default_pg) — rank 1 is behind";
  remote.elsewhere = "behind, last called all_reduce #1 (completed) at /job/train.py:12 in main";
  remote.python_stack = "File \"/job/train.py\", line 17, in <module>\n  time.sleep(60)\n";
  std::vector<WorkerFailure> failures{local, remote};
  putRanksFirst(failures, {1});
  const std::string report = formatFailureReport("train.py", failures);
  const std::string cause =
      report.substr(report.find("Root cause"), report.find("Other failures") - report.find("Root cause"));
  CHECK_THAT(cause, Catch::Contains("rank      : 1 (local_rank: 0)\n"
                                    "  host      : nodeB:42\n"
                                    "  exit      : (a rank of another node; its agent stops it as the round ends)\n"
                                    "  where     : behind, last called all_reduce #1 (completed) at /job/train.py:12 "
                                    "in main\n"
                                    "  verdict   : hang: rank 1 has not called all_reduce #2"));
  CHECK_THAT(cause, Catch::Contains("    File \"/job/train.py\", line 17, in <module>\n      time.sleep(60)\n"));
  CHECK_THAT(cause, !Catch::Contains("pid"));
  CHECK_THAT(report.substr(report.find("Other failures")), Catch::Contains("rank      : 0 (local_rank: 0)"));
}
