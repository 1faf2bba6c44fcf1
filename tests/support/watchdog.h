// A bound on a wait that has no timeout of its own (std::atomic::wait, a join): while a
// Watchdog lives, a thread of its own waits for it to be destroyed, and ends the process
// with a line naming what never came if `limit` passes first. A guard, not a clock: in a
// passing run it never fires, and its destruction wakes the thread at once.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

namespace ddprun::testing {

class Watchdog {
 public:
  Watchdog(std::chrono::milliseconds limit, std::string waiting_for)
      : what_(std::move(waiting_for)), thread_([this, limit] {
          std::unique_lock lock(mu_);
          if (cv_.wait_for(lock, limit, [this] { return done_; })) return;
          std::fflush(nullptr);  // what the test wrote so far first
          std::fprintf(stderr, "watchdog: %s did not happen within %lld ms\n", what_.c_str(),
                       static_cast<long long>(limit.count()));
          std::fflush(stderr);
          std::_Exit(3);
        }) {}
  ~Watchdog() {
    {
      std::lock_guard lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

 private:
  const std::string what_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;   // guarded by mu_
  std::thread thread_;  // last: it starts once the members above exist
};

}  // namespace ddprun::testing
