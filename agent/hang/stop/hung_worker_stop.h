// Stopping a worker that hangs (its file timer expired, or --hang_timeout found no
// progress) so that the report says where it stood: first every thread's native stack
// (stack_capture.h) into the report and the worker's stacks.txt; then, for a Python
// worker with faulthandler on (PYTHONFAULTHANDLER), SIGABRT, on which the interpreter
// prints every thread's Python traceback to its stderr before it dies; and only then the
// stopping signal, to the others at once and to a Python worker still alive after a grace;
// and, when asked, SIGKILL to one still there a while after that signal (SIGSTOP, or one it
// handles, would leave it running or stopped for ever). The processes, their stacks and the
// timers of the late signals are reached through stop_system.h.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "agent/hang/stop/stack_capture.h"
#include "agent/hang/stop/stop_system.h"
#include "agent/process/proc_stat.h"

namespace ddprun::agent {

struct HungWorker {
  pid_t pid = 0;  // the process to stop: the worker, or one of its processes
  int rank = 0;
  int local_rank = 0;
  std::string worker_dir;            // where stacks.txt goes (LogLayout::workerDir); empty: nowhere
  bool python_faulthandler = false;  // a Python worker with PYTHONFAULTHANDLER set: SIGABRT first
};

struct HungStop {
  ProcessStacks stacks;
  std::string stacks_file;        // written; empty when it was not
  std::string stacks_file_error;  // why it was not (strerror), when a directory was given
  bool aborted_first = false;     // SIGABRT was sent for Python's tracebacks
};

// The worker among `workers` (pids of processes that lead their own process groups) that
// `pid` is, or belongs to: a process of its group, or one below it that left the group.
// -1 when none (or `pid` is gone). Reads /proc; never throws.
pid_t findOwningWorker(pid_t pid, const std::vector<pid_t>& workers);

// How long a Python worker gets from SIGABRT (faulthandler prints and re-raises at once)
// before the stopping signal follows.
inline constexpr std::chrono::seconds kFaulthandlerGrace{3};

class HungWorkerStopper {
 public:
  // On the real processes, with its late signals on `io`'s timers.
  explicit HungWorkerStopper(boost::asio::io_context& io,
                             std::chrono::milliseconds capture_timeout = kStackCaptureTimeout,
                             std::chrono::milliseconds abort_grace = kFaulthandlerGrace);
  // On `system` (stop_system.h), which must outlive it.
  explicit HungWorkerStopper(StopSystem& system, std::chrono::milliseconds capture_timeout = kStackCaptureTimeout,
                             std::chrono::milliseconds abort_grace = kFaulthandlerGrace);
  ~HungWorkerStopper();
  HungWorkerStopper(const HungWorkerStopper&) = delete;
  HungWorkerStopper& operator=(const HungWorkerStopper&) = delete;

  // Captures the stacks of every worker at once (blocks up to the capture timeout),
  // writes each one's stacks.txt, then signals them as the header says: `signal` at once,
  // or SIGABRT now and `signal` after the grace, on the io_context, if the same process
  // (pid and start time) is still there. `signal` <= 0 sends nothing but the SIGABRT.
  // `kill_after` > 0 and `signal` > 0 and not SIGKILL: SIGKILL follows `signal` after
  // `kill_after`, on the io_context, to the same process if it is still there (and not a
  // zombie). `reason` goes into stacks.txt ("before stopping it: timer 'step' expired").
  // Returns one result per worker, in order. Never throws. Call on the io_context's thread.
  std::vector<HungStop> stop(const std::vector<HungWorker>& workers, int signal, const std::string& reason,
                             std::chrono::milliseconds kill_after = std::chrono::milliseconds(0));

  // Forgets the signals still to be sent (the attempt is over; everything is killed anyway).
  void cancel();

 private:
  // `signal` now, then (kill_after > 0) SIGKILL after kill_after if the process stamped is still there.
  void signalThenKill(const std::optional<ProcStat>& stamp, pid_t pid, int rank, int signal,
                      std::chrono::milliseconds kill_after);
  void sendSignal(pid_t pid, int signal, int rank);
  // Whether the process stamped is still there, neither gone, nor a zombie, nor another given its pid.
  bool stillThere(const ProcStat& stamp);
  std::unique_ptr<StopSystem> own_system_;  // the real one, when given an io_context
  StopSystem& system_;
  std::chrono::milliseconds capture_timeout_;
  std::chrono::milliseconds abort_grace_;
};

}  // namespace ddprun::agent
