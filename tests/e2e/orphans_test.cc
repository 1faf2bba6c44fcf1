#include <signal.h>

#include <csignal>
#include <fstream>
#include <sstream>

#include <catch2/catch.hpp>

#include "tests/support/test_process.h"

using namespace ddprun::testing;

namespace {

std::vector<pid_t> pidsIn(const std::string& file) {
  std::vector<pid_t> pids;
  std::istringstream in(readFile(file));
  for (pid_t pid; in >> pid;) pids.push_back(pid);
  return pids;
}

}  // namespace

TEST_CASE("kill -9 of ddprun leaves no worker or grandchild running", "[e2e][orphans]") {
  TempDir dir;
  std::vector<pid_t> pids;
  {
    TestProcess ddprun({ddprunPath(), "--standalone", "--nproc_per_node=2", "--no_python", testWorkerPath(),
                        "grandchild", dir.file("pids")});
    REQUIRE(ddprun.waitForOutput("ready rank=", 20s, 2));
    pids = pidsIn(dir.file("pids"));
    REQUIRE(pids.size() == 4);
    for (pid_t pid : pids) REQUIRE(processAlive(pid));
    ::kill(ddprun.pid(), SIGKILL);
    REQUIRE(ddprun.wait(10s));
    CHECK(ddprun.termSignal() == SIGKILL);
  }
  CHECK(eventually([&] {
    for (pid_t pid : pids) {
      if (processAlive(pid)) return false;
    }
    return true;
  }, 10s));
}

TEST_CASE("a worker's background child does not outlive a successful job", "[e2e][orphans]") {
  TempDir dir;
  std::string pid_file = dir.file("bg");
  auto r = run({ddprunPath(), "--standalone", "--nproc_per_node=1", "--term_timeout=2", "--no_python", "sh", "-c",
                "sleep 300 & echo $! > " + pid_file + "; exit 0"},
               {}, 30s);
  REQUIRE(r.finished);
  CHECK(r.exit_code == 0);
  auto pids = pidsIn(pid_file);
  REQUIRE(pids.size() == 1);
  CHECK(eventually([&] { return !processAlive(pids[0]); }, 5s));
}

TEST_CASE("stopping on a signal leaves no grandchild behind", "[e2e][orphans]") {
  TempDir dir;
  TestProcess ddprun({ddprunPath(), "--standalone", "--nproc_per_node=2", "--no_python", testWorkerPath(),
                      "grandchild", dir.file("pids")});
  REQUIRE(ddprun.waitForOutput("ready rank=", 20s, 2));
  auto pids = pidsIn(dir.file("pids"));
  REQUIRE(pids.size() == 4);
  ddprun.signal(SIGTERM);
  REQUIRE(ddprun.wait(20s));
  CHECK(ddprun.exitCode() == 128 + SIGTERM);
  for (pid_t pid : pids) CHECK_FALSE(processAlive(pid));
}

namespace {

// The orphan guard ddprun forks first, from its main thread: its child named "ddprun-guard"
// (0 when there is none).
pid_t guardOf(pid_t ddprun) {
  const std::string self = std::to_string(ddprun);
  std::istringstream children(readFile("/proc/" + self + "/task/" + self + "/children"));
  for (pid_t child; children >> child;) {
    if (readFile("/proc/" + std::to_string(child) + "/comm") == "ddprun-guard\n") return child;
  }
  return 0;
}

}  // namespace

TEST_CASE("a stopped orphan guard does not keep ddprun from exiting", "[e2e][orphans]") {
  TempDir dir;
  std::string go = dir.file("go");
  TestProcess ddprun({ddprunPath(), "--standalone", "--no_python", "sh", "-c",
                      "echo worker-up; while [ ! -e " + go + " ]; do sleep 0.05; done"});
  REQUIRE(ddprun.waitForOutput("worker-up", 20s));
  pid_t guard = 0;
  REQUIRE(eventually([&] { return (guard = guardOf(ddprun.pid())) > 0; }, 5s));
  REQUIRE(::kill(guard, SIGSTOP) == 0);
  { std::ofstream(go) << "go"; }
  // The job ends normally; before the fix ddprun then waited for the stopped guard forever.
  REQUIRE(ddprun.wait(20s));
  CHECK(ddprun.exitCode() == 0);
  CHECK_THAT(ddprun.err(), Catch::Contains("orphan guard"));
  CHECK(eventually([&] { return !processAlive(guard); }, 5s));
}

TEST_CASE("a worker's setsid daemon does not outlive a successful job", "[e2e][orphans]") {
  TempDir dir;
  std::string pid_file = dir.file("daemon");
  // setsid leaves the worker's process group (and session): the group kill cannot reach it.
  auto r = run({ddprunPath(), "--standalone", "--nproc_per_node=1", "--term_timeout=2", "--no_python", "sh", "-c",
                // Exit only once the daemon leads its own session (field 6 of its stat).
                "setsid sleep 300 & d=$!; echo $d > " + pid_file +
                    "; while [ \"$(cut -d' ' -f6 /proc/$d/stat)\" != \"$d\" ]; do sleep 0.01; done; exit 0"},
               {}, 30s);
  REQUIRE(r.finished);
  CHECK(r.exit_code == 0);
  auto pids = pidsIn(pid_file);
  REQUIRE(pids.size() == 1);
  const bool gone = eventually([&] { return !processAlive(pids[0]); }, 5s);
  if (!gone) ::kill(pids[0], SIGKILL);  // leave nothing behind, pass or fail
  CHECK(gone);
  CHECK_THAT(r.err, Catch::Contains("left their worker's process group"));
}
