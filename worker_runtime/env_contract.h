// What a worker learns from the environment ddprun (or torchrun) gives it. Read once at
// start-up; the names come from common/env_names.h, shared with the agent.
#pragma once

#include <string>

namespace ddprun::runtime {

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
  std::string error_file;   // empty when the launcher gave none.

  // Reads the contract from the process environment. Throws DdprunError naming the
  // first variable that is missing or malformed. Thread-safe if nobody calls setenv.
  static WorkerEnv fromEnvironment();
};

}  // namespace ddprun::runtime
