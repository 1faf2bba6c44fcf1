// What this node's hang summary (node_summaries.h's encodeNodeSummary) says of its workers,
// for a node that judges a hang: its ranks' ring positions, the Python frames of those whose
// stacks were taken (so that the judging node names a culprit here with its line), and, when
// there are any, their torch dumps, a live trace standing in for a rank without a dump file
// (live_traces.h's nodeDumps), each with whether its worker finished and its frames. Pure.
#pragma once

#include <string>
#include <vector>

#include "agent/hang/rings/hang_verdict.h"
#include "agent/torch_trace/flight_dump.h"

namespace ddprun::agent {

class TorchDumps;

// One worker of this node, as its summary tells it.
struct SummaryRank {
  int rank = 0;
  int local_rank = 0;
  std::string python_stack;  // its stacks taken while it ran (a faulthandler dump); empty: none
  bool finished = false;     // it exited normally
};

// The agent's workers (agent/worker.h's: place, python_stack, running, exit_code, signal).
template <class Workers>
std::vector<SummaryRank> summaryRanks(const Workers& workers) {
  std::vector<SummaryRank> out;
  for (const auto& w : workers) {
    out.push_back(
        SummaryRank{w.place.rank, w.place.local_rank, w.python_stack, !w.running && w.exit_code == 0 && w.signal == 0});
  }
  return out;
}

// This node's summary, as `node`: `positions` (its ranks' rings), `ranks`, and the dumps of
// `files` (null: none expected) and `live` (the worker servers' traces).
std::string localSummary(const std::string& node, const std::vector<RankPosition>& positions,
                         const std::vector<SummaryRank>& ranks, const TorchDumps* files,
                         const std::vector<FlightDump>& live);

}  // namespace ddprun::agent
