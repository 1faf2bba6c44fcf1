// The host's CPU and NUMA layout as Linux describes it in sysfs: which CPUs each NUMA node
// has, which socket (physical package) a CPU is in, which CPUs share its physical core and
// its last-level cache, and which NUMA node a PCI device (a GPU) is attached to.
//
// Everything is read under a root directory that normally is "/"; tests point it at a fake
// tree with the same file names (see env::kTopologyRoot). Files are read lazily, only those a
// question needs, so asking about a few CPUs of a large host stays cheap.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>

namespace ddprun::agent {

using CpuSet = std::set<int>;

// The most CPUs Linux supports (NR_CPUS is at most 8192): no CPU list names a CPU beyond it.
inline constexpr int kMaxCpus = 8192;

// Parses the kernel's list format ("0-3,8,10-11", blanks and a trailing newline allowed).
// Returns nothing for malformed text or a CPU numbered `cpu_limit` or more. The ranges are
// checked before any is expanded, so "0-2000000000" costs no more than "0-3".
std::optional<CpuSet> parseCpuList(std::string_view text, int cpu_limit = kMaxCpus);
// The kernel's list format for `cpus`: "0-3,8"; "" for an empty set.
std::string formatCpuList(const CpuSet& cpus);

class CpuTopology {
 public:
  // `root`: the directory holding sys/ (and proc/); "" or "/" for the real host.
  explicit CpuTopology(std::string root);
  // The root from DDPRUN_TOPOLOGY_ROOT (env::kTopologyRoot), or the real host.
  static CpuTopology fromEnvironment();

  const std::string& root() const { return root_; }
  bool isRealHost() const { return root_.empty(); }

  // How many CPUs this machine may have: one more than the last in
  // sys/devices/system/cpu/possible, or kMaxCpus where that file is missing (fake trees).
  // Every CPU list read here must stay below it. Throws DdprunError for a malformed file.
  int cpuLimit();

  // NUMA node -> its CPUs, from sys/devices/system/node/node<N>/cpulist. Throws
  // SystemError when the node directory cannot be read; a host without NUMA support
  // (no node directory) is reported as one node 0 with every possible CPU.
  const std::map<int, CpuSet>& nodes();
  // The socket of `cpu` (topology/physical_package_id). Throws SystemError naming the file.
  int package(int cpu);
  // The CPUs on the same physical core as `cpu`, itself included (topology/core_cpus_list,
  // or thread_siblings_list on older kernels). Throws SystemError naming the file.
  const CpuSet& coreSiblings(int cpu);
  // The CPUs sharing the largest data or unified cache of `cpu` (cache/index*/ with the
  // highest level). Throws SystemError when `cpu` has no cache information.
  const CpuSet& lastLevelCache(int cpu);
  // The NUMA node of a PCI device ("0000:3b:00.0"): sys/bus/pci/devices/<bdf>/numa_node;
  // -1 (no affinity, typical of one-node hosts) reads as node 0. Throws SystemError.
  int pciNumaNode(const std::string& bdf);

 private:
  std::string path(const std::string& relative) const;

  // A CPU list file; throws DdprunError naming the file when it is malformed or names a CPU
  // at or beyond cpuLimit().
  CpuSet readCpuList(const std::string& path);

  std::string root_;
  std::optional<int> cpu_limit_;
  std::optional<std::map<int, CpuSet>> nodes_;
  std::map<int, int> packages_;
  std::map<int, CpuSet> siblings_;
  std::map<int, CpuSet> caches_;
};

}  // namespace ddprun::agent
