#include "agent/placement/numa_binding.h"

#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <iterator>
#include <map>

#include "agent/placement/gpu_devices.h"
#include "common/error.h"

namespace ddprun::agent {
namespace {

CpuSet intersect(const CpuSet& a, const CpuSet& b) {
  CpuSet out;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::inserter(out, out.end()));
  return out;
}

// What placing one worker needs to know about the others.
struct Placement {
  int node = 0;
  int peer_index = 0;  // among the GPUs (or workers) placed on the same node
  int peers = 1;
};

class Planner {
 public:
  Planner(CpuTopology& topology, const CpuSet& allowed) : topology_(topology), allowed_(allowed) {}

  CpuSet nodeCpus(int node) {
    auto it = topology_.nodes().find(node);
    if (it == topology_.nodes().end()) throw DdprunError("NUMA node " + std::to_string(node) + " does not exist");
    CpuSet cpus = intersect(it->second, allowed_);
    if (cpus.empty()) {
      throw DdprunError("NUMA node " + std::to_string(node) + " has none of the CPUs ddprun may use (" +
                        formatCpuList(allowed_) + ")");
    }
    return cpus;
  }

  // Like torch: a node's socket is that of its lowest usable CPU.
  CpuSet socketCpus(int node) {
    const int socket = topology_.package(*nodeCpus(node).begin());
    CpuSet cpus;
    for (const auto& [other, all] : topology_.nodes()) {
      CpuSet usable = intersect(all, allowed_);
      if (!usable.empty() && topology_.package(*usable.begin()) == socket) cpus.insert(usable.begin(), usable.end());
    }
    return cpus;
  }

  CpuSet exclusiveCpus(const Placement& p) {
    // A physical core is named by its lowest CPU; the map keeps cores in that order.
    std::map<int, CpuSet> cores;
    for (int cpu : nodeCpus(p.node)) cores[*topology_.coreSiblings(cpu).begin()].insert(cpu);
    const int per_peer = static_cast<int>(cores.size()) / p.peers;
    const int with_extra = static_cast<int>(cores.size()) % p.peers;
    if (per_peer < 1) {
      throw DdprunError("NUMA node " + std::to_string(p.node) + " has " + std::to_string(cores.size()) +
                        " usable physical cores for " + std::to_string(p.peers) + " workers");
    }
    const int start = p.peer_index * per_peer + std::min(p.peer_index, with_extra);
    const int end = start + per_peer + (p.peer_index < with_extra ? 1 : 0);
    CpuSet cpus;
    auto core = std::next(cores.begin(), start);
    for (int i = start; i < end; ++i, ++core) cpus.insert(core->second.begin(), core->second.end());
    return cpus;
  }

  CpuSet coreComplexCpus(const Placement& p) {
    std::map<int, CpuSet> complexes;  // keyed by the lowest CPU sharing the cache
    for (int cpu : nodeCpus(p.node)) complexes[*topology_.lastLevelCache(cpu).begin()].insert(cpu);
    std::vector<std::pair<int, CpuSet>> ordered(complexes.begin(), complexes.end());
    // Larger complexes first (more usable CPUs), then by CPU number; stable keeps the latter.
    std::stable_sort(ordered.begin(), ordered.end(),
                     [](const auto& a, const auto& b) { return a.second.size() > b.second.size(); });
    return ordered[static_cast<size_t>(p.peer_index) % ordered.size()].second;
  }

 private:
  CpuTopology& topology_;
  const CpuSet& allowed_;
};

std::vector<Placement> place(int nproc, CpuTopology& topology, const std::vector<int>& gpu_nodes,
                             const CpuSet& allowed) {
  std::vector<Placement> placements(static_cast<size_t>(nproc));
  std::vector<int> node_of;  // per GPU, or per worker without GPUs: who shares a node
  if (!gpu_nodes.empty()) {
    if (nproc > static_cast<int>(gpu_nodes.size())) {
      throw DdprunError("local rank " + std::to_string(gpu_nodes.size()) + " has no GPU (" +
                        std::to_string(gpu_nodes.size()) +
                        " visible); set CUDA_VISIBLE_DEVICES= to spread CPU-only workers over the NUMA nodes");
    }
    node_of = gpu_nodes;
  } else {
    std::vector<int> usable_nodes;
    for (const auto& [node, cpus] : topology.nodes()) {
      if (!intersect(cpus, allowed).empty()) usable_nodes.push_back(node);
    }
    if (usable_nodes.empty()) throw DdprunError("no NUMA node has any of the CPUs ddprun may use");
    for (int rank = 0; rank < nproc; ++rank) {
      node_of.push_back(usable_nodes[static_cast<size_t>(rank) * usable_nodes.size() / static_cast<size_t>(nproc)]);
    }
  }
  for (int rank = 0; rank < nproc; ++rank) {
    Placement& p = placements[static_cast<size_t>(rank)];
    p.node = node_of[static_cast<size_t>(rank)];
    p.peers = static_cast<int>(std::count(node_of.begin(), node_of.end(), p.node));
    p.peer_index = static_cast<int>(std::count(node_of.begin(), node_of.begin() + rank, p.node));
  }
  return placements;
}

CpuSet ownAffinity() {
  CpuSet cpus;
  // Sized for hosts with more CPUs than cpu_set_t's fixed 1024.
  for (int size = 1024; size <= (1 << 20); size *= 2) {
    cpu_set_t* set = CPU_ALLOC(size);
    const size_t bytes = CPU_ALLOC_SIZE(size);
    if (::sched_getaffinity(0, bytes, set) == 0) {
      for (int cpu = 0; cpu < size; ++cpu) {
        if (CPU_ISSET_S(cpu, bytes, set)) cpus.insert(cpu);
      }
      CPU_FREE(set);
      return cpus;
    }
    CPU_FREE(set);
    if (errno != EINVAL) throw SystemError("sched_getaffinity", errno);
  }
  throw SystemError("sched_getaffinity", EINVAL);
}

}  // namespace

std::optional<NumaMode> parseNumaMode(std::string_view text) {
  if (text == "node") return NumaMode::kNode;
  if (text == "socket") return NumaMode::kSocket;
  if (text == "exclusive") return NumaMode::kExclusive;
  if (text == "core-complex") return NumaMode::kCoreComplex;
  return std::nullopt;
}

std::string_view numaModeName(NumaMode mode) {
  switch (mode) {
    case NumaMode::kNode: return "node";
    case NumaMode::kSocket: return "socket";
    case NumaMode::kExclusive: return "exclusive";
    case NumaMode::kCoreComplex: return "core-complex";
  }
  return "?";
}

std::vector<CpuBinding> planNumaBinding(NumaMode mode, int nproc, CpuTopology& topology,
                                        const std::vector<int>& gpu_numa_nodes, const CpuSet& allowed) {
  Planner planner(topology, allowed);
  std::vector<CpuBinding> bindings;
  for (const Placement& p : place(nproc, topology, gpu_numa_nodes, allowed)) {
    CpuBinding binding;
    binding.numa_node = p.node;
    switch (mode) {
      case NumaMode::kNode: binding.cpus = planner.nodeCpus(p.node); break;
      case NumaMode::kSocket: binding.cpus = planner.socketCpus(p.node); break;
      case NumaMode::kExclusive: binding.cpus = planner.exclusiveCpus(p); break;
      case NumaMode::kCoreComplex: binding.cpus = planner.coreComplexCpus(p); break;
    }
    bindings.push_back(std::move(binding));
  }
  return bindings;
}

std::vector<CpuBinding> planNumaBindingForHost(NumaMode mode, int nproc) {
  try {
    CpuTopology topology = CpuTopology::fromEnvironment();
    std::vector<int> gpu_nodes;
    for (const std::string& bdf : visibleGpuPciAddresses(topology)) gpu_nodes.push_back(topology.pciNumaNode(bdf));
    return planNumaBinding(mode, nproc, topology, gpu_nodes, ownAffinity());
  } catch (const DdprunError& e) {
    throw UsageError("--numa-binding=" + std::string(numaModeName(mode)) + ": " + e.what());
  }
}

}  // namespace ddprun::agent
