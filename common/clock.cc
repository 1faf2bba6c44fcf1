#include "common/clock.h"

#include <thread>

namespace ddprun {
namespace {

class SteadyClock final : public Clock {
 public:
  TimePoint now() const override { return std::chrono::steady_clock::now(); }
  void sleepUntil(TimePoint deadline) override { std::this_thread::sleep_until(deadline); }
  std::cv_status waitUntil(std::unique_lock<std::mutex>& lock, std::condition_variable& cv,
                           TimePoint deadline) override {
    return cv.wait_until(lock, deadline);
  }
};

}  // namespace

Clock& Clock::real() {
  // Leaked on purpose: threads still running at exit may ask for the time.
  static Clock* clock = new SteadyClock();
  return *clock;
}

}  // namespace ddprun
