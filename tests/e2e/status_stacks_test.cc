// `ddprun status --stacks` on a running job: the native stacks of every local worker,
// found through the agent's events file, while the workers go on.
#include <unistd.h>

#include <csignal>
#include <fstream>

#include <catch2/catch.hpp>

#include "tests/support/test_process.h"

using namespace ddprun::testing;

TEST_CASE("status --stacks prints the native stacks of the running workers without stopping them", "[e2e][ops]") {
  TempDir logs, marks;
  TestProcess job({ddprunPath(), "--standalone", "--nproc_per_node=2", "--log_dir=" + logs.path(), "--no_python",
                   testWorkerPath(), "wait", marks.path()});
  REQUIRE(job.waitForOutput("ready rank=", 30s, 2));
  // A worker can print before its agent records it: wait until both worker_start lines are there.
  REQUIRE(eventually(
      [&] {
        return run({"/bin/sh", "-c", "cat " + logs.path() + "/*/events.jsonl"})
                   .out.find("\"rank\":1,\"local_rank\":1,\"pid\"") != std::string::npos;
      },
      10s));
  auto stacks = run({ddprunPath(), "status", "--stacks", "--log_dir=" + logs.path()}, {}, 60s);
  REQUIRE(stacks.finished);
  INFO(stacks.out << stacks.err);
  CHECK(stacks.exit_code == 0);
  CHECK(countOf(stacks.out, "# native stacks of rank ") == 2);
  CHECK_THAT(stacks.out, Catch::Contains("# native stacks of rank 0 (local rank 0, pid "));
  CHECK_THAT(stacks.out, Catch::Contains("# native stacks of rank 1 (local rank 1, pid "));
  CHECK_THAT(stacks.out, Catch::Contains("in attempt 0 for ddprun status --stacks"));
  const bool tool = !run({"/bin/sh", "-c", "command -v eu-stack || command -v gdb"}).out.empty();
  if (tool) {
    CHECK(countOf(stacks.out, "sigsuspend") >= 2);
  } else {
    CHECK(countOf(stacks.out, "neither eu-stack (Debian package elfutils) nor gdb is installed") == 2);
  }

  // Both workers still run and still handle signals.
  job.signal(SIGTERM);
  REQUIRE(job.wait(30s));
  CHECK(job.exitCode() == 128 + SIGTERM);
  CHECK(fileExists(marks.file("term.0")));
  CHECK(fileExists(marks.file("term.1")));

  auto after = run({ddprunPath(), "status", "--stacks", "--log_dir=" + logs.path()}, {}, 30s);
  CHECK(after.exit_code == 1);
  CHECK_THAT(after.err, Catch::Contains("the agent has exited"));
  auto usage = run({ddprunPath(), "status", "--stacks"}, {}, 30s);
  CHECK(usage.exit_code == 2);
  CHECK_THAT(usage.err, Catch::Contains("--log_dir"));
}

// A forged events file naming a shell as the agent and the shell's child as its worker:
// status --stacks once attached to that child with ptrace and printed its stacks.
TEST_CASE("status --stacks refuses an events file whose agent is not a ddprun process", "[e2e][ops][bad-input]") {
  TempDir logs;
  TestProcess shell({"/bin/sh", "-c", "sleep 60 & echo child=$!; wait"});
  REQUIRE(shell.waitForOutput("child=", 10s));
  const std::string out = shell.out();
  const std::string child =
      out.substr(out.find("child=") + 6, out.find('\n', out.find("child=")) - out.find("child=") - 6);
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const std::string node = std::string(host) + ":" + std::to_string(shell.pid());
  std::ofstream(logs.path() + "/events.jsonl")
      << R"({"time":"t","unix_ms":1,"event":"agent_start","node":")" << node << R"(","run_id":"r","store":"h:1"})"
      << "\n"
      << R"({"time":"t","unix_ms":2,"event":"worker_start","node":")" << node
      << R"(","run_id":"r","rank":0,"local_rank":0,"pid":)" << child << R"(,"attempt":0})"
      << "\n";
  auto stacks = run({ddprunPath(), "status", "--stacks", "--log_dir=" + logs.path()}, {}, 60s);
  REQUIRE(stacks.finished);
  INFO(stacks.out << stacks.err);
  CHECK(stacks.exit_code == 1);
  CHECK_THAT(stacks.err, Catch::Contains("the agent named there (pid " + std::to_string(shell.pid()) + ") is ") &&
                             Catch::Contains(", not a ddprun agent"));
  CHECK_THAT(stacks.out, !Catch::Contains("# native stacks"));
  CHECK(countOf(stacks.err, "\n") == 1);
  shell.signal(SIGKILL);
  ::kill(std::stoi(child), SIGKILL);
  CHECK(shell.wait(10s));
}
