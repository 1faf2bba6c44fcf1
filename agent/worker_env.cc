#include "agent/worker_env.h"

#include <cstring>

#include "agent/ops/failure_report.h"
#include "common/env_names.h"
#include "common/recovery_keys.h"

extern char** environ;

namespace ddprun::agent {

std::vector<WorkerPlace> assignPlaces(int nproc_per_node, const rendezvous::RendezvousResult& rdzv) {
  std::vector<WorkerPlace> places;
  const int world_size = rdzv.world_size;
  for (int local_rank = 0; local_rank < nproc_per_node; ++local_rank) {
    WorkerPlace place;
    place.local_rank = local_rank;
    place.rank = rdzv.rank_base + local_rank;
    place.world_size = world_size;
    place.local_world_size = nproc_per_node;
    place.role_rank = place.rank;
    place.role_world_size = world_size;
    places.push_back(place);
  }
  return places;
}

std::optional<std::string> virtualDevice(const std::optional<std::string>& inherited, int local_rank) {
  if (!inherited) return std::to_string(local_rank);
  // As torchrun splits it: an empty list is one empty entry (no device for local rank 0).
  std::string_view rest = *inherited;
  for (int i = 0;; ++i) {
    auto comma = rest.find(',');
    if (i == local_rank) {
      std::string_view entry = rest.substr(0, comma);
      while (!entry.empty() && entry.front() == ' ') entry.remove_prefix(1);
      while (!entry.empty() && entry.back() == ' ') entry.remove_suffix(1);
      return std::string(entry);
    }
    if (comma == std::string_view::npos) return std::nullopt;
    rest.remove_prefix(comma + 1);
  }
}

bool setsOmpNumThreads(const std::map<std::string, std::string>& base, int nproc_per_node) {
  return nproc_per_node > 1 && !base.count(env::kOmpNumThreads);
}

std::map<std::string, std::string> workerEnvironment(std::map<std::string, std::string> base, const AgentConfig& config,
                                                     const rendezvous::RendezvousResult& rdzv, const WorkerPlace& place,
                                                     const std::string& error_file, int generation) {
  const bool set_omp = setsOmpNumThreads(base, config.nproc_per_node);
  auto& e = base;
  if (config.virtual_local_rank) {
    auto inherited = e.find(env::kCudaVisibleDevices);
    std::optional<std::string> device = virtualDevice(
        inherited == e.end() ? std::nullopt : std::optional<std::string>(inherited->second), place.local_rank);
    e[env::kCudaVisibleDevices] = device.value_or("");
  }
  e[env::kRank] = std::to_string(place.rank);
  e[env::kLocalRank] = config.virtual_local_rank ? "0" : std::to_string(place.local_rank);
  e[env::kWorldSize] = std::to_string(place.world_size);
  e[env::kLocalWorldSize] = std::to_string(place.local_world_size);
  e[env::kGroupRank] = std::to_string(rdzv.group_rank);
  e[env::kGroupWorldSize] = std::to_string(rdzv.group_world_size);
  e[env::kRoleRank] = std::to_string(place.role_rank);
  e[env::kRoleWorldSize] = std::to_string(place.role_world_size);
  e[env::kRoleName] = config.role;
  e[env::kMasterAddr] = rdzv.master_addr;
  e[env::kMasterPort] = std::to_string(rdzv.master_port);
  e[env::kRestartCount] = std::to_string(rdzv.restart_count);
  e[env::kMaxRestarts] = std::to_string(config.max_restarts);
  e[env::kRunId] = config.rendezvous.run_id;
  e[env::kUseAgentStore] = rdzv.use_agent_store ? "True" : "False";
  e[env::kErrorFile] = error_file;
  e[recovery::kRecoveryEnv] = config.recovery == Recovery::kInJob ? recovery::kInJob : recovery::kRestart;
  e[recovery::kGenerationEnv] = std::to_string(generation);
  std::string signals;
  for (int sig : config.stop_signals) signals += (signals.empty() ? "" : ",") + signalName(sig);
  e[env::kSignalsToHandle] = signals;
  e.try_emplace(env::kTorchNcclAsyncErrorHandling, "1");
  e.try_emplace(env::kNcclAsyncErrorHandling, "1");
  if (set_omp) e[env::kOmpNumThreads] = "1";
  if (config.python_workers && config.python_faulthandler) e.try_emplace(env::kPythonFaultHandler, "1");
  return base;
}

std::map<std::string, std::string> currentEnvironment() {
  std::map<std::string, std::string> result;
  for (char** entry = environ; entry && *entry; ++entry) {
    const char* eq = std::strchr(*entry, '=');
    if (!eq) continue;
    result.emplace(std::string(*entry, static_cast<size_t>(eq - *entry)), std::string(eq + 1));
  }
  return result;
}

}  // namespace ddprun::agent
