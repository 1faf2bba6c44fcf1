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

// A stand-in for torch 2.11's worker server, started by the script itself where ddprun's hook
// would start torch's (the hook's own is off: DDPRUN_WORKER_SERVER=0): the handler list of a
// 2.11 build, dump_traceback as torch's handler gives it, and fr_trace_json in the form of
// FlightRecorder::dump_json (agent/torch_trace/flight_json.h) for a job of two ranks where
// rank 0 completed all_reduce #1 and waits in #2 and rank 1 completed #1 only. `silent`: a
// socket that takes connections and never answers.
const char* const kFakeServer =
    R"(import faulthandler, http.server, json, os, socket, socketserver, tempfile, threading, time

def _trace(rank):
    now = time.time_ns()
    def entry(seq, state):
        return {"record_id": seq - 1, "pg_id": 0, "process_group": ["0", "default_pg"],
                "collective_seq_id": seq, "p2p_seq_id": 0, "op_id": seq, "profiling_name": "gloo:all_reduce",
                "time_created_ns": now - 10**9, "input_sizes": [[4]], "input_dtypes": ["Float"],
                "output_sizes": [[4]], "output_dtypes": ["Float"], "state": state,
                "time_discovered_started_ns": now - 10**9,
                "time_discovered_completed_ns": now if state == "completed" else 0,
                "retired": state == "completed", "timeout_ms": 300000, "is_p2p": False}
    entries = [entry(1, "completed")] + ([entry(2, "started")] if rank == 0 else [])
    last = str(len(entries))
    return {"version": "2.10", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
            "pg_status": {"0": {"last_enqueued_collective": last, "last_started_collective": last,
                                "last_completed_collective": "1"}},
            "entries": entries}

class _Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass
    def _send(self, body):
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        self._send(json.dumps(["dump_traceback", "fr_dump_file", "fr_trace_json", "ping", "pyspy_dump"]).encode())
    def do_POST(self):
        if self.path == "/handler/fr_trace_json":
            self._send(json.dumps(_trace(int(os.environ["RANK"]))).encode())
        elif self.path == "/handler/dump_traceback":
            with tempfile.TemporaryFile() as f:
                faulthandler.dump_traceback(f, all_threads=True)
                f.seek(0)
                self._send(f.read())
        else:
            self.send_error(404)

class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

def start(silent=False):
    # Bound by its name in the worker's directory: the test's paths may be longer than a socket
    # address holds.
    here = os.getcwd()
    os.chdir(os.environ["DDPRUN_PYTHON_STACKS_DIR"])
    name = "torch_ws.%d" % os.getpid()
    try:
        if silent:
            s = socket.socket(socket.AF_UNIX)
            s.bind(name)
            s.listen(8)
            globals()["_kept"] = s
        else:
            server = _Server(name, _Handler)
            threading.Thread(target=server.serve_forever, daemon=True).start()
    finally:
        os.chdir(here)
)";

RunResult runServed(const TempDir& dir, const std::string& start_server) {
  std::ofstream(dir.file("fake_ws.py")) << kFakeServer;
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
