#include "agent/process/worker_cgroups.h"

#include <unistd.h>

#include <string>

#include <catch2/catch.hpp>

#include "agent/process/cgroup_v2.h"
#include "tests/support/test_process.h"

using ddprun::agent::WorkerCgroups;
using ddprun::testing::fileExists;

TEST_CASE("worker cgroups turned off create nothing and say why", "[worker_cgroups]") {
  WorkerCgroups cgroups(::getpid(), false);
  CHECK_FALSE(cgroups.enabled());
  CHECK(cgroups.root().empty());
  CHECK(cgroups.whyNot() == "DDPRUN_NO_CGROUPS is set");
  CHECK(cgroups.create(0, 0).empty());
  cgroups.killAll();
  CHECK(cgroups.removeEmpty());
}

// Where cgroups v2 cannot be written here, WorkerCgroups must say so instead of failing.
TEST_CASE("worker cgroups are created below the own cgroup and all removed, or not enabled with a reason",
          "[worker_cgroups]") {
  std::string root;
  std::string worker;
  {
    WorkerCgroups cgroups(::getpid(), true);
    if (!cgroups.enabled()) {
      CHECK_FALSE(cgroups.whyNot().empty());
      CHECK(cgroups.create(0, 0).empty());
      return;
    }
    root = cgroups.root();
    const auto own = ddprun::agent::ownCgroupDir();
    REQUIRE(own);
    CHECK(root == *own + "/ddprun-" + std::to_string(::getpid()));
    worker = cgroups.create(1, 2);
    CHECK(worker == root + "/w1-a2");
    CHECK(fileExists(worker + "/cgroup.procs"));
    CHECK_FALSE(ddprun::agent::cgroupPopulated(worker));
    CHECK(cgroups.removeEmpty());
    CHECK_FALSE(fileExists(worker));
    worker = cgroups.create(0, 3);
    CHECK(fileExists(worker));
  }
  CHECK_FALSE(fileExists(worker));
  CHECK_FALSE(fileExists(root));
}
