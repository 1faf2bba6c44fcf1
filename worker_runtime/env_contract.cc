#include "worker_runtime/env_contract.h"

#include <netdb.h>
#include <sys/socket.h>

#include <climits>
#include <string>

#include <fmt/format.h>

#include "common/env_names.h"
#include "common/env_reader.h"
#include "common/error.h"
#include "worker_runtime/spare_wait.h"

namespace ddprun::runtime {
namespace {

int size(const char* name) { return env::requireInteger<int>(name, 1, INT_MAX); }

// A rank read after its size, so the message can give the range it must lie in.
int rankWithin(const char* name, int size) { return env::requireInteger<int>(name, 0, size - 1); }

int port(const char* name) { return env::requireInteger<int>(name, 1, 65535); }

int count(const char* name) { return env::requireInteger<int>(name, 0, INT_MAX); }

bool useAgentStore() { return env::booleanOr(env::kUseAgentStore, false); }

// Set, though possibly empty: an empty role or run id is odd but not wrong.
std::string present(const char* name) {
  auto value = env::raw(name);
  if (!value) env::throwNotSet(name);
  return *value;
}

// A name the resolver says does not exist fails now; it would fail every connect retry until
// the group timeout (30 minutes by default). Anything else (resolved, or a temporary
// resolver failure) is left to the connect, which retries.
void checkResolvable(const char* name, const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (found != nullptr) ::freeaddrinfo(found);
  if (rc == EAI_NONAME || rc == EAI_FAIL) {
    throw UsageError(fmt::format("{}={}: cannot resolve the host ({})", name, host, ::gai_strerror(rc)));
  }
}

}  // namespace

WorkerEnv WorkerEnv::fromEnvironment() {
  awaitSpareAssignment();  // a spare has no rank before its assignment
  WorkerEnv e;
  e.world_size = size(env::kWorldSize);
  e.rank = rankWithin(env::kRank, e.world_size);
  e.local_world_size = size(env::kLocalWorldSize);
  e.local_rank = rankWithin(env::kLocalRank, e.local_world_size);
  e.group_world_size = size(env::kGroupWorldSize);
  e.group_rank = rankWithin(env::kGroupRank, e.group_world_size);
  e.role_world_size = size(env::kRoleWorldSize);
  e.role_rank = rankWithin(env::kRoleRank, e.role_world_size);
  e.role_name = present(env::kRoleName);
  e.master_addr = env::requireString(env::kMasterAddr);
  e.master_port = port(env::kMasterPort);
  e.restart_count = count(env::kRestartCount);
  e.max_restarts = count(env::kMaxRestarts);
  e.run_id = present(env::kRunId);
  e.use_agent_store = useAgentStore();
  e.error_file = env::stringOr(env::kErrorFile, "");
  return e;
}

StoreEnv StoreEnv::fromEnvironment(int rank, int world_size) {
  awaitSpareAssignment();
  StoreEnv e;
  e.world_size = world_size >= 0 ? world_size : size(env::kWorldSize);
  if (e.world_size < 1) throw UsageError(fmt::format("init_process_group: world_size {} is not positive", world_size));
  if (rank < 0) {
    e.rank = rankWithin(env::kRank, e.world_size);
  } else if (rank >= e.world_size) {
    throw UsageError(fmt::format("init_process_group: rank {} is outside a world of {}", rank, e.world_size));
  } else {
    e.rank = rank;
  }
  e.master_addr = env::requireString(env::kMasterAddr);
  e.master_port = port(env::kMasterPort);
  e.use_agent_store = useAgentStore();
  checkResolvable(env::kMasterAddr, e.master_addr);
  return e;
}

int localDeviceIndex(int devices) {
  DDPRUN_CHECK(devices >= 1, "localDeviceIndex: devices=" + std::to_string(devices));
  awaitSpareAssignment();
  return env::integerOr<int>(env::kLocalRank, 0, 0, INT_MAX) % devices;
}

}  // namespace ddprun::runtime
