// The operator's signals: SIGUSR1/SIGUSR2 sent to each agent of a multi-node job reach
// every worker (checkpoint-on-signal) and the job goes on; --term_timeout is the grace
// a worker gets between SIGTERM and SIGKILL, 30 s unless given.
#include <csignal>

#include <catch2/catch.hpp>

#include "tests/e2e/ops_support.h"

using namespace ddprun::testing;
using namespace ddprun::testing::ops;

TEST_CASE("SIGUSR1 sent to the agents of a multi-node job reaches every worker and the job goes on", "[e2e][ops]") {
  TempDir dir;
  int port = 0;  // agent 0, the store's host, takes one from the kernel and announces it
  std::vector<std::unique_ptr<TestProcess>> agents;
  for (int i = 0; i < 2; ++i) {
    auto args = agentArgs("2", 2, port, "usr1job", i == 0 ? "is_host=true" : "is_host=false");
    args.insert(args.end(), {"--no_python", testWorkerPath(), "wait", dir.path()});
    agents.push_back(std::make_unique<TestProcess>(args));
    if (i == 0) port = announcedPort(*agents.back());
  }
  for (auto& agent : agents) REQUIRE(agent->waitForOutput("ready rank=", 30s, 2));
  for (auto& agent : agents) agent->signal(SIGUSR1);
  CHECK(eventually(
      [&] {
        for (int rank = 0; rank < 4; ++rank) {
          if (!fileExists(dir.file("usr1." + std::to_string(rank)))) return false;
        }
        return true;
      },
      10s));
  // Nothing else happened to the job: no worker was stopped, no agent left.
  for (auto& agent : agents) CHECK_FALSE(agent->wait(300ms));
  for (int rank = 0; rank < 4; ++rank) CHECK_FALSE(fileExists(dir.file("term." + std::to_string(rank))));
  // Stopping one agent stops the job everywhere (signalling both at once would race the
  // second signal against that agent's own exit).
  agents[0]->signal(SIGTERM);
  for (auto& agent : agents) REQUIRE(agent->wait(30s));
  CHECK(agents[0]->exitCode() == 128 + SIGTERM);
  CHECK(agents[1]->exitCode() == 1);
  CHECK_THAT(agents[1]->err(), Catch::Contains("abort:"));
  for (int rank = 0; rank < 4; ++rank) CHECK(fileExists(dir.file("term." + std::to_string(rank))));
}

namespace {

// A worker that needs 1.5 s to shut down cleanly after SIGTERM, and says when it is done.
std::vector<std::string> slowToStop(const std::string& dir, const std::vector<std::string>& flags) {
  std::vector<std::string> args = {ddprunPath(), "--standalone", "--nproc_per_node=1"};
  args.insert(args.end(), flags.begin(), flags.end());
  args.insert(args.end(), {"--no_python", "sh", "-c",
                           "trap 'sleep 1.5; touch " + dir +
                               "/clean; exit 0' TERM; echo ready; "
                               "while :; do sleep 0.05; done"});
  return args;
}

}  // namespace

TEST_CASE("the grace between SIGTERM and SIGKILL is --term_timeout", "[e2e][ops]") {
  SECTION("a worker finishes its shutdown within a long enough grace") {
    TempDir dir;
    TestProcess ddprun(slowToStop(dir.path(), {"--term_timeout=20"}));
    REQUIRE(ddprun.waitForOutput("ready", 20s));
    ddprun.signal(SIGTERM);
    REQUIRE(ddprun.wait(30s));
    CHECK(ddprun.exitCode() == 128 + SIGTERM);
    CHECK(fileExists(dir.file("clean")));
    CHECK_THAT(ddprun.err(), !Catch::Contains("SIGKILL"));
  }
  SECTION("the default grace (30 s) is long enough too") {
    TempDir dir;
    TestProcess ddprun(slowToStop(dir.path(), {}));
    REQUIRE(ddprun.waitForOutput("ready", 20s));
    ddprun.signal(SIGTERM);
    REQUIRE(ddprun.wait(40s));
    CHECK(fileExists(dir.file("clean")));
    CHECK_THAT(ddprun.err(), !Catch::Contains("SIGKILL"));
  }
  SECTION("a short grace cuts the shutdown off with SIGKILL") {
    TempDir dir;
    TestProcess ddprun(slowToStop(dir.path(), {"--term_timeout=0.3"}));
    REQUIRE(ddprun.waitForOutput("ready", 20s));
    ddprun.signal(SIGTERM);
    REQUIRE(ddprun.wait(30s));
    CHECK(ddprun.exitCode() == 128 + SIGTERM);
    CHECK_THAT(ddprun.err(), Catch::Contains("workers still running 300 ms after SIGTERM; sending SIGKILL"));
    CHECK_FALSE(fileExists(dir.file("clean")));
  }
}
