// --numa-binding through the real ddprun on a fake topology (DDPRUN_TOPOLOGY_ROOT) whose
// CPUs are 0 and 1, which every test host has: two NUMA nodes of one CPU each. The
// workers report the affinity the kernel gave them (/proc/self/status), so the binding
// checked is the applied one, not the plan.
#include <catch2/catch.hpp>

#include "tests/support/fake_topology.h"
#include "tests/support/test_process.h"

using namespace ddprun::testing;

namespace {

void describeTwoNodeHost(FakeTopology& host) {
  host.node(0, "0");
  host.node(1, "1");
  host.cpu(0, 0, "0", "0");
  host.cpu(1, 0, "1", "1");
}

// Each worker prints "rank <LOCAL_RANK> Cpus_allowed_list:\t<cpus>".
const std::vector<std::string> kReportAffinity = {
    "--no_python", "/bin/sh", "-c", "echo \"rank $LOCAL_RANK $(grep Cpus_allowed_list /proc/self/status)\""};

RunResult runBound(const FakeTopology& host, std::vector<std::string> flags, const std::string& cuda_visible = "") {
  std::vector<std::string> argv = {ddprunPath(), "--nproc_per_node=2"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.insert(argv.end(), kReportAffinity.begin(), kReportAffinity.end());
  // An empty value unsets the variable: then every fake GPU is visible.
  return run(argv, {{"DDPRUN_TOPOLOGY_ROOT", host.root()}, {"CUDA_VISIBLE_DEVICES", cuda_visible}}, 30s);
}

}  // namespace

TEST_CASE("numa-binding=node binds each worker to its GPU's node", "[e2e][numa]") {
  FakeTopology host;
  describeTwoNodeHost(host);
  host.gpu("0000:3b:00.0", 1);  // GPU 0 sits on node 1, GPU 1 on node 0
  host.gpu("0000:b1:00.0", 0);
  auto r = runBound(host, {"--numa-binding=node"});
  REQUIRE(r.finished);
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("rank 0 Cpus_allowed_list:\t1\n"));
  CHECK_THAT(r.out, Catch::Contains("rank 1 Cpus_allowed_list:\t0\n"));
  CHECK_THAT(r.err, Catch::Contains("worker rank 0 (local rank 0, pid ") &&
                        Catch::Contains(") bound to CPUs 1 (--numa-binding=node, NUMA node 1)"));
}

TEST_CASE("numa_binding without GPUs spreads the workers over the nodes", "[e2e][numa]") {
  FakeTopology host;
  describeTwoNodeHost(host);
  for (const char* mode : {"node", "exclusive", "core-complex"}) {
    auto r = runBound(host, {"--numa_binding", mode});
    REQUIRE(r.finished);
    INFO(mode << "\n" << r.out << r.err);
    REQUIRE(r.exit_code == 0);
    CHECK_THAT(r.out, Catch::Contains("rank 0 Cpus_allowed_list:\t0\n"));
    CHECK_THAT(r.out, Catch::Contains("rank 1 Cpus_allowed_list:\t1\n"));
  }
}

TEST_CASE("PET_NUMA_BINDING and CUDA_VISIBLE_DEVICES pick the binding", "[e2e][numa]") {
  FakeTopology host;
  describeTwoNodeHost(host);
  host.gpu("0000:3b:00.0", 1);
  host.gpu("0000:b1:00.0", 0);
  std::vector<std::string> argv = {ddprunPath(), "--nproc_per_node=2"};
  argv.insert(argv.end(), kReportAffinity.begin(), kReportAffinity.end());
  auto r = run(argv,
               {{"DDPRUN_TOPOLOGY_ROOT", host.root()}, {"CUDA_VISIBLE_DEVICES", "1,0"}, {"PET_NUMA_BINDING", "socket"}},
               30s);
  REQUIRE(r.finished);
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  // Both nodes are in socket 0.
  CHECK_THAT(r.out, Catch::Contains("rank 0 Cpus_allowed_list:\t0-1\n"));
  CHECK_THAT(r.out, Catch::Contains("rank 1 Cpus_allowed_list:\t0-1\n"));
  auto node = runBound(host, {"--numa-binding=node"}, "1,0");
  REQUIRE(node.exit_code == 0);
  CHECK_THAT(node.out, Catch::Contains("rank 0 Cpus_allowed_list:\t0\n"));
  CHECK_THAT(node.out, Catch::Contains("rank 1 Cpus_allowed_list:\t1\n"));
}

TEST_CASE("a numa binding that does not fit stops ddprun before any worker starts", "[e2e][numa]") {
  FakeTopology host;
  describeTwoNodeHost(host);
  host.gpu("0000:3b:00.0", 1);
  host.gpu("0000:b1:00.0", 1);  // two GPUs on a node with one core
  auto r = runBound(host, {"--numa-binding=exclusive"});
  REQUIRE(r.finished);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.err, Catch::Contains("--numa-binding=exclusive: NUMA node 1 has 1 usable physical cores for 2 workers"));
  CHECK_THAT(r.out, !Catch::Contains("Cpus_allowed_list"));

  auto bad = runBound(host, {"--numa-binding=nodes"});
  REQUIRE(bad.finished);
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.err,
             Catch::Contains("invalid --numa-binding value 'nodes': expected node, socket, exclusive or core-complex"));
}

// Under 2 GiB of address space: expanding the list below into a set once took 5.6 s and
// ended in std::bad_alloc; with the limit it fails within a second or so instead of
// taking the machine's memory.
RunResult runBoundUnder2GiB(const FakeTopology& host, const std::string& mode, const std::string& cuda_visible) {
  std::vector<std::string> argv = {"/bin/sh",
                                   "-c",
                                   "ulimit -v 2097152 && exec \"$0\" \"$@\"",
                                   ddprunPath(),
                                   "--nproc_per_node=2",
                                   "--numa-binding=" + mode};
  argv.insert(argv.end(), kReportAffinity.begin(), kReportAffinity.end());
  return run(argv, {{"DDPRUN_TOPOLOGY_ROOT", host.root()}, {"CUDA_VISIBLE_DEVICES", cuda_visible}}, 30s);
}

TEST_CASE("a huge cpulist in sysfs is refused in one line naming the file, not expanded", "[e2e][numa][bad-input]") {
  FakeTopology host;
  describeTwoNodeHost(host);
  host.node(0, "0-2000000000");
  auto r = runBoundUnder2GiB(host, "node", "");
  REQUIRE(r.finished);
  CHECK(r.exit_code == 2);
  CHECK(countOf(r.err, "\n") == 1);
  CHECK_THAT(r.err, Catch::Contains("--numa-binding=node: ") && Catch::Contains("node0/cpulist: '0-2000000000' names "
                                                                                "CPU 2000000000, but this machine has "
                                                                                "at most 8192 CPUs"));
  CHECK_THAT(r.out, !Catch::Contains("Cpus_allowed_list"));
}

TEST_CASE("an overflowing device index in CUDA_VISIBLE_DEVICES names the variable and the value",
          "[e2e][numa][bad-input]") {
  FakeTopology host;
  describeTwoNodeHost(host);
  host.gpu("0000:3b:00.0", 0);
  host.gpu("0000:b1:00.0", 1);
  auto r = runBoundUnder2GiB(host, "node", "0,99999999999999999999999");
  REQUIRE(r.finished);
  CHECK(r.exit_code == 2);
  CHECK(countOf(r.err, "\n") == 1);
  CHECK_THAT(r.err, Catch::Contains("--numa-binding=node: CUDA_VISIBLE_DEVICES='0,99999999999999999999999': device "
                                    "index 99999999999999999999999 is out of range"));
}
