// The hang verdict from torch flight-recorder dumps, one per rank (flight_dump.h): per
// process group, the first operation where the ranks part ways, and each rank's standing
// there, e.g.
//   hang: rank 1 has not called all_reduce #2 of group 0 (default_pg); rank 0 has waited in it for 10.0 s — rank 1 is
//   behind
//     rank 0: waiting in all_reduce #2 (started), called at /job/train.py:14 in main
//     rank 1: behind, last called all_reduce #1 (completed) at /job/train.py:12 in main
// Collectives are matched by their collective_seq_id within the group: the first one that
// some rank never entered (behind), entered with another op, sizes or dtypes (mismatch), or
// that is still pending. Point-to-point operations carry no shared number (p2p_seq_id counts
// each rank's own), so the k-th send from rank a to rank b is matched with the k-th recv at
// b from a, as NCCL orders them. A rank whose matching operation completed, or that the
// caller knows finished, is done. torch's analyzer (torch.distributed.flight_recorder)
// matches the same way, with more cases for coalesced and all-to-all operations; here a
// coalesced batch is one operation, compared by its op, sizes and dtypes.
//
// Pure functions over plain data (no clock, no I/O): the agent feeds them the dumps it
// gathered, `ddprun hang-report` the files of a directory.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "agent/torch_trace/flight_dump.h"

namespace ddprun::agent {

enum class RankStanding {
  kWaiting,   // inside the operation where the group stopped, as the others called it
  kBehind,    // never entered it
  kMismatch,  // entered another op there, or the same op with other sizes or dtypes
  kDone,      // completed it, or finished (options.finished_ranks)
  kUnknown,   // no dump, or its dump no longer reaches back to that operation
};
const char* rankStandingName(RankStanding standing);  // "waiting", "behind", ...

struct RankStand {
  int rank = 0;
  RankStanding standing = RankStanding::kUnknown;
  std::string doing;                     // "waiting in all_reduce #2 (started)"
  std::optional<FlightFrame> call_site;  // of the operation `doing` names
};

// One place where a group's ranks part ways.
struct GroupFinding {
  std::string group;          // "group 0 (default_pg)"
  bool p2p = false;           // from point-to-point operations, not collectives
  std::string line;           // the "hang: ..." sentence
  std::vector<int> culprits;  // ascending: behind or mismatched (none when all just wait)
  std::vector<RankStand> ranks;
};

struct DumpVerdict {
  std::vector<GroupFinding> findings;  // groups in order of first appearance; empty: no hang
  // The ranks to blame, ascending. With findings in several groups, a culprit that itself
  // waits in another group's operation only passes the hang on: the others are kept, when
  // there are any.
  std::vector<int> culprits;
  size_t ranks = 0;   // dumps read
  size_t groups = 0;  // process groups seen
  // Every finding's line with its ranks' lines under it, then (several findings) the root
  // cause; or one "no hang" line.
  std::string text() const;
};

struct DumpVerdictOptions {
  // CLOCK_REALTIME nanoseconds when the dumps were taken (the entries' clock), for "has waited
  // in it for 10.0 s"; unset: the wait is not given.
  std::optional<int64_t> now_ns;
  // Ranks known to have exited normally: done where they would be behind.
  std::vector<int> finished_ranks;
};

// The verdict over `dumps` (any order, one per rank; a rank without one is unknown where it
// matters). Never throws beyond std::bad_alloc; cost linear in the entries, up to log factors.
DumpVerdict dumpVerdict(const std::vector<FlightDump>& dumps, const DumpVerdictOptions& options = {});

}  // namespace ddprun::agent
