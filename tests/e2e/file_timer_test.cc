// torch's file timers (TORCHELASTIC_ENABLE_FILE_TIMER=1) with C++ workers through the real
// ddprun: ddprun::runtime::expires over the named pipe; a worker whose timer expires is
// killed after its stacks are taken, the report names the scope and the rank, and the job
// restarts; a timer released in time kills nothing; bad lines on the pipe are skipped.
#include <filesystem>

#include <catch2/catch.hpp>

#include "tests/e2e/ops_support.h"
#include "tests/e2e/stacks_support.h"

using namespace ddprun::testing;

namespace {

const std::map<std::string, std::string> kTimersOn = {{"TORCHELASTIC_ENABLE_FILE_TIMER", "1"}};
constexpr const char* kNoToolNote = "no native stacks: neither eu-stack (Debian package elfutils) nor gdb is installed";

}  // namespace

TEST_CASE("a C++ worker whose file timer expires is killed after its stacks are taken and the job restarts",
          "[e2e][timer]") {
  TempDir logs;
  // Rank 1 holds the timer (300 ms) for 60 s on attempt 0; everyone releases at once on attempt 1.
  auto r = run({ddprunPath(), "--standalone", "--nproc_per_node=2", "--max_restarts=1", "--log_dir=" + logs.path(),
                "--no_python", testWorkerPath(), "timer", "train_step", "300", "60000", "1", "1"},
               kTimersOn, 90s);
  REQUIRE(r.finished);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  CHECK(countOf(r.out, "armed=1") == 4);
  CHECK_THAT(r.err, Catch::Contains("worker rank 1 (pid ") && Catch::Contains("timer 'train_step' expired"));
  CHECK_THAT(r.err, Catch::Contains("restarting the worker group after rank 1 failed (restart 1 of 1)"));
  CHECK(countOf(r.out, "released rank=1") == 1);  // attempt 1 only: attempt 0's rank 1 was killed
  CHECK(countOf(r.out, "released rank=0") == 2);

  const std::string stacks = findFile(logs.path(), "/attempt_0/1/stacks.txt");
  REQUIRE(!stacks.empty());
  const std::string text = readFile(stacks);
  CHECK_THAT(text, Catch::StartsWith("# native stacks of rank 1 (local rank 1, pid "));
  CHECK_THAT(text, Catch::Contains("before stopping it: timer 'train_step' expired"));
  if (stackToolInstalled()) {
    CHECK_THAT(text, Catch::Contains("sleepInTimedScope"));
  } else {
    CHECK_THAT(text, Catch::Contains(kNoToolNote));
  }
  CHECK(findFile(logs.path(), "/attempt_0/0/stacks.txt").empty());

  const std::string events = findFile(logs.path(), "/events.jsonl");
  auto checked = ops::checkWithPython(events, R"(
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
expired = [e for e in lines if e["event"] == "timer_expired"]
assert len(expired) == 1, expired
e = expired[0]
assert e["rank"] == 1 and e["scope"] == "train_step" and e["signal"] == "SIGKILL" and e["attempt"] == 0, e
exits = [x for x in lines if x["event"] == "worker_exit" and x["pid"] == e["pid"]]
assert exits and exits[0]["signal"] == "SIGKILL" and exits[0]["failed"], exits
)");
  INFO(checked.err);
  CHECK(checked.exit_code == 0);
}

TEST_CASE("with restarts spent the report names the expired timer's scope and rank with the stacks", "[e2e][timer]") {
  // ddprun keeps its temporary run directory for the stacks: in this TMPDIR, removed at the end.
  TempDir tmp;
  auto env = kTimersOn;
  env["TMPDIR"] = tmp.path();
  auto r = run({ddprunPath(), "--standalone", "--nproc_per_node=2", "--max_restarts=0", "--no_python", testWorkerPath(),
                "timer", "epoch_7", "300", "60000", "0", "1"},
               env, 90s);
  REQUIRE(r.finished);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Catch::Contains("FAILED: 1 worker failed"));
  CHECK_THAT(r.err, Catch::Contains("  rank      : 0 (local_rank: 0)"));
  CHECK_THAT(r.err, Catch::Contains("  exit      : killed by SIGKILL (9)"));
  CHECK_THAT(r.err,
             Catch::Contains("  hung      : timer 'epoch_7' expired; ddprun took its stacks, then stopped it\n"));
  CHECK_THAT(r.err, Catch::Contains("  stacks    : ("));
  if (stackToolInstalled()) {
    CHECK_THAT(r.err, Catch::Contains("sleepInTimedScope"));
  } else {
    CHECK_THAT(r.err, Catch::Contains(kNoToolNote));
  }
  // The run directory stays for the stacks, without the job's RPC secrets.
  std::vector<std::filesystem::path> kept;
  for (const auto& entry : std::filesystem::directory_iterator(tmp.path())) {
    if (entry.path().filename().string().rfind("ddprun-", 0) == 0) kept.push_back(entry.path());
  }
  REQUIRE(kept.size() == 1);
  CHECK_THAT(r.err, Catch::Contains("keeping the run directory " + kept[0].string() + " for the stacks"));
  CHECK(std::filesystem::is_directory(kept[0] / "attempt_0" / "0"));
  CHECK_FALSE(std::filesystem::exists(kept[0] / "attempt_0" / "0" / "rpc_secret"));
  CHECK_FALSE(std::filesystem::exists(kept[0] / "attempt_0" / "1" / "rpc_secret"));
}

TEST_CASE("a file timer released in time kills nothing", "[e2e][timer]") {
  auto r = run({ddprunPath(), "--standalone", "--nproc_per_node=2", "--no_python", testWorkerPath(), "timer", "quick",
                "20000", "200", "0", "1"},
               kTimersOn, 60s);
  REQUIRE(r.finished);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  CHECK(countOf(r.out, "armed=1") == 2);
  CHECK(countOf(r.out, "released rank=") == 2);
  CHECK_THAT(r.err, !Catch::Contains("expired"));
}

TEST_CASE("without TORCHELASTIC_ENABLE_FILE_TIMER=1 there is no pipe and a C++ timer is a no-op", "[e2e][timer]") {
  auto r = run({ddprunPath(), "--standalone", "--nproc_per_node=1", "--no_python", "/bin/sh", "-c",
                "echo \"pipe=${TORCHELASTIC_TIMER_FILE-unset}\"; exec " + testWorkerPath() + " timer t 50 500 0 1"},
               {{"TORCHELASTIC_ENABLE_FILE_TIMER", ""}, {"TORCHELASTIC_TIMER_FILE", ""}}, 60s);
  REQUIRE(r.finished);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("pipe=unset"));
  CHECK_THAT(r.out, Catch::Contains("armed=0"));
  CHECK_THAT(r.out, Catch::Contains("released rank=0"));
}

TEST_CASE("bad lines on the timer pipe are skipped with a warning and the pipe is removed at exit", "[e2e][timer]") {
  TempDir dir;
  const std::string pipe = dir.file("my_timer_pipe");
  // A malformed line, a line longer than PIPE_BUF, then a timer that must still work.
  const std::string script =
      "echo \"pipe=$TORCHELASTIC_TIMER_FILE\"; "
      "printf 'not json\\n' > \"$TORCHELASTIC_TIMER_FILE\"; "
      "printf '{\"pid\": \"x\"}\\n' > \"$TORCHELASTIC_TIMER_FILE\"; "
      "head -c 5000 /dev/zero | tr '\\0' x > \"$TORCHELASTIC_TIMER_FILE\"; echo >> \"$TORCHELASTIC_TIMER_FILE\"; "
      "exec " +
      testWorkerPath() + " timer after_garbage 300 60000 0 1";
  auto env = kTimersOn;
  env["TORCHELASTIC_TIMER_FILE"] = pipe;  // as torchrun: a name in ddprun's environment is used
  env["TMPDIR"] = dir.path();             // the run directory kept for the expired timer's stacks
  auto r = run({ddprunPath(), "--standalone", "--nproc_per_node=1", "--no_python", "/bin/sh", "-c", script}, env, 90s);
  REQUIRE(r.finished);
  INFO(r.out << r.err);
  CHECK_THAT(r.out, Catch::Contains("pipe=" + pipe));
  CHECK_THAT(r.err, Catch::Contains("skipped a malformed request (not JSON at byte 0: expected '{'): not json"));
  CHECK_THAT(r.err, Catch::Contains("skipped a malformed request (no field 'scope_id')") ||
                        Catch::Contains("skipped a malformed request (field 'pid' is a string"));
  CHECK_THAT(r.err, Catch::Contains("ignored a request line of 5000 bytes"));
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Catch::Contains("timer 'after_garbage' expired"));
  CHECK_FALSE(fileExists(pipe));
}

TEST_CASE("a timer pipe that cannot be made is a usage error before any worker starts", "[e2e][timer]") {
  auto env = kTimersOn;
  env["TORCHELASTIC_TIMER_FILE"] = "/nonexistent-dir/timer";
  auto r = run({ddprunPath(), "--standalone", "--no_python", "/bin/sh", "-c", "echo started"}, env, 60s);
  REQUIRE(r.finished);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.err, Catch::Contains("file timers (TORCHELASTIC_ENABLE_FILE_TIMER=1): mkfifo(/nonexistent-dir/timer)"));
  CHECK_THAT(r.out, !Catch::Contains("started"));
}

TEST_CASE("without eu-stack or gdb the report says so and the worker is still stopped", "[e2e][timer]") {
  TempDir empty;
  auto env = kTimersOn;
  env["PATH"] = empty.path();
  auto r = run({ddprunPath(), "--standalone", "--nproc_per_node=1", "--no_python", testWorkerPath(), "timer", "t",
                "200", "60000", "0", "1"},
               env, 60s);
  REQUIRE(r.finished);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Catch::Contains(std::string("  stacks    : (") + kNoToolNote + "; all of them in "));
  // The run directory was temporary (no --log_dir); it is kept for the stacks file it names.
  const std::string file = r.err.substr(r.err.find("; all of them in ") + 17);
  CHECK(fileExists(file.substr(0, file.find(')'))));
  std::filesystem::remove_all(file.substr(0, file.find("/attempt_")));
}

namespace {

// A shell worker (it is the worker process: $$ is the worker's pid) that writes `requests`
// (an awk program printing request lines; `pid` and `now` are set) to the timer pipe, then
// a timer of its own that expires at once and asks for no signal, waits (bounded) until
// ddprun has logged that one in the events file, and exits 0. The pipe is read in order,
// so every request before it has been handled by then.
std::string floodingWorker(const std::string& requests, const std::string& events, const std::string& last_scope) {
  return "now=$(date +%s); "
         "awk -v pid=$$ -v now=$now 'BEGIN { " +
         requests +
         " }' > \"$TORCHELASTIC_TIMER_FILE\"; "
         "printf '{\"version\": 1, \"pid\": %d, \"scope_id\": \"" +
         last_scope +
         "\", \"expiration_time\": %d, \"signal\": 0}\\n' $$ $now > \"$TORCHELASTIC_TIMER_FILE\"; "
         "i=0; while ! grep -q timer_expired '" +
         events + "'; do i=$((i+1)); [ $i -gt 600 ] && exit 3; sleep 0.1; done; exit 0";
}

bool hasRawControl(const std::string& text) {
  for (char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if ((u < 0x20 && c != '\n') || u == 0x7F) return true;
  }
  return false;
}

}  // namespace

// Issue 39, defect 4: 30,000 distinct scopes from one worker grew ddprun by 114 MiB.
TEST_CASE("a worker's timers are bounded: new ones past the bound are refused with one warning and counted",
          "[e2e][timer]") {
  TempDir dir;
  const std::string events = dir.file("events.jsonl");
  // 1100 timers far in the future: 1024 are held, 76 refused; releasing s0 makes room for the last one.
  const std::string requests =
      "for (i = 0; i < 1100; i++) printf \"{\\\"version\\\": 1, \\\"pid\\\": %d, \\\"scope_id\\\": \\\"s%d\\\", "
      "\\\"expiration_time\\\": %d, \\\"signal\\\": 9}\\n\", pid, i, now + 3600; "
      "printf \"{\\\"version\\\": 1, \\\"pid\\\": %d, \\\"scope_id\\\": \\\"s0\\\", \\\"expiration_time\\\": -1, "
      "\\\"signal\\\": 0}\\n\", pid";
  auto env = kTimersOn;
  env["DDPRUN_EVENTS_FILE"] = events;
  auto r = run({ddprunPath(), "--standalone", "--nproc_per_node=1", "--no_python", "/bin/sh", "-c",
                floodingWorker(requests, events, "last")},
               env, 90s);
  REQUIRE(r.finished);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  CHECK(countOf(r.err, "holds 1024 timers, the most one worker may hold") == 1);
  CHECK_THAT(r.err, Catch::Contains("76 new timers of workers holding 1024 already in this attempt; refused"));
  CHECK_THAT(r.err, Catch::Contains("timer 'last' expired; it asked for no signal"));
}

// Issue 39, defect 6: 3,000 requests naming a pid that is not a worker logged 3,000 warnings.
TEST_CASE("timers of pids that are not the workers' are ignored with one warning and a count", "[e2e][timer]") {
  TempDir dir;
  const std::string events = dir.file("events.jsonl");
  const std::string requests =
      "for (i = 0; i < 50; i++) printf \"{\\\"version\\\": 1, \\\"pid\\\": %d, \\\"scope_id\\\": \\\"x\\\", "
      "\\\"expiration_time\\\": %d, \\\"signal\\\": 9}\\n\", 2000000000 + i, now";
  auto env = kTimersOn;
  env["DDPRUN_EVENTS_FILE"] = events;
  auto r = run({ddprunPath(), "--standalone", "--nproc_per_node=1", "--no_python", "/bin/sh", "-c",
                floodingWorker(requests, events, "last")},
               env, 90s);
  REQUIRE(r.finished);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  CHECK(countOf(r.err, "not a process of this node's running workers") == 1);
  CHECK_THAT(r.err, Catch::Contains(
                        "50 timer requests named a pid that is not a process of this node's workers in this attempt"));
}

// Issue 39, defects 6 and 9: a scope with a newline forged "[ddprun] info:" lines, with a
// terminal escape drove the console, and with a 0xFF byte (or --rdzv_id with one) made the
// events file invalid JSON.
TEST_CASE("a hostile timer scope and run id are escaped in the log and the events file stays JSON", "[e2e][timer]") {
  TempDir dir;
  const std::string events = dir.file("events.jsonl");
  auto env = kTimersOn;
  env["DDPRUN_EVENTS_FILE"] = events;
  // JSON escapes for the newline and ESC; the 0xFF byte raw, as a worker may write it.
  const std::string scope = "x\\\\n[ddprun] info: forged \\\\u001b[31mred\xff";
  auto r = run({ddprunPath(), "--nproc_per_node=1", "--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:0",
                "--rdzv_id=job\xff", "--no_python", "/bin/sh", "-c", floodingWorker("", events, scope)},
               env, 90s);
  REQUIRE(r.finished);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.err, Catch::Contains("timer 'x\\n[ddprun] info: forged \\x1b[31mred\\xff' expired"));
  CHECK_THAT(r.err, !Catch::Contains("\n[ddprun] info: forged"));
  CHECK_FALSE(hasRawControl(r.err));
  auto checked = ops::checkWithPython(events, R"(
import json, sys
lines = open(sys.argv[1], 'rb').read().decode('utf-8').splitlines()
events = [json.loads(l) for l in lines]
assert events and all(e["run_id"] == "job\ufffd" for e in events), events
expired = [e for e in events if e['event'] == 'timer_expired']
assert len(expired) == 1 and expired[0]['scope'] == 'x\n[ddprun] info: forged \x1b[31mred\ufffd', expired
)");
  INFO(checked.out << checked.err);
  CHECK(checked.exit_code == 0);
}

TEST_CASE("a timer whose signal is SIGSTOP still ends with the worker killed after --term_timeout", "[e2e][timer]") {
  // The worker asks for SIGSTOP when its timer expires (issue 39, #5): stopped, it would hold
  // the job for ever; ddprun follows with SIGKILL after --term_timeout.
  const std::string script =
      "echo \"{\\\"version\\\": 1, \\\"pid\\\": $$, \\\"scope_id\\\": \\\"stop_me\\\", "
      "\\\"expiration_time\\\": $(($(date +%s) + 1)), \\\"signal\\\": 19}\" > \"$TORCHELASTIC_TIMER_FILE\"; "
      "echo armed; exec sleep 300";
  TempDir tmp;  // the run directory kept for the stacks goes here, and with it
  auto env = kTimersOn;
  env["TMPDIR"] = tmp.path();
  auto r = run({ddprunPath(), "--standalone", "--nproc_per_node=1", "--max_restarts=0", "--term_timeout=1",
                "--no_python", "/bin/sh", "-c", script},
               env, 90s);
  INFO(r.out << r.err);
  REQUIRE(r.finished);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.out, Catch::Contains("armed"));
  CHECK_THAT(r.err, Catch::Contains("timer 'stop_me' expired"));
  CHECK_THAT(r.err, Catch::Contains("still runs 1000 ms after SIGSTOP; sending SIGKILL"));
  CHECK_THAT(r.err, Catch::Contains("  exit      : killed by SIGKILL (9)"));
}
