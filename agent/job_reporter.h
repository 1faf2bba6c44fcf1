// What others see of this node's job: its state ("joining", "running", "cooldown", ...) in
// the status record that `ddprun status` reads off the store, the health check's answer
// (--health_check_port), and the events file (DDPRUN_EVENTS_FILE, --log_dir's events.jsonl).
// The round loop tells it what happened; it words it. Thread-safety: none; the agent's
// thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agent/agent_config.h"
#include "agent/agent_rendezvous.h"
#include "agent/ops/event_log.h"
#include "agent/ops/health_server.h"
#include "agent/restart_policy.h"
#include "agent/worker_group.h"
#include "common/logging.h"

namespace ddprun::agent {

class JobReporter {
 public:
  // `group` and `policy` must outlive the reporter.
  JobReporter(const AgentConfig& config, const WorkerGroup& group, const RestartPolicy& policy);
  ~JobReporter();
  JobReporter(const JobReporter&) = delete;
  JobReporter& operator=(const JobReporter&) = delete;

  // Opens the events files (`event_files`, each line naming this node) and the health check
  // (when asked for); `rdzv` must outlive the reporter. Throws as EventLog and HealthServer do.
  void open(AgentRendezvous& rdzv, const std::vector<std::string>& event_files);
  // The health check's port (nothing without one).
  std::optional<int> healthPort() const;

  void emit(const std::string& event, const JsonObject& fields = {});

  // The node's state: published in the status record (unless the store is lost) and the health check.
  void setState(const std::string& state);
  // The same without publishing (the store may be gone): at ddprun's exit.
  void setFinalState(const std::string& state, int exit_code);
  // Publishes the status record again (its heartbeat while the node waits or sits out).
  void publishStatus();
  void refreshHealth();
  // No more status records: a publish could wait on a dead store.
  void storeLost() { store_lost_ = true; }
  void setCooldownUntil(int64_t unix_ms) { cooldown_until_ms_ = unix_ms; }
  int64_t cooldownUntil() const { return cooldown_until_ms_; }
  void setExitCode(int code) { exit_code_ = code; }

  // The round the workers run (ran) in.
  void setRound(const rendezvous::RendezvousResult& rdzv) { current_ = rdzv; }
  const std::optional<rendezvous::RendezvousResult>& round() const { return current_; }

  // A round formed (with the scale and restart events it brings), and one ended.
  void roundFormed(const rendezvous::RendezvousResult& rdzv);
  void roundEnded(const std::string& reason, bool by_this_node);
  // A hang verdict of the attempt (hang_watch.h): the health check shows it from now until
  // the next attempt's workers start.
  struct Verdict {
    std::string text;           // as the log and `ddprun status` give it
    std::string source;         // "flight_recorder", "python_stacks", "flight_ring"
    std::vector<int> culprits;  // the ranks it blames, ascending
    int attempt = 0;
  };
  void setHangVerdict(Verdict verdict);
  // The ranks of this node that straggle now (progress_watch.h): the health check lists them
  // until they recover or the attempt ends (an empty list).
  struct Straggler {
    int rank = 0;
    int group = 0;
    double lag_s = 0;  // how far behind its group's median rank it enters collectives
  };
  void setStragglers(std::vector<Straggler> stragglers);

  // Workers started, exited, or could not be stopped.
  void workerStarted(const Worker& w, const rendezvous::RendezvousResult& rdzv);
  void workerExited(const Worker& w);
  // --recovery=in-job: `failed` was replaced alone by `newcomer` (generation, pid), the job
  // having used `restarts_used` of --max_restarts with it.
  void workerReplaced(const Worker& failed, const Worker& newcomer, int restarts_used);
  void workersUnkillable(const std::vector<UnkillableWorker>& workers);

 private:
  rendezvous::AgentRecord statusRecord() const;

  const AgentConfig& config_;
  const WorkerGroup& group_;
  const RestartPolicy& policy_;
  std::shared_ptr<spdlog::logger> log_;
  AgentRendezvous* rendezvous_ = nullptr;
  std::unique_ptr<EventLog> events_;
  std::unique_ptr<HealthServer> health_;
  std::string state_ = "starting";
  std::optional<rendezvous::RendezvousResult> current_;
  std::optional<rendezvous::RendezvousResult> previous_round_;  // for scale and restart events
  std::string last_end_reason_;
  int64_t cooldown_until_ms_ = 0;
  int exit_code_ = -1;
  bool store_lost_ = false;
  std::optional<Verdict> verdict_;     // the current attempt's, for the health check
  std::vector<Straggler> stragglers_;  // this node's ranks that straggle now, for the health check
};

}  // namespace ddprun::agent
