#include "launcher/slurm_env.h"

#include <fmt/format.h>

#include <charconv>
#include <cstdlib>

#include "common/env_names.h"
#include "common/error.h"
#include "launcher/slurm_hostlist.h"

namespace ddprun::launcher {
namespace {

constexpr long long kMaxCount = 1 << 20;

// Every message says what --slurm was doing, so that a user who never typed the
// variable knows where it came from.
[[noreturn]] void fail(const std::string& why) { throw UsageError("--slurm: " + why); }

std::optional<long long> toNumber(std::string_view text) {
  long long value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) return std::nullopt;
  return value;
}

long long numberVar(const std::string& name, const std::string& value, long long min) {
  auto number = toNumber(value);
  if (!number || *number < min || *number > (name == "SLURM_JOB_ID" ? (1LL << 40) : kMaxCount)) {
    fail(fmt::format("{}='{}' is not {}", name, value, min > 0 ? "a positive integer" : "a non-negative integer"));
  }
  return *number;
}

// The first variable of `names` that is set (and not empty), with its name.
std::optional<std::pair<std::string, std::string>> firstSet(const EnvLookup& env,
                                                            std::initializer_list<const char*> names) {
  for (const char* name : names) {
    if (auto value = env(name); value && !value->empty()) return std::make_pair(std::string(name), *value);
  }
  return std::nullopt;
}

std::pair<std::string, std::string> required(const EnvLookup& env, std::initializer_list<const char*> names,
                                             const char* needed_for) {
  if (auto found = firstSet(env, names)) return *found;
  std::string list;
  for (const char* name : names) list += (list.empty() ? "" : " or ") + std::string(name);
  fail(
      fmt::format("{} is not set, so {} cannot be derived; run ddprun --slurm "
                  "inside a job step "
                  "(srun --ntasks-per-node=1 ...), or give the flag",
                  list, needed_for));
}

}  // namespace

EnvLookup processEnvironment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    return value ? std::optional<std::string>(value) : std::nullopt;
  };
}

int slurmMasterPort(long long job_id) { return 20000 + static_cast<int>(job_id % 10000); }

int countOnNode(std::string_view variable, std::string_view list, int node_index) {
  auto bad = [&]() -> UsageError {
    return UsageError(fmt::format("--slurm: {}='{}' is not a list like 2(x3),1", variable, list));
  };
  // The whole list is checked, not only up to this node's entry: a malformed
  // list is reported the same on every node.
  std::vector<std::pair<long long, long long>> entries;  // count, repeat
  std::string_view rest = list;
  while (true) {
    size_t comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    long long repeat = 1;
    if (size_t paren = item.find('('); paren != std::string_view::npos) {
      if (item.size() < paren + 4 || item.substr(paren, 2) != "(x" || item.back() != ')') throw bad();
      auto parsed = toNumber(item.substr(paren + 2, item.size() - paren - 3));
      if (!parsed || *parsed < 1) throw bad();
      repeat = *parsed;
      item = item.substr(0, paren);
    }
    auto count = toNumber(item);
    if (!count || *count < 0 || *count > kMaxCount) throw bad();
    entries.emplace_back(*count, repeat);
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  long long seen = 0;
  for (const auto& [count, repeat] : entries) {
    if (node_index < seen + repeat) return static_cast<int>(count);
    seen += repeat;
  }
  throw UsageError(fmt::format("--slurm: {}='{}' covers {} nodes, but this is node {} (SLURM_NODEID)", variable, list,
                               seen, node_index));
}

std::vector<SlurmFlag> deriveSlurmFlags(const EnvLookup& env, const std::set<std::string>& given,
                                        std::string_view backend) {
  const bool is_static = backend != "c10d";
  auto wanted = [&](const char* flag) { return given.count(flag) == 0; };
  std::vector<SlurmFlag> flags;

  // The job id first: outside a job it is the one missing variable worth naming.
  const bool need_host = is_static ? wanted("master_addr") || wanted("master_port") : wanted("rdzv_endpoint");
  std::string job_id;
  if (wanted("rdzv_id") || need_host) job_id = required(env, {"SLURM_JOB_ID", "SLURM_JOBID"}, "--rdzv_id").second;
  const long long job_number = need_host ? numberVar("SLURM_JOB_ID", job_id, 0) : 0;

  // The node list is read only when a flag needs it, so that a user who names
  // the rendezvous host is not stopped by a list ddprun cannot parse.
  std::optional<std::vector<std::string>> hosts;
  std::string hosts_source;
  auto nodeList = [&]() -> const std::vector<std::string>& {
    if (!hosts) {
      auto [name, value] = required(env, {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"},
                                    is_static ? "--master_addr" : "--rdzv_endpoint");
      try {
        hosts = expandHostlist(value);
      } catch (const UsageError& e) {
        fail(fmt::format("{}: {}", name, e.what()));
      }
      hosts_source = name;
    }
    return *hosts;
  };

  if (wanted("nnodes")) {
    if (auto found = firstSet(env, {"SLURM_NNODES", "SLURM_JOB_NUM_NODES"})) {
      flags.push_back({"nnodes", std::to_string(numberVar(found->first, found->second, 1)), found->first});
    } else {
      flags.push_back({"nnodes", std::to_string(nodeList().size()), hosts_source});
    }
  }

  std::optional<int> node_id;
  auto nodeId = [&]() {
    if (!node_id) {
      auto [name, value] = required(env, {"SLURM_NODEID"}, "this node's rank");
      node_id = static_cast<int>(numberVar(name, value, 0));
    }
    return *node_id;
  };
  if (is_static && wanted("node_rank")) {
    // Two agents of one step on one node would both claim this node's rank and the job
    // would never form; say so at once instead.
    if (auto step_tasks = firstSet(env, {"SLURM_STEP_TASKS_PER_NODE"})) {
      int tasks = countOnNode(step_tasks->first, step_tasks->second, nodeId());
      if (tasks > 1) {
        fail(
            fmt::format("{}='{}' starts {} ddprun agents on node {}, which would all claim its node rank; start one "
                        "per node (srun --ntasks-per-node=1)",
                        step_tasks->first, step_tasks->second, tasks, nodeId()));
      }
    }
    flags.push_back({"node_rank", std::to_string(nodeId()), "SLURM_NODEID"});
  }

  if (need_host) {
    std::string port = std::to_string(slurmMasterPort(job_number));
    if (is_static) {
      if (wanted("master_addr")) flags.push_back({"master_addr", nodeList().front(), "first host of " + hosts_source});
      if (wanted("master_port")) flags.push_back({"master_port", port, "SLURM_JOB_ID"});
    } else {
      const std::string& host = nodeList().front();
      // An IPv6 literal in a node list is unusual but legal for NodeAddr-style names.
      std::string endpoint = host.find(':') != std::string::npos ? "[" + host + "]:" + port : host + ":" + port;
      flags.push_back({"rdzv_endpoint", endpoint, "first host of " + hosts_source + ", SLURM_JOB_ID"});
    }
  }
  if (wanted("rdzv_id")) flags.push_back({"rdzv_id", job_id, "SLURM_JOB_ID"});

  if (wanted("nproc_per_node")) {
    std::optional<SlurmFlag> nproc;
    if (auto gpus = firstSet(env, {"SLURM_GPUS_ON_NODE"}); gpus && numberVar(gpus->first, gpus->second, 0) > 0) {
      nproc = SlurmFlag{"nproc_per_node", gpus->second, gpus->first};
    } else if (auto job_list = firstSet(env, {env::kSlurmJobTasksPerNode})) {
      nproc = SlurmFlag{"nproc_per_node", std::to_string(countOnNode(job_list->first, job_list->second, nodeId())),
                        job_list->first};
    } else if (auto per_node = firstSet(env, {"SLURM_NTASKS_PER_NODE"})) {
      nproc =
          SlurmFlag{"nproc_per_node", std::to_string(numberVar(per_node->first, per_node->second, 1)), per_node->first};
    } else if (auto list = firstSet(env, {"SLURM_TASKS_PER_NODE"})) {
      nproc =
          SlurmFlag{"nproc_per_node", std::to_string(countOnNode(list->first, list->second, nodeId())), list->first};
    }
    if (nproc && nproc->value == "0") fail(nproc->source + " gives this node no tasks; give --nproc_per_node");
    if (nproc) flags.push_back(*nproc);
  }
  return flags;
}

}  // namespace ddprun::launcher
