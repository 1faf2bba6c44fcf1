// What an operator can learn about a running job from its rendezvous store: every agent
// publishes one record (its state, its place in the current round, its restarts and the
// time of its last heartbeat) under rdzv/<run_id>/agents/<node>, and the names of all
// agents that ever joined under rdzv/<run_id>/agents. `ddprun status` reads these and the
// current round's keys; the layout is in rendezvous/PROTOCOL.md ("Job status").
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "rendezvous/store/store.h"

namespace ddprun::rendezvous {

// One agent's published record. Times are wall-clock milliseconds since the epoch, so a
// reader on another host can compare them (up to the hosts' clock skew).
struct AgentRecord {
  std::string node;                // host:pid, the node's name in end reasons.
  std::string address;             // the address it advertises to the rendezvous.
  std::string state;               // joining, running, succeeded, cooldown, stopping, exited.
  int round = -1;                  // the last round it took part in; -1 before the first.
  int group_rank = -1;             // its GROUP_RANK in that round.
  int rank_base = 0;               // RANK of its local rank 0 in that round.
  int nproc = 0;                   // its --nproc_per_node.
  int restarts = 0;                // TORCHELASTIC_RESTART_COUNT of its current workers.
  int max_restarts = 0;            // its --max_restarts.
  int64_t heartbeat_ms = 0;        // when it last refreshed this record.
  int64_t keep_alive_ms = 0;       // its keep-alive interval: how often the record is refreshed.
  int keep_alive_max_attempt = 0;  // missed refreshes after which it counts as lost.
  int consecutive_failures = 0;    // rounds in a row that ended because its workers failed.
  int64_t cooldown_until_ms = 0;   // while state is cooldown: when it will rejoin.
  int exit_code = -1;              // once state is exited: ddprun's exit code.
  // Each local worker's DDPRUN_GENERATION (by local rank; empty before its workers start):
  // above 0 for a worker that replaced a failed one alone (--recovery=in-job, docs/recovery.md).
  std::vector<int> generations;
};

// "v2|node|address|state|...|generations" (no field may contain '|'; generations
// comma-separated). decode also reads v1, an older agent's record without generations, and
// throws RendezvousError on a malformed or unknown-version record.
std::string encodeAgentRecord(const AgentRecord& record);
AgentRecord decodeAgentRecord(const std::string& text);

// Keys, relative to the job's prefix rdzv/<run_id>/.
inline std::string agentsListKey() { return "agents"; }
inline std::string agentRecordKey(const std::string& node) { return "agents/" + node; }

int64_t wallClockMillis();

struct JobStatus {
  std::string run_id;
  std::string store;                // host:port that answered.
  int round = -1;                   // the latest round; -1 when no round was ever started.
  std::string round_state;          // forming, running, ended.
  std::string end_reason;           // when round_state is ended.
  int nodes_in_round = 0;           // once the round closed.
  int world_size = 0;               // once the round closed.
  int restarts = 0;                 // job-wide restarts used by the latest round.
  int max_restarts = 0;             // from the agents' records (the largest).
  int64_t now_ms = 0;               // the reader's clock when it read the store.
  std::vector<AgentRecord> agents;  // in order of first arrival.
};

// A node counts as lost when its record has not been refreshed for longer than its
// keep-alive interval times (max attempts + 1) while it claims to be alive.
bool agentLost(const AgentRecord& record, int64_t now_ms);

// Reads the job's status through `store` (keys under rdzv/<run_id>/). Blocks for a few
// store round trips (the store's timeout each). Throws RendezvousError when no agent of
// that job ever published a record there, StoreError when the store fails.
JobStatus readJobStatus(Store& store, const std::string& run_id);

}  // namespace ddprun::rendezvous
