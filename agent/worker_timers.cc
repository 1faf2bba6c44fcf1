#include "agent/worker_timers.h"

#include <vector>

#include "agent/hang/stop/hung_worker_stop.h"
#include "agent/ops/failure_report.h"
#include "agent/process/orphan_guard.h"
#include "common/env_names.h"
#include "common/error.h"
#include "common/text_escape.h"

namespace ddprun::agent {

WorkerTimers::WorkerTimers(AgentEnv& env, HangWorkers& workers, HangReports& reports, OrphanGuard* guard,
                           OnHung on_hung)
    : env_(env),
      workers_(workers),
      reports_(reports),
      guard_(guard),
      on_hung_(std::move(on_hung)),
      log_(logger("agent")) {}

WorkerTimers::~WorkerTimers() {
  if (server_ && guard_) guard_->forgetDirectory(server_->path());
}

void WorkerTimers::start(std::map<std::string, std::string>& base_env) {
  auto named = base_env.find(env::kTimerFile);
  const std::string path =
      named != base_env.end() && !named->second.empty() ? named->second : FileTimerServer::defaultPath();
  try {
    server_ = std::make_unique<FileTimerServer>(
        env_.io(), path, [this](const TimerExpiry& e) { onExpired(e); },
        [this](int64_t pid) -> int64_t {
          const Worker* w = owning(static_cast<pid_t>(pid));
          return w ? w->pid : -1;
        });
  } catch (const SystemError& e) {
    // A pipe name that cannot be made (no such directory, not writable) is the user's to fix.
    throw UsageError(std::string("file timers (") + env::kEnableFileTimer + "=1): " + e.what());
  }
  server_->start();
  // The server unlinks its pipe when it is destroyed; a kill -9 of ddprun must not leave it either.
  if (guard_) guard_->watchDirectory(path);
  base_env[env::kTimerFile] = path;
  log_->info("file timers on {}", path);
}

Worker* WorkerTimers::owning(pid_t pid) {
  std::vector<pid_t> running;
  for (const Worker& w : workers_.workers()) {
    if (w.running) running.push_back(w.pid);
  }
  const pid_t owner = findOwningWorker(pid, running);
  for (Worker& w : workers_.workers()) {
    if (w.running && w.pid == owner) return &w;
  }
  return nullptr;
}

void WorkerTimers::onExpired(const TimerExpiry& expiry) {
  std::string scopes;
  // Scopes are the worker's text: shown escaped, so that they cannot forge log lines.
  for (const std::string& s : expiry.expired_scopes) scopes += (scopes.empty() ? "'" : ", '") + printable(s) + "'";
  const std::string scope = printable(expiry.timer.scope_id);
  const pid_t pid = static_cast<pid_t>(expiry.pid);
  Worker* w = owning(pid);
  if (w == nullptr) {
    log_->warn("file timer {} of pid {} expired, but pid {} is not a process of this node's running workers; ignored",
               scopes, pid, pid);
    return;
  }
  reports_.emit("timer_expired", JsonObject()
                                     .add("rank", w->place.rank)
                                     .add("local_rank", w->place.local_rank)
                                     .add("pid", pid)
                                     .add("scope", expiry.timer.scope_id)
                                     .add("signal", expiry.signal > 0 ? signalName(expiry.signal) : "none")
                                     .add("attempt", workers_.attempt()));
  if (workers_.stopping()) {
    log_->debug("timer {} of rank {} expired while its workers are being stopped anyway", scopes, w->place.rank);
    return;
  }
  if (expiry.signal <= 0) {
    log_->warn("worker rank {} (pid {}): timer {} expired; it asked for no signal, so it goes on", w->place.rank, pid,
               scopes);
    return;
  }
  log_->warn("worker rank {} (pid {}): timer '{}' expired; taking its stacks, then {}{}", w->place.rank, pid, scope,
             w->python_faulthandler ? "SIGABRT (Python tracebacks to its stderr) and " : "", signalName(expiry.signal));
  on_hung_(*w, pid, expiry.signal, scope);
}

}  // namespace ddprun::agent
