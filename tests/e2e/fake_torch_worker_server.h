// A stand-in for torch 2.11's worker server in a Python worker, for the e2e tests that need
// a trace handler where Debian's torch has none (tests/e2e/python_worker_server_test.cc,
// python_status_trace_test.cc): the test writes it as fake_ws.py beside its script, which
// imports it and calls start(). Its _trace(rank) may be replaced by the script for a trace of
// its own.
#pragma once

namespace ddprun::testing {

// A stand-in for torch 2.11's worker server, started by the script itself where ddprun's hook
// would start torch's (the hook's own is off: DDPRUN_WORKER_SERVER=0): the handler list of a
// 2.11 build, dump_traceback as torch's handler gives it, and fr_trace_json in the form of
// FlightRecorder::dump_json (agent/torch_trace/flight_json.h) for a job of two ranks where
// rank 0 completed all_reduce #1 and waits in #2 and rank 1 completed #1 only. `silent`: a
// socket that takes connections and never answers.
inline constexpr const char* kFakeTorchWorkerServer =
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

}  // namespace ddprun::testing
