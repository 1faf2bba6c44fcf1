#include "agent/elastic_agent.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>

#include <cerrno>
#include <cstring>
#include <chrono>
#include <future>
#include <optional>

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>

#include "agent/error_file.h"
#include "agent/failure_report.h"
#include "agent/line_forwarder.h"
#include "agent/log_layout.h"
#include "agent/orphan_guard.h"
#include "agent/process_spawner.h"
#include "agent/worker_env.h"
#include "common/env_names.h"
#include "common/error.h"
#include "common/logging.h"
#include "rendezvous/dynamic_rendezvous.h"

namespace ddprun::agent {
namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

namespace {

constexpr auto kGroupPollInterval = std::chrono::milliseconds(10);
// Output still arriving after every worker's process group is gone comes from a
// process that left its group (setsid); we stop waiting for it after this long.
constexpr auto kDrainTimeout = std::chrono::seconds(1);
constexpr const char* kDefaultPrefixTemplate = "[rank${rank}]:";

std::string hostName() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

bool groupAlive(pid_t pgid) { return ::kill(-pgid, 0) == 0 || errno == EPERM; }

// torchrun's TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE uses Python's string.Template:
// ${name} and $name both substitute.
std::string expandPrefix(std::string text, const std::string& role, int rank, int local_rank) {
  const std::pair<std::string, std::string> vars[] = {
      {"role_name", role}, {"local_rank", std::to_string(local_rank)}, {"rank", std::to_string(rank)}};
  for (const auto& [name, value] : vars) {
    for (const std::string& token : {"${" + name + "}", "$" + name}) {
      for (size_t pos = text.find(token); pos != std::string::npos; pos = text.find(token, pos + value.size())) {
        text.replace(pos, token.size(), value);
      }
    }
  }
  return text;
}

}  // namespace

class ElasticAgent::Impl {
 public:
  Impl(AgentConfig config, OrphanGuard& guard)
      : config_(std::move(config)),
        guard_(guard),
        log_(logger("agent")),
        host_(hostName()),
        child_signals_(io_, SIGCHLD),
        stop_signals_(io_, SIGINT, SIGTERM, SIGHUP),
        user_signals_(io_, SIGUSR1, SIGUSR2) {
    stop_signals_.add(SIGQUIT);
  }

  int run();

 private:
  struct Worker {
    WorkerPlace place;
    pid_t pid = -1;
    bool running = false;
    bool stopped_by_agent = false;
    int exit_code = 0;
    int signal = 0;
    std::chrono::system_clock::time_point exit_time;
    std::string error_file;
    bool failed() const { return !running && !stopped_by_agent && (signal != 0 || exit_code != 0); }
  };
  enum class Outcome { kSucceeded, kFailed, kStoppedBySignal, kRoundEnded, kStoreLost };

  void armChildSignals();
  void armStopSignals();
  void armUserSignals();
  void reapChildren();
  void startWorkers(int attempt, const rendezvous::RendezvousResult& rdzv);
  void startOneWorker(Worker& worker, int attempt, const rendezvous::RendezvousResult& rdzv);
  Outcome waitForWorkers();
  std::optional<rendezvous::RendezvousResult> formRound();
  void watchRound(int round);
  int finishJob(int exit_code);
  void afterSuccess();
  void stopWorkers(int signal);
  void clearProcessGroups();
  void drainOutput();
  void endAttempt();
  bool anyRunning() const;
  void signalRunning(int signal);
  std::vector<WorkerFailure> collectFailures() const;
  void runFor(Clock::duration d);

  AgentConfig config_;
  OrphanGuard& guard_;
  std::shared_ptr<spdlog::logger> log_;
  std::string host_;
  std::map<std::string, std::string> base_env_;
  std::string prefix_template_;
  std::unique_ptr<LogLayout> layout_;

  asio::io_context io_;
  asio::signal_set child_signals_;
  asio::signal_set stop_signals_;
  asio::signal_set user_signals_;
  std::vector<Worker> workers_;
  std::vector<std::unique_ptr<LineForwarder>> forwarders_;
  int stop_signal_ = 0;        // the first SIGINT/TERM/HUP/QUIT received.
  bool stopping_ = false;      // workers were told to stop; a second signal means kill.
  std::unique_ptr<rendezvous::DynamicRendezvous> rendezvous_;
  int round_ = -1;
  std::optional<rendezvous::RoundEvent> round_event_;  // of round_, from the watcher thread
  int attempt_ = 0;            // worker group starts on this node: names attempt_<k> log dirs
};

ElasticAgent::ElasticAgent(AgentConfig config, OrphanGuard& guard)
    : impl_(std::make_unique<Impl>(std::move(config), guard)) {}
ElasticAgent::~ElasticAgent() = default;
int ElasticAgent::run() { return impl_->run(); }

void ElasticAgent::Impl::armChildSignals() {
  child_signals_.async_wait([this](const boost::system::error_code& ec, int) {
    if (ec) return;
    reapChildren();
    armChildSignals();
  });
}

void ElasticAgent::Impl::armStopSignals() {
  stop_signals_.async_wait([this](const boost::system::error_code& ec, int signal) {
    if (ec) return;
    if (stop_signal_ == 0) stop_signal_ = signal;
    if (stopping_) {
      log_->warn("received {} again; killing the workers now", signalName(signal));
      signalRunning(SIGKILL);
    } else {
      log_->warn("received {}; stopping the workers", signalName(signal));
    }
    armStopSignals();
  });
}

void ElasticAgent::Impl::armUserSignals() {
  user_signals_.async_wait([this](const boost::system::error_code& ec, int signal) {
    if (ec) return;
    log_->info("forwarding {} to the workers", signalName(signal));
    signalRunning(signal);
    armUserSignals();
  });
}

// SIGCHLD may stand for several exits, and (as a subreaper) for orphaned grandchildren
// too: reap everything that has exited so no zombie is left.
void ElasticAgent::Impl::reapChildren() {
  for (;;) {
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid <= 0) return;
    for (Worker& w : workers_) {
      if (w.pid != pid || !w.running) continue;
      w.running = false;
      w.exit_time = std::chrono::system_clock::now();
      if (WIFSIGNALED(status)) {
        w.signal = WTERMSIG(status);
      } else {
        w.exit_code = WEXITSTATUS(status);
      }
      if (w.failed()) {
        if (w.signal) {
          log_->warn("worker rank {} (pid {}) was killed by {}", w.place.rank, pid, signalName(w.signal));
        } else {
          log_->warn("worker rank {} (pid {}) exited with code {}", w.place.rank, pid, w.exit_code);
        }
      } else {
        log_->debug("worker rank {} (pid {}) exited (code {}, signal {})", w.place.rank, pid, w.exit_code, w.signal);
      }
    }
  }
}

bool ElasticAgent::Impl::anyRunning() const {
  for (const Worker& w : workers_) {
    if (w.running) return true;
  }
  return false;
}

void ElasticAgent::Impl::signalRunning(int signal) {
  for (const Worker& w : workers_) {
    if (w.running && ::kill(-w.pid, signal) != 0 && errno != ESRCH) {
      log_->warn("cannot send {} to worker rank {} (pid {}): {}", signalName(signal), w.place.rank, w.pid,
                 std::strerror(errno));
    }
  }
}

void ElasticAgent::Impl::startWorkers(int attempt, const rendezvous::RendezvousResult& rdzv) {
  workers_.clear();
  forwarders_.clear();
  for (const WorkerPlace& place : assignPlaces(config_.nproc_per_node, rdzv)) {
    Worker worker;
    worker.place = place;
    workers_.push_back(std::move(worker));
  }
  log_->info("starting {} worker{} (ranks {}-{} of {}, node {} of {}, restart {}, master {}:{})", workers_.size(),
             workers_.size() == 1 ? "" : "s", rdzv.rank_base, rdzv.rank_base + config_.nproc_per_node - 1,
             rdzv.world_size, rdzv.group_rank, rdzv.group_world_size, rdzv.restart_count, rdzv.master_addr,
             rdzv.master_port);
  for (Worker& worker : workers_) startOneWorker(worker, attempt, rdzv);
}

void ElasticAgent::Impl::startOneWorker(Worker& worker, int attempt, const rendezvous::RendezvousResult& rdzv) {
  const int local_rank = worker.place.local_rank;
  const std::string dir = layout_->workerDir(attempt, local_rank);
  worker.error_file = LogLayout::errorFile(dir);

  SpawnRequest request;
  request.argv = config_.entrypoint;
  request.env = workerEnvironment(base_env_, config_, rdzv, worker.place, worker.error_file);

  const Std redirected = config_.redirects.forLocalRank(local_rank);
  const Std teed = config_.tee.forLocalRank(local_rank);
  const bool filtered_out = config_.local_ranks_filter && !config_.local_ranks_filter->count(local_rank);
  const std::string prefix = expandPrefix(prefix_template_, config_.role, worker.place.rank, local_rank);

  struct StreamPlan {
    bool to_file;
    bool to_console;
    bool prefixed;
    std::string file;
    int console_fd;
  };
  auto plan = [&](bool redirect, bool tee, std::string file, int console_fd) {
    StreamPlan p{redirect || tee, (!redirect || tee) && !filtered_out, tee || config_.local_ranks_filter.has_value(),
                 std::move(file), console_fd};
    return p;
  };
  StreamPlan out = plan(includesStdout(redirected), includesStdout(teed), LogLayout::stdoutFile(dir), STDOUT_FILENO);
  StreamPlan err = plan(includesStderr(redirected), includesStderr(teed), LogLayout::stderrFile(dir), STDERR_FILENO);
  auto target = [](const StreamPlan& p) {
    if (p.to_console && (p.prefixed || p.to_file)) return StdioTarget{StdioTarget::Kind::kPipe, {}};
    if (p.to_console) return StdioTarget{StdioTarget::Kind::kInherit, {}};
    return StdioTarget{StdioTarget::Kind::kFile, p.to_file ? p.file : "/dev/null"};
  };
  request.out = target(out);
  request.err = target(err);

  SpawnedProcess spawned = spawnWorker(request);
  worker.pid = spawned.pid;
  worker.running = true;
  guard_.watch(spawned.pid);
  log_->debug("worker rank {} started (pid {})", worker.place.rank, spawned.pid);

  auto forward = [&](int pipe_fd, const StreamPlan& p) {
    if (pipe_fd < 0) return;
    int file_fd = -1;
    if (p.to_file) {
      file_fd = ::open(p.file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (file_fd < 0) log_->warn("cannot open {}: {}; output goes to the console only", p.file, std::strerror(errno));
    }
    auto forwarder = std::make_unique<LineForwarder>(io_, pipe_fd, file_fd, p.console_fd, p.prefixed ? prefix : "");
    forwarder->start();
    forwarders_.push_back(std::move(forwarder));
  };
  forward(spawned.stdout_pipe, out);
  forward(spawned.stderr_pipe, err);
}

// Runs the event loop for at most `d` (or until a handler has run, whichever is first).
void ElasticAgent::Impl::runFor(Clock::duration d) {
  if (io_.stopped()) io_.restart();
  io_.run_one_for(d);
}

ElasticAgent::Impl::Outcome ElasticAgent::Impl::waitForWorkers() {
  for (;;) {
    if (stop_signal_ != 0) return Outcome::kStoppedBySignal;
    if (round_event_) {
      return round_event_->kind == rendezvous::RoundEvent::Kind::kEnded ? Outcome::kRoundEnded : Outcome::kStoreLost;
    }
    bool running = false;
    for (const Worker& w : workers_) {
      if (w.failed()) return Outcome::kFailed;
      running = running || w.running;
    }
    if (!running) return Outcome::kSucceeded;
    runFor(std::chrono::hours(1));
  }
}

// Sends `signal` to every running worker's group, waits --term_timeout for them to
// exit, then SIGKILLs what is left.
void ElasticAgent::Impl::stopWorkers(int signal) {
  stopping_ = true;
  for (Worker& w : workers_) {
    if (w.running) w.stopped_by_agent = true;
  }
  signalRunning(signal);
  const auto deadline = Clock::now() + config_.term_timeout;
  while (anyRunning() && Clock::now() < deadline) runFor(deadline - Clock::now());
  if (anyRunning()) {
    log_->warn("workers still running {} ms after {}; sending SIGKILL", config_.term_timeout.count(),
               signalName(signal));
    signalRunning(SIGKILL);
    while (anyRunning()) runFor(std::chrono::seconds(1));
  }
  stopping_ = false;
}

// A worker's children may outlive it in its process group; none may outlive the attempt.
void ElasticAgent::Impl::clearProcessGroups() {
  std::vector<pid_t> alive;
  for (const Worker& w : workers_) {
    if (groupAlive(w.pid)) alive.push_back(w.pid);
  }
  if (!alive.empty()) {
    log_->debug("{} worker process group(s) still have members; sending SIGTERM", alive.size());
    for (pid_t pgid : alive) ::kill(-pgid, SIGTERM);
    const auto deadline = Clock::now() + config_.term_timeout;
    for (;;) {
      std::erase_if(alive, [](pid_t pgid) { return !groupAlive(pgid); });
      if (alive.empty() || Clock::now() >= deadline) break;
      runFor(kGroupPollInterval);
    }
    for (pid_t pgid : alive) ::kill(-pgid, SIGKILL);
    while (!alive.empty()) {
      std::erase_if(alive, [](pid_t pgid) { return !groupAlive(pgid); });
      if (!alive.empty()) runFor(kGroupPollInterval);
    }
  }
  for (const Worker& w : workers_) guard_.forget(w.pid);
}

void ElasticAgent::Impl::drainOutput() {
  const auto deadline = Clock::now() + kDrainTimeout;
  auto pending = [this] {
    for (const auto& f : forwarders_) {
      if (!f->finished()) return true;
    }
    return false;
  };
  while (pending() && Clock::now() < deadline) runFor(deadline - Clock::now());
  for (auto& f : forwarders_) f->close();
}

void ElasticAgent::Impl::endAttempt() {
  clearProcessGroups();
  drainOutput();
  forwarders_.clear();
}

std::vector<WorkerFailure> ElasticAgent::Impl::collectFailures() const {
  std::vector<WorkerFailure> failures;
  for (const Worker& w : workers_) {
    if (!w.failed()) continue;
    WorkerFailure f;
    f.rank = w.place.rank;
    f.local_rank = w.place.local_rank;
    f.host = host_;
    f.pid = w.pid;
    f.exit_code = w.exit_code;
    f.signal = w.signal;
    f.time = w.exit_time;
    f.error_file = w.error_file;
    f.error = readErrorFile(w.error_file);
    failures.push_back(std::move(f));
  }
  sortRootCauseFirst(failures);
  return failures;
}

// The rendezvous blocks (possibly for minutes, waiting for nodes); it runs on its own
// thread so that a signal still stops ddprun at once.
std::optional<rendezvous::RendezvousResult> ElasticAgent::Impl::formRound() {
  // Shared with the completion handler, which may run after this function returned (when
  // a signal cut the wait short), so it cannot live on this stack frame.
  auto ready = std::make_shared<bool>(false);
  auto pending = std::async(std::launch::async, [this, ready] {
    struct Notify {
      Impl* self;
      std::shared_ptr<bool> ready;
      ~Notify() { asio::post(self->io_, [r = ready] { *r = true; }); }
    } notify{this, ready};
    return rendezvous_->nextRound();
  });
  while (!*ready && stop_signal_ == 0) runFor(std::chrono::hours(1));
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
    asio::post(io_, [this, event] {
      if (event.round == round_ && !round_event_) round_event_ = event;
    });
  });
}

// Ends the job for this node: the exit barrier, then the exit code.
int ElasticAgent::Impl::finishJob(int exit_code) {
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

int ElasticAgent::Impl::run() {
  ::signal(SIGPIPE, SIG_IGN);
  // Orphaned grandchildren of workers come to us, so we can reap and account for them.
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  armChildSignals();
  armStopSignals();
  armUserSignals();

  rendezvous_ = std::make_unique<rendezvous::DynamicRendezvous>(config_.rendezvous, config_.nproc_per_node);
  const std::string& node = rendezvous_->nodeName();
  base_env_ = currentEnvironment();
  auto prefix_env = base_env_.find(env::kLogLinePrefixTemplate);
  prefix_template_ = prefix_env != base_env_.end() ? prefix_env->second : kDefaultPrefixTemplate;
  const bool keep_logs = config_.redirects.anyStream() || config_.tee.anyStream();
  layout_ = std::make_unique<LogLayout>(config_.log_dir, config_.rendezvous.run_id, keep_logs);
  if (!layout_->isTemporary()) log_->info("worker logs in {}", layout_->runDir());
  if (setsOmpNumThreads(base_env_, config_.nproc_per_node)) {
    log_->warn(
        "setting OMP_NUM_THREADS=1 for each worker to avoid overloading the machine; "
        "tune it for your application as needed");
  }

  for (;; ++attempt_) {
    std::optional<rendezvous::RendezvousResult> rdzv = formRound();
    if (!rdzv) return 128 + stop_signal_;
    try {
      startWorkers(attempt_, *rdzv);
    } catch (const DdprunError& e) {
      log_->error("cannot start workers: {}", e.what());
      stopWorkers(SIGKILL);
      endAttempt();
      rendezvous_->endRound("final:" + node);
      return finishJob(kExitWorkersFailed);
    }
    watchRound(rdzv->round);
    Outcome outcome = waitForWorkers();
    if (outcome == Outcome::kSucceeded) {
      endAttempt();
      afterSuccess();
      if (stop_signal_ == 0 && round_event_->kind == rendezvous::RoundEvent::Kind::kEnded &&
          round_event_->reason == "done") {
        log_->info("all {} workers finished successfully", workers_.size());
        return finishJob(kExitOk);
      }
      outcome = stop_signal_ != 0 ? Outcome::kStoppedBySignal
                : round_event_->kind == rendezvous::RoundEvent::Kind::kEnded ? Outcome::kRoundEnded
                                                                              : Outcome::kStoreLost;
    }
    if (outcome == Outcome::kStoppedBySignal) {
      stopWorkers(stop_signal_);
      endAttempt();
      rendezvous_->endRound("abort:" + node + ":" + signalName(stop_signal_));
      finishJob(0);
      return 128 + stop_signal_;
    }
    if (outcome == Outcome::kStoreLost) {
      log_->error("lost the rendezvous store at {}: {}; stopping the workers", rendezvous_->storeAddress(),
                  round_event_->reason);
      stopWorkers(SIGTERM);
      endAttempt();
      return kExitRendezvous;
    }
    if (outcome == Outcome::kRoundEnded) {
      const std::string reason = round_event_->reason;
      stopWorkers(SIGTERM);
      endAttempt();
      if (rendezvous::DynamicRendezvous::isFinal(reason)) {
        log_->error("the job failed on another node ({}); stopping", reason);
        return finishJob(kExitWorkersFailed);
      }
      if (stop_signal_ != 0) return 128 + stop_signal_;
      log_->warn("re-forming the job ({})", reason);
      continue;
    }
    // A local worker failed.
    std::vector<WorkerFailure> failures = collectFailures();
    const bool final = rdzv->restart_count >= config_.max_restarts;
    const std::string mine = (final ? "final:" : "fail:") + node;
    const std::string standing = rendezvous_->endRound(mine);
    stopWorkers(SIGTERM);
    endAttempt();
    if (stop_signal_ != 0) return 128 + stop_signal_;
    // The round may already have ended for another reason (a node joined or failed first):
    // then that reason decides, and this failure does not count as a restart of its own.
    const bool decided_here = standing == mine;
    if (!decided_here && !rendezvous::DynamicRendezvous::isFinal(standing)) {
      log_->warn("re-forming the job ({}); rank {} failed meanwhile", standing, failures.front().rank);
      continue;
    }
    if (decided_here && !final) {
      log_->warn("restarting the worker group after rank {} failed (restart {} of {})", failures.front().rank,
                 rdzv->restart_count + 1, config_.max_restarts);
      continue;
    }
    writeAll(STDERR_FILENO, formatFailureReport(config_.entry_name, failures));
    return finishJob(kExitWorkersFailed);
  }
}

}  // namespace ddprun::agent
