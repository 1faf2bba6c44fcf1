// The flight recorder's live trace of a running worker, through torch's worker server
// (worker_server.h): what torch would write to its dump file on a timeout, asked for at any
// time, read into the FlightDump that torch's dump files give (agent/torch_trace/), so that
// `ddprun hang-report`'s verdict and the summaries take it as they take a dump.
//
// Which handler: the first of these that the server lists (GET /handler/) and whose trace has
// entries, else the last one that answered: dump_nccl_trace_pickle (NCCL's recorder, with each
// entry's Python frames), dump_nccl_trace_json (the same without frames), fr_trace_json (the
// recorder of every backend that keeps one: gloo from torch 2.8; without frames). torch 2.6's
// CPU build lists none of them: there is no live trace there.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "agent/hang/python/worker_server.h"
#include "agent/torch_trace/flight_dump.h"

namespace ddprun::agent {

// The trace handlers ddprun asks for, in the order it tries them.
const std::vector<std::string>& liveTraceHandlers();

// The trace from handler `handler`'s answer `body` for global rank `rank`: the pickle handler's
// bytes are a dump file's, the JSON ones' are read by parseFlightDumpJson. Throws
// FlightDumpError for an answer that is not a trace.
FlightDump parseLiveTrace(const std::string& handler, const std::string& body, const std::string& what, int rank);

struct LiveTrace {
  std::optional<FlightDump> dump;  // nothing when no trace could be had
  std::string handler;             // the handler it came from
  std::string problem;             // why there is none, one line; "" when there is one or none is served
};

// Lists the server's handlers at `socket`, then asks the trace handlers in order (above).
// Blocks: each request within limits (the listing within limits.timeout too). Never throws
// beyond std::bad_alloc.
LiveTrace fetchLiveTrace(const std::string& socket, int rank, const WorkerServerLimits& limits = {});

}  // namespace ddprun::agent
