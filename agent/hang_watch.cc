#include "agent/hang_watch.h"

#include <signal.h>

#include <algorithm>

#include "agent/agent_rendezvous.h"
#include "agent/hang/nodes/local_summary.h"
#include "agent/hang/python/live_traces.h"
#include "agent/hang/rings/hang_timeout.h"
#include "agent/hang/verdicts/dump_settling.h"
#include "agent/process/orphan_guard.h"
#include "common/env_names.h"

namespace ddprun::agent {
HangWatch::HangWatch(const AgentConfig& config, AgentEnv& env, HangWorkers& workers, HangReports& reports,
                     OrphanGuard* guard)
    : config_(config),
      env_(env),
      group_(workers),
      reporter_(reports),
      guard_(guard),
      log_(logger("agent")),
      collective_(env.clock()) {}

HangWatch::~HangWatch() {
  if (flight_dir_ && !flight_dir_->path().empty()) {
    if (guard_) guard_->forgetDirectory(flight_dir_->path());
    flight_dir_.reset();
  }
}

void HangWatch::setUp(AgentRendezvous& rdzv, std::map<std::string, std::string>& base_env) {
  setUp(rdzv, rdzv.nodeName(), base_env);
}

void HangWatch::setUp(rendezvous::Board& board, const std::string& node, std::map<std::string, std::string>& base_env) {
  nodes_ = std::make_unique<NodeSummaries>(board, node);
  if (config_.file_timer) {
    timers_ = std::make_unique<WorkerTimers>(
        env_, group_, reporter_, guard_, [this](Worker& w, pid_t pid, int signal, const std::string& scope) {
          judgeHang("timer '" + scope + "' of rank " + std::to_string(w.place.rank) + " expired");
          // Whatever signal it asked for (SIGSTOP, one it handles), an expired timer ends the
          // process: SIGKILL follows after --term_timeout if it is still there.
          stopHung({{&w, pid}}, signal, "timer '" + scope + "' expired", config_.term_timeout);
        });
    timers_->start(base_env);
  }
  flight_dir_ = std::make_unique<FlightDir>(config_.rendezvous.run_id);
  if (flight_dir_->path().empty()) {
    log_->warn("no flight recorder rings ({}); hang verdicts will have nothing to read", flight_dir_->problem());
    base_env.erase(env::kFlightDir);
  } else {
    base_env[env::kFlightDir] = flight_dir_->path();
    // A kill -9 of ddprun must not leave it on /dev/shm either.
    if (guard_) guard_->watchDirectory(flight_dir_->path());
  }
}

void HangWatch::attemptStarting() { attempt_started_ = now(); }

void HangWatch::workersStarted() {
  std::vector<ExpectedDump> expected_dumps;
  for (const Worker& worker : group_.workers()) {
    if (!worker.torch_dump.empty()) {
      expected_dumps.push_back(ExpectedDump{worker.place.rank, worker.torch_dump, worker.torch_dump_before});
    }
  }
  attempt_.torch_dumps.reset();
  if (!expected_dumps.empty()) attempt_.torch_dumps = std::make_unique<TorchDumps>(std::move(expected_dumps));
  collective_.started();
}

HangWatch::Wake HangWatch::wake(Clock::TimePoint limit) const {
  Wake wake;
  wake.watch_hang = config_.hang_timeout && !attempt_.hang_judged && !group_.stopping();
  wake.several_nodes = reporter_.round() && reporter_.round()->group_world_size > 1;
  wake.at = limit;
  if (wake.watch_hang) wake.at = std::min(wake.at, next_hang_check_);
  if (wake.several_nodes) wake.at = std::min(wake.at, nodes_->nextLook());
  wake.watch_dumps = attempt_.torch_dumps && collective_.line().empty() && !group_.stopping();
  wake.at = collective_.wake(wake.at, wake.watch_dumps);
  return wake;
}

void HangWatch::tick(const Wake& wake) {
  if (wake.watch_dumps) collective_.lookForDumps(*attempt_.torch_dumps, group_.workers());
  // A rank said a collective failed: the others' Python stacks now, before any of them moves on.
  if (!collective_.line().empty() && !attempt_.python_stacks_taken) takePythonStacks();
  const auto t = now();
  if (wake.watch_hang && t >= next_hang_check_) {
    next_hang_check_ = t + hangTimeoutLook(*config_.hang_timeout);
    checkHangTimeout();
  }
  if (wake.several_nodes) answerHangRequest(t);
}

std::vector<RankPosition> HangWatch::localPositions() const {
  if (!flight_dir_) return {};
  // The rings' times are the workers' steady clock, whatever clock the agent runs on. The
  // directory holds only this attempt's rings (emptied after each one, once its processes are gone).
  const int64_t now_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
  return positionsOfRanks(flight_dir_->read(), localRanks(), now_ns);
}

void HangWatch::answerHangRequest(Clock::TimePoint t) {
  if (!nodes_->requested(t)) return;
  // Its ranks' torch dumps go with the answer: they are written within a second or two of
  // the collective's timeout (torch signals the dump through its store); and their Python
  // stacks, taken now unless a failure here had them taken already.
  if (!attempt_.python_stacks_taken) takePythonStacks();  // none without Python workers
  if (attempt_.torch_dumps) settleTorchDumps();
  nodes_->answer(ownSummary());
  log_->info("another node judges a hang; published where this node's ranks stand");
}

std::string HangWatch::ownSummary() {
  return localSummary(nodes_->node(), localPositions(), summaryRanks(group_.workers()), attempt_.torch_dumps.get(),
                      attempt_.live_traces);
}

std::vector<int> HangWatch::localRanks() const {
  std::vector<int> ranks;
  for (const Worker& w : group_.workers()) ranks.push_back(w.place.rank);
  return ranks;
}

const std::vector<std::string>& HangWatch::otherNodes() {
  const auto& current = reporter_.round();
  // The other nodes may wait for their ranks' dumps before they answer.
  return nodes_->others(current ? current->group_world_size : 0,
                        attempt_.torch_dumps ? kTorchDumpWait : Clock::Duration::zero(),
                        [this] { return ownSummary(); });
}

void HangWatch::onStderrLine(int rank, std::string_view line) {
  if (!group_.stopping()) collective_.onStderrLine(rank, line);
}

void HangWatch::checkHangTimeout() {
  const double timeout_s = std::chrono::duration<double>(*config_.hang_timeout).count();
  const std::vector<RankPosition> positions = localPositions();
  const bool python = std::any_of(group_.workers().begin(), group_.workers().end(),
                                  [](const Worker& w) { return w.running && w.python_hook; });
  if (positions.empty()) {
    // Said once, when no ring showed up within a timeout of the attempt's start.
    if (!no_rings_warned_ && now() - attempt_started_ >= *config_.hang_timeout) {
      no_rings_warned_ = true;
      const NoRings said = noRingsLine(timeout_s, python, config_.python_workers, config_.python_stacks);
      log_->log(said.level, said.line);
    }
    return;
  }
  if (!noProgressFor(positions, timeout_s)) return;
  const std::string trigger = hangTimeoutTrigger(timeout_s);
  // Python workers' stacks first, while every rank still stands where it hung: the verdict
  // names the culprit's frame from them.
  if (python && !attempt_.python_stacks_taken) takePythonStacks();
  // torch's own record first where the workers' servers gave it (NCCL's, which sees the
  // collectives torch issues from C++ too), with the Python frames before it as the rings' are.
  std::string verdict = tracesCover(attempt_.live_traces, localRanks()) ? judgeTorchDumps(trigger) : std::string();
  if (!verdict.empty()) {
    const std::vector<int> trace_culprits = attempt_.culprits;
    const std::string frames = judgePythonHang(trigger);
    attempt_.culprits = trace_culprits;
    if (!frames.empty()) verdict = frames + "; " + verdict;
  }
  if (verdict.empty()) verdict = judgeRingsAndFrames(trigger);
  if (verdict.empty() && python) verdict = judgePythonHang(trigger);
  std::vector<std::pair<Worker*, pid_t>> targets;
  for (Worker& w : group_.workers()) {
    if (w.running) targets.emplace_back(&w, w.pid);
  }
  log_->warn("taking the stacks of {} worker(s), then SIGKILL", targets.size());
  stopHung(targets, SIGKILL, verdict.empty() ? trigger : verdict);
}

void HangWatch::stopHung(const std::vector<std::pair<Worker*, pid_t>>& targets, int signal, const std::string& reason,
                         std::chrono::milliseconds kill_after) {
  std::vector<HungWorker> hung;
  for (const auto& [w, pid] : targets) {
    // With its Python stacks in hand, no SIGABRT (and its 3 s grace) is needed for them.
    hung.push_back(
        HungWorker{pid, w->place.rank, w->place.local_rank, w->dir, w->python_faulthandler && w->python_stack.empty()});
  }
  std::vector<HungStop> stops = env_.stopHung(hung, signal, "before stopping it: " + reason, kill_after);
  // The report and the log point to stacks.txt, so a temporary run directory stays, even
  // when ddprun is killed.
  if (layout_->isTemporary()) {
    layout_->keep();
    if (guard_) guard_->forgetDirectory(layout_->runDir());
    log_->info("keeping the run directory {} for the stacks in it", layout_->runDir());
  }
  for (size_t i = 0; i < targets.size(); ++i) {
    Worker& w = *targets[i].first;
    w.hang_reason = reason;
    w.hang = std::move(stops[i]);
  }
}

std::vector<WorkerFailure> HangWatch::failures(const std::string& host) {
  // Workers ddprun stopped as hung were all sent SIGKILL together: wait for the others too,
  // so that the verdict's culprit is among the failures.
  auto hungRunning = [this] {
    const auto& workers = group_.workers();
    return std::any_of(workers.begin(), workers.end(), [](const Worker& w) { return w.running && w.hang; });
  };
  runWhile(env_, hungRunning, group_.killWait());
  std::vector<WorkerFailure> failures = group_.collectFailures(host, attempt_.culprits);
  // A collective that timed out or failed is a hang seen from inside: take the Python
  // stacks of the ranks still running (unless a stderr line already had them taken), say
  // where every rank stands, then stop the others as hung, before the round ends.
  const CollectiveTrigger said = collectiveFailureTrigger(collective_.line(), failures, group_.workers(), [this] {
    return attempt_.torch_dumps ? attempt_.torch_dumps->written() : std::nullopt;
  });
  if (const std::string& trigger = said.text; !trigger.empty()) {
    if (!attempt_.python_stacks_taken) takePythonStacks();
    // The local dumps before any other node is asked: they go with this node's summary.
    if (attempt_.torch_dumps) attempt_.dumps_waited = settleTorchDumps();
    std::string verdict = judgeRingsAndFrames(trigger);
    if (verdict.empty()) verdict = judgeTorchDumps(trigger);
    if (verdict.empty()) verdict = judgePythonHang(trigger);
    std::vector<std::pair<Worker*, pid_t>> targets;
    for (Worker& w : group_.workers()) {
      if (w.running) targets.emplace_back(&w, w.pid);
    }
    // An abort that no verdict ties to a collective may be any crash: the others get the
    // ordinary stop (SIGTERM first), not the hung one.
    if (!targets.empty() && !(said.maybe && verdict.empty())) {
      stopHung(targets, SIGKILL, verdict.empty() ? trigger : verdict);
      auto running = [this] { return group_.anyRunning(); };
      runWhile(env_, running, group_.killWait());
    }
    failures = group_.collectFailures(host, attempt_.culprits);
  }
  // A rank of another node that the verdict blames is the root cause of this node's report.
  if (!attempt_.remote_culprits.empty()) {
    failures.insert(failures.end(), attempt_.remote_culprits.begin(), attempt_.remote_culprits.end());
    putRanksFirst(failures, attempt_.culprits);
  }
  return failures;
}

void HangWatch::endAttempt() {
  env_.cancelHungStops();
  if (timers_) timers_->clear();
  if (flight_dir_) flight_dir_->clear();
  attempt_ = HangAttempt{};
  collective_.forget();
  if (nodes_) nodes_->forget();
}

}  // namespace ddprun::agent
