// What a worker learns from the environment ddprun (or torchrun) gives it, and the one
// strict reading of it that the runtime uses: every integer within its range, a rank within
// its size, the port a port, through common/env_reader.h, so a malformed variable fails at
// start-up with one line naming it and its value instead of running as rank 0 or waiting
// out the group timeout. The names come from common/env_names.h, shared with the agent.
#pragma once

#include <string>

namespace ddprun::runtime {

// The whole contract, as ddprun and torchrun set it for each worker.
struct WorkerEnv {
  int rank = 0;
  int local_rank = 0;
  int world_size = 1;
  int local_world_size = 1;
  int group_rank = 0;
  int group_world_size = 1;
  int role_rank = 0;
  int role_world_size = 1;
  std::string role_name;
  std::string master_addr;
  int master_port = 0;
  int restart_count = 0;
  int max_restarts = 0;
  std::string run_id;
  bool use_agent_store = false;
  std::string error_file;  // empty when the launcher gave none.

  // Reads the contract from the process environment. Every variable is required except
  // TORCHELASTIC_USE_AGENT_STORE (a boolean, default false) and TORCHELASTIC_ERROR_FILE.
  // Sizes are at least 1, each rank lies within its size, MASTER_PORT in 1..65535, counts
  // are not negative. Throws UsageError naming the first variable that is missing or
  // malformed, with its value. Does not block. Thread-safe if nobody calls setenv.
  static WorkerEnv fromEnvironment();
};

// What init_process_group(env://) reads, as torch does: RANK and WORLD_SIZE (unless the
// caller gives them), MASTER_ADDR and MASTER_PORT, and TORCHELASTIC_USE_AGENT_STORE when set.
// A worker started by hand needs only the first four.
struct StoreEnv {
  int rank = 0;
  int world_size = 1;
  std::string master_addr;
  int master_port = 0;
  bool use_agent_store = false;

  // Reads and checks them with WorkerEnv's rules; `rank` and `world_size`, when not negative,
  // stand in for RANK and WORLD_SIZE. MASTER_ADDR must be a host the resolver knows: a name
  // it reports as nonexistent fails here rather than after the group timeout of connect
  // retries (a temporary resolver failure is left to the store client, which retries).
  // Throws UsageError naming the variable and its value. Blocks for the resolver's lookup
  // of MASTER_ADDR. Thread-safe if nobody calls setenv.
  static StoreEnv fromEnvironment(int rank = -1, int world_size = -1);
};

// The CUDA device of this worker among `devices` visible ones (at least 1): LOCAL_RANK modulo
// `devices`, or 0 where LOCAL_RANK is unset or empty (a process started by hand). Throws
// UsageError naming LOCAL_RANK and its value when it is not an integer in 0..INT_MAX, so that
// `LOCAL_RANK=abc` never silently means GPU 0. Thread-safe if nobody calls setenv.
int localDeviceIndex(int devices);

}  // namespace ddprun::runtime
