// FaultInjectingStore and FaultPlan: which calls a rule picks (operation, key glob, count),
// what failing, dropping and delaying do to the caller and to the store, a plan shared by
// several connections, and failAll() as the loss of the store's host.
#include "tests/support/fault_injecting_store.h"

#include <catch2/catch.hpp>
#include <future>

#include "tests/support/in_memory_store.h"
#include "tests/support/manual_clock.h"

using namespace ddprun::rendezvous;
using ddprun::testing::ManualClock;
using namespace std::chrono_literals;

namespace {

constexpr auto kGuard = std::chrono::seconds(30);  // real time; only a broken test waits this long

template <class T>
void requireFinished(std::future<T>& f) {
  REQUIRE(f.wait_for(kGuard) == std::future_status::ready);
}

struct Fixture {
  ManualClock clock;
  InMemoryStore store{clock, 60s};
  std::shared_ptr<FaultPlan> plan = std::make_shared<FaultPlan>();
  FaultInjectingStore faulty{store, clock, plan};
};

}  // namespace

TEST_CASE("fault injection: without rules every call goes through", "[faults]") {
  Fixture f;
  f.faulty.set("a", "1");
  CHECK(f.faulty.get("a") == "1");
  CHECK(f.faulty.add("n", 3) == 3);
  CHECK(f.faulty.compareSet("a", "1", "2") == "2");
  CHECK(f.faulty.check({"a", "n"}));
  CHECK(f.faulty.numKeys() == 2);
  CHECK(f.faulty.timeout() == 60s);
  CHECK(f.plan->calls() == 6);
}

TEST_CASE("fault injection: the nth matching call fails and only that one", "[faults]") {
  Fixture f;
  f.store.set("rdzv/job/alive", "1");
  f.store.set("rdzv/job/other", "1");
  const size_t rule = f.plan->add(Fault::fail().only(StoreOp::kGet).matching("rdzv/*/alive").from(3));
  CHECK(f.faulty.get("rdzv/job/alive") == "1");
  CHECK(f.faulty.get("rdzv/job/other") == "1");  // another key: not counted
  f.faulty.set("rdzv/job/alive", "2");           // another operation: not counted
  CHECK(f.faulty.get("rdzv/job/alive") == "2");
  try {
    f.faulty.get("rdzv/job/alive");
    FAIL("the third get went through");
  } catch (const StoreTimeout&) {
    FAIL("a failure reported as a timeout");
  } catch (const StoreError& e) {
    CHECK_THAT(e.what(), Catch::Contains("get(key=rdzv/job/alive)") && Catch::Contains("injected"));
  }
  CHECK(f.faulty.get("rdzv/job/alive") == "2");
  CHECK(f.plan->hits(rule) == 1);
}

TEST_CASE("fault injection: a failed write never reaches the store", "[faults]") {
  Fixture f;
  f.plan->add(Fault::fail().only(StoreOp::kAdd).repeat(2));
  CHECK_THROWS_AS(f.faulty.add("n", 1), StoreError);
  CHECK_THROWS_AS(f.faulty.add("n", 1), StoreError);
  CHECK(f.faulty.add("n", 1) == 1);
}

TEST_CASE("fault injection: a glob matches any of the keys a call names", "[faults]") {
  Fixture f;
  f.plan->add(Fault::fail().matching("*/hb/*").always());
  CHECK_THROWS_AS(f.faulty.check({"a", "r0/hb/1"}), StoreError);
  CHECK_THROWS_AS(f.faulty.multiSet({"x", "r1/hb/0"}, {"1", "2"}), StoreError);
  CHECK_FALSE(f.store.check({"x"}));
  f.faulty.multiSet({"x", "y"}, {"1", "2"});
  CHECK(f.faulty.numKeys() == 2);  // names no key: only "*" matches it
}

TEST_CASE("fault injection: a dropped call changes nothing and times out on the clock", "[faults]") {
  Fixture f;
  f.plan->add(Fault::drop().only(StoreOp::kSet));
  auto dropped = std::async(std::launch::async, [&] { f.faulty.set("k", "v"); });
  REQUIRE(f.clock.awaitSleepers(1));
  f.clock.advance(59s);
  CHECK(f.clock.sleepers() == 1);  // the store's timeout (60 s) is not over
  f.clock.advance(1s);
  requireFinished(dropped);
  CHECK_THROWS_AS(dropped.get(), StoreTimeout);
  CHECK_FALSE(f.store.check({"k"}));

  // A dropped wait times out after its own timeout.
  f.plan->add(Fault::drop().only(StoreOp::kWait));
  f.store.set("there", "1");
  auto wait = std::async(std::launch::async, [&] { f.faulty.wait({"there"}, 5s); });
  REQUIRE(f.clock.awaitSleepers(1));
  f.clock.advance(5s);
  requireFinished(wait);
  CHECK_THROWS_AS(wait.get(), StoreTimeout);
}

TEST_CASE("fault injection: a delayed call happens once the delay is over", "[faults]") {
  Fixture f;
  f.plan->add(Fault::delayBy(3s).only(StoreOp::kSet));
  auto delayed = std::async(std::launch::async, [&] { f.faulty.set("k", "v"); });
  REQUIRE(f.clock.awaitSleepers(1));
  CHECK_FALSE(f.store.check({"k"}));
  f.clock.advance(3s);
  requireFinished(delayed);
  delayed.get();
  CHECK(f.store.get("k") == "v");
}

TEST_CASE("fault injection: interrupt ends a drop at once and fails later calls", "[faults]") {
  Fixture f;
  f.plan->add(Fault::drop());
  auto dropped = std::async(std::launch::async, [&] { return f.faulty.get("k"); });
  REQUIRE(f.clock.awaitSleepers(1));
  f.faulty.interrupt();
  requireFinished(dropped);
  try {
    dropped.get();
    FAIL("returned");
  } catch (const StoreTimeout&) {
    FAIL("an interrupted call reported a timeout");
  } catch (const StoreError& e) {
    CHECK_THAT(e.what(), Catch::Contains("interrupted"));
  }
  CHECK_THROWS_AS(f.faulty.set("a", "1"), StoreError);
}

TEST_CASE("fault injection: one plan counts the calls of every connection that shares it", "[faults]") {
  ManualClock clock;
  InMemoryStore store(clock);
  auto plan = std::make_shared<FaultPlan>();
  FaultInjectingStore one(store, clock, plan);
  FaultInjectingStore two(store, clock, plan);
  plan->add(Fault::fail().only(StoreOp::kAdd).from(2));
  CHECK(one.add("n", 1) == 1);
  CHECK_THROWS_AS(two.add("n", 1), StoreError);
  CHECK(one.add("n", 1) == 2);
  CHECK(plan->calls() == 3);
}

TEST_CASE("fault injection: failAll fails every call from then on and blocked ones at once", "[faults]") {
  ManualClock clock;
  InMemoryStore store(clock, 300s);
  auto plan = std::make_shared<FaultPlan>();
  FaultInjectingStore waiting(store.connect(300s), clock, plan);
  FaultInjectingStore idle(store, clock, plan);
  auto blocked = std::async(std::launch::async, [&] { waiting.wait({"never"}, 300s); });
  REQUIRE(clock.awaitSleepers(1));
  plan->failAll();
  requireFinished(blocked);  // reset like a connection to a dead host: no clock movement needed
  CHECK_THROWS_AS(blocked.get(), StoreError);
  CHECK_THROWS_AS(idle.set("k", "v"), StoreError);
  CHECK_FALSE(store.check({"k"}));
  plan->clear();
  CHECK_THROWS_AS(waiting.get("k"), StoreError);  // a reset connection stays reset
  FaultInjectingStore fresh(store, clock, plan);
  fresh.set("k", "v");
  CHECK(store.get("k") == "v");
}
