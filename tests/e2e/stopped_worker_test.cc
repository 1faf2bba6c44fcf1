// A worker that cannot act on signals (stopped with SIGSTOP here; in uninterruptible sleep
// on a real machine) must not hold up ddprun: it is reported with its state from /proc and
// ddprun goes on within --term_timeout.
#include <csignal>
#include <fstream>

#include <catch2/catch.hpp>

#include "tests/support/test_process.h"

using namespace ddprun::testing;

namespace {

char stateOf(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string field;
  for (int i = 0; i < 3 && stat >> field; ++i) {
  }
  return field.empty() ? '?' : field[0];
}

}  // namespace

TEST_CASE("a SIGSTOPped worker does not block shutdown and is reported with its state", "[e2e][signals]") {
  TestProcess ddprun({ddprunPath(), "--standalone", "--nproc_per_node=1", "--term_timeout=1", "--no_python",
                      testWorkerPath(), "stop-self"});
  REQUIRE(ddprun.waitForOutput("ready pid=", 30s));
  const pid_t worker = std::stoi(ddprun.out().substr(ddprun.out().find("ready pid=") + 10));
  REQUIRE(eventually([&] { return stateOf(worker) == 'T'; }, 10s));
  ddprun.signal(SIGTERM);
  REQUIRE(ddprun.wait(30s));
  INFO(ddprun.err());
  CHECK(ddprun.exitCode() == 128 + SIGTERM);
  CHECK_THAT(ddprun.err(),
             Catch::Contains("workers still running 1000 ms after SIGTERM; sending SIGKILL: rank 0 (pid " +
                             std::to_string(worker) + ") state T (stopped)"));
  CHECK_FALSE(processAlive(worker));
}

TEST_CASE("a SIGSTOPped worker is stopped with the others when a peer fails", "[e2e][restart]") {
  // Rank 0 stops itself; rank 1 fails: rank 0 cannot act on SIGTERM and is killed after --term_timeout.
  TestProcess ddprun({ddprunPath(), "--standalone", "--nproc_per_node=2", "--term_timeout=1", "--no_python", "/bin/sh",
                      "-c", "if [ $RANK = 1 ]; then sleep 1; exit 3; fi; exec " + testWorkerPath() + " stop-self"});
  REQUIRE(ddprun.wait(60s));
  INFO(ddprun.out() << ddprun.err());
  CHECK(ddprun.exitCode() == 1);
  CHECK_THAT(ddprun.err(), Catch::Contains("sending SIGKILL: rank 0 (pid ") && Catch::Contains(") state T (stopped)"));
  CHECK_THAT(ddprun.err(), Catch::Contains("exit code 3"));
}

namespace {

// Reads `pid=<n>` from the output after `marker`.
pid_t pidAfter(const std::string& text, const std::string& marker) {
  const auto at = text.find(marker);
  return at == std::string::npos ? 0 : std::stoi(text.substr(at + marker.size()));
}

}  // namespace

TEST_CASE("a worker that leaves its process group and ignores SIGTERM is still killed and the log says so truly",
          "[e2e][signals]") {
  TempDir dir;
  const std::string events_file = dir.file("events.jsonl");
  // The worker joins ddprun's own process group (same session, so setpgid allows it): a
  // signal to the worker's group no longer reaches it; only one to its pid does.
  const std::string worker =
      "import os, signal, time\n"
      "os.setpgid(0, os.getpgid(os.getppid()))\n"
      "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
      "print(f'left-group pid={os.getpid()}', flush=True)\n"
      "time.sleep(300)\n";
  TestProcess ddprun({ddprunPath(), "--standalone", "--nproc_per_node=1", "--term_timeout=1", "--no_python",
                      "/usr/bin/python3", "-c", worker},
                     {{"DDPRUN_NO_CGROUPS", "1"}, {"DDPRUN_EVENTS_FILE", events_file}});
  REQUIRE(ddprun.waitForOutput("left-group pid=", 30s));
  const pid_t pid = pidAfter(ddprun.out(), "left-group pid=");
  REQUIRE(pid > 0);
  ddprun.signal(SIGTERM);
  const bool ended = ddprun.wait(30s);
  const bool worker_left = processAlive(pid);
  INFO(ddprun.out() << ddprun.err());
  REQUIRE(ended);
  CHECK(ddprun.exitCode() == 128 + SIGTERM);
  CHECK_FALSE(worker_left);
  CHECK_THAT(ddprun.err(),
             Catch::Contains("workers still running 1000 ms after SIGTERM; sending SIGKILL: rank 0 (pid " +
                             std::to_string(pid) + ")"));
  // SIGKILL reached it: no claim that it outlived one.
  CHECK_THAT(ddprun.err(), !Catch::Contains("after SIGKILL"));
  const std::string events = readFile(events_file);
  CHECK_THAT(events, !Catch::Contains("worker_unkillable"));
  CHECK_THAT(events, Catch::Contains("\"event\":\"worker_exit\"") && Catch::Contains("\"signal\":\"SIGKILL\""));
}
