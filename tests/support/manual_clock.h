// A Clock that stands still until the test moves it: advance() wakes every thread whose
// deadline it passes (sleepUntil, waitUntil), in the order of their deadlines' passing
// all at once. Tests of state machines with timeouts run on it without sleeping: a test
// waits until the threads it drives are all blocked on the clock (awaitSleepers), then
// moves time on. All methods are thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "common/clock.h"

namespace ddprun::testing {

class ManualClock final : public Clock {
 public:
  // Starts at an arbitrary, fixed time (a day after steady_clock's epoch).
  ManualClock();

  TimePoint now() const override;
  void sleepUntil(TimePoint deadline) override;
  std::cv_status waitUntil(std::unique_lock<std::mutex>& lock, std::condition_variable& cv,
                           TimePoint deadline) override;

  // Moves time on by `duration` and wakes every waiter whose deadline is now passed;
  // returns once each of them has been notified (not once they have run).
  void advance(Duration duration);
  // Moves time on to the earliest deadline anyone waits for (nothing when nobody waits).
  // Returns that deadline.
  std::optional<TimePoint> advanceToNextDeadline();

  // Threads blocked on this clock now.
  size_t sleepers() const;
  // The earliest deadline a blocked thread waits for.
  std::optional<TimePoint> nextDeadline() const;
  // Blocks until at least `n` threads are blocked on this clock. A guard against a test
  // that would otherwise hang: returns false after `limit` of real time (the test
  // should fail then), true as soon as they are.
  bool awaitSleepers(size_t n, std::chrono::milliseconds limit = std::chrono::seconds(30));
  // The same, until also `condition` holds: it is evaluated on the calling thread, without
  // the clock's lock (it may use the stores the sleepers wait on), whenever a thread starts
  // or stops waiting. For "a node has written its key and waits again": a thread that was
  // woken but has not run yet still counts as a sleeper, so a count alone can be stale.
  bool awaitSleepers(size_t n, const std::function<bool()>& condition,
                     std::chrono::milliseconds limit = std::chrono::seconds(30));

 private:
  // One blocked thread: the mutex and condition variable it waits on, so that advance()
  // can notify it under its own mutex (no wakeup lost between its check and its wait).
  struct Sleeper {
    std::mutex* mutex;
    std::condition_variable* cv;
    TimePoint deadline;
    bool being_woken = false;  // advance() may still touch mutex/cv: the waiter must not return yet
  };

  mutable std::mutex mutex_;
  std::condition_variable changed_;  // sleepers_ or being_woken changed
  uint64_t changes_ = 0;             // every change to sleepers_, to re-evaluate conditions
  TimePoint now_;
  std::vector<std::shared_ptr<Sleeper>> sleepers_;
};

}  // namespace ddprun::testing
