// Python tracebacks across nodes: what one node's agent tells the node that judges a hang about
// where its Python ranks stand, through the agents' hang-summary exchange
// (rendezvous/board/job_board.h), beside its ranks' ring positions (agent/hang/rings/hang_verdict.h), so
// that the judging node names a culprit of another node with its Python frame. A third kind of
// line, each starting "py1 ":
//   py1 r <rank> <local rank> <node>   a rank's traceback follows
//   py1 s <rank> <line>                one line of it (python_stacks.h's formatTraceback), innermost last
// Strings are escaped as the "fr1" lines' are (agent/torch_trace/dump_summary.h). A rank
// sends at most kMaxStackLines lines (its innermost), a node at most kMaxStackSummaryBytes.
// Agents of older versions skip these lines.
//
// Pure functions over plain data; never throw beyond std::bad_alloc.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "agent/torch_trace/dump_summary.h"

namespace ddprun::agent {

struct LocalStack {
  int rank = 0;
  int local_rank = 0;
  std::string traceback;  // formatTraceback's lines; empty: none taken
};

// The "py1" lines of `stacks` (those with a traceback), within `max_bytes`: ranks that do not
// fit are left out.
std::string encodeStackSummary(const std::string& node, const std::vector<LocalStack>& stacks,
                               size_t max_bytes = kMaxStackSummaryBytes);

struct RemoteStack {
  std::string node;
  int local_rank = 0;
  std::string traceback;  // its lines, each ending '\n'
};

// The tracebacks in another node's summary (its other lines are ignored). A rank outside
// 0..world_size-1, one of `local_ranks`, sent twice, or with more than kMaxStackLines lines
// is rejected: a summary is any store value, and a worker can write one. `rejected` counts the
// "py1" lines dropped.
struct RemoteStacks {
  std::map<int, RemoteStack> ranks;
  size_t rejected = 0;
};
RemoteStacks decodeStackSummary(std::string_view summary, int world_size, const std::vector<int>& local_ranks);

// Whether a summary's line is one of these (decodeSummary of hang_verdict.h skips them).
bool isStackSummaryLine(std::string_view line);

}  // namespace ddprun::agent
