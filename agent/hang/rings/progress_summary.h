// What a node's agent publishes on the job's store about its ranks' collectives while they
// run (agent/progress_watch.h), for the other nodes' agents (stragglers) and `ddprun status`
// (lags, and --trace's current collectives): one text value a node, and the medians that
// the round's first node computes over all of them. Keys and bounds: rendezvous/PROTOCOL.md
// ("Progress").
//
//   dp1 <unix_ms> <threshold_ms>                               the header: when, and the node's --straggler_threshold
//   s <rank> <group> <last_seq> <collectives> <mean_wait_us>   a RankProgress (straggler.h)
//   v2 c ...                                                   a collective RankPosition (hang_verdict.h
//   encodePosition)
//   t <rank> <group> <seq> <op> <state> <age_ms>               a TracePosition (trace_position.h): a rank's
//                                                              current collective from torch's live trace
//
//   dm1 <unix_ms>                                              the medians' header
//   m <group> <median_wait_us> <ranks>                         a GroupMedian
//
// The header stays dp1 as lines of new kinds come: a decoder leaves out (and counts) the lines it
// does not know, so an older status or agent reads a newer value, and a value without them
// reads as before.
//
// Anyone who can write to the store can write these values, so the decoders take nothing on
// trust: every number is range-checked, ranks must lie within the world, each (rank, group)
// counts once, entries are capped, and a value over its byte bound is refused whole.
// Pure; never throws (beyond std::bad_alloc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "agent/hang/rings/hang_verdict.h"
#include "agent/hang/rings/straggler.h"
#include "agent/hang/rings/trace_position.h"

namespace ddprun::agent {

// The most entries of each kind (progress lines, positions, trace positions) one node's value holds: a
// node's few hundred ranks times their groups, at most.
inline constexpr size_t kMaxProgressEntries = 512;
// The most bytes of one node's value (about 110 KiB at kMaxProgressEntries progress lines and
// positions); the encoder leaves out what would go past it (trace positions, written last,
// first), the decoder refuses a longer value.
inline constexpr size_t kMaxProgressBytes = 128 * 1024;
// The most groups the medians' value holds (and bytes: about 40 a line).
inline constexpr size_t kMaxMedianGroups = 256;
inline constexpr size_t kMaxMediansBytes = 16 * 1024;

struct NodeProgress {
  int64_t unix_ms = 0;                  // wall clock when the node read its rings
  double threshold_s = 0;               // its --straggler_threshold (0: off)
  std::vector<RankProgress> ranks;      // its ranks' progress, per group
  std::vector<RankPosition> positions;  // its ranks' collective positions, per group
  // Its ranks' current collectives from torch's live trace, per group (ranks whose worker
  // serves one: agent/hang/python/live_positions.h); their rings' positions stay in `positions`.
  std::vector<TracePosition> traces;
};

// The value, at most kMaxProgressBytes and kMaxProgressEntries of each kind (the first ones).
std::string encodeNodeProgress(const NodeProgress& progress);

struct DecodedProgress {
  NodeProgress progress;
  size_t rejected = 0;  // lines left out: malformed, out of range, repeated, past the caps
};
// nullopt when `text` is not such a value (no "dp1" header, longer than kMaxProgressBytes).
// Ranks and group ranks must lie in 0..world_size-1; only collective positions are kept; each
// (rank, group) once per kind.
std::optional<DecodedProgress> decodeNodeProgress(std::string_view text, int world_size);

struct JobMedians {
  int64_t unix_ms = 0;
  std::vector<GroupMedian> groups;
};
std::string encodeJobMedians(const JobMedians& medians);
// nullopt when not such a value or longer than kMaxMediansBytes; bad lines are left out.
std::optional<JobMedians> decodeJobMedians(std::string_view text);

}  // namespace ddprun::agent
