// InMemoryStore: StoreState's semantics behind a mutex, blocking calls that a change wakes
// at once and that time out on the store's clock (a manual one here: no test sleeps),
// and clients with their own timeouts and interrupt().
#include "tests/support/in_memory_store.h"

#include <catch2/catch.hpp>
#include <future>

#include "tests/support/manual_clock.h"

using namespace ddprun::rendezvous;
using ddprun::testing::ManualClock;
using namespace std::chrono_literals;

namespace {

constexpr auto kGuard = std::chrono::seconds(30);  // real time; only a broken test waits this long

template <class T>
bool ready(std::future<T>& f) {
  return f.wait_for(0s) == std::future_status::ready;
}

template <class T>
void requireFinished(std::future<T>& f) {
  REQUIRE(f.wait_for(kGuard) == std::future_status::ready);
}

}  // namespace

TEST_CASE("in-memory store: a get waits for its key and a set from another thread wakes it", "[in_memory]") {
  ManualClock clock;
  InMemoryStore store(clock, 10s);
  auto got = std::async(std::launch::async, [&] { return store.get("k"); });
  REQUIRE(clock.awaitSleepers(1));
  CHECK_FALSE(ready(got));
  store.set("k", "v");
  requireFinished(got);
  CHECK(got.get() == "v");
}

TEST_CASE("in-memory store: a get times out when the clock passes the store's timeout and not before", "[in_memory]") {
  ManualClock clock;
  InMemoryStore store(clock, 10s);
  auto got = std::async(std::launch::async, [&] { return store.get("missing"); });
  REQUIRE(clock.awaitSleepers(1));
  clock.advance(9999ms);
  CHECK(clock.sleepers() == 1);  // its deadline is not passed: still waiting
  clock.advance(1ms);
  requireFinished(got);
  try {
    got.get();
    FAIL("get returned");
  } catch (const StoreTimeout& e) {
    CHECK_THAT(e.what(), Catch::Contains("get(key=missing)") && Catch::Contains("10000 ms"));
  }
}

TEST_CASE("in-memory store: wait and multi_get want every key and wait has its own timeout", "[in_memory]") {
  ManualClock clock;
  InMemoryStore store(clock, 300s);
  auto values = std::async(std::launch::async, [&] { return store.multiGet({"a", "b"}); });
  REQUIRE(clock.awaitSleepers(1));
  store.set("a", "1");
  CHECK_FALSE(ready(values));  // "b" is still missing
  store.set("b", "2");
  requireFinished(values);
  CHECK(values.get() == std::vector<std::string>{"1", "2"});

  auto waited = std::async(std::launch::async, [&] { store.wait({"a", "c"}, 2s); });
  REQUIRE(clock.awaitSleepers(1));
  clock.advance(2s);
  requireFinished(waited);
  CHECK_THROWS_AS(waited.get(), StoreTimeout);
}

TEST_CASE("in-memory store: queue_pop waits for a push and times out on the clock", "[in_memory]") {
  ManualClock clock;
  InMemoryStore store(clock);
  auto popped = std::async(std::launch::async, [&] { return store.queuePop("q", 5s); });
  REQUIRE(clock.awaitSleepers(1));
  store.queuePush("q", "x");
  requireFinished(popped);
  CHECK(popped.get() == "x");
  CHECK(store.queueLength("q") == 0);

  auto empty = std::async(std::launch::async, [&] { return store.queuePop("q", 5s); });
  REQUIRE(clock.awaitSleepers(1));
  clock.advance(5s);
  requireFinished(empty);
  CHECK_THROWS_AS(empty.get(), StoreTimeout);
}

TEST_CASE("in-memory store: bad input fails with StoreError at once", "[in_memory]") {
  ManualClock clock;
  InMemoryStore store(clock);
  store.set("text", "abc");
  try {
    store.add("text", 1);
    FAIL("add returned");
  } catch (const StoreTimeout&) {
    FAIL("a timeout for a bad value");
  } catch (const StoreError& e) {
    CHECK_THAT(e.what(), Catch::Contains("add(key=text)"));
  }
  CHECK(store.get("text") == "abc");
  CHECK_THROWS_AS(store.multiSet({"a", "b"}, {"1"}), StoreError);
  CHECK_FALSE(store.check({"a"}));
}

TEST_CASE("in-memory store: the other operations keep the server's semantics", "[in_memory]") {
  ManualClock clock;
  InMemoryStore store(clock);
  CHECK(store.add("n", 2) == 2);
  CHECK(store.compareSet("n", "2", "7") == "7");
  CHECK(store.compareSet("n", "2", "9") == "7");
  store.append("s", "ab");
  store.append("s", "cd");
  store.multiSet({"m1", "m2"}, {"x", "y"});
  CHECK(store.multiGet({"s", "m2"}) == std::vector<std::string>{"abcd", "y"});
  CHECK(store.numKeys() == 4);
  CHECK(store.listKeys() == std::vector<std::string>{"m1", "m2", "n", "s"});
  CHECK(store.deleteKey("m1"));
  CHECK_FALSE(store.deleteKey("m1"));
  CHECK(store.numKeys() == 3);
}

TEST_CASE("in-memory store: a client has its own timeout and interrupt() fails its blocked call and later ones",
          "[in_memory]") {
  ManualClock clock;
  InMemoryStore store(clock, 300s);
  auto quick = store.connect(1s, "10.0.0.7");
  auto other = store.connect(300s);
  CHECK(quick->timeout() == 1s);
  CHECK(quick->localAddress() == "10.0.0.7");

  auto timed_out = std::async(std::launch::async, [&] { return quick->get("k"); });
  REQUIRE(clock.awaitSleepers(1));
  clock.advance(1s);
  requireFinished(timed_out);
  CHECK_THROWS_AS(timed_out.get(), StoreTimeout);

  auto blocked = std::async(std::launch::async, [&] { quick->wait({"k"}, 300s); });
  auto bystander = std::async(std::launch::async, [&] { return other->get("k"); });
  REQUIRE(clock.awaitSleepers(2));
  quick->interrupt();
  requireFinished(blocked);
  try {
    blocked.get();
    FAIL("wait returned");
  } catch (const StoreTimeout&) {
    FAIL("an interrupted call reported a timeout");
  } catch (const StoreError& e) {
    CHECK_THAT(e.what(), Catch::Contains("interrupted"));
  }
  CHECK_THROWS_AS(quick->set("k", "v"), StoreError);
  CHECK_FALSE(store.check({"k"}));  // the interrupted client's set never happened
  CHECK_FALSE(ready(bystander));    // the other client still waits
  other->set("k", "v");
  requireFinished(bystander);
  CHECK(bystander.get() == "v");
}

TEST_CASE("in-memory store: the timeout-only constructor waits on the real clock", "[in_memory]") {
  InMemoryStore store(std::chrono::milliseconds(1));
  CHECK(store.timeout() == 1ms);
  CHECK_THROWS_AS(store.get("missing"), StoreTimeout);
  store.set("k", "v");
  CHECK(store.get("k") == "v");
}
