// torch.distributed.elastic's contract with torch 2.6 workers across restarts
// (elastic_restart.py): the run id stays, the restart count counts, each attempt gets a fresh
// workers' store (torch 2.x no longer prefixes keys per attempt), and when the restarts run
// out the report shows the error file @record wrote in the last attempt.
#include <catch2/catch.hpp>

#include "tests/support/test_process.h"
#include "tests/torch2/torch2_scripts.h"

using namespace ddprun::testing;

TEST_CASE("torch 2.6 workers restart after failures with one TORCHELASTIC_RUN_ID and restart counts 0 1 2",
          "[torch2]") {
  auto r = run({ddprunPath(), "--standalone", "--nproc_per_node=2", "--max_restarts=3",
                torch2Script("elastic_restart.py"), "--succeed-at", "2"},
               torch2Env(), 240s);
  INFO(r.out << r.err);
  REQUIRE(r.finished);
  CHECK(r.exit_code == 0);
  CHECK(countOf(r.out, "MISMATCH") == 0);
  const std::string first = "attempt 0: run_id=";
  const auto at = r.out.find(first);
  REQUIRE(at != std::string::npos);
  const std::string run_id = r.out.substr(at + first.size(), r.out.find(' ', at + first.size()) - at - first.size());
  CHECK(run_id.size() >= 8);
  for (int restart = 0; restart <= 2; ++restart) {
    const std::string n = std::to_string(restart);
    CHECK(countOf(r.out, "attempt " + n + ": run_id=" + run_id + " restart=" + n + " master=") == 1);
  }
  CHECK(countOf(r.out, "run_id=") == 3);
  CHECK_THAT(r.err, Catch::Contains("restarting the worker group after rank 1 failed (restart 1 of 3)"));
  CHECK_THAT(r.err, Catch::Contains("restarting the worker group after rank 1 failed (restart 2 of 3)"));
  CHECK_THAT(r.err, Catch::Contains("all 2 workers finished successfully"));
  CHECK(countOf(r.err, "FAILED") == 0);
}

TEST_CASE("after the last restart the report shows the error file torch 2.6's @record wrote", "[torch2]") {
  auto r = run({ddprunPath(), "--standalone", "--nproc_per_node=2", "--max_restarts=1",
                torch2Script("elastic_restart.py"), "--succeed-at", "9"},
               torch2Env(), 240s);
  INFO(r.out << r.err);
  REQUIRE(r.finished);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Catch::Contains("restarting the worker group after rank 1 failed (restart 1 of 1)"));
  CHECK(countOf(r.out, "attempt 1: run_id=") == 1);
  const auto at = r.err.find("elastic_restart.py FAILED: 1 worker failed");
  REQUIRE(at != std::string::npos);
  const std::string report = r.err.substr(at);
  CHECK_THAT(report, Catch::Contains("rank      : 1 (local_rank: 1)"));
  CHECK_THAT(report, Catch::Contains("exit      : exit code 1"));
  // The second attempt's file, its message whole (two lines, η decoded from JSON's \u03b7).
  CHECK_THAT(report, Catch::Contains("/attempt_1/1/error.json\n"));
  CHECK_THAT(report, Catch::Contains("  message   : RuntimeError: planned failure at restart 1: loss is nan "
                                     "(learning rate \xce\xb7=0.5)\n"
                                     "              last good step: 3\n"));
  CHECK_THAT(report, Catch::Contains("  traceback :\n    Traceback (most recent call last):\n"));
  CHECK_THAT(report, Catch::Contains("elastic_restart.py\", line "));
  CHECK_THAT(report, Catch::Contains("    RuntimeError: planned failure at restart 1: loss is nan"));
  CHECK(countOf(report, "restart 0") == 0);
}
