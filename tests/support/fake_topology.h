// A fake sysfs tree for --numa-binding tests: the files Linux has under /sys for NUMA
// nodes, CPU topology and caches, GPUs' PCI devices and /proc/driver/nvidia/gpus, written
// under a temporary directory that DDPRUN_TOPOLOGY_ROOT (agent/placement/cpu_topology.h) can name.
#pragma once

#include <filesystem>
#include <fstream>
#include <string>

#include "tests/support/test_process.h"

namespace ddprun::testing {

class FakeTopology {
 public:
  const std::string& root() const { return dir_.path(); }

  void node(int node, const std::string& cpulist) {
    write("sys/devices/system/node/node" + std::to_string(node) + "/cpulist", cpulist);
  }
  // One CPU: its socket, the CPUs of its physical core and those sharing its L3 cache
  // (empty: no cache directory). Small L1 caches are described too, as real hosts do.
  void cpu(int cpu, int socket, const std::string& core_cpus, const std::string& l3_cpus) {
    const std::string dir = "sys/devices/system/cpu/cpu" + std::to_string(cpu);
    write(dir + "/topology/physical_package_id", std::to_string(socket));
    write(dir + "/topology/thread_siblings_list", core_cpus);
    if (l3_cpus.empty()) return;
    cache(dir + "/cache/index0", "Data", 1, std::to_string(cpu));
    cache(dir + "/cache/index1", "Instruction", 1, std::to_string(cpu));
    cache(dir + "/cache/index3", "Unified", 3, l3_cpus);
  }
  // A GPU at PCI address `bdf` on NUMA node `node` (-1: the kernel knows none).
  void gpu(const std::string& bdf, int node) {
    write("sys/bus/pci/devices/" + bdf + "/numa_node", std::to_string(node));
    std::filesystem::create_directories(root() + "/proc/driver/nvidia/gpus/" + bdf);
  }

 private:
  void cache(const std::string& dir, const std::string& type, int level, const std::string& cpus) {
    write(dir + "/type", type);
    write(dir + "/level", std::to_string(level));
    write(dir + "/shared_cpu_list", cpus);
  }
  void write(const std::string& relative, const std::string& text) {
    const std::filesystem::path path = root() + "/" + relative;
    std::filesystem::create_directories(path.parent_path());
    std::ofstream(path) << text << "\n";
  }

  TempDir dir_;
};

}  // namespace ddprun::testing
