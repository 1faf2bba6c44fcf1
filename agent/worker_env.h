// torchrun's environment contract: the variables each worker gets, computed from the
// agent config, the rendezvous result and the worker's place in the group.
#pragma once

#include <map>
#include <string>

#include "agent/agent_config.h"
#include "rendezvous/rendezvous_config.h"

namespace ddprun::agent {

struct WorkerPlace {
  int local_rank = 0;
  int rank = 0;              // global rank over all nodes.
  int world_size = 1;
  int local_world_size = 1;
  int role_rank = 0;
  int role_world_size = 1;
};

// Places of this node's workers: RANK is contiguous per node, starting at the prefix sum
// of the local world sizes of the nodes before it (rdzv.rank_base).
std::vector<WorkerPlace> assignPlaces(int nproc_per_node, const rendezvous::RendezvousResult& rdzv);

// Returns `base` (the agent's own environment) with the contract variables set.
// OMP_NUM_THREADS=1 and the NCCL async error flags are added only when `base` lacks them.
std::map<std::string, std::string> workerEnvironment(std::map<std::string, std::string> base,
                                                     const AgentConfig& config,
                                                     const rendezvous::RendezvousResult& rdzv,
                                                     const WorkerPlace& place, const std::string& error_file);

// True when the agent will set OMP_NUM_THREADS itself (and should say so once).
bool setsOmpNumThreads(const std::map<std::string, std::string>& base, int nproc_per_node);

// The calling process's environment as a map.
std::map<std::string, std::string> currentEnvironment();

}  // namespace ddprun::agent
