#include "agent/placement/numa_binding.h"

#include <stdlib.h>

#include <fstream>

#include <catch2/catch.hpp>

#include "agent/placement/cpu_topology.h"
#include "agent/placement/gpu_devices.h"
#include "common/error.h"
#include "tests/support/fake_topology.h"
#include "tests/support/scoped_env.h"

using namespace ddprun::agent;
using ddprun::testing::FakeTopology;
using ddprun::testing::ScopedEnv;

namespace {

// 2 sockets x 2 NUMA nodes x 4 cores x 2 hyperthreads, numbered as Linux does: core k
// (0-15) is CPUs k and k+16. Node n has cores 4n..4n+3, in two L3 complexes of two cores.
void describeTwoSocketHost(FakeTopology& host) {
  for (int node = 0; node < 4; ++node) {
    const int c = 4 * node;
    host.node(node, std::to_string(c) + "-" + std::to_string(c + 3) + "," + std::to_string(c + 16) + "-" +
                        std::to_string(c + 19));
  }
  for (int core = 0; core < 16; ++core) {
    const int first = core - core % 2;  // the complex's first core
    const std::string l3 = std::to_string(first) + "-" + std::to_string(first + 1) + "," + std::to_string(first + 16) +
                           "-" + std::to_string(first + 17);
    const std::string siblings = std::to_string(core) + "," + std::to_string(core + 16);
    host.cpu(core, core / 8, siblings, l3);
    host.cpu(core + 16, core / 8, siblings, l3);
  }
}

CpuSet allCpus() {
  CpuSet cpus;
  for (int cpu = 0; cpu < 32; ++cpu) cpus.insert(cpu);
  return cpus;
}

std::vector<std::string> plan(NumaMode mode, int nproc, const FakeTopology& host, const std::vector<int>& gpu_nodes,
                              const CpuSet& allowed = allCpus()) {
  CpuTopology topology(host.root());
  std::vector<std::string> cpus;
  for (const CpuBinding& b : planNumaBinding(mode, nproc, topology, gpu_nodes, allowed)) {
    cpus.push_back(formatCpuList(b.cpus));
  }
  return cpus;
}

std::string planError(NumaMode mode, int nproc, const FakeTopology& host, const std::vector<int>& gpu_nodes,
                      const CpuSet& allowed = allCpus()) {
  try {
    plan(mode, nproc, host, gpu_nodes, allowed);
  } catch (const ddprun::DdprunError& e) {
    return e.what();
  }
  return "<no error>";
}

using Strings = std::vector<std::string>;

}  // namespace

TEST_CASE("CPU lists parse and print in the kernel's format", "[unit][numa]") {
  CHECK(parseCpuList("0-3,8,10-11\n") == CpuSet{0, 1, 2, 3, 8, 10, 11});
  CHECK(parseCpuList("") == CpuSet{});
  CHECK_FALSE(parseCpuList("3-1"));
  CHECK_FALSE(parseCpuList("a"));
  CHECK_FALSE(parseCpuList("1-"));
  CHECK(formatCpuList({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11");
  // Bounded before anything is expanded: this list once filled a set until std::bad_alloc.
  CHECK_FALSE(parseCpuList("0-2000000000"));
  CHECK_FALSE(parseCpuList("4-7", 4));
  CHECK(parseCpuList("0-3", 4) == CpuSet{0, 1, 2, 3});
  CHECK(parseCpuList("8191") == CpuSet{8191});
  CHECK_FALSE(parseCpuList("8192"));
  CHECK(formatCpuList({}) == "");
  CHECK(parseNumaMode("core-complex") == NumaMode::kCoreComplex);
  CHECK_FALSE(parseNumaMode("Node"));
}

TEST_CASE("node mode binds each rank to the NUMA node of its GPU", "[unit][numa]") {
  FakeTopology host;
  describeTwoSocketHost(host);
  CHECK(plan(NumaMode::kNode, 4, host, {0, 1, 2, 3}) == Strings{"0-3,16-19", "4-7,20-23", "8-11,24-27", "12-15,28-31"});
  CHECK(plan(NumaMode::kNode, 2, host, {3, 0, 1}) == Strings{"12-15,28-31", "0-3,16-19"});
}

TEST_CASE("without GPUs the workers are spread evenly over the NUMA nodes", "[unit][numa]") {
  FakeTopology host;
  describeTwoSocketHost(host);
  CHECK(plan(NumaMode::kNode, 2, host, {}) == Strings{"0-3,16-19", "8-11,24-27"});
  CHECK(plan(NumaMode::kNode, 8, host, {}) == Strings{"0-3,16-19", "0-3,16-19", "4-7,20-23", "4-7,20-23", "8-11,24-27",
                                                      "8-11,24-27", "12-15,28-31", "12-15,28-31"});
  // Nodes with none of the allowed CPUs take no workers.
  CHECK(plan(NumaMode::kNode, 2, host, {}, {0, 1, 8, 9}) == Strings{"0-1", "8-9"});
}

TEST_CASE("socket mode binds to every node of the GPU's socket", "[unit][numa]") {
  FakeTopology host;
  describeTwoSocketHost(host);
  CHECK(plan(NumaMode::kSocket, 2, host, {1, 2}) == Strings{"0-7,16-23", "8-15,24-31"});
}

TEST_CASE("exclusive mode splits a node's physical cores among its GPUs", "[unit][numa]") {
  FakeTopology host;
  describeTwoSocketHost(host);
  // GPUs 0 and 1 share node 1: two whole cores (both hyperthreads) each.
  CHECK(plan(NumaMode::kExclusive, 2, host, {1, 1}) == Strings{"4-5,20-21", "6-7,22-23"});
  // Three GPUs on four cores: the lowest takes the extra core.
  CHECK(plan(NumaMode::kExclusive, 3, host, {0, 0, 0}) == Strings{"0-1,16-17", "2,18", "3,19"});
  // Every visible GPU on the node counts, even one without a worker (as in torch).
  CHECK(plan(NumaMode::kExclusive, 1, host, {2, 2, 2, 2}) == Strings{"8,24"});
  // Without GPUs, the workers placed on a node share it.
  CHECK(plan(NumaMode::kExclusive, 4, host, {}) == Strings{"0-3,16-19", "4-7,20-23", "8-11,24-27", "12-15,28-31"});
  CHECK(plan(NumaMode::kExclusive, 8, host, {}).at(1) == "2-3,18-19");
  CHECK_THAT(planError(NumaMode::kExclusive, 5, host, {0, 0, 0, 0, 0}),
             Catch::Contains("NUMA node 0 has 4 usable physical cores for 5 workers"));
}

TEST_CASE("core-complex mode gives each GPU its own L3 complex while they last", "[unit][numa]") {
  FakeTopology host;
  describeTwoSocketHost(host);
  CHECK(plan(NumaMode::kCoreComplex, 2, host, {0, 0}) == Strings{"0-1,16-17", "2-3,18-19"});
  CHECK(plan(NumaMode::kCoreComplex, 3, host, {3, 3, 3}) == Strings{"12-13,28-29", "14-15,30-31", "12-13,28-29"});
  // The complex with more usable CPUs comes first.
  CHECK(plan(NumaMode::kCoreComplex, 1, host, {0}, {0, 2, 3, 18}) == Strings{"2-3,18"});
}

TEST_CASE("a binding that cannot be planned says why", "[unit][numa]") {
  FakeTopology host;
  describeTwoSocketHost(host);
  CHECK_THAT(planError(NumaMode::kNode, 3, host, {0, 1}),
             Catch::Contains("local rank 2 has no GPU (2 visible)") && Catch::Contains("CUDA_VISIBLE_DEVICES="));
  CHECK_THAT(planError(NumaMode::kNode, 1, host, {2}, {0, 1}),
             Catch::Contains("NUMA node 2 has none of the CPUs ddprun may use (0-1)"));
  CHECK_THAT(planError(NumaMode::kNode, 1, host, {7}), Catch::Contains("NUMA node 7 does not exist"));

  FakeTopology bare;  // no cache directories
  bare.node(0, "0-1");
  bare.cpu(0, 0, "0", "");
  bare.cpu(1, 0, "1", "");
  CHECK_THAT(planError(NumaMode::kCoreComplex, 1, bare, {}), Catch::Contains("cpu0/cache"));
  CHECK(plan(NumaMode::kExclusive, 2, bare, {}, {0, 1}) == Strings{"0", "1"});
}

TEST_CASE("CPU lists in sysfs are bounded by the machine's possible CPUs", "[unit][numa][bad-input]") {
  FakeTopology host;
  describeTwoSocketHost(host);
  const std::string possible = host.root() + "/sys/devices/system/cpu/possible";
  std::ofstream(possible) << "0-31\n";
  CHECK(CpuTopology(host.root()).cpuLimit() == 32);
  CHECK(plan(NumaMode::kNode, 1, host, {1}) == Strings{"4-7,20-23"});
  host.node(1, "4-7,20-23,40");
  CHECK_THAT(
      planError(NumaMode::kNode, 1, host, {1}),
      Catch::Contains("node1/cpulist: '4-7,20-23,40' names CPU 40, but this machine has at most 32 CPUs (0-31)"));
  host.node(1, "0-2000000000");
  CHECK_THAT(planError(NumaMode::kNode, 1, host, {1}), Catch::Contains("names CPU 2000000000"));
  std::ofstream(possible) << "0-9000\n";
  CHECK_THROWS_WITH(CpuTopology(host.root()).cpuLimit(), Catch::Contains("is not a list of at most 8192 CPUs"));
}

TEST_CASE("an overflowing CUDA_VISIBLE_DEVICES index is an error naming the variable", "[unit][numa][bad-input]") {
  FakeTopology host;
  host.gpu("0000:3b:00.0", 0);
  CpuTopology topology(host.root());
  ScopedEnv visible("CUDA_VISIBLE_DEVICES", "0,18446744073709551616");
  CHECK_THROWS_WITH(visibleGpuPciAddresses(topology),
                    Catch::Equals("CUDA_VISIBLE_DEVICES='0,18446744073709551616': device index 18446744073709551616 "
                                  "is out of range"));
}

TEST_CASE("GPUs come in PCI order, picked and reordered by CUDA_VISIBLE_DEVICES", "[unit][numa]") {
  FakeTopology host;
  host.gpu("0000:b1:00.0", 1);
  host.gpu("0000:3b:00.0", -1);
  host.gpu("0000:5e:00.0", 0);
  CpuTopology topology(host.root());
  const char* old = std::getenv("CUDA_VISIBLE_DEVICES");
  const std::string saved = old ? old : "";
  ::unsetenv("CUDA_VISIBLE_DEVICES");
  CHECK(visibleGpuPciAddresses(topology) == Strings{"0000:3b:00.0", "0000:5e:00.0", "0000:b1:00.0"});
  CHECK(topology.pciNumaNode("0000:3b:00.0") == 0);  // -1: no affinity known
  CHECK(topology.pciNumaNode("0000:b1:00.0") == 1);
  ::setenv("CUDA_VISIBLE_DEVICES", "2,0,7,1", 1);  // CUDA stops at the invalid 7
  CHECK(visibleGpuPciAddresses(topology) == Strings{"0000:b1:00.0", "0000:3b:00.0"});
  ::setenv("CUDA_VISIBLE_DEVICES", "", 1);
  CHECK(visibleGpuPciAddresses(topology).empty());
  ::setenv("CUDA_VISIBLE_DEVICES", "GPU-0a1b", 1);
  CHECK_THROWS_WITH(visibleGpuPciAddresses(topology), Catch::Contains("CUDA_VISIBLE_DEVICES entry 'GPU-0a1b'"));
  if (old) {
    ::setenv("CUDA_VISIBLE_DEVICES", saved.c_str(), 1);
  } else {
    ::unsetenv("CUDA_VISIBLE_DEVICES");
  }
}

// allDevices() once asked NVML for the PCI address of every index it claimed, 4 billion of them.
TEST_CASE("an NVML that claims billions of GPUs is an error naming it, not a walk over them",
          "[unit][numa][bad-input]") {
  ScopedEnv root("DDPRUN_TOPOLOGY_ROOT", std::nullopt);  // the real host: NVML is asked
  ScopedEnv library("DDPRUN_NVML_LIBRARY", DDPRUN_FAKE_NVML);
  ScopedEnv count("FAKE_NVML_COUNT", "4294967280");
  ScopedEnv lost("FAKE_NVML_LOST", std::nullopt);
  for (const std::optional<std::string> visible : {std::optional<std::string>(), std::optional<std::string>("0")}) {
    ScopedEnv cuda("CUDA_VISIBLE_DEVICES", visible);
    CHECK_THROWS_WITH(visibleGpuPciAddresses(CpuTopology::fromEnvironment()),
                      Catch::Equals(std::string("NVML (") + DDPRUN_FAKE_NVML +
                                    ") reports 4294967280 GPUs (more than 1024): refusing"));
  }
  ScopedEnv sane("FAKE_NVML_COUNT", "2");
  ScopedEnv cuda("CUDA_VISIBLE_DEVICES", "1,GPU-fa4e0000-0000-0000-0000-000000000000");
  CHECK(visibleGpuPciAddresses(CpuTopology::fromEnvironment()) == Strings{"0000:20:00.0", "0000:10:00.0"});
}
