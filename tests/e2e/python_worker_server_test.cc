// torch's worker server in real Python workers (agent/hang/python/_ddprun_worker_server.py,
// worker_server.h): where torch has one (2.4 and later: torch 2.6 in the torch 2.x tier),
// ddprun's hook starts it on a socket of the worker's own in the run directory, mode 0600,
// without a word on the job's stderr, and the hang watch takes the Python stacks through it
// (dump_traceback) instead of signalling the worker. Where torch has none (Debian's 1.13),
// nothing changes: no socket, the stacks come from the signal. Each run is bounded at 60 s
// (about 15 s: the verdict comes after --hang_timeout's 10 s).
#include <filesystem>
#include <fstream>

#include <catch2/catch.hpp>

#include "tests/e2e/fake_torch_worker_server.h"
#include "tests/support/test_process.h"

using namespace ddprun::testing;

TEST_CASE("Python under --hang_timeout: the stacks come through torch's worker server where torch has one",
          "[e2e][torch]") {
  TempDir dir;
  const std::string script = dir.file("served.py");
  std::ofstream(script)
      << "import os, stat, time\n"
         "from datetime import timedelta\n"
         "import torch\n"
         "import torch.distributed as dist\n"
         "dist.init_process_group('gloo', timeout=timedelta(seconds=300))\n"
         "rank = dist.get_rank()\n"
         "p = os.path.join(os.environ['DDPRUN_PYTHON_STACKS_DIR'], 'torch_ws.%d' % os.getpid())\n"
         "if os.path.exists(p):\n"
         "    st = os.lstat(p)\n"
         "    print(f'ws {oct(st.st_mode & 0o777)} socket={stat.S_ISSOCK(st.st_mode)} '\n"
         "          f'mine={st.st_uid == os.getuid()} at {p}', flush=True)\n"
         "else:\n"
         "    print('ws none', flush=True)\n"
         "if rank == 0 and hasattr(torch._C._distributed_c10d, '_get_handler_names'):\n"
         "    print('handlers', sorted(torch._C._distributed_c10d._get_handler_names()), flush=True)\n"
         "t = torch.ones(4)\n"
         "dist.all_reduce(t)\n"
         "if rank == 1:\n"
         "    time.sleep(120)\n"
         "else:\n"
         "    dist.all_reduce(t)\n";
  std::map<std::string, std::string> env = {{"PYTHON", pythonPath()}, {"TMPDIR", dir.file("tmp")}};
  std::filesystem::create_directories(env["TMPDIR"]);
  auto r =
      run({ddprunPath(), "--standalone", "--nproc_per_node=2", "--hang_timeout=10", "--log_dir=" + dir.path(), script},
          env, 60s);
  REQUIRE(r.finished);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 1);
  const bool served = countOf(r.out, "ws 0o600 socket=True mine=True at " + dir.path() + "/") == 2;
  // The torch 2.x tier's torch has the server; Debian's 1.13 has none.
  if (pythonPath().find("torch2") != std::string::npos) {
    REQUIRE(served);
    // What Debian 13's CPU build of torch 2.6 registers (docs/operating.md's table).
    CHECK_THAT(r.out, Catch::Contains("handlers ['dump_traceback', 'ping']"));
  }
  if (served) {
    CHECK_THAT(r.err, Catch::Contains("took the Python stacks of 2 of 2 worker(s)"));
    CHECK_THAT(r.err, Catch::Contains("(2 from torch's worker server)"));
    // torch's own log lines about its server stay off the job's stderr.
    CHECK_THAT(r.err, !Catch::Contains("Server listening"));
    CHECK_THAT(r.err, !Catch::Contains("WorkerServer"));
  } else {
    CHECK(countOf(r.out, "ws none") == 2);
    CHECK_THAT(r.err, Catch::Contains("(0 from torch's worker server)"));
  }
  // The main thread's frame, from whichever source: where rank 1 sleeps, where rank 0 waits.
  CHECK_THAT(r.err, Catch::Contains("hang: rank 1 is not in a collective, at " + script +
                                    ":19 in <module>: time.sleep(120); rank 0 waits in all_reduce (called at " +
                                    script + ":21 in <module>: dist.all_reduce(t)) — rank 1 is behind"));
  CHECK_THAT(r.err, !Catch::Contains("Timed out waiting"));
}

namespace {

RunResult runServed(const TempDir& dir, const std::string& start_server) {
  std::ofstream(dir.file("fake_ws.py")) << kFakeTorchWorkerServer;
  const std::string script = dir.file("served211.py");
  std::ofstream(script) << "import sys, time\n"
                           "from datetime import timedelta\n"
                           "import torch\n"
                           "import torch.distributed as dist\n"
                           "sys.path.insert(0, "
                        << "'" << dir.path() << "'"
                        << ")\n"
                           "import fake_ws\n"
                           "dist.init_process_group('gloo', timeout=timedelta(seconds=300))\n"
                           "rank = dist.get_rank()\n"
                        << start_server
                        << "t = torch.ones(4)\n"
                           "dist.all_reduce(t)\n"
                           "if rank == 1:\n"
                           "    time.sleep(120)\n"
                           "else:\n"
                           "    dist.all_reduce(t)\n";
  std::map<std::string, std::string> env = {
      {"PYTHON", pythonPath()}, {"TMPDIR", dir.file("tmp")}, {"DDPRUN_WORKER_SERVER", "0"}};
  std::filesystem::create_directories(env["TMPDIR"]);
  return run(
      {ddprunPath(), "--standalone", "--nproc_per_node=2", "--hang_timeout=10", "--log_dir=" + dir.path(), script}, env,
      60s);
}

}  // namespace

TEST_CASE("Python under --hang_timeout: the rank behind is named from the live trace a worker server serves",
          "[e2e][torch]") {
  TempDir dir;
  auto r = runServed(dir, "fake_ws.start()\n");
  REQUIRE(r.finished);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Catch::Contains("took 2 live flight-recorder trace(s) from torch's worker servers"));
  // The torch-dump verdict over the two traces (its words, not the rings'), with the frames before it.
  CHECK_THAT(r.err, Catch::Contains("hang: rank 1 has not called all_reduce #2 of group 0 (default_pg)"));
  CHECK_THAT(r.err, Catch::Contains("rank 1: behind, last called all_reduce #1 (completed)"));
  CHECK_THAT(r.err, Catch::Contains("hang: rank 1 is not in a collective, at "));
  CHECK_THAT(r.err, !Catch::Contains("hang: rank 1 has not called #2 (last completed"));
  CHECK_THAT(r.err, Catch::Contains("rank      : 1 (local_rank: 1)"));
  CHECK_THAT(r.err, !Catch::Contains("live trace"));
  CHECK_THAT(r.err, !Catch::Contains("Timed out waiting"));
}

TEST_CASE("Python under --hang_timeout: a worker server that never answers costs one warning, the verdict as before",
          "[e2e][torch]") {
  TempDir dir;
  auto r = runServed(dir, "if rank == 1:\n    fake_ws.start(silent=True)\n");
  REQUIRE(r.finished);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 1);
  CHECK(countOf(r.err, "the verdict goes without its live trace") == 1);
  CHECK_THAT(r.err, !Catch::Contains("live flight-recorder trace(s)"));
  // The rings' verdict, as without a server.
  CHECK_THAT(r.err, Catch::Contains("hang: rank 1 has not called #2 (last completed all_reduce #1"));
  CHECK_THAT(r.err, Catch::Contains("rank      : 1 (local_rank: 1)"));
  CHECK_THAT(r.err, !Catch::Contains("Timed out waiting"));
}
