// The hang verdict from torch's flight-recorder dumps across the nodes of a job, as one
// function from what a node holds to a judgement: this node's ranks' dumps (or live traces,
// agent/hang/python/live_traces.h), the other nodes' hang summaries
// (agent/hang/nodes/node_summaries.h) when the job spans more than this node, and the ranks
// that finished. It judges only when every rank of the job has a dump that reads; otherwise
// it says which ranks had none, and the Python stacks judge instead. A culprit of another
// node becomes a failure of this node's report, with its host, local rank, standing and frames.
// What it would log comes back with it, in order, so that the caller logs it and tests read it.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <spdlog/common.h>

#include "agent/hang/python/live_traces.h"
#include "agent/hang/python/stack_summary.h"
#include "agent/ops/failure_report.h"

namespace ddprun::agent {

struct DumpCase {
  NodeDumps local;                      // this node's ranks' dumps, those missing, those unreadable
  std::chrono::milliseconds waited{0};  // how long this node waited for its dump files
  std::vector<int> local_ranks;         // this node's ranks
  std::vector<int> finished_ranks;      // this node's ranks that exited normally
  std::optional<int64_t> now_ns;        // the dumps' time (DumpVerdictOptions::now_ns)
  int world_size = 0;                   // the job's ranks; 0: no round
  // The other nodes' summaries, asked for only when the job has ranks elsewhere and this
  // node's own dumps all read.
  std::function<const std::vector<std::string>&()> others;
};

struct DumpJudgement {
  std::vector<std::pair<spdlog::level::level_enum, std::string>> log;  // lines to log, in order
  std::vector<int> culprits;                                           // none: no verdict (the Python stacks judge)
  std::string text;       // the verdict, a line for each group's finding (the log's and the event's)
  std::string sentences;  // the report's reason: the findings' lines, then the root cause
  // The culprits on other nodes, as failures of this node's report (time unset).
  std::vector<WorkerFailure> remote_culprits;
  // Every Python frame the other nodes sent, by rank (the first node's, for a rank two claim).
  std::map<int, RemoteStack> remote_stacks;
};

DumpJudgement judgeDumps(const std::string& trigger, DumpCase c);

// A rank of another node that a verdict blames, as a failure of this node's report: its node
// and local rank, `reason` and where it stands (`elsewhere`), its frames as its node sent them
// (a worker's text: shown escaped, a line at a time). Time unset.
WorkerFailure remoteFailure(int rank, const std::string& node, int local_rank, const std::string& frames,
                            const std::string& reason, const std::string& elsewhere);

}  // namespace ddprun::agent
