// torch's worker control plane, asked by the agent: the HTTP server that torch 2.4 and later
// have (torch._C._distributed_c10d._WorkerServer), which ddprun's Python hook starts in each
// worker on a Unix socket of the worker's own, `<worker dir>/torch_ws.<pid>` (mode 0600;
// _ddprun_worker_server.py). Its API, the same in torch 2.4 through 2.11: GET /handler/ gives
// the handlers' names as a JSON list; POST /handler/<name> runs one (dump_traceback: every
// thread's Python stack as faulthandler prints it; the flight recorder's live trace, where the
// process groups keep one: fr_trace_json, dump_nccl_trace_json, dump_nccl_trace_pickle); an
// unknown name gets 404.
//
// A worker is not trusted to answer, nor to answer briefly: each ask is bounded in time (a
// worker whose interpreter lock is held in C++ never answers dump_traceback) and in memory
// (at most max_bytes of the body are kept; the rest is not read), and the ask says what went
// wrong in one line. Asks run on threads of their own (WorkerServerAsks), never on the agent's
// event loop. HTTP is Boost.Beast's.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <future>
#include <optional>
#include <string>
#include <vector>

namespace ddprun::agent {

// The socket ddprun's hook makes for process `pid` in the worker directory `dir`.
std::string workerServerSocket(const std::string& dir, pid_t pid);
// The socket of `pid` in `dir` when one is there (a socket file), else "". Never blocks.
std::string existingWorkerServerSocket(const std::string& dir, pid_t pid);

struct WorkerServerLimits {
  // The whole exchange: connect, request, the answer's header and body. Default 2 s.
  std::chrono::milliseconds timeout{2000};
  // The most of a body kept; a longer one is cut there and the rest not read. Default 64 MiB.
  size_t max_bytes = size_t{64} << 20;
};

struct WorkerServerReply {
  int status = 0;    // the HTTP status; 0 when no answer came
  std::string body;  // at most max_bytes
  bool cut = false;  // the body was longer than max_bytes
  // Why the answer cannot be used, one line naming the socket and the request ("" when it can:
  // status 200, whole): no answer in time, refused, an error status, cut.
  std::string problem;
  bool ok() const { return problem.empty(); }
};

// `method` "GET" or "POST" of `target` ("/handler/dump_traceback") on the server at `socket`.
// Blocks the calling thread for at most limits.timeout (plus the close); never throws beyond
// std::bad_alloc.
WorkerServerReply askWorkerServer(const std::string& socket, const std::string& method, const std::string& target,
                                  const WorkerServerLimits& limits = {});

// The handler names in a GET /handler/ answer; nullopt when it is not a JSON list of strings.
std::optional<std::vector<std::string>> parseHandlerNames(const std::string& body);

// Several asks at once, each on a thread of its own, for a caller that must not block (the
// agent's event loop looks at done() between its own work). Not thread-safe: one thread uses
// it. The destructor waits for the asks still running: at most limits.timeout.
class WorkerServerAsks {
 public:
  struct Ask {
    std::string socket;
    std::string method = "POST";
    std::string target;
  };
  WorkerServerAsks(std::vector<Ask> asks, WorkerServerLimits limits);
  ~WorkerServerAsks();
  WorkerServerAsks(const WorkerServerAsks&) = delete;
  WorkerServerAsks& operator=(const WorkerServerAsks&) = delete;

  // Whether every ask has its answer (or gave up). Never blocks.
  bool done();
  // The replies in the order of the asks; one still running is a reply whose problem says so
  // (and is left to finish on its thread). Call once.
  std::vector<WorkerServerReply> take();

 private:
  std::vector<Ask> asks_;
  std::vector<std::future<WorkerServerReply>> replies_;
};

}  // namespace ddprun::agent
