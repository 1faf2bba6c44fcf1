// The flight recorder's live traces of this node's workers, for the hang watch: asked of each
// worker's torch worker server (live_trace.h) before anyone is stopped, all at once on threads
// of their own, off the agent's event loop, each bounded by the worker server's limits; then
// fed to the torch-dump verdict (dump_verdict.h) beside any dump files, and to the node's hang
// summary (dump_summary.h) as a dump is. A worker without a server (torch 1.13, a CPU build's
// server without a trace handler) is simply not asked again; one whose server gives no usable
// trace costs one warning.
#pragma once

#include <sys/types.h>

#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "agent/hang/python/worker_server_stacks.h"
#include "agent/torch_trace/flight_dump.h"

namespace ddprun::agent {

class TorchDumps;

struct TraceAsk {
  std::string dir;  // the worker's directory, where its server's socket is
  pid_t pid = 0;
  int rank = 0;  // its global rank
};

// Asks the server of each worker that has one for its live trace, at once on threads of their
// own; meanwhile `wait` runs the caller's loop until every ask has ended (each within a few of
// the worker server's default limits). Logs one warning per server that gave no usable trace.
// The traces that came, with entries or without, in the order of the asks.
std::vector<FlightDump> askWorkerServersForTraces(const std::vector<TraceAsk>& asks, const WaitStep& wait);

// The same over the agent's workers (running ones with ddprun's hook).
template <class Workers>
std::vector<FlightDump> tracesFromWorkerServers(const Workers& workers, const WaitStep& wait) {
  std::vector<TraceAsk> asks;
  for (const auto& w : workers) {
    if (w.running && w.python_hook) asks.push_back(TraceAsk{w.dir, w.pid, w.place.rank});
  }
  return askWorkerServersForTraces(asks, wait);
}

// This node's dumps for the verdict and its summary: each local rank's dump file where one was
// read, else its live trace. `missing`: local ranks with neither (a dump file not yet written,
// or unreadable, counts as none when a live trace stands in for it; with live traces, a rank
// with neither is missing too); `unreadable`: the dump files' problems, for ranks without a
// live trace.
struct NodeDumps {
  std::vector<FlightDump> dumps;
  std::vector<int> missing;
  std::vector<std::string> unreadable;
  size_t live = 0;  // how many of `dumps` are live traces
};
NodeDumps nodeDumps(const TorchDumps* files, const std::vector<FlightDump>& live, const std::vector<int>& local_ranks);

// Whether every one of `local_ranks` has a live trace.
bool tracesCover(const std::vector<FlightDump>& live, const std::vector<int>& local_ranks);

}  // namespace ddprun::agent
