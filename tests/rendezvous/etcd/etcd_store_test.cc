// EtcdStore against a real 3-member cluster: torch's store semantics on etcd, watches that
// wake waiters, a lease whose lapse deletes its key, and fail-over past a dead member.
#include <thread>

#include <catch2/catch.hpp>

#include "rendezvous/etcd/etcd_store.h"
#include "tests/rendezvous/etcd/etcd_cluster.h"

using namespace ddprun::testing;
using namespace ddprun::rendezvous;
using namespace ddprun::rendezvous::etcd;

namespace {

std::unique_ptr<EtcdStore> storeOn(const std::string& endpoints, const std::string& prefix) {
  EtcdConnectionOptions o;
  o.endpoints = parseEndpoints(endpoints);
  o.attempt_timeout = std::chrono::milliseconds(1000);
  return std::make_unique<EtcdStore>(o, prefix, std::chrono::milliseconds(10000));
}

}  // namespace

TEST_CASE("store: set, get, add, compare-and-set, check, list and delete with torch's rules", "[etcd]") {
  EtcdCluster cluster;
  REQUIRE_ETCD(cluster);
  auto store = storeOn(cluster.endpoints(), "/store-test");
  store->probe(std::chrono::milliseconds(5000));
  store->set("a", std::string("x\0y", 3));
  CHECK(store->get("a") == std::string("x\0y", 3));
  CHECK(store->add("n", 5) == 5);
  CHECK(store->add("n", -2) == 3);
  CHECK(store->get("n") == "3");
  CHECK(store->compareSet("c", "", "first") == "first");
  CHECK(store->compareSet("c", "", "second") == "first");
  CHECK(store->compareSet("c", "first", "third") == "third");
  CHECK(store->compareSet("missing", "old", "new") == "old");
  CHECK_FALSE(store->check({"missing"}));
  CHECK(store->check({"a", "n", "c"}));
  store->append("l", "p");
  store->append("l", "q");
  CHECK(store->get("l") == "pq");
  CHECK(store->listKeys().size() == 4);  // the ADD markers are not keys
  CHECK(store->numKeys() == 4);
  CHECK(store->deleteKey("a"));
  CHECK_FALSE(store->deleteKey("a"));
  store->deletePrefix("");
  CHECK(cluster.keys("/store-test/").empty());
}

TEST_CASE("store: a wait is woken by a watch, and times out when nothing comes", "[etcd]") {
  EtcdCluster cluster;
  REQUIRE_ETCD(cluster);
  auto store = storeOn(cluster.endpoints(), "/wait-test");
  auto writer = storeOn(cluster.endpoints(), "/wait-test");
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    writer->set("k", "v");
  });
  store->wait({"k"}, std::chrono::milliseconds(20000));
  t.join();
  CHECK(store->get("k") == "v");
  CHECK_THROWS_AS(store->wait({"never"}, std::chrono::milliseconds(1500)), StoreTimeout);
}

TEST_CASE("store: a key on a lease that is not kept alive is deleted, and a watch sees it", "[etcd]") {
  EtcdCluster cluster;
  REQUIRE_ETCD(cluster);
  auto store = storeOn(cluster.endpoints(), "/lease-test");
  const int64_t kept = store->grantLease(2);
  const int64_t lapsing = store->grantLease(2);
  store->setWithLease("kept", "1", kept);
  store->setWithLease("lapsing", "1", lapsing);
  const auto kv = store->read("lapsing");
  REQUIRE(kv);
  std::atomic<bool> stop{false};
  std::thread keeper([&] {
    while (!stop) {
      store->keepAlive(kept);
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
  });
  CHECK(store->waitDeleted("lapsing", kv->mod_revision, std::chrono::steady_clock::now() + std::chrono::seconds(20)));
  stop = true;
  keeper.join();
  CHECK(store->read("kept"));
  CHECK_FALSE(store->read("lapsing"));
}

TEST_CASE("store: with a member killed, calls go to the others", "[etcd]") {
  EtcdCluster cluster;
  REQUIRE_ETCD(cluster);
  auto store = storeOn(cluster.endpoints(), "/failover-test");
  CHECK(store->add("n", 1) == 1);
  cluster.kill(1);  // the first member: the one every call starts with
  CHECK(store->add("n", 1) == 2);
  const int leader = cluster.leader();
  REQUIRE(leader >= 2);
  cluster.kill(leader);  // two of three gone: no quorum, a call ends by its deadline
  // It returns (by its 10 s deadline; a hang would run into the test's timeout) with the error.
  auto quick = storeOn(cluster.endpoints(), "/failover-test");
  CHECK_THROWS_AS(quick->add("n", 1), StoreError);
}
