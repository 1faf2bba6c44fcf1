// torch's file timers (TORCHELASTIC_ENABLE_FILE_TIMER=1) of this node's workers, as the hang
// watch (hang_watch.h) serves them: the server on its named pipe (hang/timers/), accepting
// timers only of the running workers' processes, and what an expired timer means. Each
// expiry is an event of the events file; a timer that asked for a signal ends its worker
// as hung (the watch's part, `on_hung`), unless the workers are being stopped anyway; one
// that asked for none is said and nothing more. Unlike torch's server, which signals
// whatever pid a request names, ddprun stops only its own workers' processes.
// Thread-safety: none; the agent's thread (the server reads on the AgentEnv's io_context).
#pragma once

#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "agent/agent_env.h"
#include "agent/hang/timers/file_timer_server.h"
#include "agent/hang_watch_ports.h"
#include "common/logging.h"

namespace ddprun::agent {

class OrphanGuard;

class WorkerTimers {
 public:
  // A running worker's process `pid` whose timer `scope` (escaped) expired and asked for `signal`.
  using OnHung = std::function<void(Worker& worker, pid_t pid, int signal, const std::string& scope)>;

  // Everything given must outlive this; `guard` may be null.
  WorkerTimers(AgentEnv& env, HangWorkers& workers, HangReports& reports, OrphanGuard* guard, OnHung on_hung);
  // Removes the pipe (and stops watching it for a kill -9 of ddprun).
  ~WorkerTimers();
  WorkerTimers(const WorkerTimers&) = delete;
  WorkerTimers& operator=(const WorkerTimers&) = delete;

  // As torch's agent: serves the pipe named in `base_env` (TORCHELASTIC_TIMER_FILE), else a
  // new one, and names it there for the workers. Throws UsageError when it cannot be made.
  void start(std::map<std::string, std::string>& base_env);
  // The attempt is over: its timers go with its processes.
  void clear() { server_->clearTimers(); }

 private:
  void onExpired(const TimerExpiry& expiry);
  // The running worker that `pid` is, or belongs to: a process of its process group, or one
  // below it that left the group. Null: none.
  Worker* owning(pid_t pid);

  AgentEnv& env_;
  HangWorkers& workers_;
  HangReports& reports_;
  OrphanGuard* guard_;
  OnHung on_hung_;
  std::shared_ptr<spdlog::logger> log_;
  std::unique_ptr<FileTimerServer> server_;
};

}  // namespace ddprun::agent
