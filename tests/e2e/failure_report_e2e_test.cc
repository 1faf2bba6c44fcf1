#include <csignal>

#include <catch2/catch.hpp>

#include "tests/support/test_process.h"

using namespace ddprun::testing;

TEST_CASE("the report shows exit code, signal name and the error-file message", "[e2e][report]") {
  SECTION("exit code") {
    auto r = run({ddprunPath(), "--standalone", "--nproc_per_node=1", "--no_python", testWorkerPath(), "exit", "42"});
    REQUIRE(r.finished);
    CHECK(r.exit_code == 1);
    CHECK_THAT(r.err, Catch::Contains("ddprun_test_worker FAILED"));
    CHECK_THAT(r.err, Catch::Contains("exit code 42"));
    CHECK_THAT(r.err, Catch::Contains("rank      : 0 (local_rank: 0)"));
    CHECK_THAT(r.err, Catch::Contains("pid       : "));
    CHECK_THAT(r.err, Catch::Contains("host      : "));
  }
  SECTION("signal") {
    auto r = run({ddprunPath(), "--standalone", "--nproc_per_node=1", "--no_python", testWorkerPath(), "raise",
                  std::to_string(SIGSEGV)});
    REQUIRE(r.finished);
    CHECK(r.exit_code == 1);
    CHECK_THAT(r.err, Catch::Contains("killed by SIGSEGV (11)"));
  }
  SECTION("error file written by the worker runtime") {
    auto r = run({ddprunPath(), "--standalone", "--nproc_per_node=2", "--no_python", testWorkerPath(), "throw",
                  "dataset shard 7 is corrupt"});
    REQUIRE(r.finished);
    CHECK(r.exit_code == 1);
    CHECK_THAT(r.err, Catch::Contains("message   : std::runtime_error: dataset shard 7 is corrupt"));
    CHECK_THAT(r.err, Catch::Contains("error_file: "));
  }
}

TEST_CASE("the root cause is the earliest failure", "[e2e][report]") {
  // Rank 1 fails at once; rank 0 fails 300 ms later, before the agent has stopped it.
  auto r = run({ddprunPath(), "--standalone", "--nproc_per_node=2", "--no_python", "sh", "-c",
                "trap '' TERM; if [ $RANK = 0 ]; then sleep 0.3; exit 5; fi; exit 6"},
               {}, 30s);
  REQUIRE(r.finished);
  CHECK(r.exit_code == 1);
  auto root = r.err.find("Root cause");
  REQUIRE(root != std::string::npos);
  auto rank1 = r.err.find("rank      : 1", root);
  REQUIRE(rank1 != std::string::npos);
  CHECK_THAT(r.err.substr(rank1, 200), Catch::Contains("exit code 6"));
}
