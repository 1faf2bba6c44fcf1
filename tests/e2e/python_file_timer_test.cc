// torch's own file timer client (torch.distributed.elastic.timer, unchanged) under ddprun
// with TORCHELASTIC_ENABLE_FILE_TIMER=1: an expired timer kills the worker, after its native
// stacks and, through faulthandler, its Python traceback; the job restarts. Debian's torch 1.13, and
// torch 2.6 in the torch 2.x tier (pythonPath()).
#include <filesystem>
#include <fstream>

#include <catch2/catch.hpp>

#include "tests/support/test_process.h"

using namespace ddprun::testing;

namespace {

const std::map<std::string, std::string> kEnv = {{"PYTHON", pythonPath()}, {"TORCHELASTIC_ENABLE_FILE_TIMER", "1"}};

// Rank 1 stays in stuck_in_step() beyond its 1 s timer on attempts below HANG_ATTEMPTS.
std::string writeScript(const TempDir& dir, double after_s) {
  const std::string path = dir.file("timed.py");
  std::ofstream(path) << "import os, sys, time\n"
                         "import torch.distributed.elastic.timer as timer\n"
                         "timer.configure(timer.FileTimerClient(os.environ['TORCHELASTIC_TIMER_FILE']))\n"
                         "rank = int(os.environ['RANK'])\n"
                         "attempt = int(os.environ['TORCHELASTIC_RESTART_COUNT'])\n"
                         "hang = rank == 1 and attempt < int(sys.argv[1])\n"
                         "print(f'rank {rank} attempt {attempt} faulthandler={os.environ.get(\"PYTHONFAULTHANDLER\")}',"
                         " flush=True)\n"
                         "def stuck_in_step():\n"
                         "    time.sleep(120)\n"
                         "with timer.expires(after="
                      << after_s
                      << ", scope='py_step'):\n"
                         "    if hang:\n"
                         "        stuck_in_step()\n"
                         "print(f'rank {rank} released', flush=True)\n";
  return path;
}

}  // namespace

TEST_CASE("a torch file timer that expires kills the worker with its Python traceback and the job restarts",
          "[e2e][torch]") {
  TempDir dir;
  const std::string logs = dir.path() + "/logs";
  // --tee: the workers' lines reach the console whole, never mixed with ddprun's own.
  auto r = run({ddprunPath(), "--standalone", "--nproc_per_node=2", "--max_restarts=1", "--log_dir=" + logs, "--tee=3",
                writeScript(dir, 1.0), "1"},
               kEnv, 240s);
  REQUIRE(r.finished);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("[rank1]:rank 1 attempt 0 faulthandler=1"));
  CHECK_THAT(r.err, Catch::Contains("worker rank 1 (pid ") && Catch::Contains("timer 'py_step' expired"));
  // faulthandler's dump on SIGABRT: every thread, with the frame the worker hung in.
  CHECK_THAT(r.err, Catch::Contains("[rank1]:Fatal Python error: Aborted"));
  CHECK_THAT(r.err, Catch::Contains("[rank1]:") && Catch::Contains("line 9 in stuck_in_step"));
  CHECK_THAT(r.err, Catch::Contains("was killed by SIGABRT"));
  CHECK_THAT(r.err, Catch::Contains("restarting the worker group after rank 1 failed (restart 1 of 1)"));
  CHECK(countOf(r.out, "rank 1 released") == 1);
  bool stacks = false;
  std::string stderr_log;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(logs)) {
    const std::string path = entry.path().string();
    stacks = stacks || path.find("/attempt_0/1/stacks.txt") != std::string::npos;
    if (path.find("/attempt_0/1/stderr.log") != std::string::npos) stderr_log = readFile(path);
  }
  CHECK(stacks);
  CHECK_THAT(stderr_log, Catch::Contains("Fatal Python error: Aborted") && Catch::Contains("in stuck_in_step"));
}

TEST_CASE("a torch file timer released in time kills nothing", "[e2e][torch]") {
  TempDir dir;
  auto r = run({ddprunPath(), "--standalone", "--nproc_per_node=2", writeScript(dir, 60.0), "0"}, kEnv, 240s);
  REQUIRE(r.finished);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  CHECK(countOf(r.out, " released") == 2);
  CHECK_THAT(r.err, !Catch::Contains("expired"));
}

TEST_CASE("with --no_python_faulthandler the timer's own signal kills and the report names the scope", "[e2e][torch]") {
  TempDir dir;
  auto env = kEnv;
  env["TMPDIR"] = dir.path();  // the run directory kept for the expired timer's stacks
  auto r =
      run({ddprunPath(), "--standalone", "--nproc_per_node=2", "--no_python_faulthandler", writeScript(dir, 1.0), "1"},
          env, 240s);
  REQUIRE(r.finished);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.out, Catch::Contains("rank 1 attempt 0 faulthandler=None"));
  CHECK_THAT(r.err, !Catch::Contains("Fatal Python error"));
  CHECK_THAT(r.err, Catch::Contains("  rank      : 1 (local_rank: 1)"));
  CHECK_THAT(r.err, Catch::Contains("  exit      : killed by SIGKILL (9)"));
  CHECK_THAT(r.err,
             Catch::Contains("  hung      : timer 'py_step' expired; ddprun took its stacks, then stopped it\n"));
}
