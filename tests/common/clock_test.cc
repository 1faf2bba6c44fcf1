// The Clock seam: the real clock's waits at a deadline already passed (they must not
// block), and the ManualClock that the state machine tests run on: time moves only on
// advance(), which wakes exactly the waiters whose deadline it passes.
#include "common/clock.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <future>

#include "tests/support/manual_clock.h"

using ddprun::Clock;
using ddprun::testing::ManualClock;
using namespace std::chrono_literals;

namespace {

constexpr auto kGuard = std::chrono::seconds(30);  // real time; only a broken test waits this long

template <class T>
bool ready(std::future<T>& f) {
  return f.wait_for(0s) == std::future_status::ready;
}

}  // namespace

TEST_CASE("clock: the real clock returns at once for a deadline already passed", "[clock]") {
  Clock& clock = Clock::real();
  const auto before = clock.now();
  clock.sleepUntil(before - 1s);
  std::mutex mutex;
  std::condition_variable cv;
  std::unique_lock lock(mutex);
  CHECK(clock.waitUntil(lock, cv, clock.now() - 1ms) == std::cv_status::timeout);
  CHECK(lock.owns_lock());
  CHECK(clock.now() >= before);
}

TEST_CASE("clock: a manual clock stands still until advanced", "[clock]") {
  ManualClock clock;
  const auto start = clock.now();
  CHECK(clock.now() == start);
  clock.advance(1500ms);
  CHECK(clock.now() - start == 1500ms);
  CHECK(clock.sleepers() == 0);
  CHECK_FALSE(clock.nextDeadline());
  CHECK_FALSE(clock.advanceToNextDeadline());
  clock.sleepUntil(start);  // passed: returns at once
}

TEST_CASE("clock: advance wakes the sleepers whose deadline it passes and no others", "[clock]") {
  ManualClock clock;
  const auto start = clock.now();
  auto soon = std::async(std::launch::async, [&] { clock.sleepFor(5s); });
  auto later = std::async(std::launch::async, [&] { clock.sleepFor(10s); });
  REQUIRE(clock.awaitSleepers(2));
  CHECK(clock.nextDeadline() == start + 5s);
  clock.advance(4s);
  CHECK(clock.sleepers() == 2);
  clock.advance(1s);
  REQUIRE(soon.wait_for(kGuard) == std::future_status::ready);
  CHECK(clock.sleepers() == 1);
  CHECK_FALSE(ready(later));
  CHECK(clock.advanceToNextDeadline() == start + 10s);
  REQUIRE(later.wait_for(kGuard) == std::future_status::ready);
  CHECK(clock.now() == start + 10s);
}

TEST_CASE("clock: a manual waitUntil returns no_timeout when notified and timeout at its deadline", "[clock]") {
  ManualClock clock;
  std::mutex mutex;
  std::condition_variable cv;
  bool flag = false;
  auto notified = std::async(std::launch::async, [&] {
    std::unique_lock lock(mutex);
    const auto deadline = clock.now() + 60s;
    while (!flag) {
      if (clock.waitUntil(lock, cv, deadline) == std::cv_status::timeout) return false;
    }
    return true;
  });
  REQUIRE(clock.awaitSleepers(1));
  {
    std::lock_guard lock(mutex);
    flag = true;
  }
  cv.notify_all();
  REQUIRE(notified.wait_for(kGuard) == std::future_status::ready);
  CHECK(notified.get());

  auto timed_out = std::async(std::launch::async, [&] {
    std::unique_lock lock(mutex);
    return clock.waitUntil(lock, cv, clock.now() + 60s) == std::cv_status::timeout && lock.owns_lock();
  });
  REQUIRE(clock.awaitSleepers(1));
  clock.advance(60s);
  REQUIRE(timed_out.wait_for(kGuard) == std::future_status::ready);
  CHECK(timed_out.get());
}

TEST_CASE("clock: awaitSleepers with a condition waits for the sleepers and the condition", "[clock]") {
  ManualClock clock;
  std::atomic<bool> written{false};
  auto sleeper = std::async(std::launch::async, [&] {
    written = true;
    clock.sleepFor(1s);
  });
  CHECK(clock.awaitSleepers(1, [&] { return written.load(); }));
  CHECK(clock.sleepers() == 1);
  clock.advance(1s);
  REQUIRE(sleeper.wait_for(kGuard) == std::future_status::ready);
}
