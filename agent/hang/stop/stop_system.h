// What stopping a hung worker (hung_worker_stop.h) does to the world, as a seam: reading a
// process's identity, taking its native stacks, signalling it, and running a late signal
// after a while. The real one (StopSystem::real) is /proc, eu-stack or gdb
// (stack_capture.h), kill(2) and timers on an io_context's steady clock; tests give fake
// processes on a manual clock (tests/agent/hang/stop/), so that the order of the stacks and
// the signals, and the bounds on the waits, are checked without a process or a sleep.
// Thread-safety: none; the io_context's thread only.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "agent/hang/stop/stack_capture.h"
#include "agent/process/proc_stat.h"

namespace ddprun::agent {

class StopSystem {
 public:
  virtual ~StopSystem() = default;
  // The process's fields (its start time tells it from a later one given its pid; 'Z': a
  // zombie); nothing when it is gone.
  virtual std::optional<ProcStat> procStat(pid_t pid) = 0;
  // Every pid's native stacks, taken at once, in `timeout` at most (captureNativeStacks).
  virtual std::vector<ProcessStacks> captureStacks(const std::vector<pid_t>& pids,
                                                   std::chrono::milliseconds timeout) = 0;
  // kill(2): 0 or errno.
  virtual int signal(pid_t pid, int signal) = 0;
  // No core file from the SIGABRT that follows (its RLIMIT_CORE lowered).
  virtual void suppressCoreDump(pid_t pid) = 0;
  // Runs `action` after `delay` on the agent's thread, unless cancelTimers() comes first.
  virtual void after(std::chrono::milliseconds delay, std::function<void()> action) = 0;
  virtual void cancelTimers() = 0;

  // The real processes, with timers on `io` (which must outlive it).
  static std::unique_ptr<StopSystem> real(boost::asio::io_context& io);
};

}  // namespace ddprun::agent
