// The hang verdict from ddprun's flight-recorder rings across the nodes of a job, as one
// function from what a node holds to a judgement (as dump_judgement.h is for torch's dumps):
// this node's ranks' positions and, when the round has other nodes, theirs and their Python
// ranks' frames from their hang summaries (agent/hang/nodes/node_summaries.h), read leniently
// (what no rank of the job can hold is dropped and said). A culprit of another node whose node
// sent its frames becomes a failure of this node's report. What it would log comes back with
// it, in order, so that the caller logs it and tests read it. Pure.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <spdlog/common.h>

#include "agent/hang/python/stack_summary.h"
#include "agent/hang/rings/hang_verdict.h"
#include "agent/ops/failure_report.h"

namespace ddprun::agent {

struct RingCase {
  std::vector<RankPosition> local;  // this node's ranks' positions
  std::vector<int> local_ranks;     // this node's ranks
  int world_size = 0;               // the job's ranks
  bool several_nodes = false;       // the round has other nodes: their summaries are read
  // Python workers before their first collective have no ring yet: no position at all is no
  // news then (said at debug level), their stacks judge.
  bool python_workers = false;
  std::map<int, RemoteStack> known_stacks;  // other nodes' frames known already (the first holds)
  std::vector<int> known_remote_culprits;   // ranks of other nodes blamed already
  // The other nodes' summaries, asked for only when the round has other nodes.
  std::function<const std::vector<std::string>&()> others;
};

struct RingJudgement {
  std::vector<std::pair<spdlog::level::level_enum, std::string>> log;  // lines to log, in order
  std::optional<HangVerdict> verdict;                                  // none: the rings show no hang
  std::map<int, RemoteStack> remote_stacks;    // the frames the other nodes sent, by rank (the first node's)
  std::vector<WorkerFailure> remote_culprits;  // culprits on other nodes with known frames (time unset)
};

RingJudgement judgeRings(const std::string& trigger, RingCase c);

}  // namespace ddprun::agent
