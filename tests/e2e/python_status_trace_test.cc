// `ddprun status --trace` on a running Python job (agent/hang/python/live_positions.h,
// agent/progress_watch.h): a rank whose worker serves torch's live trace (the stand-in 2.11
// server of fake_torch_worker_server.h, with a trace of a collective torch issued from C++,
// which ddprun's hook never sees) shows that collective, marked `torch`, while a rank without a
// server shows its ring's row, marked `ring`; a job on Debian's torch 1.13 (no worker server;
// torch 2.6's CPU build in the torch 2.x tier: no trace handler) shows the rings' rows for
// every rank. Each job runs until the test stops it: about 10-20 s a case (the agent publishes
// every 5 s), bounded at 60 s.
#include <csignal>
#include <filesystem>
#include <fstream>
#include <regex>

#include <catch2/catch.hpp>

#include "tests/e2e/fake_torch_worker_server.h"
#include "tests/support/test_process.h"

using namespace ddprun::testing;

namespace {

// Both ranks complete one all_reduce, say so and wait; `serve` is run on rank 1 after
// init_process_group.
const char* const kScript = R"(import os, sys, time
from datetime import timedelta
import torch
import torch.distributed as dist
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
dist.init_process_group('gloo', timeout=timedelta(seconds=300))
rank = dist.get_rank()
if rank == 1 and os.environ.get('SERVE') == '1':
    import fake_ws
    # What torch 2.11's recorder holds for a DDP step that rank 1 is in: the gradient
    # all-gather #57 that torch issued from C++, started 3 s ago.
    def trace(rank):
        now = time.time_ns()
        entry = {"record_id": 56, "pg_id": 0, "process_group": ["0", "default_pg"], "collective_seq_id": 57,
                 "p2p_seq_id": 0, "op_id": 57, "profiling_name": "nccl:_allgather_base",
                 "time_created_ns": now - 3 * 10**9, "input_sizes": [[4]], "input_dtypes": ["Float"],
                 "output_sizes": [[8]], "output_dtypes": ["Float"], "state": "started",
                 "time_discovered_started_ns": now - 3 * 10**9, "time_discovered_completed_ns": 0,
                 "retired": False, "timeout_ms": 600000, "is_p2p": False}
        return {"version": "2.10", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
                "pg_status": {}, "entries": [entry]}
    fake_ws._trace = trace
    fake_ws.start()
t = torch.ones(4)
dist.all_reduce(t)
print('ready', rank, flush=True)
time.sleep(50)
)";

struct Job {
  TempDir dir;
  std::unique_ptr<TestProcess> ddprun;
};

void startJob(Job& job, bool serve) {
  std::ofstream(job.dir.file("fake_ws.py")) << kFakeTorchWorkerServer;
  const std::string script = job.dir.file("job.py");
  std::ofstream(script) << kScript;
  const std::string tmp = job.dir.file("tmp");
  std::filesystem::create_directories(tmp);
  // The hook's own torch server off: the stand-in takes its socket.
  std::map<std::string, std::string> env = {{"PYTHON", pythonPath()}, {"TMPDIR", tmp}, {"SERVE", serve ? "1" : "0"}};
  if (serve) env["DDPRUN_WORKER_SERVER"] = "0";
  job.ddprun =
      std::make_unique<TestProcess>(std::vector<std::string>{ddprunPath(), "--standalone", "--nproc_per_node=2",
                                                             "--log_dir=" + job.dir.file("logs"), script},
                                    env);
}

RunResult statusTrace(const Job& job, bool json) {
  std::vector<std::string> args = {ddprunPath(), "status", "--log_dir=" + job.dir.file("logs"), "--trace"};
  if (json) args.push_back("--json");
  return run(args, {}, 30s);
}

// The table of `status --trace` once `row` (a regex) is in it; the last table read otherwise.
std::string traceOnceShown(const Job& job, const std::regex& row) {
  std::string table;
  eventually(
      [&] {
        table = statusTrace(job, false).out;
        return std::regex_search(table, row);
      },
      40s);
  return table;
}

void stopJob(Job& job) {
  job.ddprun->signal(SIGTERM);
  job.ddprun->wait(30s);
}

}  // namespace

TEST_CASE("status --trace: a rank whose worker serves torch's live trace shows its collective, marked torch",
          "[e2e][torch]") {
  Job job;
  startJob(job, /*serve=*/true);
  REQUIRE(job.ddprun->waitForOutput("ready", 60s, 2));
  const std::regex torch_row(R"((^|\n)1\s+0\s+#57\s+_allgather_base\s+started\s+\d+\.\ds\s+torch\n)");
  const std::string table = traceOnceShown(job, torch_row);
  const std::string json = statusTrace(job, true).out;
  stopJob(job);
  INFO(table << json << job.ddprun->err());
  CHECK_THAT(table, Catch::Contains("RANK  GROUP  SEQ"));
  CHECK_THAT(table, Catch::Contains("SOURCE"));
  CHECK(std::regex_search(table, torch_row));
  // Rank 0 has no server: its ring's row, the all_reduce the hook saw.
  CHECK(std::regex_search(table, std::regex(R"((^|\n)0\s+0\s+#1\s+all_reduce\s+completed\s+\d+\.\ds\s+ring\n)")));
  // Rank 1's ring row gives way to its trace.
  CHECK_FALSE(std::regex_search(table, std::regex(R"((^|\n)1\s+0\s+#1\s)")));
  CHECK_THAT(json, Catch::Contains(R"("rank":1,"group":0,"seq":57,"op":"_allgather_base")"));
  CHECK_THAT(json, Catch::Contains(R"("state":"started","source":"torch")"));
  CHECK_THAT(json, Catch::Contains(R"("state":"completed","source":"ring")"));
  // The server answered every time: nothing to warn about.
  CHECK_THAT(job.ddprun->err(), !Catch::Contains("status --trace` shows rank"));
}

TEST_CASE("status --trace: ranks without a trace handler show their rings' rows, marked ring", "[e2e][torch]") {
  Job job;
  startJob(job, /*serve=*/false);
  REQUIRE(job.ddprun->waitForOutput("ready", 60s, 2));
  const std::regex rank1(R"((^|\n)1\s+0\s+#1\s+all_reduce\s+completed\s+\d+\.\ds\s+ring\n)");
  const std::string table = traceOnceShown(job, rank1);
  stopJob(job);
  INFO(table << job.ddprun->err());
  CHECK(std::regex_search(table, std::regex(R"((^|\n)0\s+0\s+#1\s+all_reduce\s+completed\s+\d+\.\ds\s+ring\n)")));
  CHECK(std::regex_search(table, rank1));
  CHECK_THAT(table, !Catch::Contains("torch\n"));
  CHECK_THAT(job.ddprun->err(), !Catch::Contains("status --trace` shows rank"));
}
