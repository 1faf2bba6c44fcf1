#include <catch2/catch.hpp>

#include "tests/support/test_process.h"

using namespace ddprun::testing;

TEST_CASE("a worker that fails on attempt 0 and succeeds on attempt 1", "[e2e][restart]") {
  SECTION("--max_restarts=1 restarts the group and exits 0") {
    auto r = run({ddprunPath(), "--standalone", "--nproc_per_node=2", "--max_restarts=1", "--no_python",
                  testWorkerPath(), "fail-attempts", "1", "3"});
    REQUIRE(r.finished);
    INFO(r.err);
    CHECK(r.exit_code == 0);
    CHECK_THAT(r.err, Catch::Contains("restarting the worker group"));
    CHECK_THAT(r.err, !Catch::Contains("FAILED"));
  }
  SECTION("--max_restarts=0 exits 1 with the report") {
    auto r = run({ddprunPath(), "--standalone", "--nproc_per_node=2", "--max_restarts=0", "--no_python",
                  testWorkerPath(), "fail-attempts", "1", "3"});
    REQUIRE(r.finished);
    CHECK(r.exit_code == 1);
    CHECK_THAT(r.err, Catch::Contains("FAILED"));
    CHECK_THAT(r.err, Catch::Contains("exit code 3"));
    CHECK_THAT(r.err, !Catch::Contains("restarting"));
  }
}

TEST_CASE("restarts run out: every attempt is made, then exit 1", "[e2e][restart]") {
  auto r = run({ddprunPath(), "--standalone", "--nproc_per_node=2", "--max_restarts=3", "--no_python", "sh", "-c",
                "echo attempt=$TORCHELASTIC_RESTART_COUNT rank=$RANK; exit 3"});
  REQUIRE(r.finished);
  CHECK(r.exit_code == 1);
  // The first worker to fail stops its peer, which may not have printed yet.
  for (int attempt = 0; attempt <= 3; ++attempt) {
    CHECK(countOf(r.out, "attempt=" + std::to_string(attempt) + " ") >= 1);
  }
  CHECK(countOf(r.out, "attempt=4") == 0);
  CHECK(countOf(r.err, "restarting the worker group") == 3);
}

TEST_CASE("when one worker fails the others are stopped, not waited for", "[e2e][restart]") {
  // Rank 1 fails after 200 ms; rank 0 would wait forever.
  auto r = run({ddprunPath(), "--standalone", "--nproc_per_node=2", "--term_timeout=5", "--no_python", testWorkerPath(),
                "fail-rank", "1", "4", "200"},
               {}, 30s);
  REQUIRE(r.finished);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Catch::Contains("rank      : 1"));
  CHECK_THAT(r.err, Catch::Contains("exit code 4"));
  // Rank 0 was stopped by the agent: it is not a failure in the report.
  CHECK_THAT(r.err, !Catch::Contains("Other failures"));
}

TEST_CASE("a worker ignoring SIGTERM is killed after --term_timeout", "[e2e][restart]") {
  auto start = std::chrono::steady_clock::now();
  auto r = run({ddprunPath(), "--standalone", "--nproc_per_node=2", "--term_timeout=0.5", "--no_python", "sh", "-c",
                "if [ $RANK = 1 ]; then sleep 0.3; exit 2; fi; exec " + testWorkerPath() + " ignore-term"},
               {}, 30s);
  REQUIRE(r.finished);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Catch::Contains("SIGKILL"));
  CHECK(std::chrono::steady_clock::now() - start < 20s);
}
