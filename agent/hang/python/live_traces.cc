#include "agent/hang/python/live_traces.h"

#include <algorithm>
#include <cstdio>
#include <future>
#include <memory>

#include <fmt/format.h>

#include "agent/hang/python/live_trace.h"
#include "agent/hang/python/worker_server.h"
#include "agent/torch_trace/torch_dumps.h"
#include "common/logging.h"

namespace ddprun::agent {
namespace {

constexpr auto kPoll = std::chrono::milliseconds(20);
// fetchLiveTrace makes at most four requests (the listing and three handlers), one after the
// other, each within the limits' timeout: past that, an ask is not waited for any longer.
constexpr int kRequestsPerTrace = 4;

}  // namespace

std::vector<FlightDump> askWorkerServersForTraces(const std::vector<TraceAsk>& asks, const WaitStep& wait) {
  const WorkerServerLimits limits;
  struct Pending {
    std::string socket;
    std::future<LiveTrace> trace;
  };
  std::vector<Pending> pending;
  for (const TraceAsk& a : asks) {
    std::string socket = existingWorkerServerSocket(a.dir, a.pid);
    if (socket.empty()) continue;
    const int rank = a.rank;
    auto trace =
        std::async(std::launch::async, [socket, rank, limits] { return fetchLiveTrace(socket, rank, limits); });
    pending.push_back(Pending{std::move(socket), std::move(trace)});
  }
  std::vector<FlightDump> out;
  if (pending.empty()) return out;
  auto allDone = [&] {
    return std::all_of(pending.begin(), pending.end(), [](Pending& p) {
      return p.trace.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
    });
  };
  // The second bound only guards against a thread that never started.
  while (!allDone() && wait(kPoll) < (kRequestsPerTrace + 1) * limits.timeout) {
  }
  for (Pending& p : pending) {
    // Ready by now but for a thread that never started: its future's destructor waits for it,
    // within the same bound.
    if (p.trace.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
      logger("agent")->warn("torch's worker server {}: no live trace in time; the verdict goes without it", p.socket);
      continue;
    }
    LiveTrace trace = p.trace.get();
    if (trace.dump) {
      out.push_back(std::move(*trace.dump));
    } else if (!trace.problem.empty()) {
      logger("agent")->warn("{}; the verdict goes without its live trace", trace.problem);
    }
  }
  return out;
}

NodeDumps nodeDumps(const TorchDumps* files, const std::vector<FlightDump>& live, const std::vector<int>& local_ranks) {
  NodeDumps out;
  auto hasLive = [&](int rank) {
    return std::any_of(live.begin(), live.end(), [rank](const FlightDump& d) { return d.rank == rank; });
  };
  std::vector<int> from_files;
  if (files) {
    for (FlightDump& d : files->dumps()) {
      from_files.push_back(d.rank);
      out.dumps.push_back(std::move(d));
    }
    for (int rank : files->missing()) {
      if (!hasLive(rank)) out.missing.push_back(rank);
    }
    for (const std::string& line : files->unreadable()) {
      // "rank <n>: <why>" (TorchDumps::unreadable)
      int rank = -1;
      if (std::sscanf(line.c_str(), "rank %d:", &rank) == 1 && hasLive(rank)) continue;
      out.unreadable.push_back(line);
    }
  }
  for (const FlightDump& d : live) {
    if (std::find(from_files.begin(), from_files.end(), d.rank) != from_files.end()) continue;
    if (std::find(local_ranks.begin(), local_ranks.end(), d.rank) == local_ranks.end()) continue;
    out.dumps.push_back(d);
    ++out.live;
  }
  // With live traces in play, a local rank that has neither one nor a dump file of its own
  // (no server, no dump prefix) is missing too: the verdict would not see it.
  if (!live.empty()) {
    const std::vector<int> written = files ? files->writtenRanks() : std::vector<int>{};
    for (int rank : local_ranks) {
      const bool has =
          std::any_of(out.dumps.begin(), out.dumps.end(), [rank](const FlightDump& d) { return d.rank == rank; });
      // A file written but unreadable is named in `unreadable`.
      const bool pending = std::find(written.begin(), written.end(), rank) != written.end();
      if (!has && !pending && std::find(out.missing.begin(), out.missing.end(), rank) == out.missing.end()) {
        out.missing.push_back(rank);
      }
    }
    std::sort(out.missing.begin(), out.missing.end());
  }
  return out;
}

bool tracesCover(const std::vector<FlightDump>& live, const std::vector<int>& local_ranks) {
  return !local_ranks.empty() && std::all_of(local_ranks.begin(), local_ranks.end(), [&](int rank) {
    return std::any_of(live.begin(), live.end(), [rank](const FlightDump& d) { return d.rank == rank; });
  });
}

}  // namespace ddprun::agent
