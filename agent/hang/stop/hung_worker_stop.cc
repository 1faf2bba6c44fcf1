#include "agent/hang/stop/hung_worker_stop.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>

#include "agent/ops/failure_report.h"
#include "agent/process/proc_stat.h"
#include "agent/process/process_signals.h"
#include "common/logging.h"
#include "common/unique_fd.h"
#include "common/worker_file.h"

namespace ddprun::agent {
namespace {

// Returns "" or strerror.
std::string writeFile(const std::string& path, const std::string& text) {
  // In the worker's directory: a FIFO the worker left there must not block the agent.
  std::string reason;
  UniqueFd fd = createWorkerFile(path, O_TRUNC, 0644, &reason);
  if (!fd) return reason;
  std::string_view rest = text;
  while (!rest.empty()) {
    const ssize_t n = ::write(fd.get(), rest.data(), rest.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return std::strerror(errno);
    rest.remove_prefix(static_cast<size_t>(n));
  }
  const int err = fd.close();
  return err == 0 ? "" : std::strerror(err);
}

}  // namespace

pid_t findOwningWorker(pid_t pid, const std::vector<pid_t>& workers) {
  auto isWorker = [&](pid_t p) { return std::find(workers.begin(), workers.end(), p) != workers.end(); };
  if (isWorker(pid)) return pid;
  std::optional<ProcStat> stat = readProcStat(pid);
  if (!stat || stat->state == 'Z') return -1;
  if (isWorker(stat->pgid)) return stat->pgid;
  // Bounded: a loop in what /proc says (pids reused while we read) must not hang the agent.
  for (int depth = 0; stat && stat->ppid > 1 && depth < 64; ++depth) {
    if (isWorker(stat->ppid)) return stat->ppid;
    stat = readProcStat(stat->ppid);
  }
  return -1;
}

HungWorkerStopper::HungWorkerStopper(boost::asio::io_context& io, std::chrono::milliseconds capture_timeout,
                                     std::chrono::milliseconds abort_grace)
    : own_system_(StopSystem::real(io)),
      system_(*own_system_),
      capture_timeout_(capture_timeout),
      abort_grace_(abort_grace) {}

HungWorkerStopper::HungWorkerStopper(StopSystem& system, std::chrono::milliseconds capture_timeout,
                                     std::chrono::milliseconds abort_grace)
    : system_(system), capture_timeout_(capture_timeout), abort_grace_(abort_grace) {}

HungWorkerStopper::~HungWorkerStopper() { cancel(); }

void HungWorkerStopper::sendSignal(pid_t pid, int signal, int rank) {
  const int err = system_.signal(pid, signal);
  if (err != 0 && err != ESRCH) {
    logger("agent")->warn("cannot send {} to pid {} of rank {}: {}", signalName(signal), pid, rank, std::strerror(err));
  }
}

bool HungWorkerStopper::stillThere(const ProcStat& stamp) {
  const std::optional<ProcStat> now = system_.procStat(stamp.pid);
  return now && now->start_time == stamp.start_time && now->state != 'Z';
}

void HungWorkerStopper::signalThenKill(const std::optional<ProcStat>& stamp, pid_t pid, int rank, int signal,
                                       std::chrono::milliseconds kill_after) {
  sendSignal(pid, signal, rank);
  if (!stamp || signal == SIGKILL || kill_after.count() <= 0) return;
  system_.after(kill_after, [this, stamp = *stamp, rank, signal, kill_after] {
    if (!stillThere(stamp)) return;
    logger("agent")->warn("rank {} (pid {}) still runs {} ms after {}; sending SIGKILL", rank, stamp.pid,
                          kill_after.count(), signalName(signal));
    sendSignal(stamp.pid, SIGKILL, rank);
  });
}

void HungWorkerStopper::cancel() { system_.cancelTimers(); }

std::vector<HungStop> HungWorkerStopper::stop(const std::vector<HungWorker>& workers, int signal,
                                              const std::string& reason, std::chrono::milliseconds kill_after) {
  std::vector<pid_t> pids;
  for (const HungWorker& w : workers) pids.push_back(w.pid);
  // Stamped before anything is signalled: the late signal must reach this process, not a
  // later one that was given its pid.
  std::vector<std::optional<ProcStat>> stamps;
  for (pid_t pid : pids) stamps.push_back(system_.procStat(pid));
  std::vector<ProcessStacks> stacks = system_.captureStacks(pids, capture_timeout_);

  std::vector<HungStop> results(workers.size());
  for (size_t i = 0; i < workers.size(); ++i) {
    const HungWorker& w = workers[i];
    HungStop& r = results[i];
    r.stacks = std::move(stacks[i]);
    if (!w.worker_dir.empty()) {
      const std::string file = w.worker_dir + "/" + kStacksFileName;
      r.stacks_file_error = writeFile(file, formatStacksFile(w.rank, w.local_rank, r.stacks, reason));
      if (r.stacks_file_error.empty()) {
        r.stacks_file = file;
        logger("agent")->info("stacks of rank {} (pid {}) in {}", w.rank, w.pid, file);
      } else {
        logger("agent")->warn("cannot write {}: {}", file, r.stacks_file_error);
      }
    }
    if (!r.stacks.problem.empty()) {
      logger("agent")->warn("stacks of rank {} (pid {}): {}", w.rank, w.pid, r.stacks.problem);
    }

    if (!w.python_faulthandler) {
      if (signal > 0) signalThenKill(stamps[i], w.pid, w.rank, signal, kill_after);
      continue;
    }
    system_.suppressCoreDump(w.pid);
    sendSignal(w.pid, SIGABRT, w.rank);
    r.aborted_first = true;
    if (signal <= 0 || !stamps[i]) continue;
    const ProcStat stamp = *stamps[i];
    const int rank = w.rank;
    system_.after(abort_grace_, [this, stamp, signal, rank, kill_after] {
      if (!stillThere(stamp)) return;
      logger("agent")->warn("rank {} (pid {}) still runs after SIGABRT; sending {}", rank, stamp.pid,
                            signalName(signal));
      signalThenKill(stamp, stamp.pid, rank, signal, kill_after);
    });
  }
  return results;
}

}  // namespace ddprun::agent
