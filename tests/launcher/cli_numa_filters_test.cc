// The command line of --numa-binding and --duplicate_*_filters: both spellings, PET_*,
// and one-line usage errors. The binding is planned on a fake two-node host.
#include <stdlib.h>

#include <catch2/catch.hpp>
#include <map>

#include "common/error.h"
#include "launcher/cli.h"
#include "tests/launcher/parse_args.h"
#include "tests/support/fake_topology.h"
#include "tests/support/scoped_env.h"

using ddprun::UsageError;
using ddprun::launcher::ParsedCommandLine;
using ddprun::testing::ScopedEnv;
using Strings = std::vector<std::string>;

namespace {

ParsedCommandLine parse(std::vector<std::string> args) {
  args.insert(args.end(), {"--no_python", "/bin/true"});
  return ddprun::testing::parseArgs(std::move(args));
}

std::string usageErrorOf(std::vector<std::string> args) {
  try {
    parse(std::move(args));
  } catch (const UsageError& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace

TEST_CASE("numa binding is planned from either spelling or PET_NUMA_BINDING", "[cli][numa]") {
  ddprun::testing::FakeTopology host;
  host.node(0, "0");
  host.node(1, "1");
  host.cpu(0, 0, "0", "0");
  host.cpu(1, 0, "1", "1");
  ScopedEnv topology("DDPRUN_TOPOLOGY_ROOT", host.root());
  ScopedEnv no_gpus("CUDA_VISIBLE_DEVICES", "");
  for (const char* flag : {"--numa-binding=node", "--numa_binding=node"}) {
    auto c = parse({"--nproc_per_node=2", flag}).config;
    REQUIRE(c.numa_binding == ddprun::agent::NumaMode::kNode);
    REQUIRE(c.cpu_bindings.size() == 2);
    CHECK(c.cpu_bindings[0].cpus == ddprun::agent::CpuSet{0});
    CHECK(c.cpu_bindings[1].cpus == ddprun::agent::CpuSet{1});
    CHECK(c.cpu_bindings[1].numa_node == 1);
  }
  {
    ScopedEnv pet("PET_NUMA_BINDING", "exclusive");
    CHECK(parse({"--nproc_per_node=2"}).config.numa_binding == ddprun::agent::NumaMode::kExclusive);
  }
  auto unbound = parse({"--nproc_per_node=2"}).config;
  CHECK_FALSE(unbound.numa_binding);
  CHECK(unbound.cpu_bindings.empty());
}

TEST_CASE("bad numa binding values are one-line usage errors", "[cli][numa]") {
  ddprun::testing::FakeTopology host;
  host.node(0, "0-1");
  host.cpu(0, 0, "0-1", "");
  host.cpu(1, 0, "0-1", "");
  ScopedEnv topology("DDPRUN_TOPOLOGY_ROOT", host.root());
  ScopedEnv no_gpus("CUDA_VISIBLE_DEVICES", "");
  CHECK(usageErrorOf({"--numa-binding=numa"}) ==
        "invalid --numa-binding value 'numa': expected node, socket, exclusive or core-complex");
  CHECK(usageErrorOf({"--nproc_per_node=2", "--numa-binding=exclusive"}) ==
        "--numa-binding=exclusive: NUMA node 0 has 1 usable physical cores for 2 workers");
  CHECK_THAT(usageErrorOf({"--numa-binding=core-complex"}),
             Catch::StartsWith("--numa-binding=core-complex: list ") && Catch::Contains("cpu0/cache"));
}

TEST_CASE("duplicate filters parse in either spelling and from PET_*", "[cli][filters]") {
  auto c = parse({"--duplicate-stdout-filters=apple,kiwi,,lime", "--duplicate_stderr_filters", "x"}).config;
  CHECK(c.duplicate_stdout_filters == Strings{"apple", "kiwi,lime"});
  CHECK(c.duplicate_stderr_filters == Strings{"x"});
  {
    ScopedEnv pet("PET_DUPLICATE_STDOUT_FILTERS", "a,b");
    CHECK(parse({}).config.duplicate_stdout_filters == Strings{"a", "b"});
  }
  {
    ScopedEnv pet("PET_DUPLICATE_STDOUT_FILTERS", "");
    CHECK(parse({}).config.duplicate_stdout_filters.empty());
  }
  CHECK(parse({}).config.duplicate_stderr_filters.empty());
  CHECK_THAT(usageErrorOf({"--duplicate_stderr_filters=a,,,"}),
             Catch::StartsWith("invalid --duplicate_stderr_filters value 'a,,,': empty filter"));
}
