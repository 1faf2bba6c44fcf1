#include <csignal>

#include <catch2/catch.hpp>

#include "tests/support/test_process.h"

using namespace ddprun::testing;

namespace {

void checkStopSignal(int sig, const std::string& name) {
  TempDir dir;
  TestProcess ddprun({ddprunPath(), "--standalone", "--nproc_per_node=2", "--term_timeout=10", "--no_python",
                      testWorkerPath(), "wait", dir.path()});
  REQUIRE(ddprun.waitForOutput("ready rank=", 20s, 2));
  ddprun.signal(sig);
  REQUIRE(ddprun.wait(20s));
  CHECK(ddprun.exitCode() == 128 + sig);
  // The same signal reached each worker's process group.
  CHECK(fileExists(dir.file(name + ".0")));
  CHECK(fileExists(dir.file(name + ".1")));
}

}  // namespace

TEST_CASE("SIGTERM is forwarded and ddprun exits 128+15", "[e2e][signals]") { checkStopSignal(SIGTERM, "term"); }
TEST_CASE("SIGINT is forwarded and ddprun exits 128+2", "[e2e][signals]") { checkStopSignal(SIGINT, "int"); }
TEST_CASE("SIGHUP is forwarded and ddprun exits 128+1", "[e2e][signals]") { checkStopSignal(SIGHUP, "hup"); }
TEST_CASE("SIGQUIT is forwarded and ddprun exits 128+3", "[e2e][signals]") { checkStopSignal(SIGQUIT, "quit"); }

TEST_CASE("SIGUSR1 and SIGUSR2 are forwarded and the job goes on", "[e2e][signals]") {
  TempDir dir;
  TestProcess ddprun(
      {ddprunPath(), "--standalone", "--nproc_per_node=2", "--no_python", testWorkerPath(), "wait", dir.path()});
  REQUIRE(ddprun.waitForOutput("ready rank=", 20s, 2));
  ddprun.signal(SIGUSR1);
  CHECK(eventually([&] { return fileExists(dir.file("usr1.0")) && fileExists(dir.file("usr1.1")); }, 10s));
  ddprun.signal(SIGUSR2);
  CHECK(eventually([&] { return fileExists(dir.file("usr2.0")) && fileExists(dir.file("usr2.1")); }, 10s));
  CHECK_FALSE(ddprun.wait(300ms));
  ddprun.signal(SIGTERM);
  REQUIRE(ddprun.wait(20s));
  CHECK(ddprun.exitCode() == 128 + SIGTERM);
}

TEST_CASE("signals reach the workers' children too", "[e2e][signals]") {
  TempDir dir;
  // The worker is a shell whose child does the work; the shell itself ignores TERM.
  TestProcess ddprun({ddprunPath(), "--standalone", "--nproc_per_node=1", "--term_timeout=10", "--no_python", "sh",
                      "-c", "trap '' TERM; " + testWorkerPath() + " wait " + dir.path() + "; exit 0"});
  REQUIRE(ddprun.waitForOutput("ready rank=", 20s));
  ddprun.signal(SIGTERM);
  REQUIRE(ddprun.wait(20s));
  CHECK(ddprun.exitCode() == 128 + SIGTERM);
  CHECK(fileExists(dir.file("term.0")));
}

TEST_CASE("a second SIGINT kills workers that ignore the first", "[e2e][signals]") {
  TestProcess ddprun({ddprunPath(), "--standalone", "--nproc_per_node=2", "--term_timeout=60", "--no_python", "sh",
                      "-c", "trap '' INT TERM; echo ready rank=$RANK; while :; do sleep 0.05; done"});
  REQUIRE(ddprun.waitForOutput("ready rank=", 20s, 2));
  ddprun.signal(SIGINT);
  CHECK_FALSE(ddprun.wait(300ms));
  ddprun.signal(SIGINT);
  REQUIRE(ddprun.wait(10s));
  CHECK(ddprun.exitCode() == 128 + SIGINT);
}

TEST_CASE("a signal stops ddprun while it waits for other nodes to join", "[e2e][signals]") {
  // Node 0 of a 2-node static job: it hosts the store and waits for node 1, which never comes.
  TestProcess ddprun({ddprunPath(), "--nnodes=2", "--node_rank=0", "--master_addr=127.0.0.1", "--master_port=0",
                      "--no_python", "true"},
                     {{"DDPRUN_LOG_LEVEL", "debug"}});
  REQUIRE(ddprun.waitForOutput("serving the rendezvous store", 10s));
  ddprun.signal(SIGTERM);
  REQUIRE(ddprun.wait(10s));
  CHECK(ddprun.exitCode() == 128 + SIGTERM);
}
