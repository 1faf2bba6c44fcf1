// The hang verdict: from where every rank of a process group stands in its flight
// recorder (common/flight_ring.h), one line that says who is behind or who called
// something else, e.g.
//   hang: rank 5 is at all_reduce #1204 (started 312 s ago); ranks 0-4,6-7 wait in all_reduce #1205 — rank 5 is behind
//   hang: rank 3 called broadcast where the others called all_reduce (#88)
// and, for ranks waiting in a point-to-point message (whose ring numbers them apart from
// the collectives), a line of its own per group, e.g.
//   hang: rank 0 waits in recv from rank 1 (#3, started 30 s ago) while rank 1 has no operation pending — rank 1 is
//   behind
// Pure functions over plain data (no clock, no I/O), so that the agent can feed them its
// local rings and the summaries other nodes' agents publish through the store.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/flight_ring.h"

namespace ddprun::agent {

// Where one rank stands in one group's collectives or in its point-to-point messages:
// enough to judge a hang, small enough for the store.
struct RankPosition {
  FlightRingKind kind = FlightRingKind::kCollective;  // which of the group's rings
  int rank = 0;                                       // global rank
  int group = 0;                                      // 0: the default group
  int group_rank = 0;                                 // in the group (a message's peer is one)
  uint64_t last_completed_seq = 0;
  FlightOp last_completed_op = FlightOp::kUnknown;
  double last_completed_age_s = -1;  // seconds since it completed; -1: none completed
  // Collectives: the oldest operation not completed (enqueued, started or failed); none when
  // idle. Messages, which complete in any order: the oldest one enqueued or started, else the
  // newest failed one when nothing completed after it.
  std::optional<FlightRecord> pending;
  double pending_age_s = 0;  // seconds since it started (or was enqueued, when not started)
};

// A rank's position from its ring read at `now_ns` (steady clock of the same host). For a
// point-to-point ring the last completed is the message that completed last.
RankPosition positionOf(const FlightRingSnapshot& ring, int64_t now_ns);

// Whether the group is hung by --hang_timeout's rule: some rank has had an operation
// pending for at least `timeout_s` seconds and no rank has completed one for that long (a
// rank that has never completed one counts from when its oldest pending operation was
// enqueued). Collectives and messages count alike. A slow job that keeps completing
// operations is never hung, nor one whose ranks compute, with nothing pending, for longer.
bool noProgressFor(const std::vector<RankPosition>& ranks, double timeout_s);

// A verdict: its line, and the ranks it blames (the ones behind, or the ones that called
// something else), which the failure report then puts first; none when no rank here is behind.
struct HangVerdict {
  std::string text;
  std::vector<int> culprits;  // ascending
};

// The verdict over the ranks of every group, or nullopt when nothing is pending anywhere
// (no rank waits for another). "rank 0-4,6-7" lists ranks as ranges. Per group, the line of
// its collectives, then the line of its messages: for each rank with one pending, where it
// waits and for whom, and where that peer is when it is idle or in a collective (then it
// is behind, unless the waiting rank has not called that collective: they wait for each
// other).
std::optional<HangVerdict> hangVerdict(const std::vector<RankPosition>& ranks);

// Whether a worker's error message says a collective timed out, in the words of ddprun's
// runtime ("timed out"), gloo ("Timed out waiting 3000ms for recv operation") or NCCL's
// watchdog ("collective operation timeout"): such a failure is a hang seen from inside.
bool reportsCollectiveTimeout(std::string_view message);

// "0-4,6-7".
std::string rankRanges(std::vector<int> ranks);

// One rank's position as one store value ("v2 kind rank group ... [pending ...]"), and back
// (nullopt when malformed, of another version, or with anything left over). Other nodes'
// agents publish these under a round-scoped key.
std::string encodePosition(const RankPosition& p);
std::optional<RankPosition> decodePosition(const std::string& text);

// The most positions one node's summary may hold: a node runs at most a few hundred ranks,
// each with a collective and a message ring per group.
inline constexpr size_t kMaxSummaryPositions = 4096;

// The positions of another node's hang summary (one encoded position a line) that can be
// true in this job: a rank and group rank within 0..world_size-1, not one of `local_ranks`
// (this node knows those itself), the first of each (kind, group, rank) only, and at most
// kMaxSummaryPositions. Lines starting "fr" (torch's dumps, agent/torch_trace/dump_summary.h) or "py"
// (Python tracebacks, agent/hang/python/stack_summary.h)
// are skipped, not rejected. A summary is any store value, and a worker can write one: a forged
// one once made the verdict blame ranks 4242 and 4243 of a 2-rank job in 20,000 lines.
// `rejected` counts the lines dropped (malformed ones included). Pure; never throws.
struct SummaryPositions {
  std::vector<RankPosition> positions;
  size_t rejected = 0;
};
SummaryPositions decodeSummary(std::string_view summary, int world_size, const std::vector<int>& local_ranks);

}  // namespace ddprun::agent
