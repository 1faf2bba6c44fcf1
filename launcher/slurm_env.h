// `ddprun --slurm`: the flags a job step's environment implies, so that one line in an
// sbatch script (`srun --ntasks-per-node=1 ddprun-slurm train.py`) starts the job on
// every node. Pure functions of a variable lookup, so the mapping is tested without SLURM.
//
// The rendezvous is the static backend: SLURM has already fixed the nodes and numbered
// them (SLURM_NODEID), so the node rank is SLURM's, GROUP_RANK and RANK follow SLURM's
// node order, no node waits for a last call, and the step's first node hosts the store
// at --master_addr:--master_port, as torchrun's `--node_rank=$SLURM_NODEID` recipes do.
// Restarts after worker failures work across nodes as in any static job. Given
// --rdzv_backend=c10d, the same host and port become --rdzv_endpoint instead.
#pragma once

#include <functional>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun::launcher {

// Reads one environment variable; nullopt when unset.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

// The process environment.
EnvLookup processEnvironment();

// One flag derived from SLURM's variables: name without dashes ("nnodes"), value, and
// the variable(s) it came from, for the log.
struct SlurmFlag {
  std::string name;
  std::string value;
  std::string source;
};

// The default --master_port under --slurm: derived from the job id, so that the nodes
// agree without talking and two jobs sharing a first node rarely collide; the range
// 20000-29999 lies below Linux's ephemeral ports.
int slurmMasterPort(long long job_id);

// The flags --slurm sets, in the order --dry_run prints them. Flags named in `given`
// (set on the command line or through PET_*) are neither derived nor needed. `backend`
// is the rendezvous backend in effect ("static" or "c10d"). Mapping:
//   nnodes          SLURM_NNODES, else SLURM_JOB_NUM_NODES, else the node list's length
//   node_rank       SLURM_NODEID (static; refused when SLURM_STEP_TASKS_PER_NODE puts
//                   more than one agent on this node)
//   master_addr     first host of SLURM_STEP_NODELIST, else SLURM_JOB_NODELIST, else
//                   SLURM_NODELIST (static; the step's list first because SLURM_NODEID
//                   numbers the step's nodes, which may be fewer than the job's)
//   master_port     slurmMasterPort(SLURM_JOB_ID) (static)
//   rdzv_endpoint   that host and port (c10d)
//   rdzv_id         SLURM_JOB_ID
//   nproc_per_node  SLURM_GPUS_ON_NODE when > 0, else this node's entry of
//                   DDPRUN_SLURM_JOB_TASKS_PER_NODE, else SLURM_NTASKS_PER_NODE, else
//                   this node's entry of SLURM_TASKS_PER_NODE; left to ddprun's
//                   default when none is set
// Pure; thread-safe if `env` is. Throws UsageError naming the variable when one that is
// needed is missing or malformed.
std::vector<SlurmFlag> deriveSlurmFlags(const EnvLookup& env, const std::set<std::string>& given,
                                        std::string_view backend);

// The count for node `node_index` (0-based) in SLURM's per-node list syntax, as in
// SLURM_TASKS_PER_NODE: "2(x3),1" is 2, 2, 2, 1. Throws UsageError for a malformed list
// (checked whole) or an index past its end; `variable` names the list in the message.
int countOnNode(std::string_view variable, std::string_view list, int node_index);

}  // namespace ddprun::launcher
