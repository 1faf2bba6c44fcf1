// What a node brings to the rendezvous and what it gets back. Plain structs; every
// field documents its default (the torchrun default where torchrun has one).
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ddprun::rendezvous {

struct RendezvousConfig {
  std::string backend = "static";           // "static" or "c10d".
  std::string endpoint;                     // host[:port]; empty means none given.
  std::string run_id = "none";              // --rdzv_id; also TORCHELASTIC_RUN_ID.
  int min_nodes = 1;                        // --nnodes MIN (or N).
  int max_nodes = 1;                        // --nnodes MAX (or N).
  int node_rank = 0;                        // --node_rank (static backend).
  std::string master_addr = "127.0.0.1";    // --master_addr.
  std::optional<int> master_port;           // --master_port; unset means pick a free one.
  std::string local_addr;                   // --local_addr; empty means this host's name.
  bool standalone = false;                  // --standalone.
  std::map<std::string, std::string> conf;  // --rdzv_conf key=value pairs.
};

// --rdzv_conf, parsed: torchrun's keys plus ddprun's. Durations in the conf are seconds.
// store_type is checked but not kept: tcp is the only store ddprun has.
struct RendezvousSettings {
  std::chrono::milliseconds join_timeout{600000};       // join_timeout (alias: timeout): a round must form.
  std::chrono::milliseconds last_call_timeout{30000};   // last_call_timeout: wait after MIN nodes joined.
  std::chrono::milliseconds close_timeout{30000};       // close_timeout: wait for peers when the job ends.
  std::chrono::milliseconds read_timeout{60000};        // read_timeout: one store operation.
  std::chrono::milliseconds keep_alive_interval{5000};  // keep_alive_interval.
  int keep_alive_max_attempt = 3;                       // keep_alive_max_attempt: misses before eviction.
  // heartbeat_timeout (torch's name): one keep-alive store operation; unset: read_timeout.
  std::optional<std::chrono::milliseconds> heartbeat_timeout;
  std::optional<bool> is_host;            // is_host: unset = decide from the endpoint.
  std::string token_file;                 // token_file (DDPRUN_TOKEN wins).
  std::vector<std::string> unknown_keys;  // passed through by torchrun; we warn.
};

// Parses config.conf. Throws UsageError naming the key for a bad value.
RendezvousSettings parseRendezvousSettings(const std::map<std::string, std::string>& conf);

// The job as one node sees it after a round of rendezvous.
struct RendezvousResult {
  int round = 0;                 // rendezvous round; every re-formation starts a new one.
  int group_rank = 0;            // this node's rank among nodes (GROUP_RANK).
  int group_world_size = 1;      // number of nodes in the job (GROUP_WORLD_SIZE).
  int rank_base = 0;             // RANK of this node's local rank 0.
  int world_size = 1;            // WORLD_SIZE: all workers of all nodes.
  int restart_count = 0;         // TORCHELASTIC_RESTART_COUNT: job-wide restarts after failures.
  std::string master_addr;       // MASTER_ADDR for the workers.
  int master_port = 0;           // MASTER_PORT for the workers.
  bool use_agent_store = false;  // TORCHELASTIC_USE_AGENT_STORE.
  // The RPC peers' secret for this round (worker_runtime/rpc/auth.h), handed to the
  // workers in a 0600 file; empty when it could only travel through the open store.
  std::string rpc_secret;
};

}  // namespace ddprun::rendezvous
