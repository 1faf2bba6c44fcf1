// The round loop of the agent: each round it joins the rendezvous, starts this node's
// workers (the worker group), watches them (the hang watch ticks meanwhile) until they end,
// fail, a stop signal comes or the round ends elsewhere, stops them and clears what is left
// (containment), and decides with the restart policy whether to restart, re-form or end the
// job. What others see of it goes through the job reporter. All of it runs on the agent's
// thread, in the AgentEnv's event loop.
#include "agent/elastic_agent.h"
#include "agent/elastic_agent_impl.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <optional>

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>

#include "agent/agent_env.h"
#include "agent/agent_rendezvous.h"
#include "agent/containment.h"
#include "agent/hang/python/python_hook.h"
#include "agent/hang_watch.h"
#include "agent/job_reporter.h"
#include "agent/node_cooldown.h"
#include "agent/ops/event_log.h"
#include "agent/ops/failure_report.h"
#include "agent/output/log_layout.h"
#include "agent/placement/gpu_watch.h"
#include "agent/process/orphan_guard.h"
#include "agent/progress_watch.h"
#include "agent/restart_policy.h"
#include "agent/worker_env.h"
#include "agent/worker_group.h"
#include "common/console_writer.h"
#include "common/env_names.h"
#include "common/error.h"
#include "common/logging.h"

namespace ddprun::agent {
namespace asio = boost::asio;

namespace {

constexpr const char* kDefaultPrefixTemplate = "[rank${rank}]:";
// How long an elastic job's node with a sick GPU sits out before it looks again, when
// --node_cooldown does not say: a sick GPU rarely heals without an operator.
constexpr auto kSickGpuSitOut = std::chrono::seconds(60);

std::string hostName() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

}  // namespace

ElasticAgent::Impl::Impl(AgentConfig config, OrphanGuard* guard, AgentEnv& env,
                         std::function<std::unique_ptr<AgentRendezvous>()> make_rendezvous)
    : config_(std::move(config)),
      guard_(guard),
      env_(env),
      make_rendezvous_(std::move(make_rendezvous)),
      log_(logger("agent")),
      host_(hostName()),
      policy_(config_.max_restarts, NodeCooldown(config_.node_cooldown, config_.node_cooldown_max), env.clock()),
      group_(config_, env, guard,
             [this](int rank, std::string_view line) {
               if (gpu_watch_) gpu_watch_->onStderrLine(rank, line);  // a CUDA fault, for the failure report
               hang_.onStderrLine(rank, line);
             }),
      reporter_(config_, group_, policy_),
      hang_(config_, env, hang_workers_, hang_reports_, guard),
      progress_(config_, env, group_, reporter_),
      containment_(config_, env, group_, guard),
      recovery_(config_, env, group_, reporter_, containment_) {
  env_.onSignals({SIGCHLD}, [this](int) {
    for (const Worker* w : group_.reap()) reporter_.workerExited(*w);
  });
  const auto& stop = config_.stop_signals;
  env_.onSignals(stop, [this](int signal) { onStopSignal(signal); });
  // The user signals are the operator's way to talk to the workers (a checkpoint request
  // from SLURM, say), so they are forwarded unless --signals_to_handle makes them stop the job.
  std::vector<int> user;
  for (int sig : {SIGUSR1, SIGUSR2}) {
    if (std::find(stop.begin(), stop.end(), sig) == stop.end()) user.push_back(sig);
  }
  if (!user.empty()) {
    env_.onSignals(user, [this](int signal) {
      log_->info("forwarding {} to the workers", signalName(signal));
      group_.signalRunning(signal);
    });
  }
}

ElasticAgent::ElasticAgent(AgentConfig config, OrphanGuard& guard) : own_env_(AgentEnv::real()) {
  const int nproc = config.nproc_per_node;
  const rendezvous::RendezvousConfig rdzv = config.rendezvous;
  impl_ = std::make_unique<Impl>(std::move(config), &guard, *own_env_,
                                 [rdzv, nproc] { return AgentRendezvous::dynamic(rdzv, nproc); });
}
ElasticAgent::ElasticAgent(AgentConfig config, OrphanGuard* guard, AgentEnv& env,
                           std::function<std::unique_ptr<AgentRendezvous>()> rendezvous)
    : impl_(std::make_unique<Impl>(std::move(config), guard, env, std::move(rendezvous))) {}
ElasticAgent::~ElasticAgent() = default;
int ElasticAgent::run() { return impl_->run(); }

void ElasticAgent::Impl::onStopSignal(int signal) {
  if (stop_signal_ == 0) stop_signal_ = signal;
  if (group_.stopping()) {
    log_->warn("received {} again; killing the workers now", signalName(signal));
    group_.signalRunning(SIGKILL);
  } else {
    log_->warn("received {}; stopping the workers", signalName(signal));
  }
}

void ElasticAgent::Impl::startWorkers(const rendezvous::RendezvousResult& rdzv) {
  hang_.attemptStarting();
  group_.begin(attempt_, rdzv);
  for (size_t i = 0; i < group_.workers().size(); ++i) {
    group_.startOne(i, containment_.cgroupFor(group_.workers()[i].place.local_rank, attempt_));
    reporter_.workerStarted(group_.workers()[i], rdzv);
  }
  hang_.workersStarted();
  progress_.workersStarted();
}

ElasticAgent::Impl::Outcome ElasticAgent::Impl::waitForWorkers() {
  for (;;) {
    if (auto outcome = signalOrRoundEvent()) return *outcome;
    bool running = false;
    for (const Worker& w : group_.workers()) {
      if (w.failed()) return Outcome::kFailed;
      running = running || w.running;
    }
    if (!running) return Outcome::kSucceeded;
    if (hang_.collectiveGraceOver()) return Outcome::kFailed;
    const HangWatch::Wake wake =
        hang_.wake(std::min({now() + std::chrono::hours(1), progress_.nextLook(), recovery_.nextLook()}));
    runFor(std::max<Clock::Duration>(wake.at - now(), Clock::Duration::zero()));
    hang_.tick(wake);
    progress_.tick();
    recovery_.tick();  // --recovery=in-job's spare worker
  }
}

void ElasticAgent::Impl::stopAttempt(int signal) {
  reporter_.workersUnkillable(group_.stop(signal));
  endAttempt();
}

void ElasticAgent::Impl::endAttempt() {
  // The warm spare stays for the next attempt (a re-form, another node's failure): a spare that
  // is loaded when the next failure comes is what makes in-job recovery cost a re-form only;
  // one started per round is still loading LibTorch when failures come seconds apart. It ends
  // with the job (finishJob, run).
  // What the attempt's processes asked for ends with them.
  hang_.endAttempt();
  progress_.endAttempt();
  containment_.clear();
  group_.drainOutput();
}

// The rendezvous blocks (possibly for minutes, waiting for nodes); it runs on its own
// thread so that a signal still stops ddprun at once.
std::optional<rendezvous::RendezvousResult> ElasticAgent::Impl::formRound() {
  // Shared with the completion handler, which may run after this function returned (when
  // a signal cut the wait short), so it cannot live on this stack frame.
  auto ready = std::make_shared<bool>(false);
  auto pending = std::async(std::launch::async, [this, ready] {
    struct Notify {
      asio::io_context* io;
      std::shared_ptr<bool> ready;
      ~Notify() {
        asio::post(*io, [r = ready] { *r = true; });
      }
    } notify{&env_.io(), ready};
    return rendezvous_->nextRound();
  });
  // The node's status record keeps its heartbeat while it waits for the round.
  auto next_beat = now() + settings_.keep_alive_interval;
  while (!*ready && stop_signal_ == 0) {
    runFor(std::max<Clock::Duration>(next_beat - now(), std::chrono::milliseconds(1)));
    if (!*ready && now() >= next_beat) {
      reporter_.publishStatus();
      next_beat = now() + settings_.keep_alive_interval;
    }
  }
  if (!*ready) {
    rendezvous_->interrupt();
    pending.wait();
    return std::nullopt;
  }
  return pending.get();
}

void ElasticAgent::Impl::watchRound(int round) {
  round_ = round;
  round_event_.reset();
  rendezvous_->watch([this](rendezvous::RoundEvent event) {
    asio::post(env_.io(), [this, event] {
      if (event.round == round_ && !round_event_) round_event_ = event;
    });
  });
}

// Ends the job for this node: the exit barrier, then the exit code.
int ElasticAgent::Impl::finishJob(int exit_code) {
  group_.retireSpare();  // no attempt follows: not kept through the exit barrier
  reporter_.setExitCode(exit_code);
  // Published before the exit barrier: once everyone has checked out, the store's host leaves.
  reporter_.setState("exited");
  rendezvous_->finish();
  return exit_code;
}

// This node's workers are done; the job is done when every node's are. Until then a
// failure elsewhere re-forms the job and this node's workers run again.
void ElasticAgent::Impl::afterSuccess() {
  try {
    rendezvous_->markDone();
  } catch (const DdprunError& e) {
    round_event_ = rendezvous::RoundEvent{rendezvous::RoundEvent::Kind::kStoreLost, round_, e.what()};
  }
  while (!round_event_ && stop_signal_ == 0) runFor(std::chrono::hours(1));
}

std::optional<int> ElasticAgent::Impl::sitOut(std::chrono::milliseconds duration, const std::string& why) {
  try {
    rendezvous_->sitOut();
  } catch (const rendezvous::StoreError& e) {
    log_->error("lost the rendezvous store at {}: {}", rendezvous_->storeAddress(), e.what());
    reporter_.storeLost();
    return kExitRendezvous;
  }
  const auto until = now() + duration;
  reporter_.setCooldownUntil(rendezvous::wallClockMillis() + duration.count());
  const double seconds = std::chrono::duration<double>(duration).count();
  const std::string reason =
      why.empty() ? fmt::format("this node's workers failed {} times in a row", policy_.consecutiveFailures()) : why;
  log_->warn("{}; it sits out of the job for {:.1f} s", reason, seconds);
  reporter_.emit("node_cooldown", JsonObject()
                                      .add("consecutive_failures", policy_.consecutiveFailures())
                                      .add("seconds", seconds)
                                      .add("until", isoTimeUtc(reporter_.cooldownUntil()))
                                      .add("reason", reason));
  reporter_.setState("cooldown");
  // Meanwhile the job may end without this node: then so does this agent.
  auto next_check = now() + settings_.keep_alive_interval;
  for (;;) {
    if (stop_signal_ != 0) return finishJob(128 + stop_signal_);
    const auto t = now();
    if (t >= until) break;
    if (t < next_check) {
      runFor(std::min(until, next_check) - t);
      continue;
    }
    next_check = t + settings_.keep_alive_interval;
    reporter_.publishStatus();
    try {
      if (auto reason = rendezvous_->jobEndedWhileAway()) return jobEndedAway(*reason);
    } catch (const rendezvous::StoreError& e) {
      log_->error("lost the rendezvous store at {} while sitting out: {}", rendezvous_->storeAddress(), e.what());
      reporter_.storeLost();
      return kExitRendezvous;
    }
  }
  reporter_.setCooldownUntil(0);
  log_->info("cooldown over; this node rejoins the job");
  reporter_.emit("cooldown_end", JsonObject().add("consecutive_failures", policy_.consecutiveFailures()));
  return std::nullopt;
}

int ElasticAgent::Impl::jobEndedAway(const std::string& reason) {
  const auto end = rendezvous::RoundEnd::parse(reason);
  const bool done = end && end->kind == rendezvous::RoundEnd::Kind::kDone;
  if (done) {
    log_->info("the job finished successfully while this node sat out");
  } else {
    log_->error("the job ended ({}) while this node sat out", reason);
  }
  reporter_.emit("job_ended_while_away", JsonObject().add("reason", reason));
  return finishJob(done ? kExitOk : kExitWorkersFailed);
}

void ElasticAgent::Impl::setUp() {
  containment_.setUp();
  rendezvous_ = make_rendezvous_();
  WorkerGroupSetup setup;
  setup.base_env = currentEnvironment();
  hang_.setUp(*rendezvous_, setup.base_env);
  // The rings' directory, as the hang watch named it to the workers.
  const auto flight_dir = setup.base_env.find(env::kFlightDir);
  progress_.setUp(*rendezvous_, flight_dir != setup.base_env.end() ? flight_dir->second : std::string());
  recovery_.setUp(*rendezvous_, flight_dir != setup.base_env.end() ? flight_dir->second : std::string());
  auto prefix_env = setup.base_env.find(env::kLogLinePrefixTemplate);
  setup.prefix_template = prefix_env != setup.base_env.end() ? prefix_env->second : kDefaultPrefixTemplate;
  const bool keep_logs = config_.redirects.anyStream() || config_.tee.anyStream();
  layout_ = std::make_unique<LogLayout>(config_.log_dir, config_.rendezvous.run_id, keep_logs);
  if (!layout_->isTemporary()) log_->info("worker logs in {}", layout_->runDir());
  // Removed at exit; the guard removes it (rpc_secret files included) if ddprun is killed.
  if (layout_->isTemporary() && guard_) guard_->watchDirectory(layout_->runDir());
  if (config_.python_workers && config_.python_stacks) {
    try {
      writePythonHook(layout_->pythonHookDir());
      setup.python_hook_dir = layout_->pythonHookDir();
      // A run directory that stays (--log_dir, or kept for a hung worker's stacks) loses the
      // hook at the end; if ddprun is killed first, the guard removes it.
      if (guard_) guard_->watchDirectory(layout_->pythonHookDir());
    } catch (const SystemError& e) {
      log_->warn("no Python stacks when a collective fails: {}", e.what());
    }
  }
  if (setsOmpNumThreads(setup.base_env, config_.nproc_per_node)) {
    log_->warn(
        "setting OMP_NUM_THREADS=1 for each worker to avoid overloading the machine; "
        "tune it for your application as needed");
  }
  setup.layout = layout_.get();
  auto gpu_options = GpuWatch::optionsFor(host_, config_.nproc_per_node, setup.base_env);
  group_.setUp(std::move(setup));
  hang_.setLayout(*layout_);
  settings_ = rendezvous::parseRendezvousSettings(config_.rendezvous.conf);
  std::vector<std::string> event_files;
  if (!layout_->isTemporary()) event_files.push_back(layout_->runDir() + "/" + kEventsFileName);
  if (config_.events_file) event_files.push_back(*config_.events_file);
  reporter_.open(*rendezvous_, event_files);
  JsonObject start;
  start.add("store", rendezvous_->storeAddress())
      .add("hosts_store", rendezvous_->hostsStore())
      .add("nproc_per_node", config_.nproc_per_node)
      .add("min_nodes", config_.rendezvous.min_nodes)
      .add("max_nodes", config_.rendezvous.max_nodes)
      .add("max_restarts", config_.max_restarts)
      .add("node_cooldown_s", std::chrono::duration<double>(config_.node_cooldown).count())
      .add("node_cooldown_max_s", std::chrono::duration<double>(config_.node_cooldown_max).count());
  if (const auto port = reporter_.healthPort()) start.add("health_check_port", *port);
  reporter_.emit("agent_start", start);
  gpu_watch_ = std::make_unique<GpuWatch>(std::move(gpu_options),
                                          [this](const std::string& e, const JsonObject& f) { reporter_.emit(e, f); });
}

int ElasticAgent::Impl::run() {
  setUp();
  int code = 0;
  try {
    code = runRounds();
    group_.retireSpare();  // the ends that skip finishJob (a signal while joining, a lost store)
  } catch (const DdprunError& e) {
    group_.retireSpare();
    const int exit_code = dynamic_cast<const RendezvousError*>(&e) ? kExitRendezvous : kExitWorkersFailed;
    reporter_.setFinalState("exited", exit_code);
    reporter_.emit("agent_exit", JsonObject().add("exit_code", exit_code).add("error", e.what()));
    throw;
  }
  reporter_.setFinalState("exited", code);
  reporter_.emit("agent_exit", JsonObject().add("exit_code", code));
  return code;
}

int ElasticAgent::Impl::runRounds() {
  for (;; ++attempt_) {
    // GPU health before each start (agent/placement/gpu_watch.h): while a GPU this node hands
    // out is sick, an elastic job goes on without the node; any other job does not start on it.
    std::string sick_gpus = gpu_watch_->beforeStart();
    while (!sick_gpus.empty() && config_.rendezvous.min_nodes < config_.rendezvous.max_nodes) {
      const auto wait = config_.node_cooldown.count() > 0 ? config_.node_cooldown : kSickGpuSitOut;
      if (auto code = sitOut(std::chrono::duration_cast<std::chrono::milliseconds>(wait), sick_gpus)) return *code;
      sick_gpus = gpu_watch_->beforeStart();
    }
    reporter_.setState("joining");
    std::optional<rendezvous::RendezvousResult> rdzv;
    try {
      rdzv = formRound();
    } catch (const rendezvous::JobEndedError& e) {
      return jobEndedAway(e.reason());
    }
    if (!rdzv) return 128 + stop_signal_;
    reporter_.roundFormed(*rdzv);
    reporter_.setRound(*rdzv);
    const Outcome outcome = runAttempt(*rdzv, sick_gpus);
    if (auto code = endOfAttempt(outcome, *rdzv)) return *code;
  }
}

ElasticAgent::Impl::Outcome ElasticAgent::Impl::runAttempt(const rendezvous::RendezvousResult& rdzv,
                                                           const std::string& sick_gpus) {
  try {
    if (!sick_gpus.empty()) {
      throw DdprunError(sick_gpus +
                        "; not starting workers on it (an elastic job, --nnodes MIN:MAX, would go on without "
                        "this node)");
    }
    recovery_.roundStarted(rdzv);
    startWorkers(rdzv);
  } catch (const DdprunError& e) {
    log_->error("cannot start workers: {}", e.what());
    return Outcome::kStartFailed;
  }
  policy_.attemptStarted();
  reporter_.setState("running");
  watchRound(rdzv.round);
  Outcome outcome = waitForWorkers();
  // --recovery=in-job: a failed worker replaced alone, the attempt goes on.
  while (outcome == Outcome::kFailed && recovery_.replaceFailed()) outcome = waitForWorkers();
  if (outcome != Outcome::kSucceeded) return outcome;
  endAttempt();
  reporter_.setState("succeeded");
  afterSuccess();
  if (stop_signal_ == 0 && round_event_->kind == rendezvous::RoundEvent::Kind::kEnded &&
      policy_.afterRoundEnd(round_event_->reason, true).action == RestartPolicy::Action::kSucceed) {
    return Outcome::kJobDone;
  }
  return *signalOrRoundEvent();  // afterSuccess() returns with one of them
}

std::optional<ElasticAgent::Impl::Outcome> ElasticAgent::Impl::signalOrRoundEvent() const {
  if (stop_signal_ != 0) return Outcome::kStoppedBySignal;
  if (!round_event_) return std::nullopt;
  return round_event_->kind == rendezvous::RoundEvent::Kind::kEnded ? Outcome::kRoundEnded : Outcome::kStoreLost;
}

// The one ending of an attempt: its workers stop and its round ends (this node writes why, or
// another node did), in the order each outcome needs; then the job ends, or another attempt
// follows (nothing returned).
std::optional<int> ElasticAgent::Impl::endOfAttempt(Outcome outcome, const rendezvous::RendezvousResult& rdzv) {
  const std::string& node = rendezvous_->nodeName();
  AttemptEnd end;
  std::vector<WorkerFailure> failures;
  switch (outcome) {
    case Outcome::kSucceeded:  // never: runAttempt() makes it one of the others
    case Outcome::kJobDone:
      log_->info("all {} workers finished successfully", group_.workers().size());
      reporter_.roundEnded(round_event_->reason, false);
      return finishJob(kExitOk);
    case Outcome::kStartFailed:
      // Its workers never ran: they are killed, not stopped.
      end = {SIGKILL, rendezvous::RoundEnd::finalFailure(node), false, false, true};
      break;
    case Outcome::kStoppedBySignal:
      end.mine = rendezvous::RoundEnd::abort(node, signalName(stop_signal_));
      end.signal = stop_signal_;
      break;
    case Outcome::kStoreLost:
      log_->error("lost the rendezvous store at {}: {}; stopping the workers", rendezvous_->storeAddress(),
                  round_event_->reason);
      reporter_.storeLost();
      reporter_.emit("store_lost", JsonObject().add("round", rdzv.round).add("error", round_event_->reason));
      break;
    case Outcome::kRoundEnded: reporter_.roundEnded(round_event_->reason, false); break;
    case Outcome::kFailed:
      // A local worker failed: the hang watch says whether a collective did, and where the
      // ranks stand, before the round ends.
      failures = hang_.failures(host_);
      if (failures.empty()) {
        // A stderr line said a collective failed, and no worker failed even when stopped.
        log_->error("{}; yet no worker failed; ending the job", hang_.collectiveLine());
        end.mine = rendezvous::RoundEnd::finalFailure(node);
        end.told_as_mine = true;
      } else {
        // Written before the workers stop, so that the other nodes stop theirs meanwhile.
        end.mine = policy_.endForFailure(node, recovery_.restartsUsed(rdzv.restart_count));
        end.round_first = true;
      }
      break;
  }
  const std::string standing = stopAndEndRound(end);

  switch (outcome) {
    case Outcome::kStoreLost: return kExitRendezvous;
    case Outcome::kRoundEnded:
      if (policy_.afterRoundEnd(round_event_->reason, false).action == RestartPolicy::Action::kFail) {
        log_->error("the job failed on another node ({}); stopping", round_event_->reason);
        return finishJob(kExitWorkersFailed);
      }
      if (stop_signal_ != 0) return 128 + stop_signal_;
      log_->warn("re-forming the job ({})", round_event_->reason);
      return std::nullopt;
    case Outcome::kStoppedBySignal: return finishJob(128 + stop_signal_);
    case Outcome::kFailed:
      if (!failures.empty()) return afterFailure(failures, *end.mine, standing, rdzv);
      [[fallthrough]];
    default: return finishJob(kExitWorkersFailed);
  }
}

std::string ElasticAgent::Impl::stopAndEndRound(const AttemptEnd& end) {
  std::string standing;
  const auto endRound = [&] {
    if (!end.mine) return;
    standing = rendezvous_->endRound(*end.mine);
    reporter_.roundEnded(standing, end.told_as_mine || standing == end.mine->format());
  };
  if (end.round_first) endRound();
  if (end.say_stopping) reporter_.setState("stopping");
  stopAttempt(end.signal);
  if (!end.round_first) endRound();
  return standing;
}

std::optional<int> ElasticAgent::Impl::afterFailure(std::vector<WorkerFailure>& failures,
                                                    const rendezvous::RoundEnd& mine, const std::string& standing,
                                                    const rendezvous::RendezvousResult& rdzv) {
  gpu_watch_->explainFailures(failures);  // a GPU fault: its GPU named in the report, a gpu_fault event
  if (stop_signal_ != 0) return 128 + stop_signal_;
  const RestartPolicy::Decision decision = policy_.afterFailure(mine, standing);
  if (decision.action == RestartPolicy::Action::kReform) {
    log_->warn("re-forming the job ({}); rank {} failed meanwhile", standing, failures.front().rank);
    return std::nullopt;
  }
  if (decision.action == RestartPolicy::Action::kRestart) {
    log_->warn("restarting the worker group after rank {} failed (restart {} of {})", failures.front().rank,
               rdzv.restart_count + 1, config_.max_restarts);
    if (decision.sit_out.count() > 0) return sitOut(decision.sit_out);
    return std::nullopt;
  }
  group_.addStderrTails(failures);
  console().write(ConsoleStream::kStderr, formatFailureReport(config_.entry_name, failures));
  return finishJob(kExitWorkersFailed);
}

}  // namespace ddprun::agent
