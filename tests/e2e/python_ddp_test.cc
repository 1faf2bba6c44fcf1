#include <fstream>

#include <catch2/catch.hpp>

#include "tests/support/test_process.h"

using namespace ddprun::testing;

// ddprun runs .py programs with $PYTHON: the torch under test (1.13, or 2.6 in the torch 2.x tier).
static const std::map<std::string, std::string> kTorchPython = {{"PYTHON", pythonPath()}};

TEST_CASE("a PyTorch DDP script (gloo, CPU) trains under ddprun --standalone", "[e2e][torch]") {
  auto r = run(
      {ddprunPath(), "--standalone", "--nproc_per_node=2", sourceDir() + "/trainers/elastic_ddp.py", "--steps", "30"},
      kTorchPython, 240s);
  REQUIRE(r.finished);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  CHECK(countOf(r.out, "replicas in sync") == 2);
  CHECK_THAT(r.out, Catch::Contains("rank 0/2: started"));
}

TEST_CASE("with a rendezvous token, Python workers still get a token-free workers' store", "[e2e][torch]") {
  auto env = kTorchPython;
  env["DDPRUN_TOKEN"] = "job-secret";
  auto r = run(
      {ddprunPath(), "--standalone", "--nproc_per_node=2", sourceDir() + "/trainers/elastic_ddp.py", "--steps", "5"},
      env, 240s);
  REQUIRE(r.finished);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  CHECK(countOf(r.out, "replicas in sync") == 2);
}

TEST_CASE("a Python worker's exception reaches the report through torch's @record", "[e2e][torch]") {
  TempDir dir;
  std::string script = dir.file("boom.py");
  std::ofstream(script) << "from torch.distributed.elastic.multiprocessing.errors import record\n"
                           "@record\n"
                           "def main():\n"
                           "    raise ValueError('bad learning rate 42')\n"
                           "main()\n";
  auto r = run({ddprunPath(), "--standalone", "--nproc_per_node=1", script}, kTorchPython, 120s);
  REQUIRE(r.finished);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Catch::Contains("message   : ValueError: bad learning rate 42"));
  CHECK_THAT(r.err, Catch::Contains("Traceback (most recent call last):"));
  CHECK_THAT(r.err, Catch::Contains("boom.py"));
}

TEST_CASE("a gloo collective that times out in a Python worker stops the rank it waited for with its traceback",
          "[e2e][torch]") {
  TempDir dir;
  std::string script = dir.file("stuck.py");
  std::ofstream(script) << "import datetime, time, torch, torch.distributed as dist\n"
                           "from torch.distributed.elastic.multiprocessing.errors import record\n"
                           "def stuck_before_second_all_reduce():\n"
                           "    time.sleep(120)\n"
                           "@record\n"
                           "def main():\n"
                           "    dist.init_process_group('gloo', timeout=datetime.timedelta(seconds=3))\n"
                           "    t = torch.ones(4)\n"
                           "    dist.all_reduce(t)\n"
                           "    if dist.get_rank() == 1:\n"
                           "        stuck_before_second_all_reduce()\n"
                           "    dist.all_reduce(t)\n"
                           "main()\n";
  auto r =
      run({ddprunPath(), "--standalone", "--nproc_per_node=2", "--log_dir=" + dir.path(), script}, kTorchPython, 120s);
  REQUIRE(r.finished);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 1);
  // Rank 0's gloo timeout ("Timed out waiting 3000ms") is a hang seen from inside: rank 1's
  // Python stack, taken through ddprun's hook before anything is stopped, shows it outside any
  // collective; it is stopped as hung and is the root cause, with that stack.
  CHECK_THAT(r.err, Catch::Contains("rank 0 failed: a collective timed out; hang: rank 1 is not in a collective, at " +
                                    script + ":4 in stuck_before_second_all_reduce: time.sleep(120)"));
  CHECK_THAT(r.err, Catch::Contains("Root cause (first failure):\n  rank      : 1 (local_rank: 1)"));
  CHECK_THAT(r.err, Catch::Contains("  hung      : hang: rank 1 is not in a collective"));
  CHECK_THAT(r.err, Catch::Contains("line 4, in stuck_before_second_all_reduce\n      time.sleep(120)"));
}
