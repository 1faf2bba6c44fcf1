// The hang verdict through the real ddprun with C++ workers whose collectives run on the
// host backend (test_worker's `collectives` mode): --hang_timeout names the rank that is
// behind and the operation, takes the stacks, restarts the job; a slow job that keeps
// completing collectives is never called hung; mismatched collectives are named (over TCP;
// on shared memory they fail at once); and
// nothing is left in /dev/shm; a rank waiting in a point-to-point receive is named with
// the peer that never sent (test_worker's `p2p-recv` mode). The two-node verdict runs on network-namespace nodes
// (netns_multihost_test.sh's hang scenario).
#include <csignal>
#include <filesystem>
#include <memory>

#include <catch2/catch.hpp>

#include "tests/e2e/ops_support.h"
#include "tests/e2e/stacks_support.h"

using namespace ddprun::testing;

namespace {

// This run's flight recorder directories left on /dev/shm (named after --rdzv_id).
int flightDirsOf(const std::string& run_id) {
  return static_cast<int>(shmEntriesWithPrefix("ddprun_flight-" + run_id + "-").size());
}

std::vector<std::string> ddprunArgs(const std::string& run_id, int nproc, const std::string& hang_timeout,
                                    const std::string& log_dir, const std::string& mode = "collectives") {
  return {ddprunPath(),           "--nnodes=1",
          "--rdzv_backend=c10d",  "--rdzv_endpoint=127.0.0.1:0",
          "--rdzv_id=" + run_id,  "--nproc_per_node=" + std::to_string(nproc),
          "--max_restarts=1",     "--hang_timeout=" + hang_timeout,
          "--log_dir=" + log_dir, "--no_python",
          testWorkerPath(),       mode};
}

}  // namespace

TEST_CASE("hang_timeout names the rank that never called all_reduce #N and takes its stacks and restarts the job",
          "[e2e][hang]") {
  TempDir logs;
  const std::string id = "hang-behind-" + std::to_string(::getpid());
  auto argv = ddprunArgs(id, 2, "3", logs.path());
  // Rank 1 sleeps 10 min before all_reduce #5 on attempt 0 only.
  for (const char* a : {"8", "50", "1", "5", "600000", "1"}) argv.push_back(a);
  auto r = run(argv, {}, 120s);
  REQUIRE(r.finished);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.err, Catch::Contains("--hang_timeout: no rank on this node completed an operation for 3 s"));
  CHECK_THAT(r.err, Catch::Contains("hang: rank 1 has not called #5 (last completed all_reduce #4, "));
  CHECK_THAT(r.err, Catch::Contains("rank 0 waits in all_reduce #5 (started "));
  CHECK_THAT(r.err, Catch::Contains("— rank 1 is behind"));
  // Both ranks were stopped; the one behind is the cause, not the first one the stop reached.
  CHECK_THAT(r.err, Catch::Contains("restarting the worker group after rank 1 failed"));
  CHECK(countOf(r.out, "done rank=") == 2);  // attempt 1 finished

  const std::string stacks = findFile(logs.path(), "/attempt_0/1/stacks.txt");
  REQUIRE(!stacks.empty());
  const std::string text = readFile(stacks);
  CHECK_THAT(text, Catch::Contains("hang: rank 1 has not called #5"));
  if (stackToolInstalled()) CHECK_THAT(text, Catch::Contains("sleepBeforeCollective"));
  CHECK(flightDirsOf(id) == 0);
}

TEST_CASE("hang_timeout names a rank waiting in recv from a peer that never sends and restarts the job",
          "[e2e][hang]") {
  TempDir logs;
  const std::string id = "hang-recv-" + std::to_string(::getpid());
  auto argv = ddprunArgs(id, 2, "3", logs.path(), "p2p-recv");
  // On attempt 0 rank 1 sleeps 10 min instead of sending; no collective is pending meanwhile.
  argv.push_back("1");
  auto r = run(argv, {}, 120s);
  REQUIRE(r.finished);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.err, Catch::Contains("--hang_timeout: no rank on this node completed an operation for 3 s"));
  CHECK_THAT(r.err, Catch::Contains("hang: rank 0 waits in recv from rank 1 (#1, started "));
  CHECK_THAT(r.err, Catch::Contains("while rank 1 has no operation pending — rank 1 is behind"));
  CHECK_THAT(r.err, Catch::Contains("restarting the worker group after rank 1 failed"));
  CHECK(countOf(r.out, "done rank=") == 2);  // attempt 1 finished
  const std::string stacks = findFile(logs.path(), "/attempt_0/1/stacks.txt");
  REQUIRE(!stacks.empty());
  if (stackToolInstalled()) CHECK_THAT(readFile(stacks), Catch::Contains("sleepInsteadOfSend"));
  CHECK(flightDirsOf(id) == 0);
}

TEST_CASE("hang_timeout never fires on a slow job that keeps completing collectives", "[e2e][hang]") {
  TempDir logs;
  const std::string id = "hang-slow-" + std::to_string(::getpid());
  auto argv = ddprunArgs(id, 2, "4", logs.path());
  // Rank 1 takes 2 s before each of 4 all_reduces (rank 0 waits inside each for 2 s).
  for (const char* a : {"4", "10", "1", "0", "2000", "1"}) argv.push_back(a);
  auto r = run(argv, {}, 120s);
  REQUIRE(r.finished);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.err, !Catch::Contains("hang:") && !Catch::Contains("--hang_timeout:"));
  CHECK_THAT(r.err, !Catch::Contains("restarting"));
  CHECK(countOf(r.out, "done rank=") == 2);
  CHECK(flightDirsOf(id) == 0);
}

TEST_CASE("hang_timeout names a rank that called broadcast where the others called all_reduce", "[e2e][hang]") {
  TempDir logs;
  const std::string id = "hang-mismatch-" + std::to_string(::getpid());
  auto argv = ddprunArgs(id, 3, "3", logs.path());
  for (const char* a : {"5", "10", "2", "3", "0", "1", "broadcast"}) argv.push_back(a);
  // Over TCP, where mismatched calls hang; on shared memory they fail at once (below).
  auto r = run(argv, {{"DDPRUN_SHM", "0"}}, 120s);
  REQUIRE(r.finished);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.err, Catch::Contains("hang: rank 2 called broadcast where the others called all_reduce (#3)"));
  CHECK(countOf(r.out, "done rank=") == 3);
  CHECK(flightDirsOf(id) == 0);
}

TEST_CASE("on shared memory a broadcast where the others call all_reduce fails at once naming both calls",
          "[e2e][hang]") {
  TempDir logs;
  const std::string id = "small-mismatch-" + std::to_string(::getpid());
  auto argv = ddprunArgs(id, 3, "60", logs.path());
  for (const char* a : {"5", "10", "2", "3", "0", "1", "broadcast"}) argv.push_back(a);
  auto r = run(argv, {}, 120s);
  REQUIRE(r.finished);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.err, Catch::Contains("mismatched collectives (shared memory): rank 2 (") &&
                        Catch::Contains(") called broadcast of 4096 bytes from rank 0 where rank 0 (") &&
                        Catch::Contains(") called all_reduce of 4096 bytes (float32, sum)"));
  // Not left to hang: --hang_timeout (60 s) never fired.
  CHECK_THAT(r.err, !Catch::Contains("--hang_timeout:"));
  CHECK(countOf(r.out, "done rank=") == 3);  // attempt 1 finished
  CHECK(flightDirsOf(id) == 0);
}

TEST_CASE("a collective that times out brings the hang verdict and the others are stopped as hung", "[e2e][hang]") {
  TempDir logs;
  // No --hang_timeout: rank 0's all_reduce #3 times out after 2 s while rank 1 sleeps before it.
  auto r = run({ddprunPath(), "--standalone", "--nproc_per_node=2", "--log_dir=" + logs.path(), "--no_python",
                testWorkerPath(), "collectives", "4", "10", "1", "3", "600000", "1", "sleep", "2000"},
               {}, 120s);
  REQUIRE(r.finished);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Catch::Contains("rank 0 failed: a collective timed out; hang: rank 1 has not called #3 (last "
                                    "completed all_reduce #2, "));
  CHECK_THAT(r.err, Catch::Contains("rank 0 failed in all_reduce #3 — rank 1 is behind"));
  // Rank 1, still running, was stopped as hung: its stacks show where it was.
  CHECK_THAT(r.err, Catch::Contains("  hung      : hang: rank 1 has not called #3"));
  // Rank 0's timeout is the symptom; the root cause is rank 1, which the verdict found behind.
  CHECK_THAT(r.err, Catch::Contains("Root cause (first failure):\n  rank      : 1 (local_rank: 1)"));
  const std::string stacks = findFile(logs.path(), "/attempt_0/1/stacks.txt");
  REQUIRE(!stacks.empty());
  if (stackToolInstalled()) CHECK_THAT(readFile(stacks), Catch::Contains("sleepBeforeCollective"));
}

TEST_CASE("hang_timeout over workers without a flight recorder says once that it cannot judge them", "[e2e][hang]") {
  // `sleep` keeps no ring, as a Python worker keeps none: nothing to judge, and the user is told.
  auto r = run({ddprunPath(), "--standalone", "--nproc_per_node=2", "--hang_timeout=1", "--no_python", "sleep", "3"},
               {}, 60s);
  REQUIRE(r.finished);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  CHECK(countOf(r.err, "--hang_timeout 1 s: no worker on this node keeps a flight recorder") == 1);
  CHECK_THAT(r.err, Catch::Contains("TORCHELASTIC_ENABLE_FILE_TIMER=1"));
}

TEST_CASE("a kill -9 of ddprun leaves no flight recorder directory on /dev/shm", "[e2e][hang]") {
  const std::string id = "hang-kill9-" + std::to_string(::getpid());
  TempDir logs;
  auto argv = ddprunArgs(id, 2, "30", logs.path());
  for (const char* a : {"1000", "50", "0", "0", "0", "0"}) argv.push_back(a);
  TestProcess ddprun(argv);
  REQUIRE(ddprun.waitForOutput("step 2 rank=", 60s));
  CHECK(flightDirsOf(id) == 1);
  ddprun.signal(SIGKILL);
  REQUIRE(ddprun.wait(30s));
  // The orphan guard removes it once it sees the agent gone.
  CHECK(eventually([&] { return flightDirsOf(id) == 0; }, 10s));
}
