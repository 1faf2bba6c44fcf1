// `ddprun status` after a worker was replaced alone (--recovery=in-job, issue 47): each
// node's row shows its workers' generations, the table and --json. The workers are
// in_job_fake_worker (tests/agent/: the runtime's part of the protocol through the store
// client) inside a shell that, once the fake worker is done, waits for the test's release
// file, so that the job is still running while status reads it. Bounded: the shells give up
// waiting after 30 s, the job after 60 s; TestProcess kills what is left.
#include <fstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "tests/support/test_process.h"

using namespace ddprun::testing;

namespace {

RunResult status(const std::vector<std::string>& extra) {
  std::vector<std::string> args = {ddprunPath(), "status"};
  args.insert(args.end(), extra.begin(), extra.end());
  return run(args, {}, 30s);
}

}  // namespace

TEST_CASE("status shows the generation of a worker replaced alone, in the table and in --json", "[e2e][ops]") {
  TempDir dir;
  const std::string release = dir.file("release");
  // $1 the fake worker, $2 its record file, $3 the release file. Rank 1 fails once (exit 3)
  // and is replaced in generation 1; every worker that ends well then waits for the release.
  const std::string script =
      "\"$1\" \"$2\" 1 1 || exit $?; i=0; while [ ! -e \"$3\" ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done";
  TestProcess job({ddprunPath(), "--standalone", "--nproc_per_node=2", "--max_restarts=1", "--recovery=in-job",
                   "--term_timeout=5", "--log_dir=" + dir.file("logs"), "--no_python", "/bin/sh", "-c", script, "sh",
                   binDir() + "/in_job_fake_worker", dir.file("record"), release});
  REQUIRE(job.waitForOutput("replaced alone", 60s));

  RunResult json;
  const bool shown = eventually(
      [&] {
        json = status({"--log_dir=" + dir.file("logs"), "--json"});
        return json.exit_code == 0 && json.out.find("\"worker_generations\":[0,1]") != std::string::npos;
      },
      30s);
  INFO(json.out << json.err << job.out() << job.err());
  CHECK(shown);
  const RunResult table = status({"--log_dir=" + dir.file("logs")});
  INFO(table.out << table.err);
  CHECK(table.exit_code == 0);
  CHECK_THAT(table.out, Catch::Contains("GENERATIONS"));
  CHECK_THAT(table.out, Catch::Contains("  0,1  "));  // local rank 0 in generation 0, local rank 1 in 1

  std::ofstream(release).put('\n');
  REQUIRE(job.wait(60s));
  CHECK(job.exitCode() == 0);
}
