// torchrun's environment contract: the variables each worker gets, computed from the
// agent config, the rendezvous result and the worker's place in the group.
#pragma once

#include <map>
#include <optional>
#include <string>

#include "agent/agent_config.h"
#include "rendezvous/rounds/rendezvous_config.h"

namespace ddprun::agent {

struct WorkerPlace {
  int local_rank = 0;
  int rank = 0;  // global rank over all nodes.
  int world_size = 1;
  int local_world_size = 1;
  int role_rank = 0;
  int role_world_size = 1;
};

// Places of this node's workers: RANK is contiguous per node, starting at the prefix sum
// of the local world sizes of the nodes before it (rdzv.rank_base).
std::vector<WorkerPlace> assignPlaces(int nproc_per_node, const rendezvous::RendezvousResult& rdzv);

// --virtual_local_rank: the CUDA_VISIBLE_DEVICES value of the worker at `local_rank`. Entry
// number local_rank of the agent's own list (`inherited`, split at commas, blanks trimmed),
// or the index itself when the agent has no list. Nothing when the list is too short.
std::optional<std::string> virtualDevice(const std::optional<std::string>& inherited, int local_rank);

// Returns `base` (the agent's own environment) with the contract variables set.
// OMP_NUM_THREADS=1 and the NCCL async error flags are added only when `base` lacks them.
// PYTHONFAULTHANDLER=1 is added for Python workers (config.python_workers) unless
// config.python_faulthandler is off or `base` has it.
// With config.virtual_local_rank, LOCAL_RANK is 0 and CUDA_VISIBLE_DEVICES is virtualDevice()
// (the launcher has checked that one exists for every local rank).
// DDPRUN_RECOVERY is config.recovery's name and DDPRUN_GENERATION `generation`: 0 at a
// round's start, the generation a replacement starts in (common/recovery_keys.h); both
// always set, whatever `base` has, so that a worker never reads a stale pair.
std::map<std::string, std::string> workerEnvironment(std::map<std::string, std::string> base, const AgentConfig& config,
                                                     const rendezvous::RendezvousResult& rdzv, const WorkerPlace& place,
                                                     const std::string& error_file, int generation = 0);

// True when the agent will set OMP_NUM_THREADS itself (and should say so once).
bool setsOmpNumThreads(const std::map<std::string, std::string>& base, int nproc_per_node);

// The calling process's environment as a map.
std::map<std::string, std::string> currentEnvironment();

}  // namespace ddprun::agent
