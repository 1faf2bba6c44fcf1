// --numa-binding: which CPUs each local worker may run on, chosen as torchrun chooses them.
// Worker LOCAL_RANK is placed on the NUMA node of GPU LOCAL_RANK (CUDA device order); on a
// host without visible GPUs the workers are spread evenly over the NUMA nodes instead
// (local rank r of n goes to node index r * nodes / n). Then, by mode:
//   node          every CPU of that NUMA node;
//   socket        every CPU of the socket that holds that node (all its nodes);
//   exclusive     a disjoint slice of the node's physical cores, split evenly among the
//                 GPUs (or, without GPUs, the workers) on that node, lower ones taking
//                 the remainder; both hyperthreads of a core go together;
//   core-complex  one group of CPUs sharing the last-level cache (an L3 complex) in that
//                 node; larger groups first, a different one per GPU while they last.
// Only CPU affinity is set, as in torch: memory follows by first touch from those CPUs.
// Every set is limited to the CPUs ddprun itself may use (its own affinity, a cpuset).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "agent/placement/cpu_topology.h"

namespace ddprun::agent {

enum class NumaMode { kNode, kSocket, kExclusive, kCoreComplex };

// "node", "socket", "exclusive", "core-complex"; nothing for other text.
std::optional<NumaMode> parseNumaMode(std::string_view text);
std::string_view numaModeName(NumaMode mode);

struct CpuBinding {
  int numa_node = 0;  // the node the worker was placed on (its GPU's, or its share).
  CpuSet cpus;        // never empty.
};

// The binding of local ranks 0..nproc-1. `gpu_numa_nodes`: the NUMA node of each visible
// GPU in device order (empty: no GPUs). `allowed`: the CPUs the workers may use at all.
// Pure apart from reading `topology`. Throws DdprunError saying why no binding fits (a
// rank without a GPU, a node with no allowed CPUs, fewer cores than workers, missing
// sysfs files).
std::vector<CpuBinding> planNumaBinding(NumaMode mode, int nproc, CpuTopology& topology,
                                        const std::vector<int>& gpu_numa_nodes, const CpuSet& allowed);

// The plan for this host: topology from sysfs (or env::kTopologyRoot), GPUs from
// visibleGpuPciAddresses(), `allowed` from ddprun's own affinity. Throws UsageError
// starting with "--numa-binding=<mode>: " when no binding fits.
std::vector<CpuBinding> planNumaBindingForHost(NumaMode mode, int nproc);

}  // namespace ddprun::agent
