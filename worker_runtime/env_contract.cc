#include "worker_runtime/env_contract.h"

#include <charconv>
#include <cstdlib>
#include <string_view>

#include "common/env_names.h"
#include "common/error.h"

namespace ddprun::runtime {
namespace {

std::string required(const char* name) {
  const char* value = std::getenv(name);
  if (!value) throw DdprunError(std::string("environment variable ") + name + " is not set (start workers with ddprun)");
  return value;
}

int requiredInt(const char* name) {
  std::string text = required(name);
  int value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
    throw DdprunError(std::string("environment variable ") + name + "='" + text + "' is not an integer");
  }
  return value;
}

std::string optional(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "";
}

}  // namespace

WorkerEnv WorkerEnv::fromEnvironment() {
  WorkerEnv e;
  e.rank = requiredInt(env::kRank);
  e.local_rank = requiredInt(env::kLocalRank);
  e.world_size = requiredInt(env::kWorldSize);
  e.local_world_size = requiredInt(env::kLocalWorldSize);
  e.group_rank = requiredInt(env::kGroupRank);
  e.group_world_size = requiredInt(env::kGroupWorldSize);
  e.role_rank = requiredInt(env::kRoleRank);
  e.role_world_size = requiredInt(env::kRoleWorldSize);
  e.role_name = required(env::kRoleName);
  e.master_addr = required(env::kMasterAddr);
  e.master_port = requiredInt(env::kMasterPort);
  e.restart_count = requiredInt(env::kRestartCount);
  e.max_restarts = requiredInt(env::kMaxRestarts);
  e.run_id = required(env::kRunId);
  e.use_agent_store = optional(env::kUseAgentStore) == "True";
  e.error_file = optional(env::kErrorFile);
  return e;
}

}  // namespace ddprun::runtime
