// torch's flight-recorder dumps across nodes: what one node's agent tells the node that judges
// a collective failure about its ranks' dumps, through the agents' hang-summary exchange
// (rendezvous/board/job_board.h), so that dumpVerdict covers every rank of the job. A second kind of
// line beside the ring positions of agent/hang/rings/hang_verdict.h ("v2 ..."), each starting "fr1 ":
//   fr1 n <node>                                        the node that answers
//   fr1 d <rank> <local rank> <truncated> <finished>    a rank's dump follows
//   fr1 g <rank> <group name> <desc> <ranks>            a group it is in (ranks as "0-7,9")
//   fr1 e <rank> <group name> <desc> <collective seq> <p2p seq> <is p2p> <op> <p2p src> <p2p dst>
//         <state> <created ns> <started ns|-> <completed ns|-> <timeout ms> <input sizes>
//         <input dtypes> <output sizes> <output dtypes> <file> <line> <function>
//   fr1 s <rank> <line>                                 a line of its Python traceback, taken
//                                                       before anyone was stopped
// Strings are escaped (%XX for spaces, '%', ',' and control bytes; "-" is the empty string),
// sizes are "[[8],[4,4]]", dtypes "Float,Int" ("-": none). Per group a rank sends its entries
// around its last completed collective (a few before, a few after: where the ranks part ways is
// at most the first one not completed), and its newest entry; each entry with its call site
// only (callSite). A dump cut so is marked truncated, as torch's own ring marks one that
// overwrote its oldest entries. The dumps stay within a byte budget: fewer entries per group
// first, then fewer ranks; the tracebacks (their innermost lines) within one of their own.
// Agents of older versions skip these lines.
//
// Pure functions over plain data; never throw beyond std::bad_alloc.
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "agent/torch_trace/flight_dump.h"

namespace ddprun::agent {

// The most bytes of dump lines one node's summary holds, and of traceback lines beside them
// (its ring positions stay under job_board.cc's cap beside both).
inline constexpr size_t kMaxDumpSummaryBytes = 448 * 1024;
inline constexpr size_t kMaxStackSummaryBytes = 96 * 1024;
// The most lines of one rank's traceback sent (its innermost).
inline constexpr size_t kMaxStackLines = 16;

// What a node knows of one of its ranks' dumps.
struct LocalDump {
  FlightDump dump;
  int local_rank = 0;
  bool finished = false;  // the worker exited normally
  // Its Python main thread's traceback (python_stacks.h's formatTraceback), taken before
  // anyone was stopped; empty: none.
  std::string python_stack;
};

// `dump` with, per group, only the entries from `before` ahead of its last completed
// collective (the first entry when none completed) through `after` past it, and its newest
// entry overall; frames cut to the call site. Marked truncated when an entry was left out.
FlightDump compactDump(const FlightDump& dump, size_t before, size_t after);

// The "fr1" lines for `dumps`, within `max_bytes` (at least the node line; ranks that do not
// fit even at the fewest entries are left out, and the judging node names them), then the
// tracebacks of the ranks sent, at most kMaxStackLines each, within `max_stack_bytes`.
std::string encodeDumpSummary(const std::string& node, const std::vector<LocalDump>& dumps,
                              size_t max_bytes = kMaxDumpSummaryBytes, size_t max_stack_bytes = kMaxStackSummaryBytes);

// A rank of another node, as its summary told.
struct RemoteRank {
  std::string node;
  int local_rank = 0;
};

struct RemoteDumps {
  std::vector<FlightDump> dumps;  // by rank, ascending
  std::vector<int> finished_ranks;
  std::map<int, RemoteRank> ranks;           // of the dumps
  std::map<int, std::string> python_stacks;  // of the ranks that sent one, a line each
  size_t rejected = 0;                       // "fr1" lines dropped: malformed, or a rank this job cannot hold
};

// The dumps in another node's summary (its other lines are ignored). A rank outside
// 0..world_size-1, one of `local_ranks` (this node reads those itself), or sent twice is
// rejected with its lines: a summary is any store value, and a worker can write one.
RemoteDumps decodeDumpSummary(std::string_view summary, int world_size, const std::vector<int>& local_ranks);

// Whether a summary's line is one of these (decodeSummary of hang_verdict.h skips them).
bool isDumpSummaryLine(std::string_view line);

// The lines' escaping of one string as one token (%XX for spaces, '%', ',' and control bytes;
// "-" is the empty string), and back (nullopt when malformed); the "py1" lines
// (agent/hang/python/stack_summary.h) use it too.
std::string escapeSummaryText(std::string_view text);
std::optional<std::string> unescapeSummaryText(std::string_view token);

}  // namespace ddprun::agent
