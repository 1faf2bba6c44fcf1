// The spawner's CPU binding: applied before exec, and a binding the kernel refuses fails
// the start instead of leaving the worker unbound.
#include "agent/process/process_spawner.h"

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include "common/error.h"
#include "rendezvous/store/descriptor_limit.h"
#include "tests/support/test_process.h"

using namespace ddprun::agent;

namespace {

// Waits for `pid` (a test-only child that exits at once) and returns its exit code.
int reap(pid_t pid) {
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

TEST_CASE("a worker is bound to its CPUs before exec", "[unit][numa]") {
  ddprun::testing::TempDir dir;
  SpawnRequest request;
  request.argv = {"/bin/grep", "Cpus_allowed_list", "/proc/self/status"};
  request.out = {StdioTarget::Kind::kFile, dir.file("out")};
  request.cpus = {0};
  SpawnedProcess spawned = spawnWorker(request);
  REQUIRE(reap(spawned.pid) == 0);
  CHECK(ddprun::testing::readFile(dir.file("out")) == "Cpus_allowed_list:\t0\n");
}

TEST_CASE("a binding the kernel refuses fails the start", "[unit][numa]") {
  SpawnRequest request;
  request.argv = {"/bin/true"};
  request.cpus = {4095};  // no test host has it
  CHECK_THROWS_WITH(spawnWorker(request), "bind worker /bin/true to CPUs 4095 (sched_setaffinity): Invalid argument");
  // The child that could not bind was reaped by the spawner: nothing is left to wait for.
  CHECK(::waitpid(-1, nullptr, WNOHANG) == -1);
}

TEST_CASE("a worker gets back the descriptor limit its user gave ddprun, not the store's raised one",
          "[unit][spawner]") {
  rlimit before{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &before) == 0);
  if (before.rlim_max != RLIM_INFINITY && before.rlim_max < 256) {
    WARN("skipped: the hard descriptor limit is below 256");
    return;
  }
  // A soft limit below the hard one, as a user's shell usually has, for the store to raise.
  rlimit lowered = before;
  lowered.rlim_cur = 200;
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &lowered) == 0);
  ddprun::rendezvous::DescriptorLimit now;
  ddprun::rendezvous::raiseDescriptorLimit(0, &now);
  CHECK(now.soft > 200);
  REQUIRE(ddprun::rendezvous::descriptorSoftLimitBeforeRaise() != 0);
  const uint64_t user_soft = ddprun::rendezvous::descriptorSoftLimitBeforeRaise();
  ddprun::testing::TempDir dir;
  SpawnRequest request;
  request.argv = {"/bin/sh", "-c", "ulimit -Sn"};
  request.out = {StdioTarget::Kind::kFile, dir.file("out")};
  SpawnedProcess spawned = spawnWorker(request);
  REQUIRE(reap(spawned.pid) == 0);
  CHECK(ddprun::testing::readFile(dir.file("out")) == std::to_string(user_soft) + "\n");
  ::setrlimit(RLIMIT_NOFILE, &before);
}
