// Scoped timers for C++ workers, over torch's file timer protocol: the same JSON lines
// that torch.distributed.elastic.timer.FileTimerClient writes, to the same named pipe
// (TORCHELASTIC_TIMER_FILE, which ddprun and torchrun create under
// TORCHELASTIC_ENABLE_FILE_TIMER=1). If the scope has not ended when the timer expires,
// the agent kills the process with the timer's signal (ddprun takes its stacks first and
// names the scope in the failure report).
//
//   {
//     auto timer = ddprun::runtime::expires(std::chrono::seconds(60), "train_step");
//     step();  // killed if this takes more than 60 s
//   }          // released here
//
// Without TORCHELASTIC_TIMER_FILE in the environment (no agent watches timers) expires()
// does nothing and returns a timer that releases nothing.
#pragma once

#include <chrono>
#include <csignal>
#include <string>
#include <string_view>

namespace ddprun::runtime {

class ScopedTimer {
 public:
  // A timer that is not set: destroying or releasing it does nothing.
  ScopedTimer() = default;
  // Releases the timer if it is still set; a failure to (the agent is gone) is logged.
  ~ScopedTimer();
  ScopedTimer(ScopedTimer&& other) noexcept;
  ScopedTimer& operator=(ScopedTimer&& other) noexcept;
  ScopedTimer(const ScopedTimer&) = delete;
  ScopedTimer& operator=(const ScopedTimer&) = delete;

  // Releases the timer now (later calls and the destructor do nothing). Throws DdprunError
  // when the pipe cannot be written.
  void release();
  // True while the timer is set.
  bool armed() const { return !pipe_.empty(); }
  const std::string& scope() const { return scope_; }

 private:
  friend ScopedTimer expires(std::chrono::duration<double> after, std::string_view scope, int signal);
  ScopedTimer(std::string pipe, std::string scope) : pipe_(std::move(pipe)), scope_(std::move(scope)) {}

  std::string pipe_;  // empty: not set
  std::string scope_;
};

// Sets the timer `scope` of this process to expire `after` from now; the agent kills the
// process with `signal` (torch's default: SIGKILL; <= 0: the expiry is only reported) if it
// is not released by then. Setting a scope that is already set moves its expiry (the agent
// keeps one timer per process and scope, so either object's release ends it). Returns at
// once (the pipe is opened non-blocking). Throws DdprunError naming the pipe when
// TORCHELASTIC_TIMER_FILE is set but cannot be opened or written (no agent reads it), or
// when `scope` makes the request longer than PIPE_BUF. Thread-safe.
[[nodiscard]] ScopedTimer expires(std::chrono::duration<double> after, std::string_view scope, int signal = SIGKILL);

// The request line torch's FileTimerClient writes, without its newline (for tests).
std::string timerRequestLine(int pid, std::string_view scope, double expiration_time, int signal);

}  // namespace ddprun::runtime
