// `ddprun status`: what a running job looks like, read from its rendezvous store: every
// node with its state, group rank, ranks, restarts and last heartbeat, the current round
// and the restarts used, as a short table or (--json) one JSON object for scripts. The
// job is named by --rdzv_endpoint and --rdzv_id, or found through the events file an
// agent wrote under --log_dir. Under the nodes, each rank's lag at the collectives and the
// stragglers, from the progress the agents publish (agent/progress_watch.h); with --trace,
// every rank's current collective (group, sequence number, op, state, age) instead. With
// --stacks (and --log_dir) it prints instead the native stacks of that agent's running
// workers (launcher/worker_stacks.h).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "agent/hang/rings/progress_summary.h"
#include "rendezvous/board/job_status.h"
#include "rendezvous/store/store.h"

namespace ddprun::launcher {

// True when argv names the status subcommand (argv[1] == "status").
bool isStatusCommand(int argc, const char* const* argv);

// Prints the job's status to stdout. Returns the exit code: 0 when the status was read.
// Blocks for a few store round trips (connect: up to 5 s). Throws UsageError for bad
// flags or a log directory without an agent's events file, RendezvousError when the store
// cannot be reached or knows no such job.
int runStatusCommand(int argc, const char* const* argv);

// The widest a cell of the status table gets, in characters: a longer node name, address,
// state or end reason (a record anyone who can write to the store may forge) shows as its
// first 61 characters and "...". A table is then at most about 9 x 66 columns wide.
inline constexpr size_t kStatusCellColumns = 64;

// The table and the JSON object printed for `status` (exposed for tests). The table shows the
// store's text escaped (common/text_escape.h) and cut to kStatusCellColumns; the JSON object
// holds it whole, JSON-escaped.
std::string formatStatusTable(const rendezvous::JobStatus& status);
std::string formatStatusJson(const rendezvous::JobStatus& status);

// The progress the current round's nodes published (agent/hang/rings/progress_summary.h), decoded
// and bounded: at most kMaxProgressBytes a node and kMaxStatusProgressBytes in all.
inline constexpr size_t kMaxStatusProgressBytes = size_t{64} << 20;
struct JobProgress {
  struct Node {
    int group_rank = 0;
    agent::NodeProgress progress;
  };
  std::vector<Node> nodes;  // ascending by group rank
  size_t rejected = 0;      // lines (or whole values) left out as malformed or out of range
};
// Reads it through `store` for `status`'s round (none before a round runs). Blocks for a few
// store round trips; throws StoreError.
JobProgress readJobProgress(rendezvous::Store& store, const rendezvous::JobStatus& status);
// Under the table: each rank's lag and the stragglers (by the threshold the round's first node
// published); with `trace`, each rank's current collective instead, and whether it comes from
// torch's live trace or ddprun's ring. Numbers and op names of [A-Za-z0-9_] only: nothing else
// of the store's text reaches the terminal.
std::string formatProgressTable(const rendezvous::JobStatus& status, const JobProgress& progress, bool trace);
// formatStatusJson's object with the same as members: "straggler_threshold_s", "stragglers"
// and "ranks" (each rank's lag), and with `trace` "trace" (each rank's current collective).
std::string formatStatusJson(const rendezvous::JobStatus& status, const JobProgress& progress, bool trace);

// The store address and run id in the agent_start event of an events file (the most
// recently written one when `dir` holds several run directories). Throws UsageError.
struct JobLocation {
  std::string endpoint;
  std::string run_id;
};
JobLocation locateJobFromLogDir(const std::string& dir);

// The last hang verdict in an events file ("attempt 0: hang: rank 1 is behind ..."), shown under
// the table when the job was found through --log_dir; nothing when there is none or the file
// cannot be read. Never throws.
std::optional<std::string> lastHangVerdict(const std::string& events_file);

// The events file of an agent in `dir` (a run directory, or a --log_dir holding several:
// the most recently written one). Throws UsageError when there is none.
std::string newestEventsFile(const std::string& dir);

}  // namespace ddprun::launcher
