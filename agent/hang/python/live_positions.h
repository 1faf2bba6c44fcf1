// Each rank's current collective from torch's live flight-recorder trace, for the progress the
// node publishes every few seconds (agent/progress_watch.h) and `ddprun status --trace`. Where
// a worker's torch serves a trace handler (torch 2.11 on NCCL, gloo from 2.8), its trace holds
// the collectives torch issues from C++ (DDP's gradient all-reduces under backward()), which
// ddprun's hook and its rings never see.
//
// tracePositions reduces one trace to a row per process group. LiveTraceReader reads the traces
// of this node's workers, each on a thread of its own, off the agent's event loop, each request
// within the worker server's limits (worker_server.h: 2 s, 64 MiB). A worker is asked for its
// handler list once; one without a socket (torch 1.13) costs a stat a read, one whose list has
// no trace handler (torch 2.6's CPU build) nothing more. One that does not answer, or answers
// with no usable trace, costs one warning, once.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agent/hang/python/worker_server.h"
#include "agent/hang/rings/trace_position.h"
#include "agent/torch_trace/flight_dump.h"

namespace ddprun::agent {

// The rank's current collective in each process group of `dump` (its rank is dump.rank), as of
// `now_unix_ns` (CLOCK_REALTIME, the clock torch's entries are stamped with on the same host):
// the oldest entry not completed (pending, started, or failed: past its own timeout_ms), else
// the last one completed. Point-to-point entries are left out (a collective's row, as the
// rings' rows are); a trace without collective entries gives no row. Ascending by group. Pure.
std::vector<TracePosition> tracePositions(const FlightDump& dump, int64_t now_unix_ns);

// The trace handlers a periodic read asks, from those the server lists: the JSON ones, each
// (fr_trace_json has gloo's recorder, dump_nccl_trace_json NCCL's: a job with both kinds of
// group has entries in each), else the pickle (frames and all: torch builds with no JSON handler).
std::vector<std::string> periodicTraceHandlers(const std::vector<std::string>& listed);

class LiveTraceReader {
 public:
  struct Source {
    std::string dir;  // the worker's directory, where its server's socket is
    pid_t pid = 0;
    int rank = 0;  // its global rank
  };

  explicit LiveTraceReader(WorkerServerLimits limits = {});
  // Waits for the reads still running: each within a few of the limits' timeouts.
  ~LiveTraceReader();
  LiveTraceReader(const LiveTraceReader&) = delete;
  LiveTraceReader& operator=(const LiveTraceReader&) = delete;

  // Starts a read of each of `sources` whose server has a trace handler (or has not been asked
  // for its list yet) and has no read running. Never blocks: a stat a source.
  void start(const std::vector<Source>& sources);
  // Whether a read that the last start() began is still running. Never blocks.
  bool busy();
  // Blocks until every read that the last start() began has finished, or `bound` has passed
  // (false then): for a caller that may wait, as a one-shot read or a test, instead of asking
  // busy() again and again. The agent's progress look never waits (it asks busy()).
  bool waitIdle(std::chrono::milliseconds bound);
  // The rows of the reads done since the last take(), as of `now_unix_ns`; logs one warning per
  // worker, once, for a read without a usable trace. Never blocks.
  std::vector<TracePosition> take(int64_t now_unix_ns);
  // A new attempt: its workers are others. Reads still running finish on their threads, unused.
  void forget();

 private:
  struct Read {
    std::optional<std::vector<std::string>> listed;  // the handlers, when this read listed them
    std::vector<FlightDump> traces;
    std::string problem;  // why no trace came, one line; "" when none is wrong
  };
  struct Worker {
    int rank = 0;
    std::optional<std::vector<std::string>> handlers;  // periodicTraceHandlers, once listed
    std::future<Read> read;
    bool fresh = false;  // started by the last start()
    bool warned = false;
  };

  // One read of a worker's trace, on a thread of its own: its handler list when not known yet
  // (`handlers` nullopt), then each trace handler in `handlers`. Never throws beyond bad_alloc.
  static Read readOnce(const std::string& socket, int rank, std::optional<std::vector<std::string>> handlers,
                       const WorkerServerLimits& limits);

  WorkerServerLimits limits_;
  std::map<pid_t, Worker> workers_;
  std::vector<std::future<Read>> forgotten_;  // reads of a past attempt, still running
};

}  // namespace ddprun::agent
