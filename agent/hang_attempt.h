// What the hang watch (hang_watch.h) learns of one attempt of the workers: whether it judged
// a hang and whom it blamed, the Python stacks and torch dumps it took, the culprits and
// frames the other nodes' summaries gave (what said a collective failed is its
// CollectiveWatch's). All of it is forgotten together when the attempt ends
// (HangWatch::endAttempt), so that the next attempt starts afresh: one struct, reset at once.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agent/hang/python/stack_summary.h"
#include "agent/ops/failure_report.h"
#include "agent/torch_trace/torch_dumps.h"
#include "common/clock.h"

namespace ddprun::agent {

struct HangAttempt {
  bool hang_judged = false;                               // the rings' verdict was given (once per attempt)
  std::vector<int> culprits;                              // the ranks a verdict blamed: the report's root cause
  bool python_stacks_taken = false;                       // the Python stacks were taken (once per attempt)
  std::vector<FlightDump> live_traces;                    // from the worker servers, with the stacks
  std::unique_ptr<TorchDumps> torch_dumps;                // when a worker has a dump prefix
  std::vector<WorkerFailure> remote_culprits;             // ranks of other nodes a verdict blamed
  std::map<int, RemoteStack> remote_stacks;               // other nodes' Python ranks' frames, by rank
  std::optional<std::chrono::milliseconds> dumps_waited;  // failures()' wait for the local dumps
};

}  // namespace ddprun::agent
