// A job of rendezvous nodes as threads of the test, for the state machine's tests and the
// job board's: every node has its own RendezvousEnv over one in-memory network (with its own
// faults), and time is a manual clock that moves only when the test moves it, once every
// thread it drives is blocked on the clock. So timeouts are exact and nothing sleeps.
#pragma once

#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "rendezvous/backends.h"
#include "rendezvous/board/job_board.h"
#include "rendezvous/rounds/dynamic_rendezvous.h"
#include "tests/rendezvous/in_memory_network.h"
#include "tests/support/manual_clock.h"
#include "tests/support/scoped_env.h"

namespace ddprun::rendezvous::testing {

using ddprun::testing::ManualClock;
using ddprun::testing::ScopedEnv;
using namespace std::chrono_literals;

constexpr int kPort = 29400;
constexpr auto kKeepAlive = 5s;
constexpr int kMaxMisses = 3;
constexpr auto kLastCall = 30s;
constexpr auto kJoinTimeout = 600s;
constexpr auto kGuard = std::chrono::seconds(30);  // real time; only a broken test waits this long
constexpr int kNproc = 2;

// A call of one node's rendezvous running on a thread of its own. If the test ends before
// the call does (a failed REQUIRE), the node is interrupted so that the thread ends too.
template <class T>
class Call {
 public:
  Call(DynamicRendezvous& rdzv, std::future<T> result) : rdzv_(rdzv), result_(std::move(result)) {}
  Call(Call&&) = default;
  ~Call() {
    if (!result_.valid() || ready()) return;
    rdzv_.interrupt();
    result_.wait();
  }
  bool ready() const { return result_.wait_for(0s) == std::future_status::ready; }
  // Blocks until the call returns (within the real-time guard); returns or rethrows.
  T get() {
    REQUIRE(result_.wait_for(kGuard) == std::future_status::ready);
    return result_.get();
  }

 private:
  DynamicRendezvous& rdzv_;
  std::future<T> result_;
};

// One agent's rendezvous, and what its watcher reported.
class Node {
 public:
  Node(InMemoryNetwork& network, const std::string& name, RendezvousConfig config)
      : env_(network, name), rdzv_(std::move(config), kNproc, env_, openBackend) {}

  DynamicRendezvous& rdzv() { return rdzv_; }
  // What this node posts beside the rounds (status, hang summaries).
  JobBoard& board() { return board_; }
  FaultPlan& faults() { return env_.faults(); }
  Call<RendezvousResult> nextRound() {
    return {rdzv_, std::async(std::launch::async, [this] { return rdzv_.nextRound(); })};
  }
  Call<void> finish() {
    return {rdzv_, std::async(std::launch::async, [this] { rdzv_.finish(); })};
  }
  void watch() {
    rdzv_.watch([this](RoundEvent event) {
      std::lock_guard lock(mutex_);
      event_ = std::move(event);
      changed_.notify_all();
    });
  }
  // The watcher's report; blocks until there is one (within the real-time guard).
  RoundEvent awaitEvent() {
    std::unique_lock lock(mutex_);
    if (!changed_.wait_for(lock, kGuard, [&] { return event_.has_value(); })) FAIL("no round event");
    return *event_;
  }
  bool hasEvent() {
    std::lock_guard lock(mutex_);
    return event_.has_value();
  }

 private:
  TestNodeEnv env_;
  // Before rdzv_, whose destructor stops the watcher that reports here.
  std::mutex mutex_;
  std::condition_variable changed_;
  std::optional<RoundEvent> event_;
  DynamicRendezvous rdzv_;
  JobBoard board_{rdzv_};  // after rdzv_, which must outlive it
};

// A c10d job on one manual clock: the first node added hosts the store.
class Job {
 public:
  Job(int min_nodes, int max_nodes) : min_(min_nodes), max_(max_nodes) {}

  Node& add(const std::string& name) {
    RendezvousConfig config;
    config.backend = "c10d";
    config.endpoint = "127.0.0.1:" + std::to_string(kPort);
    config.run_id = "job";
    config.min_nodes = min_;
    config.max_nodes = max_;
    config.conf = {{"is_host", nodes_.empty() ? "1" : "0"},
                   {"keep_alive_interval", std::to_string(kKeepAlive.count())},
                   {"keep_alive_max_attempt", std::to_string(kMaxMisses)},
                   {"last_call_timeout", std::to_string(kLastCall.count())},
                   {"join_timeout", std::to_string(kJoinTimeout.count())}};
    nodes_.push_back(std::make_unique<Node>(network, name, config));
    return *nodes_.back();
  }

  InMemoryStore& store() { return network.store(kPort); }
  bool has(const std::string& key) { return store().check({"rdzv/job/" + key}); }
  std::string get(const std::string& key) { return store().get("rdzv/job/" + key); }
  // Waits until `n` threads are blocked on the clock, then moves it on by `d`.
  void advance(size_t n, ManualClock::Duration d) {
    REQUIRE(clock.awaitSleepers(n));
    clock.advance(d);
  }

  ManualClock clock;
  InMemoryNetwork network{clock};

 private:
  ScopedEnv no_token_{"DDPRUN_TOKEN", std::nullopt};
  int min_, max_;
  // Destroyed before the network (and in any order: a node destroyed stops its watcher,
  // and the network keeps every store's memory for the connections left to it).
  std::vector<std::unique_ptr<Node>> nodes_;
};

// Forms a round of the nodes given, in this order (group rank = position): each joins once
// the one before it waits, and the last one closes the round (it must make the job full,
// or `last_call` must be set to close it by the last-call timer).
inline std::vector<RendezvousResult> form(Job& job, std::vector<Node*> nodes, bool last_call = false) {
  std::vector<Call<RendezvousResult>> pending;
  for (size_t i = 0; i < nodes.size(); ++i) {
    pending.push_back(nodes[i]->nextRound());
    if (i + 1 < nodes.size() || last_call) REQUIRE(job.clock.awaitSleepers(i + 1));
  }
  if (last_call) job.clock.advance(kLastCall);
  std::vector<RendezvousResult> results;
  for (auto& call : pending) results.push_back(call.get());
  return results;
}

}  // namespace ddprun::rendezvous::testing
