#include "agent/hang/stop/stop_system.h"

#include <sys/resource.h>

#include <algorithm>

#include <boost/asio/steady_timer.hpp>

#include "agent/process/process_signals.h"

namespace ddprun::agent {
namespace {

class RealStopSystem final : public StopSystem {
 public:
  explicit RealStopSystem(boost::asio::io_context& io) : io_(io) {}
  ~RealStopSystem() override { cancelTimers(); }

  std::optional<ProcStat> procStat(pid_t pid) override { return readProcStat(pid); }
  std::vector<ProcessStacks> captureStacks(const std::vector<pid_t>& pids, std::chrono::milliseconds timeout) override {
    return captureNativeStacks(pids, timeout);
  }
  int signal(pid_t pid, int signal) override { return signalProcess(pid, signal); }

  // SIGABRT ends in a core dump after faulthandler's tracebacks. Nobody asked for that core
  // (it can take minutes and gigabytes for a large worker), so the soft limit goes to 1 byte:
  // below a page, which stops a core file, and the value at which the kernel also skips a
  // core piped to a handler (systemd-coredump), where 0 would not.
  void suppressCoreDump(pid_t pid) override {
    rlimit limit{};
    if (::prlimit(pid, RLIMIT_CORE, nullptr, &limit) != 0) return;
    limit.rlim_cur = std::min<rlim_t>(1, limit.rlim_max);
    ::prlimit(pid, RLIMIT_CORE, &limit, nullptr);
  }

  void after(std::chrono::milliseconds delay, std::function<void()> action) override {
    auto timer = std::make_shared<boost::asio::steady_timer>(io_);
    timer->expires_after(delay);
    timer->async_wait([action = std::move(action)](const boost::system::error_code& ec) {
      if (!ec) action();
    });
    timers_.push_back(std::move(timer));
  }
  void cancelTimers() override {
    for (auto& t : timers_) t->cancel();
    timers_.clear();
  }

 private:
  boost::asio::io_context& io_;
  std::vector<std::shared_ptr<boost::asio::steady_timer>> timers_;
};

}  // namespace

std::unique_ptr<StopSystem> StopSystem::real(boost::asio::io_context& io) {
  return std::make_unique<RealStopSystem>(io);
}

}  // namespace ddprun::agent
