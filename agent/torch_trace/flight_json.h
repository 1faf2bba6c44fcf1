// torch's flight recorder as JSON: what the worker server's trace handlers answer
// (fr_trace_json, every process group that keeps a recorder, gloo from torch 2.8 and NCCL;
// dump_nccl_trace_json, NCCL's), read into the FlightDump of a pickled dump (flight_dump.h)
// so that the verdict and the summaries take either. The JSON has the pickle's keys but for
// three differences, from torch's FlightRecorder::dump_json (torch 2.5 through 2.11): no
// `frames` (no call sites), `time_discovered_*_ns` 0 for "not yet" where the pickle has
// None, and `pg_status`'s numbers as strings. `entries` is left out when there are none.
#pragma once

#include <string>
#include <string_view>

#include "agent/torch_trace/flight_dump.h"

namespace ddprun::agent {

// The trace in `bytes` for global rank `rank`. `what` names it in errors. At most
// `max_entries` of the newest entries are kept (the dump is then `truncated`). Throws
// FlightDumpError ("what: ...") for text that is not JSON or has not a trace's keys and types;
// unknown keys are ignored. Pure.
FlightDump parseFlightDumpJson(std::string_view bytes, const std::string& what, int rank,
                               size_t max_entries = PickleLimits{}.max_entries);

}  // namespace ddprun::agent
