// What a node brings to the rendezvous and what it gets back. Plain structs; every
// field documents its default (the torchrun default where torchrun has one).
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>

namespace ddprun::rendezvous {

struct RendezvousConfig {
  std::string backend = "static";        // "static" or "c10d".
  std::string endpoint;                  // host[:port]; empty means none given.
  std::string run_id = "none";           // --rdzv_id; also TORCHELASTIC_RUN_ID.
  int min_nodes = 1;                     // --nnodes MIN (or N).
  int max_nodes = 1;                     // --nnodes MAX (or N).
  int node_rank = 0;                     // --node_rank (static backend).
  std::string master_addr = "127.0.0.1"; // --master_addr.
  std::optional<int> master_port;        // --master_port; unset means pick a free one.
  std::string local_addr;                // --local_addr; empty means this host's name.
  bool standalone = false;               // --standalone.
  std::map<std::string, std::string> conf;  // --rdzv_conf key=value pairs.
};

// The job as one node sees it after a round of rendezvous.
struct RendezvousResult {
  int group_rank = 0;            // this node's rank among nodes (GROUP_RANK).
  int group_world_size = 1;      // number of nodes in the job (GROUP_WORLD_SIZE).
  std::string master_addr;       // MASTER_ADDR for the workers.
  int master_port = 0;           // MASTER_PORT for the workers.
  bool use_agent_store = false;  // TORCHELASTIC_USE_AGENT_STORE.
};

}  // namespace ddprun::rendezvous
