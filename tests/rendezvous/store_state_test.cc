// StoreState on its own, as the server's I/O thread drives it: torch's compare_set and
// add rules, which connections a change wakes, queues, the barrier, torch 1.13 watches,
// and a dropped connection that leaves nothing behind.
#include "rendezvous/store/store_state.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <limits>

#include "rendezvous/store/wire_protocol.h"

using namespace ddprun::rendezvous;

namespace {

std::string value(const StoreState& state, const std::string& key) {
  const std::string* v = state.get(key);
  return v ? *v : "<missing>";
}

bool woke(const StoreEffects& effects, ConnectionId connection) {
  return std::find(effects.woken.begin(), effects.woken.end(), connection) != effects.woken.end();
}

// A torch 1.13 watch frame: u8 kind, then key, old and new value as u64-length strings.
std::string watchFrame(wire::WatchResponse kind, const std::string& key, const std::string& old_value,
                       const std::string& new_value) {
  std::string frame(1, static_cast<char>(kind));
  wire::putBytes(frame, key);
  wire::putBytes(frame, old_value);
  wire::putBytes(frame, new_value);
  return frame;
}

}  // namespace

TEST_CASE("store state: compare_set on a missing key creates it only when expected is empty", "[store_state]") {
  StoreState state;
  StoreEffects effects;
  CHECK(state.compareSet("k", "something", "new", effects) == "something");
  CHECK(state.get("k") == nullptr);
  CHECK(state.compareSet("k", "", "first", effects) == "first");
  CHECK(value(state, "k") == "first");
}

TEST_CASE("store state: compare_set on an existing key swaps on a match and replies what is stored", "[store_state]") {
  StoreState state;
  StoreEffects effects;
  state.set("k", "a", effects);
  CHECK(state.compareSet("k", "b", "c", effects) == "a");  // no match: the current value
  CHECK(value(state, "k") == "a");
  CHECK(state.compareSet("k", "a", "c", effects) == "c");  // match: the new value
  CHECK(value(state, "k") == "c");
  // An empty expected value matches only an empty stored one.
  CHECK(state.compareSet("k", "", "d", effects) == "c");
  state.set("empty", "", effects);
  CHECK(state.compareSet("empty", "", "filled", effects) == "filled");
}

TEST_CASE("store state: compare_set wakes the key's waiters whatever it did as torch's server does", "[store_state]") {
  StoreState state;
  StoreEffects effects;
  REQUIRE_FALSE(state.wait(1, {"k"}));
  state.compareSet("k", "not there", "x", effects);  // swaps nothing and creates nothing
  CHECK(woke(effects, 1));
  CHECK(state.waitingConnections() == 0);
}

TEST_CASE("store state: add keeps a decimal string and reads it as std::stoll does", "[store_state]") {
  StoreState state;
  StoreEffects effects;
  CHECK(state.add("n", 5, effects) == 5);  // a missing key counts from 0
  CHECK(value(state, "n") == "5");
  CHECK(state.add("n", -7, effects) == -2);
  CHECK(value(state, "n") == "-2");
  state.set("spaced", "  +40", effects);
  CHECK(state.add("spaced", 2, effects) == 42);
  state.set("junk", "12abc", effects);  // trailing junk is ignored
  CHECK(state.add("junk", 1, effects) == 13);
  CHECK(value(state, "junk") == "13");
  state.set("max", std::to_string(std::numeric_limits<int64_t>::max()), effects);
  CHECK(state.add("max", 1, effects) == std::numeric_limits<int64_t>::min());  // wraps, never traps
}

TEST_CASE("store state: add on a value with no leading number fails and changes nothing", "[store_state]") {
  StoreState state;
  StoreEffects effects;
  for (const char* text : {"abc", "", "   ", "-", "+", "x12"}) {
    INFO(text);
    state.set("k", text, effects);
    CHECK_FALSE(state.add("k", 1, effects));
    CHECK(value(state, "k") == text);
  }
}

TEST_CASE("store state: a wait for several keys is woken by the last of them only", "[store_state]") {
  StoreState state;
  StoreEffects effects;
  state.set("there", "1", effects);
  CHECK(state.wait(7, {"there"}));  // already satisfied: nothing registered
  CHECK(state.waitingConnections() == 0);
  CHECK_FALSE(state.wait(7, {"a", "there", "b"}));
  CHECK(state.waitingConnections() == 1);
  StoreEffects first;
  state.set("a", "1", first);
  CHECK_FALSE(woke(first, 7));
  StoreEffects second;
  state.append("b", "x", second);
  CHECK(woke(second, 7));
  CHECK(state.waitingConnections() == 0);
}

TEST_CASE("store state: a cancelled wait is not woken later", "[store_state]") {
  StoreState state;
  StoreEffects effects;
  REQUIRE_FALSE(state.wait(3, {"k"}));
  REQUIRE_FALSE(state.wait(4, {"k"}));
  CHECK(state.cancelWait(3));
  CHECK_FALSE(state.cancelWait(3));  // nothing left to cancel
  state.set("k", "v", effects);
  CHECK_FALSE(woke(effects, 3));
  CHECK(woke(effects, 4));
}

TEST_CASE("store state: waits withdrawn and made again, as keep-alives do, wake each connection once and only when due",
          "[store_state]") {
  StoreState state;
  StoreEffects effects;
  // Many connections wait on one key and withdraw, over and over (each agent's watcher on a
  // round's end); connection 1 comes back waiting on two keys.
  for (int turn = 0; turn < 5; ++turn) {
    for (ConnectionId c = 1; c <= 100; ++c) REQUIRE_FALSE(state.wait(c, {"end"}));
    for (ConnectionId c = 1; c <= 100; ++c) REQUIRE(state.cancelWait(c));
  }
  REQUIRE_FALSE(state.wait(1, {"end", "other"}));
  for (ConnectionId c = 2; c <= 50; ++c) REQUIRE_FALSE(state.wait(c, {"end", "end"}));
  CHECK(state.waitingConnections() == 50);
  state.set("end", "done", effects);
  CHECK_FALSE(woke(effects, 1));  // still missing "other"
  CHECK(effects.woken.size() == 49);
  for (ConnectionId c = 2; c <= 50; ++c) CHECK(std::count(effects.woken.begin(), effects.woken.end(), c) == 1);
  effects = {};
  state.set("other", "x", effects);
  CHECK(effects.woken == std::vector<ConnectionId>{1});
  CHECK(state.waitingConnections() == 0);
}

TEST_CASE("store state: queues pop in order and count as existing keys while not empty and wake one waiter",
          "[store_state]") {
  StoreState state;
  StoreEffects effects;
  CHECK_FALSE(state.queuePop("q"));
  CHECK_FALSE(state.check({"q"}));
  REQUIRE_FALSE(state.wait(1, {"q"}));
  REQUIRE_FALSE(state.wait(2, {"q"}));
  StoreEffects pushed;
  state.queuePush("q", "first", pushed);
  CHECK(pushed.woken.size() == 1);  // one element satisfies one popper
  CHECK(woke(pushed, 1));
  state.queuePush("q", "second", effects);
  CHECK(woke(effects, 2));
  CHECK(state.check({"q"}));
  CHECK(state.queueLength("q") == 2);
  CHECK(state.queuePop("q") == "first");
  CHECK(state.queuePop("q") == "second");
  CHECK_FALSE(state.queuePop("q"));
  CHECK(state.queueLength("q") == 0);
  CHECK_FALSE(state.check({"q"}));
}

TEST_CASE("store state: a barrier releases everyone when the last of the world arrives", "[store_state]") {
  StoreState state;
  StoreEffects effects;
  CHECK_FALSE(state.barrier(1, "b", 3, effects));
  CHECK_FALSE(state.barrier(2, "b", 3, effects));
  CHECK(effects.woken.empty());
  CHECK(value(state, "b") == "2");
  StoreEffects last;
  CHECK(state.barrier(3, "b", 3, last));
  CHECK(woke(last, 1));
  CHECK(woke(last, 2));
  CHECK_FALSE(woke(last, 3));  // the last arrival is answered directly
  CHECK(state.waitingConnections() == 0);
}

TEST_CASE("store state: torch 1.13 watchers hear of creation and updates and deletion", "[store_state]") {
  StoreState state;
  state.watch(9, "k");
  StoreEffects created;
  state.set("k", "a", created);
  REQUIRE(created.watch_messages.size() == 1);
  CHECK(created.watch_messages[0].first == 9);
  CHECK(created.watch_messages[0].second == watchFrame(wire::WatchResponse::kKeyCreated, "k", "", "a"));
  StoreEffects updated;
  CHECK(state.compareSet("k", "a", "b", updated) == "b");
  REQUIRE(updated.watch_messages.size() == 1);
  CHECK(updated.watch_messages[0].second == watchFrame(wire::WatchResponse::kKeyUpdated, "k", "a", "b"));
  StoreEffects deleted;
  CHECK(state.deleteKey("k", deleted));
  REQUIRE(deleted.watch_messages.size() == 1);
  CHECK(deleted.watch_messages[0].second == watchFrame(wire::WatchResponse::kKeyDeleted, "k", "b", ""));
  StoreEffects none;
  CHECK_FALSE(state.deleteKey("k", none));
  CHECK(none.watch_messages.empty());
}

TEST_CASE("store state: a dropped connection leaves no wait or watch behind", "[store_state]") {
  StoreState state;
  StoreEffects effects;
  REQUIRE_FALSE(state.wait(5, {"a", "b"}));
  REQUIRE_FALSE(state.barrier(6, "bar", 2, effects));
  state.watch(5, "w");
  state.dropConnection(5);
  state.dropConnection(6);
  CHECK(state.waitingConnections() == 0);
  StoreEffects later;
  state.set("a", "1", later);
  state.set("b", "1", later);
  state.set("w", "1", later);
  CHECK(later.woken.empty());
  CHECK(later.watch_messages.empty());
  // The barrier's count stays: a new arrival completes it as the second of two.
  StoreEffects arrival;
  CHECK(state.barrier(7, "bar", 2, arrival));
  CHECK_FALSE(woke(arrival, 6));
}

TEST_CASE("store state: num_keys counts every key and list_keys sorts them", "[store_state]") {
  StoreState state;
  StoreEffects effects;
  state.set("b", "1", effects);
  state.set("init/x", "1", effects);
  state.append("a", "x", effects);
  state.append("a", "y", effects);
  CHECK(value(state, "a") == "xy");
  CHECK(state.numKeys() == 3);
  CHECK(state.listKeys() == std::vector<std::string>{"a", "b", "init/x"});
  CHECK(state.deleteKey("b", effects));
  CHECK(state.numKeys() == 2);
}
