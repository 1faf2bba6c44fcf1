// A rank's current collective in one process group as torch's flight recorder shows it (the
// live trace a worker's torch worker server serves: agent/hang/python/live_positions.h), as
// the node's published progress carries it (progress_summary.h) to `ddprun status --trace`.
// It stands beside the rings' RankPosition (hang_verdict.h) rather than in it: torch names its
// operations in words ddprun's FlightOp does not have ("_allgather_base", "coalesced") and
// keeps no ring record of its own, so a row is its few shown fields only.
//
//   t <rank> <group> <seq> <op> <state> <age_ms>
//
// One line of the node's value. An agent before this line's time reads it as a malformed line
// and leaves it out (progress_summary.cc counts it rejected), so an older `ddprun status`
// shows the rings' rows it shows today. Pure; never throws (beyond std::bad_alloc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace ddprun::agent {

// Where the trace's current collective stands: kPending (enqueued, not seen started),
// kStarted, kFailed (not completed past the entry's own timeout_ms: torch's watchdog has
// given up on it), kCompleted (nothing pending: the last one completed).
enum class TraceState { kPending, kStarted, kFailed, kCompleted };
// "pending", "started", "failed", "completed": the words `status --trace` shows for the rings too.
const char* traceStateName(TraceState state);

// The longest op name a row keeps; longer ones are cut (torch's are at most about 40).
inline constexpr size_t kMaxTraceOpChars = 48;

struct TracePosition {
  int rank = 0;      // global rank
  int group = 0;     // torch's process group: its name when a number ("0": the default group), else its id
  uint64_t seq = 0;  // the collective's collective_seq_id in that group
  std::string op;    // "all_reduce", "_allgather_base", "coalesced": only [A-Za-z0-9_] (traceOpName)
  TraceState state = TraceState::kPending;
  double age_s = 0;  // since it started (or was enqueued, or completed), as of the reading
};

// `raw` as a row keeps it: each character outside [A-Za-z0-9_] as '_', at most
// kMaxTraceOpChars, "unknown" when empty. The store's text never reaches a terminal otherwise.
std::string traceOpName(std::string_view raw);

// The line above (no newline), and back: nullopt for anything else than exactly such a line
// with numbers in range (a rank and group at least 0, an age within about 11 days), a known
// state and an op of traceOpName's characters.
std::string encodeTracePosition(const TracePosition& p);
std::optional<TracePosition> decodeTracePosition(std::string_view line);

}  // namespace ddprun::agent
