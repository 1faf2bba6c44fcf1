// A backend plugged in from its own folder (shared_store_backend.h): the rounds form
// through it as through c10d's or etcd's, and the factory knows it by the name it
// registered, with nothing outside this folder naming it.
#include "tests/rendezvous/test_backend/shared_store_backend.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <memory>
#include <set>
#include <vector>

#include "rendezvous/backends.h"
#include "rendezvous/rounds/round_end.h"
#include "tests/rendezvous/manual_job.h"

using namespace ddprun::rendezvous;
using namespace ddprun::rendezvous::testing;

namespace {

RendezvousConfig sharedConfig(const std::string& store_name, int nodes) {
  RendezvousConfig config;
  config.backend = kSharedBackend;
  config.endpoint = store_name;
  config.run_id = "job";
  config.min_nodes = nodes;
  config.max_nodes = nodes;
  return config;
}

}  // namespace

TEST_CASE(
    "backends: a backend of the tests' own registered from its folder forms rounds, and the last node out "
    "clears the job from a store that outlives it",
    "[rdzv][backend]") {
  ManualClock clock;
  InMemoryNetwork network{clock};
  ScopedEnv no_token{"DDPRUN_TOKEN", std::nullopt};
  const std::string name = "plugged-in-job";
  std::vector<std::unique_ptr<Node>> nodes;
  for (const char* node : {"a:1", "b:2", "c:3"}) {
    nodes.push_back(std::make_unique<Node>(network, node, sharedConfig(name, 3)));
  }
  std::vector<Call<RendezvousResult>> calls;
  for (auto& node : nodes) calls.push_back(node->nextRound());
  std::vector<RendezvousResult> results;
  for (auto& call : calls) results.push_back(call.get());

  std::set<int> group_ranks;
  for (const RendezvousResult& r : results) {
    group_ranks.insert(r.group_rank);
    CHECK(r.round == 0);
    CHECK(r.group_world_size == 3);
    CHECK(r.world_size == 3 * kNproc);
    CHECK(r.rank_base == r.group_rank * kNproc);
    CHECK(r.master_addr == results[0].master_addr);
    CHECK(r.master_port == results[0].master_port);
  }
  CHECK(group_ranks == std::set<int>{0, 1, 2});
  // The round lives in the backend's store, which no node serves.
  InMemoryStore& store = sharedStore(name);
  CHECK(store.check({"rdzv/job/r0/closed"}));
  for (auto& node : nodes) {
    CHECK_FALSE(node->rdzv().hostsStore());
    CHECK(node->rdzv().storeAddress() == "shared " + name);
  }

  for (auto& node : nodes) node->rdzv().markDone();
  CHECK(store.get("rdzv/job/r0/end") == RoundEnd::done().format());
  for (auto& node : nodes) node->finish().get();
  // The store outlives the job: the last node out removed the job's keys.
  const auto keys = store.listKeys();
  CHECK(std::none_of(keys.begin(), keys.end(), [](const std::string& k) { return k.rfind("rdzv/job/", 0) == 0; }));
}

TEST_CASE("backends: an unknown --rdzv_backend is refused naming it and every registered backend", "[backend]") {
  ManualClock clock;
  InMemoryNetwork network{clock};
  TestNodeEnv env(network, "a:1");
  RendezvousConfig config = sharedConfig("unused", 1);
  config.backend = "nope";
  CHECK_THROWS_AS(openRendezvous(config, kNproc, env), ddprun::UsageError);
  CHECK_THROWS_WITH(openRendezvous(config, kNproc, env), Catch::Contains("'nope'") && Catch::Contains("c10d") &&
                                                             Catch::Contains("static") && Catch::Contains("etcd-v2") &&
                                                             Catch::Contains(kSharedBackend));
  const auto names = backendNames();
  CHECK(std::count(names.begin(), names.end(), kSharedBackend) == 1);
}
