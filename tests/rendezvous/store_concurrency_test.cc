// Many clients at once on one server: no lost ADDs, exactly one compare_set winner,
// waiters released together.
#include <algorithm>
#include <catch2/catch.hpp>
#include <condition_variable>
#include <future>
#include <mutex>
#include <set>
#include <thread>

#include "tests/rendezvous/store_test_util.h"
#include "tests/support/test_process.h"

using namespace ddprun::rendezvous;
using namespace ddprun::rendezvous::testing;

namespace {

// Holds threads back until all are ready, so that they really race. The last to arrive wakes
// the others; 10 s is only a guard (a thread that failed before arriving lets the rest go).
class StartLine {
 public:
  explicit StartLine(int parties) : waiting_(parties) {}
  void arriveAndWait() {
    std::unique_lock lock(mutex_);
    if (--waiting_ == 0) {
      all_.notify_all();
      return;
    }
    all_.wait_for(lock, 10s, [this] { return waiting_ == 0; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable all_;
  int waiting_;  // under mutex_
};

}  // namespace

TEST_CASE("concurrency: 16 threads x 200 adds on one key lose nothing", "[concurrency]") {
  constexpr int kThreads = 16;
  constexpr int kAdds = 200;
  StoreServer server(localServerOptions());
  StartLine start(kThreads);
  std::vector<std::future<std::vector<int64_t>>> results;
  for (int t = 0; t < kThreads; ++t) {
    results.push_back(std::async(std::launch::async, [&] {
      TcpStoreClient client(clientOptions(server.port()));
      start.arriveAndWait();
      std::vector<int64_t> seen;
      for (int i = 0; i < kAdds; ++i) seen.push_back(client.add("counter", 1));
      return seen;
    }));
  }
  std::set<int64_t> all;
  for (auto& r : results) {
    REQUIRE(r.wait_for(60s) == std::future_status::ready);
    auto seen = r.get();
    CHECK(std::is_sorted(seen.begin(), seen.end()));  // one client's adds are ordered
    all.insert(seen.begin(), seen.end());
  }
  // Every add saw a distinct total: 1..3200, each exactly once.
  CHECK(all.size() == size_t{kThreads * kAdds});
  CHECK(*all.begin() == 1);
  CHECK(*all.rbegin() == kThreads * kAdds);
  TcpStoreClient check(clientOptions(server.port()));
  CHECK(check.get("counter") == "3200");
}

TEST_CASE("concurrency: one shared client used by many threads stays consistent", "[concurrency]") {
  StoreServer server(localServerOptions());
  TcpStoreClient shared(clientOptions(server.port()));
  std::vector<std::future<void>> done;
  for (int t = 0; t < 8; ++t) {
    done.push_back(std::async(std::launch::async, [&, t] {
      for (int i = 0; i < 100; ++i) {
        std::string key = "t" + std::to_string(t) + "/" + std::to_string(i);
        shared.set(key, std::to_string(i * t));
        if (shared.get(key) != std::to_string(i * t)) throw std::runtime_error("wrong value for " + key);
        shared.add("total", 1);
      }
    }));
  }
  for (auto& d : done) {
    REQUIRE(d.wait_for(60s) == std::future_status::ready);
    CHECK_NOTHROW(d.get());
  }
  CHECK(shared.get("total") == "800");
  CHECK(shared.numKeys() == 801);
}

TEST_CASE("concurrency: racing compare_set from empty has exactly one winner", "[concurrency]") {
  constexpr int kClients = 24;
  StoreServer server(localServerOptions());
  for (int round = 0; round < 5; ++round) {
    const std::string key = "leader/" + std::to_string(round);
    StartLine start(kClients);
    std::vector<std::future<std::pair<std::string, std::string>>> results;
    for (int c = 0; c < kClients; ++c) {
      results.push_back(std::async(std::launch::async, [&, c] {
        TcpStoreClient client(clientOptions(server.port()));
        std::string mine = "client-" + std::to_string(c);
        start.arriveAndWait();
        return std::make_pair(mine, client.compareSet(key, "", mine));
      }));
    }
    int winners = 0;
    std::set<std::string> replies;
    for (auto& r : results) {
      REQUIRE(r.wait_for(30s) == std::future_status::ready);
      auto [mine, reply] = r.get();
      if (reply == mine) ++winners;
      replies.insert(reply);
    }
    INFO("round " << round);
    CHECK(winners == 1);
    REQUIRE(replies.size() == 1);  // the losers all learned who won
    TcpStoreClient check(clientOptions(server.port()));
    CHECK(check.get(key) == *replies.begin());
  }
}

TEST_CASE("concurrency: one set releases every waiter on the key", "[concurrency]") {
  constexpr int kWaiters = 12;
  StoreServer server(localServerOptions());
  std::vector<std::future<std::string>> waiters;
  for (int w = 0; w < kWaiters; ++w) {
    waiters.push_back(std::async(std::launch::async, [&] {
      TcpStoreClient client(clientOptions(server.port()));
      return client.get("go");
    }));
  }
  REQUIRE(server.waitFor([&](const auto& c) { return c.waiting_clients == kWaiters; }, 10s));
  TcpStoreClient(clientOptions(server.port())).set("go", "now");
  for (auto& w : waiters) {
    REQUIRE(w.wait_for(10s) == std::future_status::ready);
    CHECK(w.get() == "now");
  }
}
