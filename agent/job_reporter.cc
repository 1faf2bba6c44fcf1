#include "agent/job_reporter.h"

namespace ddprun::agent {
namespace {

// What a round's end reason means, in the words of the events file.
const char* causeOf(const std::string& reason) {
  const auto end = rendezvous::RoundEnd::parse(reason);
  if (!end) return "other";
  switch (end->kind) {
    case rendezvous::RoundEnd::Kind::kDone: return "done";
    case rendezvous::RoundEnd::Kind::kFail: return "worker_failure";
    case rendezvous::RoundEnd::Kind::kFinal: return "worker_failure_final";
    case rendezvous::RoundEnd::Kind::kAbort: return "stopped";
    case rendezvous::RoundEnd::Kind::kJoin: return "node_joined";
    case rendezvous::RoundEnd::Kind::kEvict: return "node_evicted";
  }
  return "other";
}

// The states in which the health check answers 200.
bool healthyState(const std::string& state) {
  return state == "starting" || state == "joining" || state == "running" || state == "succeeded";
}

}  // namespace

JobReporter::JobReporter(const AgentConfig& config, const WorkerGroup& group, const RestartPolicy& policy)
    : config_(config), group_(group), policy_(policy), log_(logger("agent")) {}

JobReporter::~JobReporter() = default;

void JobReporter::open(AgentRendezvous& rdzv, const std::vector<std::string>& event_files) {
  rendezvous_ = &rdzv;
  events_ = std::make_unique<EventLog>(event_files, config_.rendezvous.run_id);
  events_->setNode(rdzv.nodeName());
  if (config_.events_console) events_->alsoToConsole();
  if (config_.health_check_port) {
    health_ = std::make_unique<HealthServer>(config_.health_check_addr, *config_.health_check_port);
    log_->info("health check at http://{}:{}/", config_.health_check_addr, health_->port());
  }
}

std::optional<int> JobReporter::healthPort() const {
  if (!health_) return std::nullopt;
  return health_->port();
}

void JobReporter::emit(const std::string& event, const JsonObject& fields) {
  if (events_) events_->emit(event, fields);
}

rendezvous::AgentRecord JobReporter::statusRecord() const {
  rendezvous::AgentRecord r;
  r.state = state_;
  r.nproc = config_.nproc_per_node;
  r.max_restarts = config_.max_restarts;
  if (current_) {
    r.round = current_->round;
    r.group_rank = current_->group_rank;
    r.rank_base = current_->rank_base;
    r.restarts = current_->restart_count;
  }
  r.consecutive_failures = policy_.consecutiveFailures();
  r.cooldown_until_ms = cooldown_until_ms_;
  r.exit_code = exit_code_;
  for (const Worker& w : group_.workers()) r.generations.push_back(w.generation);
  return r;
}

void JobReporter::setState(const std::string& state) {
  state_ = state;
  if (rendezvous_ && !store_lost_) rendezvous_->publishStatus(statusRecord());
  refreshHealth();
}

void JobReporter::setFinalState(const std::string& state, int exit_code) {
  exit_code_ = exit_code;
  state_ = state;
  refreshHealth();
}

void JobReporter::publishStatus() { rendezvous_->publishStatus(statusRecord()); }

void JobReporter::refreshHealth() {
  if (!health_) return;
  const bool healthy = healthyState(state_);
  JsonObject body;
  body.add("status", healthy ? "ok" : "unavailable").add("state", state_);
  body.add("node", rendezvous_->nodeName()).add("run_id", config_.rendezvous.run_id);
  body.add("store", rendezvous_->storeAddress());
  if (current_) {
    body.add("round", current_->round)
        .add("group_rank", current_->group_rank)
        .add("group_world_size", current_->group_world_size)
        .add("world_size", current_->world_size)
        .add("first_rank", current_->rank_base)
        .add("last_rank", current_->rank_base + config_.nproc_per_node - 1)
        .add("restart_count", current_->restart_count);
  } else {
    body.addNull("round");
  }
  body.add("max_restarts", config_.max_restarts).add("consecutive_failures", policy_.consecutiveFailures());
  if (state_ == "cooldown") body.add("cooldown_until", isoTimeUtc(cooldown_until_ms_));
  if (exit_code_ >= 0) body.add("exit_code", exit_code_);
  std::vector<JsonObject> workers;
  for (const Worker& w : group_.workers()) {
    JsonObject o;
    o.add("rank", w.place.rank).add("local_rank", w.place.local_rank).add("pid", w.pid).add("running", w.running);
    o.add("generation", w.generation);  // above 0: a replacement (--recovery=in-job)
    workers.push_back(std::move(o));
  }
  body.add("workers", workers);
  if (verdict_) {
    // "attempt N: <verdict>", as `ddprun status` shows it, and the ranks it blames.
    std::string blamed = "[";
    for (size_t i = 0; i < verdict_->culprits.size(); ++i) {
      blamed += (i ? "," : "") + std::to_string(verdict_->culprits[i]);
    }
    body.add("hang_verdict", JsonObject()
                                 .add("attempt", verdict_->attempt)
                                 .add("verdict", "attempt " + std::to_string(verdict_->attempt) + ": " + verdict_->text)
                                 .add("source", verdict_->source)
                                 .raw("blamed_ranks", blamed + "]"));
  }
  // A straggler slows the job down but breaks nothing: the answer stays 200.
  std::vector<JsonObject> stragglers;
  for (const Straggler& s : stragglers_) {
    stragglers.push_back(JsonObject().add("rank", s.rank).add("group", s.group).add("lag_s", s.lag_s));
  }
  body.add("stragglers", stragglers);
  health_->update(healthy, body.str());
}

void JobReporter::roundFormed(const rendezvous::RendezvousResult& rdzv) {
  emit("rendezvous_round", JsonObject()
                               .add("round", rdzv.round)
                               .add("group_rank", rdzv.group_rank)
                               .add("nodes", rdzv.group_world_size)
                               .add("world_size", rdzv.world_size)
                               .add("first_rank", rdzv.rank_base)
                               .add("last_rank", rdzv.rank_base + config_.nproc_per_node - 1)
                               .add("restart_count", rdzv.restart_count)
                               .add("master", rdzv.master_addr + ":" + std::to_string(rdzv.master_port)));
  if (previous_round_) {
    const auto& prev = *previous_round_;
    if (rdzv.group_world_size != prev.group_world_size) {
      const bool down = rdzv.group_world_size < prev.group_world_size;
      log_->info("the job scales {} from {} to {} node(s) ({})", down ? "down" : "up", prev.group_world_size,
                 rdzv.group_world_size, last_end_reason_);
      emit(down ? "scale_down" : "scale_up", JsonObject()
                                                 .add("round", rdzv.round)
                                                 .add("from_nodes", prev.group_world_size)
                                                 .add("to_nodes", rdzv.group_world_size)
                                                 .add("from_world_size", prev.world_size)
                                                 .add("to_world_size", rdzv.world_size)
                                                 .add("reason", last_end_reason_));
    }
    if (rdzv.restart_count > prev.restart_count) {
      emit("restart", JsonObject()
                          .add("round", rdzv.round)
                          .add("restart_count", rdzv.restart_count)
                          .add("max_restarts", config_.max_restarts)
                          .add("reason", last_end_reason_));
    }
  }
  previous_round_ = rdzv;
}

void JobReporter::roundEnded(const std::string& reason, bool by_this_node) {
  last_end_reason_ = reason;
  emit("round_end", JsonObject()
                        .add("round", current_ ? current_->round : -1)
                        .add("reason", reason)
                        .add("cause", causeOf(reason))
                        .add("by_this_node", by_this_node));
}

void JobReporter::setHangVerdict(Verdict verdict) {
  verdict_ = std::move(verdict);
  refreshHealth();
}

void JobReporter::setStragglers(std::vector<Straggler> stragglers) {
  stragglers_ = std::move(stragglers);
  refreshHealth();
}

void JobReporter::workerStarted(const Worker& w, const rendezvous::RendezvousResult& rdzv) {
  if (verdict_ && verdict_->attempt != group_.attempt()) verdict_.reset();  // another attempt's
  emit("worker_start", JsonObject()
                           .add("rank", w.place.rank)
                           .add("local_rank", w.place.local_rank)
                           .add("pid", w.pid)
                           .add("attempt", group_.attempt())
                           .add("round", rdzv.round)
                           .add("restart_count", rdzv.restart_count));
}

void JobReporter::workerExited(const Worker& w) {
  JsonObject exit;
  exit.add("rank", w.place.rank)
      .add("local_rank", w.place.local_rank)
      .add("pid", w.pid)
      .add("attempt", group_.attempt());
  if (w.signal) {
    exit.addNull("exit_code").add("signal", signalName(w.signal));
  } else {
    exit.add("exit_code", w.exit_code).addNull("signal");
  }
  exit.add("failed", w.failed()).add("stopped_by_agent", w.stopped_by_agent);
  emit("worker_exit", exit);
  refreshHealth();
}

void JobReporter::workerReplaced(const Worker& failed, const Worker& newcomer, int restarts_used) {
  JsonObject e;
  e.add("rank", failed.place.rank).add("local_rank", failed.place.local_rank).add("failed_pid", failed.pid);
  if (failed.signal) {
    e.addNull("exit_code").add("signal", signalName(failed.signal));
  } else {
    e.add("exit_code", failed.exit_code).addNull("signal");
  }
  e.add("pid", newcomer.pid)
      .add("generation", newcomer.generation)
      .add("attempt", group_.attempt())
      .add("restarts_used", restarts_used)
      .add("max_restarts", config_.max_restarts);
  emit("worker_replaced", e);
  // `ddprun status` shows the newcomer's generation from now, not at the next state change.
  if (rendezvous_ && !store_lost_) rendezvous_->publishStatus(statusRecord());
  refreshHealth();
}

void JobReporter::workersUnkillable(const std::vector<UnkillableWorker>& workers) {
  for (const UnkillableWorker& w : workers) {
    emit("worker_unkillable", JsonObject()
                                  .add("rank", w.rank)
                                  .add("pid", w.pid)
                                  .add("attempt", group_.attempt())
                                  .add("state", w.state)
                                  .add("sigkill_sent", w.sigkill_sent));
  }
}

}  // namespace ddprun::agent
