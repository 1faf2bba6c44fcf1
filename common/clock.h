// Time as a seam: what code that waits needs from the clock (now, sleeping, waiting on a
// condition variable until a deadline), so that state machines with timeouts (the
// rendezvous, the restart policy) run in tests on a manual clock that only moves when the
// test says so (tests/support/manual_clock.h). Production code takes a Clock& and is
// given Clock::real(), which is std::chrono::steady_clock.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

namespace ddprun {

class Clock {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  using Duration = std::chrono::steady_clock::duration;

  virtual ~Clock() = default;

  // The current time of this clock. Thread-safe.
  virtual TimePoint now() const = 0;
  // Blocks the calling thread until now() >= deadline; returns at once when it already is.
  // Thread-safe; cannot be interrupted (wait on a condition variable for that).
  virtual void sleepUntil(TimePoint deadline) = 0;
  void sleepFor(Duration duration) { sleepUntil(now() + duration); }
  // As std::condition_variable::wait_until, on this clock: `lock` (held on entry, held
  // again on return) is released while the thread waits on `cv`, until `cv` is notified
  // or now() >= deadline. Returns std::cv_status::timeout iff now() >= deadline on
  // return. May return early without either (spuriously), so callers re-check their
  // condition in a loop. Thread-safe.
  virtual std::cv_status waitUntil(std::unique_lock<std::mutex>& lock, std::condition_variable& cv,
                                   TimePoint deadline) = 0;

  // The process-wide steady clock. Never destroyed; thread-safe.
  static Clock& real();
};

}  // namespace ddprun
