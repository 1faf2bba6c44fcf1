#include "agent/hang/python/live_trace.h"

#include <algorithm>

#include <fmt/format.h>

#include "agent/torch_trace/flight_json.h"
#include "common/text_escape.h"

namespace ddprun::agent {

const std::vector<std::string>& liveTraceHandlers() {
  static const std::vector<std::string> names = {"dump_nccl_trace_pickle", "dump_nccl_trace_json", "fr_trace_json"};
  return names;
}

FlightDump parseLiveTrace(const std::string& handler, const std::string& body, const std::string& what, int rank) {
  if (handler.size() >= 7 && handler.compare(handler.size() - 7, 7, "_pickle") == 0) {
    FlightDump dump = parseFlightDump(body, what);
    dump.rank = rank;
    return dump;
  }
  return parseFlightDumpJson(body, what, rank);
}

LiveTrace fetchLiveTrace(const std::string& socket, int rank, const WorkerServerLimits& limits) {
  LiveTrace out;
  const WorkerServerReply listing = askWorkerServer(socket, "GET", "/handler/", limits);
  if (!listing.ok()) {
    out.problem = listing.problem;
    return out;
  }
  const std::optional<std::vector<std::string>> names = parseHandlerNames(listing.body);
  if (!names) {
    out.problem = fmt::format("torch's worker server {}: GET /handler/ gave no list of names", printable(socket));
    return out;
  }
  for (const std::string& handler : liveTraceHandlers()) {
    if (std::find(names->begin(), names->end(), handler) == names->end()) continue;
    const WorkerServerReply reply = askWorkerServer(socket, "POST", "/handler/" + handler, limits);
    if (!reply.ok()) {
      out.problem = reply.problem;
      continue;
    }
    try {
      FlightDump dump = parseLiveTrace(handler, reply.body, fmt::format("{} ({})", printable(socket), handler), rank);
      const bool has_entries = !dump.entries.empty();
      out.dump = std::move(dump);
      out.handler = handler;
      out.problem.clear();
      if (has_entries) break;
    } catch (const FlightDumpError& e) {
      out.problem = e.what();
    }
  }
  return out;
}

}  // namespace ddprun::agent
