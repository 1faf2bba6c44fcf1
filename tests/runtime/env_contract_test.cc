// The worker's environment contract read strictly: WorkerEnv (the whole contract) and
// StoreEnv (what init_process_group(env://) reads). A malformed variable fails with one line
// naming it and its value, before anything connects: RANK=abc used to run as rank 0,
// MASTER_PORT=99999 to wrap to 34463, and RANK=-1, RANK >= WORLD_SIZE or an unknown
// MASTER_ADDR to wait out the 30-minute group timeout.
#include "worker_runtime/env_contract.h"

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "common/env_names.h"
#include "common/error.h"
#include "tests/support/scoped_env.h"

using ddprun::UsageError;
using ddprun::runtime::StoreEnv;
using ddprun::runtime::WorkerEnv;
using ddprun::testing::ScopedEnv;
namespace env = ddprun::env;

namespace {

using Changes = std::map<std::string, std::optional<std::string>>;

// The contract as ddprun sets it for rank 1 of 4 (two nodes of two), with `changes` applied
// (nullopt unsets a variable); restored when it goes out of scope.
class Contract {
 public:
  explicit Contract(const Changes& changes = {}) {
    Changes vars = {
        {env::kRank, "1"},
        {env::kLocalRank, "1"},
        {env::kWorldSize, "4"},
        {env::kLocalWorldSize, "2"},
        {env::kGroupRank, "0"},
        {env::kGroupWorldSize, "2"},
        {env::kRoleRank, "1"},
        {env::kRoleWorldSize, "4"},
        {env::kRoleName, "trainer"},
        {env::kMasterAddr, "127.0.0.1"},
        {env::kMasterPort, "29500"},
        {env::kRestartCount, "2"},
        {env::kMaxRestarts, "3"},
        {env::kRunId, "job-1"},
        {env::kUseAgentStore, "True"},
        {env::kErrorFile, "/tmp/error.json"},
    };
    for (const auto& [name, value] : changes) vars[name] = value;
    for (const auto& [name, value] : vars) scoped_.push_back(std::make_unique<ScopedEnv>(name, value));
  }

 private:
  std::vector<std::unique_ptr<ScopedEnv>> scoped_;
};

template <class Fn>
std::string usageMessage(Fn&& fn) {
  try {
    fn();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("env contract: the whole contract is read", "[unit][env]") {
  Contract contract;
  const WorkerEnv e = WorkerEnv::fromEnvironment();
  CHECK(e.rank == 1);
  CHECK(e.local_rank == 1);
  CHECK(e.world_size == 4);
  CHECK(e.local_world_size == 2);
  CHECK(e.group_rank == 0);
  CHECK(e.group_world_size == 2);
  CHECK(e.role_rank == 1);
  CHECK(e.role_world_size == 4);
  CHECK(e.role_name == "trainer");
  CHECK(e.master_addr == "127.0.0.1");
  CHECK(e.master_port == 29500);
  CHECK(e.restart_count == 2);
  CHECK(e.max_restarts == 3);
  CHECK(e.run_id == "job-1");
  CHECK(e.use_agent_store);
  CHECK(e.error_file == "/tmp/error.json");
}

TEST_CASE("env contract: the optional variables may be missing", "[unit][env]") {
  Contract contract(Changes{{env::kUseAgentStore, std::nullopt}, {env::kErrorFile, std::nullopt}});
  const WorkerEnv e = WorkerEnv::fromEnvironment();
  CHECK_FALSE(e.use_agent_store);
  CHECK(e.error_file.empty());
}

TEST_CASE("env contract: a malformed variable is named with its value", "[unit][env]") {
  const std::vector<std::pair<Changes, std::string>> cases = {
      {{{env::kRank, "abc"}}, "RANK=abc: not an integer"},
      {{{env::kRank, "-1"}}, "RANK=-1: out of range 0..3"},
      {{{env::kRank, "4"}}, "RANK=4: out of range 0..3"},
      {{{env::kWorldSize, "0"}}, "WORLD_SIZE=0: out of range 1..2147483647"},
      {{{env::kLocalRank, "2"}}, "LOCAL_RANK=2: out of range 0..1"},
      {{{env::kGroupRank, "x"}}, "GROUP_RANK=x: not an integer"},
      {{{env::kRoleRank, "9"}}, "ROLE_RANK=9: out of range 0..3"},
      {{{env::kMasterPort, "99999"}}, "MASTER_PORT=99999: out of range 1..65535"},
      {{{env::kMasterPort, "0"}}, "MASTER_PORT=0: out of range 1..65535"},
      {{{env::kRestartCount, "-2"}}, "TORCHELASTIC_RESTART_COUNT=-2: out of range 0..2147483647"},
      {{{env::kUseAgentStore, "sometimes"}},
       "TORCHELASTIC_USE_AGENT_STORE=sometimes: not a boolean (1/0, true/false, yes/no, on/off)"},
      {{{env::kRank, std::nullopt}}, "RANK is not set"},
      {{{env::kMasterAddr, std::nullopt}}, "MASTER_ADDR is not set"},
      {{{env::kRunId, std::nullopt}}, "TORCHELASTIC_RUN_ID is not set"},
  };
  for (const auto& [changes, message] : cases) {
    INFO(message);
    Contract contract(changes);
    CHECK(usageMessage([] { WorkerEnv::fromEnvironment(); }) == message);
  }
}

TEST_CASE("env contract: init_process_group needs only RANK WORLD_SIZE MASTER_ADDR and MASTER_PORT", "[unit][env]") {
  Changes only_four;
  for (const char* name : {env::kLocalRank, env::kLocalWorldSize, env::kGroupRank, env::kGroupWorldSize, env::kRoleRank,
                           env::kRoleWorldSize, env::kRoleName, env::kRestartCount, env::kMaxRestarts, env::kRunId,
                           env::kUseAgentStore, env::kErrorFile}) {
    only_four[name] = std::nullopt;
  }
  Contract contract(only_four);
  const StoreEnv e = StoreEnv::fromEnvironment();
  CHECK(e.rank == 1);
  CHECK(e.world_size == 4);
  CHECK(e.master_addr == "127.0.0.1");
  CHECK(e.master_port == 29500);
  CHECK_FALSE(e.use_agent_store);
}

TEST_CASE("env contract: a rank or world size given by the caller stands in for the variable", "[unit][env]") {
  Contract contract(Changes{{env::kRank, "abc"}, {env::kWorldSize, std::nullopt}});
  const StoreEnv e = StoreEnv::fromEnvironment(2, 3);
  CHECK(e.rank == 2);
  CHECK(e.world_size == 3);
  CHECK(usageMessage([] { StoreEnv::fromEnvironment(3, 3); }) == "init_process_group: rank 3 is outside a world of 3");
  Contract world(Changes{{env::kWorldSize, "2"}});
  CHECK(usageMessage([] { StoreEnv::fromEnvironment(2, -1); }) == "init_process_group: rank 2 is outside a world of 2");
}

TEST_CASE("env contract: init_process_group's variables fail before anything connects", "[unit][env]") {
  const std::vector<std::pair<Changes, std::string>> cases = {
      {{{env::kRank, "abc"}}, "RANK=abc: not an integer"},
      {{{env::kRank, "-1"}}, "RANK=-1: out of range 0..3"},
      {{{env::kRank, "4"}}, "RANK=4: out of range 0..3"},
      {{{env::kWorldSize, "many"}}, "WORLD_SIZE=many: not an integer"},
      {{{env::kMasterPort, "99999"}}, "MASTER_PORT=99999: out of range 1..65535"},
      {{{env::kMasterPort, std::nullopt}}, "MASTER_PORT is not set"},
      {{{env::kUseAgentStore, "2"}}, "TORCHELASTIC_USE_AGENT_STORE=2: not a boolean (1/0, true/false, yes/no, on/off)"},
  };
  for (const auto& [changes, message] : cases) {
    INFO(message);
    Contract contract(changes);
    CHECK(usageMessage([] { StoreEnv::fromEnvironment(); }) == message);
  }
}

TEST_CASE("env contract: a MASTER_ADDR that names no host fails at once", "[unit][env]") {
  // Malformed, so the resolver refuses it without asking DNS: the test needs no network.
  // (The e2e test of a worker starts one with bogus.invalid, which DNS reports as unknown.)
  Contract contract(Changes{{env::kMasterAddr, "no..such.host"}});
  CHECK(usageMessage([] { StoreEnv::fromEnvironment(); }) ==
        "MASTER_ADDR=no..such.host: cannot resolve the host (Name or service not known)");
}

TEST_CASE("env contract: MASTER_ADDR may be a name or an address", "[unit][env]") {
  for (const char* addr : {"localhost", "127.0.0.1", "::1"}) {
    INFO(addr);
    Contract contract(Changes{{env::kMasterAddr, addr}});
    CHECK(StoreEnv::fromEnvironment().master_addr == addr);
  }
}

// ddp::default_device() picks its GPU through localDeviceIndex(): it once read LOCAL_RANK
// with std::atoi, so LOCAL_RANK=abc (or 1x) silently meant GPU 0.
TEST_CASE("env contract: the local CUDA device comes from a checked LOCAL_RANK", "[unit][env]") {
  {
    ScopedEnv unset("LOCAL_RANK", std::nullopt);
    CHECK(ddprun::runtime::localDeviceIndex(4) == 0);
  }
  {
    ScopedEnv local("LOCAL_RANK", "5");
    CHECK(ddprun::runtime::localDeviceIndex(4) == 1);
    CHECK(ddprun::runtime::localDeviceIndex(8) == 5);
  }
  for (const char* bad : {"abc", "1x", "-1", " 2", "99999999999"}) {
    ScopedEnv local("LOCAL_RANK", bad);
    INFO("LOCAL_RANK=" << bad);
    CHECK_THROWS_AS(ddprun::runtime::localDeviceIndex(2), ddprun::UsageError);
    CHECK_THROWS_WITH(ddprun::runtime::localDeviceIndex(2), Catch::StartsWith(std::string("LOCAL_RANK=") + bad + ": "));
  }
}
