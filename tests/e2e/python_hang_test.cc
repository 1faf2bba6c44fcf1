// A torch collective that times out under ddprun, with plain scripts (gloo, no @record, as the
// seeds' scripts): the rank that never called the collective, or called another one, is the
// report's root cause with its Python frame, taken through ddprun's Python hook before it was
// stopped. Debian's torch 1.13, and torch 2.6 in the torch 2.x tier (pythonPath()).
#include <fstream>

#include <catch2/catch.hpp>

#include "tests/support/test_process.h"

using namespace ddprun::testing;

namespace {

const std::map<std::string, std::string> kTorchPython = {{"PYTHON", pythonPath()}};

// Rank 1 does `rank1_line` where rank 0 calls its second all_reduce (line 12 of the script);
// the group's timeout is 5 s.
std::string writeScript(const TempDir& dir, const std::string& rank1_line) {
  const std::string path = dir.file("job.py");
  std::ofstream(path) << "import time\n"
                         "from datetime import timedelta\n"
                         "import torch\n"
                         "import torch.distributed as dist\n"
                         "dist.init_process_group('gloo', timeout=timedelta(seconds=5))\n"
                         "rank = dist.get_rank()\n"
                         "t = torch.ones(4)\n"
                         "dist.all_reduce(t)\n"
                         "if rank == 1:\n"
                         "    "
                      << rank1_line
                      << "\n"
                         "else:\n"
                         "    dist.all_reduce(t)\n"
                         "print(f'rank {rank} done', flush=True)\n";
  return path;
}

// The report's root cause section: from its heading to the next rule.
std::string rootCause(const std::string& err) {
  const size_t at = err.find("Root cause (first failure):");
  if (at == std::string::npos) return {};
  return err.substr(at, err.find("------", at) - at);
}

}  // namespace

TEST_CASE("a rank that sleeps while the others' all_reduce times out is the root cause, with its line",
          "[e2e][torch]") {
  TempDir dir;
  const std::string script = writeScript(dir, "time.sleep(60)");
  // --log_dir in the test's directory: the run directory kept for the stacks goes with it.
  auto r =
      run({ddprunPath(), "--standalone", "--nproc_per_node=2", "--log_dir=" + dir.path(), script}, kTorchPython, 240s);
  REQUIRE(r.finished);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Catch::Contains("hang: rank 1 is not in a collective, at " + script +
                                    ":10 in <module>: time.sleep(60); rank 0 waits in all_reduce (called at " + script +
                                    ":12 in <module>: dist.all_reduce(t)) — rank 1 is behind"));
  const std::string cause = rootCause(r.err);
  CHECK_THAT(cause, Catch::Contains("rank      : 1 (local_rank: 1)"));
  CHECK_THAT(cause, Catch::Contains("File \"" + script + "\", line 10, in <module>\n      time.sleep(60)"));
  // Rank 0's exception, saved by the hook although the script has no @record.
  CHECK_THAT(r.err, Catch::Contains("Timed out waiting 5000ms for recv operation to complete"));
  CHECK(countOf(r.out, " done") == 0);
}

TEST_CASE("a rank that calls broadcast where the others call all_reduce is the root cause, as a mismatch",
          "[e2e][torch]") {
  TempDir dir;
  const std::string script = writeScript(dir, "dist.broadcast(t, src=1)");
  // --tee: the timeout line on rank 0's stderr goes through ddprun, which acts on it at once.
  auto r = run({ddprunPath(), "--standalone", "--nproc_per_node=2", "--tee=3", "--log_dir=" + dir.path(), script},
               kTorchPython, 240s);
  REQUIRE(r.finished);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Catch::Contains("hang: rank 1 called broadcast at " + script +
                                    ":10 in <module>: dist.broadcast(t, src=1); rank 0 waits in all_reduce"));
  CHECK_THAT(r.err, Catch::Contains("— rank 1 called something else"));
  const std::string cause = rootCause(r.err);
  CHECK_THAT(cause, Catch::Contains("rank      : 1 (local_rank: 1)"));
  CHECK_THAT(cause, Catch::Contains("File \"" + script + "\", line 10, in <module>"));
  CHECK_THAT(cause, Catch::Contains("in broadcast"));
}

TEST_CASE("with --no_python_stacks the report follows the exit order, as before", "[e2e][torch]") {
  TempDir dir;
  const std::string script = writeScript(dir, "time.sleep(60)");
  auto r =
      run({ddprunPath(), "--standalone", "--nproc_per_node=2", "--no_python_stacks", "--log_dir=" + dir.path(), script},
          kTorchPython, 240s);
  REQUIRE(r.finished);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Catch::Contains("Timed out waiting 5000ms for recv operation to complete"));
  CHECK_THAT(r.err, !Catch::Contains("hang: rank 1"));
  CHECK_THAT(rootCause(r.err), Catch::Contains("rank      : 0 (local_rank: 0)"));
}
