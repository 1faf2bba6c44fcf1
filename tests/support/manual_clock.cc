#include "tests/support/manual_clock.h"

#include <algorithm>

namespace ddprun::testing {

ManualClock::ManualClock() : now_(TimePoint{} + std::chrono::hours(24)) {}

Clock::TimePoint ManualClock::now() const {
  std::lock_guard lock(mutex_);
  return now_;
}

void ManualClock::sleepUntil(TimePoint deadline) {
  std::mutex mutex;
  std::condition_variable cv;
  std::unique_lock lock(mutex);
  while (waitUntil(lock, cv, deadline) != std::cv_status::timeout) {
  }
}

// Lock order: the caller's mutex, then mutex_ (never the other way round: advance()
// releases mutex_ before it takes a sleeper's mutex).
std::cv_status ManualClock::waitUntil(std::unique_lock<std::mutex>& lock, std::condition_variable& cv,
                                      TimePoint deadline) {
  auto sleeper = std::make_shared<Sleeper>(Sleeper{lock.mutex(), &cv, deadline});
  {
    std::lock_guard guard(mutex_);
    if (now_ >= deadline) return std::cv_status::timeout;
    sleepers_.push_back(sleeper);
    ++changes_;
    changed_.notify_all();
  }
  // `lock` is held from the registration to here, so advance() (which notifies under it)
  // cannot notify before this thread waits.
  cv.wait(lock);
  // Deregister; if advance() is notifying this sleeper right now, it needs our mutex and
  // condition variable alive until it is done, and it needs our mutex free to get there.
  lock.unlock();
  {
    std::unique_lock guard(mutex_);
    if (std::erase(sleepers_, sleeper) > 0) ++changes_;
    changed_.notify_all();
    changed_.wait(guard, [&] { return !sleeper->being_woken; });
  }
  lock.lock();
  return now() >= deadline ? std::cv_status::timeout : std::cv_status::no_timeout;
}

void ManualClock::advance(Duration duration) {
  std::vector<std::shared_ptr<Sleeper>> due;
  {
    std::lock_guard guard(mutex_);
    now_ += duration;
    for (auto it = sleepers_.begin(); it != sleepers_.end();) {
      if ((*it)->deadline <= now_) {
        (*it)->being_woken = true;
        due.push_back(*it);
        it = sleepers_.erase(it);
        ++changes_;
      } else {
        ++it;
      }
    }
    changed_.notify_all();
  }
  for (const auto& sleeper : due) {
    std::lock_guard guard(*sleeper->mutex);
    sleeper->cv->notify_all();
  }
  std::lock_guard guard(mutex_);
  for (const auto& sleeper : due) sleeper->being_woken = false;
  changed_.notify_all();
}

std::optional<Clock::TimePoint> ManualClock::advanceToNextDeadline() {
  auto next = nextDeadline();
  if (!next) return std::nullopt;
  const TimePoint current = now();
  advance(*next > current ? *next - current : Duration::zero());
  return next;
}

size_t ManualClock::sleepers() const {
  std::lock_guard guard(mutex_);
  return sleepers_.size();
}

std::optional<Clock::TimePoint> ManualClock::nextDeadline() const {
  std::lock_guard guard(mutex_);
  if (sleepers_.empty()) return std::nullopt;
  return (*std::min_element(sleepers_.begin(), sleepers_.end(),
                            [](const auto& a, const auto& b) { return a->deadline < b->deadline; }))
      ->deadline;
}

bool ManualClock::awaitSleepers(size_t n, std::chrono::milliseconds limit) {
  const std::function<bool()> always = [] { return true; };
  return awaitSleepers(n, always, limit);
}

bool ManualClock::awaitSleepers(size_t n, const std::function<bool()>& condition, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  std::unique_lock guard(mutex_);
  for (;;) {
    if (!changed_.wait_until(guard, deadline, [&] { return sleepers_.size() >= n; })) return false;
    const uint64_t seen = changes_;
    guard.unlock();
    const bool holds = condition();
    guard.lock();
    // The count again: the condition may have come true through a sleeper that left.
    if (holds && sleepers_.size() >= n) return true;
    if (!changed_.wait_until(guard, deadline, [&] { return changes_ != seen; })) return false;
  }
}

}  // namespace ddprun::testing
