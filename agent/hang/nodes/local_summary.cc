#include "agent/hang/nodes/local_summary.h"

#include "agent/hang/nodes/node_summaries.h"
#include "agent/hang/python/live_traces.h"
#include "agent/hang/python/python_stacks.h"
#include "agent/hang/python/stack_summary.h"
#include "agent/torch_trace/dump_summary.h"

namespace ddprun::agent {

std::string localSummary(const std::string& node, const std::vector<RankPosition>& positions,
                         const std::vector<SummaryRank>& ranks, const TorchDumps* files,
                         const std::vector<FlightDump>& live) {
  std::vector<LocalStack> stacks;
  for (const SummaryRank& r : ranks) {
    if (r.python_stack.empty()) continue;
    stacks.push_back(LocalStack{r.rank, r.local_rank, formatTraceback(mainThreadFrames(r.python_stack))});
  }
  std::vector<LocalDump> dumps;
  if (files || !live.empty()) {
    std::vector<int> local_ranks;
    for (const SummaryRank& r : ranks) local_ranks.push_back(r.rank);
    // The live traces travel as dumps do, for ranks without a dump file.
    for (FlightDump& d : nodeDumps(files, live, local_ranks).dumps) {
      for (const SummaryRank& r : ranks) {
        if (r.rank != d.rank) continue;
        dumps.push_back(LocalDump{std::move(d), r.local_rank, r.finished,
                                  r.python_stack.empty() ? "" : formatTraceback(mainThreadFrames(r.python_stack))});
        break;
      }
    }
  }
  return encodeNodeSummary(node, positions, stacks, dumps);
}

}  // namespace ddprun::agent
