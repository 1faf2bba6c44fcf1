#include "agent/elastic_agent.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <optional>
#include <set>
#include <sstream>
#include <string_view>

#include <fmt/format.h>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>

#include "agent/adopted_children.h"
#include "agent/error_file.h"
#include "agent/escaped_processes.h"
#include "agent/event_log.h"
#include "agent/failure_report.h"
#include "agent/file_timer_server.h"
#include "agent/filtered_log.h"
#include "agent/flight_dir.h"
#include "agent/hang_verdict.h"
#include "agent/health_server.h"
#include "agent/hung_worker_stop.h"
#include "agent/line_forwarder.h"
#include "agent/log_layout.h"
#include "agent/node_cooldown.h"
#include "agent/numa_binding.h"
#include "agent/orphan_guard.h"
#include "agent/process_signals.h"
#include "agent/process_spawner.h"
#include "agent/process_state.h"
#include "agent/python_hook.h"
#include "agent/python_stacks.h"
#include "agent/restart_policy.h"
#include "agent/secret_file.h"
#include "agent/torch_dumps.h"
#include "agent/torch_trace/dump_verdict.h"
#include "agent/worker_cgroups.h"
#include "agent/worker_env.h"
#include "common/clock.h"
#include "common/console_writer.h"
#include "common/env_names.h"
#include "common/error.h"
#include "common/logging.h"
#include "common/text_escape.h"
#include "rendezvous/dynamic_rendezvous.h"
#include "rendezvous/etcd/etcd_env.h"

namespace ddprun::agent {
namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

namespace {

constexpr auto kGroupPollInterval = std::chrono::milliseconds(10);
// Rounds of stopping adopted orphans (each may hand its own children to the agent).
constexpr int kMaxOrphanRounds = 8;
// Output still arriving after every worker's process group is gone comes from a
// process that left its group (setsid); we stop waiting for it after this long.
constexpr auto kDrainTimeout = std::chrono::seconds(1);
// How often the agent looks for workers' descendants that left their process group, to
// tell the orphan guard. With cgroups too: a process can leave its cgroup as well (a write
// to another cgroup's cgroup.procs). One that left less than this before ddprun is killed
// with kill -9 can outlive it; a scan is one pass over /proc.
constexpr auto kEscapeScanInterval = std::chrono::milliseconds(500);
// How long killed processes get to leave their cgroups at the end of an attempt.
constexpr auto kCgroupRemoveTimeout = std::chrono::seconds(5);
constexpr const char* kDefaultPrefixTemplate = "[rank${rank}]:";
// How often an agent of a multi-node job looks for another node's hang summary request,
// and how long the node judging a hang waits for the answers (more than one look apart).
constexpr std::chrono::seconds kHangRequestPoll{2};
constexpr std::chrono::seconds kHangSummaryWait{5};
// How long the agent waits for the Python workers' stacks after signalling their hook
// (faulthandler writes them from its signal handler, at once, even in a blocked call).
constexpr auto kPythonStacksWait = std::chrono::seconds(2);
constexpr auto kPythonStacksPoll = std::chrono::milliseconds(20);
// A worker said on stderr that a collective failed: this long for it to end on its own (gloo
// raises at once; NCCL's watchdog aborts the process) before ddprun stops the attempt.
constexpr auto kCollectiveFailureGrace = std::chrono::seconds(5);
// torch's flight-recorder dumps: how often the agent looks for a new one while the workers run
// (a dump is written when a collective timed out), and, once a collective failed, how long it
// waits for every local rank's: the ranks still running write theirs when torch signals the
// timeout dump through the store (their watchdogs look about once a second), not torch's ~60 s.
// With no dump at all after kTorchFirstDumpWait, none is coming (gloo before torch 2.8).
constexpr auto kTorchDumpLook = std::chrono::milliseconds(250);
constexpr auto kTorchDumpSettleLook = std::chrono::milliseconds(100);
constexpr auto kTorchDumpWait = std::chrono::seconds(3);
constexpr auto kTorchFirstDumpWait = std::chrono::seconds(1);

// A worker that SIGKILL has not ended after --term_timeout (at least this long) sleeps
// uninterruptibly in the kernel: ddprun reports it and goes on without it.
constexpr auto kMinKillWait = std::chrono::seconds(1);

std::string hostName() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

bool groupAlive(pid_t pgid) {
  const int err = signalGroup(pgid, 0);
  return err == 0 || err == EPERM;
}

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

class ElasticAgent::Impl {
 public:
  Impl(AgentConfig config, OrphanGuard& guard)
      : config_(std::move(config)),
        guard_(guard),
        log_(logger("agent")),
        host_(hostName()),
        child_signals_(io_, SIGCHLD),
        stop_signals_(io_),
        user_signals_(io_),
        escape_scan_(io_),
        policy_(config_.max_restarts, NodeCooldown(config_.node_cooldown, config_.node_cooldown_max),
                ddprun::Clock::real()) {
    const auto& stop = config_.stop_signals;
    for (int sig : stop) stop_signals_.add(sig);
    // The user signals are the operator's way to talk to the workers (a checkpoint request
    // from SLURM, say), so they are forwarded unless --signals_to_handle makes them stop the job.
    for (int sig : {SIGUSR1, SIGUSR2}) {
      if (std::find(stop.begin(), stop.end(), sig) == stop.end()) user_signals_.add(sig);
    }
  }
  ~Impl();

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
    std::shared_ptr<StreamRecord> stderr_record;  // when stderr goes through the agent
    std::string dir;                              // its log directory in this attempt
    bool python_faulthandler = false;             // a Python worker with PYTHONFAULTHANDLER: SIGABRT before a hang kill
    std::string hang_reason;                      // set when ddprun stopped it as hung ("timer 'step' expired")
    std::optional<HungStop> hang;                 // its stacks, then
    bool abandoned = false;                       // survived SIGKILL (uninterruptible sleep); no longer waited for
    bool left_group = false;                      // found outside its own process group (said once)
    bool python_hook = false;                     // it got ddprun's Python hook (python_hook.h)
    std::string python_stack;                     // its Python stacks (faulthandler), taken by takePythonStacks
    std::string python_stack_file;                // where they are
    std::string torch_dump;                       // where torch writes its flight-recorder dump; empty: nowhere known
    FileStamp torch_dump_before;                  // that file when the worker started
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
  void stopAdoptedOrphans();
  void setUpContainment();
  void armEscapeScan();
  void scanEscaped();
  void forgetEscaped();
  void removeWorkerCgroups();
  void clearProcessGroups();
  void drainOutput();
  void endAttempt();
  bool anyRunning() const;
  // Sends `signal` to the worker's process group and to the worker itself (which may have
  // left its group). Returns whether the worker was reached; says why not when it was not.
  bool signalWorker(Worker& w, int signal);
  void signalRunning(int signal);
  std::vector<WorkerFailure> collectFailures() const;
  void addStderrTails(std::vector<WorkerFailure>& failures) const;
  void runFor(Clock::duration d);
  // Runs the event loop while `busy()` holds, for at most `limit`.
  template <typename Busy>
  void runWhile(Busy busy, Clock::duration limit) {
    for (const auto deadline = Clock::now() + limit; busy() && Clock::now() < deadline;)
      runFor(deadline - Clock::now());
  }
  int runRounds();
  // Hung workers (file timers; the hang verdict): stacks first, then the stop.
  void startFileTimers();
  void onTimerExpired(const TimerExpiry& expiry);
  Worker* workerOwning(pid_t pid);
  // Stops each (worker, pid) as hung with `signal` after capturing its stacks (and Python's
  // tracebacks), recording why and the stacks for the failure report.
  // `kill_after` > 0: SIGKILL follows `signal` after that long to whom it did not end.
  void stopHung(const std::vector<std::pair<Worker*, pid_t>>& targets, int signal, const std::string& reason,
                std::chrono::milliseconds kill_after = std::chrono::milliseconds(0));
  // The hang verdict (hang_verdict.h) over this node's flight recorder rings, logged once per
  // attempt with what triggered it, before anyone is stopped. Returns it (empty: none).
  std::string judgeHang(const std::string& trigger);
  // --hang_timeout: when no local rank has completed an operation (a collective or a
  // point-to-point message) for that long while one is pending, judges the hang and stops
  // every running worker as hung (stacks first).
  void checkHangTimeout();
  std::vector<RankPosition> localPositions() const;
  // A worker's stderr line: says it when a torch collective failed (python_stacks.h).
  void onWorkerStderrLine(int rank, std::string_view line);
  // Something says a torch collective failed while the workers run (a stderr line, a dump):
  // the stacks are taken at once and the attempt stops if no worker ends within the grace.
  void noticeCollectiveFailure(const std::string& what);
  // A worker's flight-recorder dump written since it started: says it (once per attempt).
  void lookForTorchDumps();
  // Signals every running worker's Python hook and waits (kPythonStacksWait at most) for
  // their stacks; once per attempt.
  void takePythonStacks();
  // What says that a torch collective failed in this attempt: a worker's stderr line, or a
  // failure's message (error file, saved exception, stderr tail), a dump; or, only `maybe`
  // (set then), a Python worker killed by SIGABRT with no error file, which a collective's
  // watchdog does but so does any abort. Empty: nothing does.
  std::string collectiveFailureTrigger(const std::vector<WorkerFailure>& failures, bool& maybe) const;
  // The verdict from the ranks' Python frames (python_stacks.h), logged and recorded like
  // judgeHang's; sets the culprits. Returns it (empty: none).
  std::string judgePythonHang(const std::string& trigger);
  // The verdict from torch's flight-recorder dumps of the local ranks (torch_dumps.h), after
  // waiting at most kTorchDumpWait for them, when every rank of the job has one that reads;
  // logged and recorded like judgeHang's ("source":"flight_recorder"), it sets the culprits.
  // Otherwise one line says which ranks had none (or which could not be read). Returns the
  // verdict's sentences (empty: none).
  std::string judgeTorchDumps(const std::string& trigger);
  // Another node judges a hang: publish where this node's ranks stand (once per round).
  void answerHangRequest();
  Clock::duration killWait() const { return std::max<Clock::duration>(config_.term_timeout, kMinKillWait); }

  // Operating the job: the state others see (status, health check) and the events file.
  void setState(const std::string& state);
  rendezvous::AgentRecord statusRecord() const;
  void refreshHealth();
  void emit(const std::string& event, const JsonObject& fields = {});
  void emitRound(const rendezvous::RendezvousResult& rdzv);
  void emitRoundEnd(const std::string& reason, bool by_this_node);
  // The cooldown of a flapping node: sits out for `duration` (or until the job ends).
  // Returns the exit code when ddprun should end now, nothing when it should rejoin.
  std::optional<int> sitOut(std::chrono::milliseconds duration);
  int jobEndedAway(const std::string& reason);

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
  asio::steady_timer escape_scan_;
  std::unique_ptr<WorkerCgroups> cgroups_;
  std::set<ProcessStamp> escaped_;  // told to the guard: outside every worker's group
  std::vector<Worker> workers_;
  std::vector<std::unique_ptr<LineForwarder>> forwarders_;
  std::shared_ptr<FilteredLog> filtered_stdout_;  // this attempt's, with --duplicate_stdout_filters
  std::shared_ptr<FilteredLog> filtered_stderr_;
  int stop_signal_ = 0;    // the first of config_.stop_signals received.
  bool stopping_ = false;  // workers were told to stop; a second signal means kill.
  std::unique_ptr<rendezvous::DynamicRendezvous> rendezvous_;
  int round_ = -1;
  std::optional<rendezvous::RoundEvent> round_event_;  // of round_, from the watcher thread
  int attempt_ = 0;                                    // worker group starts on this node: names attempt_<k> log dirs

  rendezvous::RendezvousSettings settings_;
  RestartPolicy policy_;
  std::unique_ptr<EventLog> events_;
  std::unique_ptr<HealthServer> health_;
  std::string state_ = "starting";
  std::optional<rendezvous::RendezvousResult> current_;         // the round the workers run (ran) in
  std::optional<rendezvous::RendezvousResult> previous_round_;  // for scale and restart events
  std::string last_end_reason_;
  int64_t cooldown_until_ms_ = 0;
  int exit_code_ = -1;
  bool store_lost_ = false;                        // no more status records: a publish could wait on a dead store
  std::unique_ptr<FileTimerServer> timer_server_;  // TORCHELASTIC_ENABLE_FILE_TIMER=1
  std::unique_ptr<FlightDir> flight_dir_;          // the workers' flight recorder rings
  bool hang_judged_ = false;                       // this attempt's verdict was given
  std::vector<int> hang_culprits_;                 // the ranks it blamed: the report's root cause
  Clock::time_point next_hang_check_{};            // --hang_timeout's next look at the rings
  Clock::time_point attempt_started_{};            // when this attempt's workers were started
  bool no_rings_warned_ = false;                   // --hang_timeout found no ring to watch (said once)
  Clock::time_point next_hang_request_check_{};    // the next look for another node's request
  HungWorkerStopper hung_stopper_{io_};
  std::string python_hook_dir_;              // where the sitecustomize.py is; empty: no hook
  std::string collective_line_;              // "rank 0: <line>": a stderr line said a collective failed
  Clock::time_point collective_line_at_{};   // when
  bool python_stacks_taken_ = false;         // this attempt's Python stacks were taken
  std::unique_ptr<TorchDumps> torch_dumps_;  // this attempt's, when a worker has a dump prefix
  Clock::time_point next_dump_look_{};       // lookForTorchDumps' next look
};

ElasticAgent::Impl::~Impl() {
  if (flight_dir_ && !flight_dir_->path().empty()) {
    guard_.forgetDirectory(flight_dir_->path());
    flight_dir_.reset();
  }
  if (!cgroups_ || !cgroups_->enabled()) return;
  const std::string root = cgroups_->root();
  cgroups_.reset();
  // One the agent could not remove stays with the guard, which tries again when ddprun exits.
  if (::access(root.c_str(), F_OK) != 0) guard_.forgetCgroup(root);
}

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
      JsonObject exit;
      exit.add("rank", w.place.rank).add("local_rank", w.place.local_rank).add("pid", pid).add("attempt", attempt_);
      if (w.signal) {
        exit.addNull("exit_code").add("signal", signalName(w.signal));
      } else {
        exit.add("exit_code", w.exit_code).addNull("signal");
      }
      exit.add("failed", w.failed()).add("stopped_by_agent", w.stopped_by_agent);
      emit("worker_exit", exit);
      refreshHealth();
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

bool ElasticAgent::Impl::signalWorker(Worker& w, int signal) {
  const int to_group = signalGroup(w.pid, signal);
  const int to_worker = signalProcess(w.pid, signal);
  if (to_group == ESRCH && to_worker == 0 && !w.left_group) {
    w.left_group = true;
    log_->warn("worker rank {} (pid {}) has left its process group; signalling it by its pid", w.place.rank, w.pid);
  }
  if (to_worker != 0 && to_worker != ESRCH) {
    log_->warn("cannot send {} to worker rank {} (pid {}): {}", signalName(signal), w.place.rank, w.pid,
               std::strerror(to_worker));
  }
  return to_worker == 0;
}

void ElasticAgent::Impl::signalRunning(int signal) {
  for (Worker& w : workers_) {
    if (w.running) signalWorker(w, signal);
  }
}

void ElasticAgent::Impl::startWorkers(int attempt, const rendezvous::RendezvousResult& rdzv) {
  attempt_started_ = Clock::now();
  workers_.clear();
  forwarders_.clear();
  filtered_stdout_.reset();
  filtered_stderr_.reset();
  if (!config_.duplicate_stdout_filters.empty()) {
    filtered_stdout_ = std::make_shared<FilteredLog>(LogLayout::filteredStdoutFile(layout_->attemptDir(attempt)),
                                                     config_.duplicate_stdout_filters);
  }
  if (!config_.duplicate_stderr_filters.empty()) {
    filtered_stderr_ = std::make_shared<FilteredLog>(LogLayout::filteredStderrFile(layout_->attemptDir(attempt)),
                                                     config_.duplicate_stderr_filters);
  }
  for (const WorkerPlace& place : assignPlaces(config_.nproc_per_node, rdzv)) {
    Worker worker;
    worker.place = place;
    workers_.push_back(std::move(worker));
  }
  log_->info("starting {} worker{} (ranks {}-{} of {}, node {} of {}, restart {}, master {}:{})", workers_.size(),
             workers_.size() == 1 ? "" : "s", rdzv.rank_base, rdzv.rank_base + config_.nproc_per_node - 1,
             rdzv.world_size, rdzv.group_rank, rdzv.group_world_size, rdzv.restart_count, rdzv.master_addr,
             rdzv.master_port);
  std::vector<ExpectedDump> expected_dumps;
  for (Worker& worker : workers_) {
    startOneWorker(worker, attempt, rdzv);
    if (!worker.torch_dump.empty()) {
      expected_dumps.push_back(ExpectedDump{worker.place.rank, worker.torch_dump, worker.torch_dump_before});
    }
    emit("worker_start", JsonObject()
                             .add("rank", worker.place.rank)
                             .add("local_rank", worker.place.local_rank)
                             .add("pid", worker.pid)
                             .add("attempt", attempt)
                             .add("round", rdzv.round)
                             .add("restart_count", rdzv.restart_count));
  }
  torch_dumps_.reset();
  if (!expected_dumps.empty()) torch_dumps_ = std::make_unique<TorchDumps>(std::move(expected_dumps));
  next_dump_look_ = Clock::now() + kTorchDumpLook;
}

void ElasticAgent::Impl::startOneWorker(Worker& worker, int attempt, const rendezvous::RendezvousResult& rdzv) {
  const int local_rank = worker.place.local_rank;
  const std::string dir = layout_->workerDir(attempt, local_rank);
  worker.error_file = LogLayout::errorFile(dir);

  SpawnRequest request;
  request.argv = config_.entrypoint;
  request.env = workerEnvironment(base_env_, config_, rdzv, worker.place, worker.error_file);
  worker.dir = dir;
  if (config_.python_workers && !python_hook_dir_.empty()) {
    addPythonHook(request.env, python_hook_dir_, dir);
    worker.python_hook = true;
  }
  if (config_.python_workers && config_.torch_flight_recorder) {
    addTorchFlightRecorder(request.env, layout_->attemptDir(attempt) + "/torch_trace_rank_");
  }
  // Ours, or the user's: torch appends the global rank.
  if (const std::string prefix = config_.python_workers ? torchDumpPrefix(request.env) : ""; !prefix.empty()) {
    worker.torch_dump = prefix + std::to_string(worker.place.rank);
    worker.torch_dump_before = stampOf(worker.torch_dump);
  }
  const auto faulthandler = request.env.find(env::kPythonFaultHandler);
  worker.python_faulthandler =
      config_.python_workers && faulthandler != request.env.end() && !faulthandler->second.empty();
  if (!rdzv.rpc_secret.empty()) {
    const std::string secret_file = dir + "/rpc_secret";
    writeSecretFile(secret_file, rdzv.rpc_secret);
    request.env[env::kRpcSecretFile] = secret_file;
  }

  const Std redirected = config_.redirects.forLocalRank(local_rank);
  const Std teed = config_.tee.forLocalRank(local_rank);
  const bool filtered_out = config_.local_ranks_filter && !config_.local_ranks_filter->count(local_rank);
  const std::string prefix = expandPrefix(prefix_template_, config_.role, worker.place.rank, local_rank);

  struct StreamPlan {
    bool to_file;
    bool to_console;
    bool prefixed;
    std::string file;
    ConsoleStream console;
  };
  auto plan = [&](bool redirect, bool tee, std::string file, ConsoleStream console) {
    StreamPlan p{redirect || tee, (!redirect || tee) && !filtered_out, tee || config_.local_ranks_filter.has_value(),
                 std::move(file), console};
    return p;
  };
  StreamPlan out =
      plan(includesStdout(redirected), includesStdout(teed), LogLayout::stdoutFile(dir), ConsoleStream::kStdout);
  StreamPlan err =
      plan(includesStderr(redirected), includesStderr(teed), LogLayout::stderrFile(dir), ConsoleStream::kStderr);
  // A log file is written by the agent, never by the worker itself: a full --log_dir must
  // not fail the worker's writes (and so change its exit code).
  auto target = [](const StreamPlan& p) {
    if (p.to_file || (p.to_console && p.prefixed)) return StdioTarget{StdioTarget::Kind::kPipe, {}};
    if (p.to_console) return StdioTarget{StdioTarget::Kind::kInherit, {}};
    return StdioTarget{StdioTarget::Kind::kFile, "/dev/null"};
  };
  request.out = target(out);
  request.err = target(err);
  request.cgroup = cgroups_->create(local_rank, attempt);
  if (!config_.cpu_bindings.empty()) request.cpus = config_.cpu_bindings.at(static_cast<size_t>(local_rank)).cpus;

  SpawnedProcess spawned = spawnWorker(request);
  worker.pid = spawned.pid;
  worker.running = true;
  guard_.watch(spawned.pid);
  if (config_.numa_binding) {
    const CpuBinding& binding = config_.cpu_bindings.at(static_cast<size_t>(local_rank));
    log_->info("worker rank {} (local rank {}, pid {}) bound to CPUs {} (--numa-binding={}, NUMA node {})",
               worker.place.rank, local_rank, spawned.pid, formatCpuList(binding.cpus),
               numaModeName(*config_.numa_binding), binding.numa_node);
  } else {
    log_->debug("worker rank {} started (pid {})", worker.place.rank, spawned.pid);
  }

  auto forward = [&](int pipe_fd, const StreamPlan& p, std::shared_ptr<StreamRecord> record,
                     std::shared_ptr<FilteredLog> filtered, std::function<void(std::string_view)> on_line = {}) {
    if (pipe_fd < 0) return;
    ForwardOptions options;
    if (p.to_file) {
      options.file = p.file;
      options.file_fd.reset(::open(p.file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
      if (!options.file_fd) {
        const int err = errno;
        log_->warn("cannot open worker log {}: {}; this stream is not saved there", p.file, std::strerror(err));
        if (record) record->file_error = std::strerror(err);
      }
    }
    if (p.to_console) options.console = p.console;
    if (p.prefixed) options.prefix = prefix;
    options.record = std::move(record);
    options.filtered = std::move(filtered);
    options.on_line = std::move(on_line);
    auto forwarder = std::make_unique<LineForwarder>(io_, pipe_fd, std::move(options));
    forwarder->start();
    forwarders_.push_back(std::move(forwarder));
  };
  // As torchrun's: the ranks teed to the console (--tee, --local_ranks_filter) are filtered.
  auto filteredIf = [&](bool teed_here, const std::shared_ptr<FilteredLog>& log) {
    return teed_here && !filtered_out ? log : nullptr;
  };
  forward(spawned.stdout_pipe, out, nullptr, filteredIf(includesStdout(teed), filtered_stdout_));
  if (spawned.stderr_pipe >= 0) worker.stderr_record = std::make_shared<StreamRecord>();
  const int rank = worker.place.rank;
  forward(spawned.stderr_pipe, err, worker.stderr_record, filteredIf(includesStderr(teed), filtered_stderr_),
          [this, rank](std::string_view line) { onWorkerStderrLine(rank, line); });
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
    if (!collective_line_.empty() && Clock::now() >= collective_line_at_ + kCollectiveFailureGrace) {
      log_->warn("no worker ended within {} s of '{}'; stopping the attempt",
                 std::chrono::duration_cast<std::chrono::seconds>(kCollectiveFailureGrace).count(), collective_line_);
      return Outcome::kFailed;
    }
    const bool watch_hang = config_.hang_timeout && !hang_judged_ && !stopping_;
    const bool several_nodes = current_ && current_->group_world_size > 1;
    Clock::time_point wake = Clock::now() + std::chrono::hours(1);
    if (watch_hang) wake = std::min(wake, next_hang_check_);
    if (several_nodes) wake = std::min(wake, next_hang_request_check_);
    if (!collective_line_.empty()) wake = std::min(wake, collective_line_at_ + kCollectiveFailureGrace);
    const bool watch_dumps = torch_dumps_ && collective_line_.empty() && !stopping_;
    if (watch_dumps) wake = std::min(wake, next_dump_look_);
    runFor(std::max<Clock::duration>(wake - Clock::now(), Clock::duration::zero()));
    if (watch_dumps && Clock::now() >= next_dump_look_) {
      next_dump_look_ = Clock::now() + kTorchDumpLook;
      lookForTorchDumps();
    }
    // A rank said a collective failed: the others' Python stacks now, before any of them moves on.
    if (!collective_line_.empty() && !python_stacks_taken_) takePythonStacks();
    const auto now = Clock::now();
    if (watch_hang && now >= next_hang_check_) {
      // A few times per timeout, at most once a second: reading the rings is cheap.
      next_hang_check_ = now + std::clamp<Clock::duration>(*config_.hang_timeout / 4, std::chrono::milliseconds(50),
                                                           std::chrono::seconds(1));
      checkHangTimeout();
    }
    if (several_nodes && now >= next_hang_request_check_) {
      next_hang_request_check_ = now + kHangRequestPoll;
      answerHangRequest();
    }
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
  runWhile([this] { return anyRunning(); }, config_.term_timeout);
  if (anyRunning()) {
    // Each with its state: a stopped (T) or uninterruptibly sleeping (D) worker is why.
    std::string states;
    for (const Worker& w : workers_) {
      if (!w.running) continue;
      states += fmt::format("{}rank {} (pid {}) state {}", states.empty() ? "" : ", ", w.place.rank, w.pid,
                            describeProcessState(w.pid));
    }
    log_->warn("workers still running {} ms after {}; sending SIGKILL: {}", config_.term_timeout.count(),
               signalName(signal), states);
    std::set<pid_t> killed;  // the workers SIGKILL reached
    for (Worker& w : workers_) {
      if (w.running && signalWorker(w, SIGKILL)) killed.insert(w.pid);
    }
    // A worker in uninterruptible sleep (D) dies only when its kernel call returns, which may
    // be never (a dead NFS server, a wedged driver): it must not hold up ddprun.
    runWhile([this] { return anyRunning(); }, killWait());
    for (Worker& w : workers_) {
      if (!w.running) continue;
      const std::string state = describeProcessState(w.pid);
      const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(killWait()).count();
      if (killed.count(w.pid)) {
        log_->error("worker rank {} (pid {}) still running {} ms after SIGKILL, state {}; going on without it",
                    w.place.rank, w.pid, waited, state);
      } else {
        log_->error("worker rank {} (pid {}) could not be sent SIGKILL and still runs, state {}; going on without it",
                    w.place.rank, w.pid, state);
      }
      emit("worker_unkillable", JsonObject()
                                    .add("rank", w.place.rank)
                                    .add("pid", w.pid)
                                    .add("attempt", attempt_)
                                    .add("state", state)
                                    .add("sigkill_sent", killed.count(w.pid) > 0));
      w.running = false;
      w.abandoned = true;
    }
  }
  stopping_ = false;
}

void ElasticAgent::Impl::startFileTimers() {
  if (!config_.file_timer) return;
  // As torch's agent: the pipe named in ddprun's environment, else a new one; the workers
  // get its name either way.
  auto named = base_env_.find(env::kTimerFile);
  const std::string path =
      named != base_env_.end() && !named->second.empty() ? named->second : FileTimerServer::defaultPath();
  try {
    timer_server_ = std::make_unique<FileTimerServer>(
        io_, path, [this](const TimerExpiry& e) { onTimerExpired(e); },
        [this](int64_t pid) -> int64_t {
          const Worker* w = workerOwning(static_cast<pid_t>(pid));
          return w ? w->pid : -1;
        });
  } catch (const SystemError& e) {
    // A pipe name that cannot be made (no such directory, not writable) is the user's to fix.
    throw UsageError(std::string("file timers (") + env::kEnableFileTimer + "=1): " + e.what());
  }
  timer_server_->start();
  base_env_[env::kTimerFile] = path;
  log_->info("file timers on {}", path);
}

// The running worker that `pid` is, or belongs to: a process of its process group, or one
// below it that left the group.
ElasticAgent::Impl::Worker* ElasticAgent::Impl::workerOwning(pid_t pid) {
  std::vector<pid_t> running;
  for (const Worker& w : workers_) {
    if (w.running) running.push_back(w.pid);
  }
  const pid_t owner = findOwningWorker(pid, running);
  for (Worker& w : workers_) {
    if (w.running && w.pid == owner) return &w;
  }
  return nullptr;
}

void ElasticAgent::Impl::onTimerExpired(const TimerExpiry& expiry) {
  std::string scopes;
  // Scopes are the worker's text: shown escaped, so that they cannot forge log lines.
  for (const std::string& s : expiry.expired_scopes) scopes += (scopes.empty() ? "'" : ", '") + printable(s) + "'";
  const std::string scope = printable(expiry.timer.scope_id);
  const pid_t pid = static_cast<pid_t>(expiry.pid);
  Worker* w = workerOwning(pid);
  // Unlike torch's server, which signals whatever pid a request names, ddprun stops only
  // its own workers' processes.
  if (w == nullptr) {
    log_->warn("file timer {} of pid {} expired, but pid {} is not a process of this node's running workers; ignored",
               scopes, pid, pid);
    return;
  }
  emit("timer_expired", JsonObject()
                            .add("rank", w->place.rank)
                            .add("local_rank", w->place.local_rank)
                            .add("pid", pid)
                            .add("scope", expiry.timer.scope_id)
                            .add("signal", expiry.signal > 0 ? signalName(expiry.signal) : "none")
                            .add("attempt", attempt_));
  if (stopping_) {
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
  judgeHang("timer '" + scope + "' of rank " + std::to_string(w->place.rank) + " expired");
  // Whatever signal it asked for (SIGSTOP, one it handles), an expired timer ends the process:
  // SIGKILL follows after --term_timeout if it is still there.
  stopHung({{w, pid}}, expiry.signal, "timer '" + scope + "' expired", config_.term_timeout);
}

std::vector<RankPosition> ElasticAgent::Impl::localPositions() const {
  std::vector<RankPosition> positions;
  if (!flight_dir_) return positions;
  const int64_t now_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
  // The directory holds only this attempt's rings (emptied after each one, once its processes
  // are gone); a worker may be a wrapper of the process that writes (sh -c, a Python parent),
  // so the ring's pid is not matched, only its rank against this node's.
  for (const FlightRingSnapshot& ring : flight_dir_->read()) {
    for (const Worker& w : workers_) {
      if (w.place.rank == ring.rank) positions.push_back(positionOf(ring, now_ns));
    }
  }
  return positions;
}

void ElasticAgent::Impl::answerHangRequest() {
  if (!rendezvous_->hangSummaryRequested()) return;
  std::string summary;
  for (const RankPosition& p : localPositions()) summary += encodePosition(p) + "\n";
  rendezvous_->publishHangSummary(summary);
  log_->info("another node judges a hang; published where this node's ranks stand");
}

void ElasticAgent::Impl::onWorkerStderrLine(int rank, std::string_view line) {
  if (!collective_line_.empty() || stopping_) return;
  auto failure = collectiveFailureIn(line);
  if (!failure) return;
  noticeCollectiveFailure(fmt::format("rank {}: {}", rank, printable(*failure)));
}

void ElasticAgent::Impl::noticeCollectiveFailure(const std::string& what) {
  collective_line_ = what;
  collective_line_at_ = Clock::now();
  log_->warn("a collective failed ({}); taking the Python stacks of the workers still running", collective_line_);
}

void ElasticAgent::Impl::lookForTorchDumps() {
  const std::optional<int> rank = torch_dumps_->written();
  if (!rank) return;
  for (const Worker& w : workers_) {
    if (w.place.rank == *rank) {
      noticeCollectiveFailure(
          fmt::format("rank {}: wrote torch's flight-recorder dump {}", *rank, printable(w.torch_dump)));
    }
  }
}

void ElasticAgent::Impl::takePythonStacks() {
  python_stacks_taken_ = true;
  struct Ask {
    Worker* worker;
    std::string file;
    uintmax_t size = 0;
    bool done = false;
  };
  std::vector<Ask> asks;
  for (Worker& w : workers_) {
    if (!w.running || !w.python_hook) continue;
    // The worker itself when it registered the hook, else the first of its processes that did
    // (a wrapper: sh -c python ...); never a pid outside the worker.
    pid_t target = -1;
    for (pid_t pid : registeredPythonPids(w.dir)) {
      if (pid == w.pid) {
        target = pid;
        break;
      }
      if (target < 0 && findOwningWorker(pid, {w.pid}) == w.pid) target = pid;
    }
    if (target <= 1) continue;
    if (signalProcess(target, kPythonStacksSignal) != 0) continue;
    asks.push_back(Ask{&w, pythonStacksFile(w.dir, target)});
  }
  if (asks.empty()) return;
  const auto start = Clock::now();
  // Done when each file has something and did not grow since the last look.
  for (const auto deadline = start + kPythonStacksWait; Clock::now() < deadline;) {
    runFor(kPythonStacksPoll);
    bool all = true;
    for (Ask& a : asks) {
      std::error_code ec;
      const uintmax_t size = std::filesystem::file_size(a.file, ec);
      // One that ended meanwhile writes nothing more (its exception's traceback serves instead).
      a.done = !a.worker->running || (!ec && size > 0 && size == a.size);
      a.size = ec ? 0 : size;
      all = all && a.done;
    }
    if (all) break;
  }
  size_t taken = 0;
  for (Ask& a : asks) {
    a.worker->python_stack = readSmallFile(a.file);
    if (a.worker->python_stack.empty()) continue;
    a.worker->python_stack_file = a.file;
    ++taken;
  }
  log_->info("took the Python stacks of {} of {} worker(s) in {} ms", taken, asks.size(),
             std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count());
}

std::string ElasticAgent::Impl::collectiveFailureTrigger(const std::vector<WorkerFailure>& failures,
                                                         bool& maybe) const {
  maybe = false;
  if (!collective_line_.empty()) return "a collective failed (" + collective_line_ + ")";
  for (const WorkerFailure& f : failures) {
    if (!f.hang_reason.empty()) continue;
    if (f.error && reportsCollectiveTimeout(f.error->message)) {
      return fmt::format("rank {} failed: a collective timed out", f.rank);
    }
    std::string said = f.python_exception;
    for (const Worker& w : workers_) {
      if (w.pid == f.pid && w.stderr_record) said += "\n" + w.stderr_record->tail.text();
    }
    if (auto line = collectiveFailureIn(said)) {
      return fmt::format("rank {} failed: a collective failed ({})", f.rank, printable(*line));
    }
  }
  const std::optional<int> dumped = torch_dumps_ ? torch_dumps_->written() : std::nullopt;
  // NCCL's watchdog aborts the process from a C++ thread: no error file, no exception, and
  // its words on stderr reach ddprun only when stderr goes through it.
  for (const WorkerFailure& f : failures) {
    if (!f.hang_reason.empty() || f.signal != SIGABRT || f.error || !f.python_exception.empty()) continue;
    for (const Worker& w : workers_) {
      if (w.pid == f.pid && (w.python_hook || !w.torch_dump.empty())) {
        maybe = !dumped;  // a dump ties it to a collective
        return fmt::format("rank {} was killed by SIGABRT and wrote no error file, as torch's NCCL watchdog does",
                           f.rank);
      }
    }
  }
  if (dumped) return fmt::format("rank {} wrote torch's flight-recorder dump", *dumped);
  return {};
}

std::string ElasticAgent::Impl::judgeTorchDumps(const std::string& trigger) {
  if (!torch_dumps_) return {};
  const auto start = Clock::now();
  for (;;) {
    if (torch_dumps_->poll()) break;
    const auto waited = Clock::now() - start;
    if (waited >= kTorchDumpWait) break;
    if (waited >= kTorchFirstDumpWait && torch_dumps_->writtenRanks().empty()) break;
    // The workers' output and exits are served meanwhile; the looks stay apart, so that a
    // file's size holding still means that torch is done writing it.
    const auto next = Clock::now() + kTorchDumpSettleLook;
    while (Clock::now() < next) runFor(next - Clock::now());
  }
  const auto waited_ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
  const std::vector<int> missing = torch_dumps_->missing();
  if (torch_dumps_->writtenRanks().empty()) {
    log_->info("no torch flight-recorder dump from rank {} within {} ms; the verdict comes from the Python stacks",
               rankRanges(missing), waited_ms);
    return {};
  }
  std::string gaps;
  if (!missing.empty()) {
    gaps = fmt::format("no dump from rank {} within {} ms", rankRanges(missing), waited_ms);
  }
  for (const std::string& line : torch_dumps_->unreadable()) {
    gaps += (gaps.empty() ? "" : "; ") + printable(line);
  }
  if (!gaps.empty()) {
    log_->warn("torch flight-recorder dumps: {}; the verdict comes from the Python stacks", gaps);
    return {};
  }
  if (current_ && static_cast<size_t>(current_->world_size) > workers_.size()) {
    log_->warn(
        "torch flight-recorder dumps: only this node's (rank {}) are read; other nodes' are not gathered, so the "
        "verdict comes from the Python stacks",
        rankRanges(torch_dumps_->writtenRanks()));
    return {};
  }
  DumpVerdictOptions options;
  if (const int64_t newest = torch_dumps_->newestNs(); newest > 0) options.now_ns = newest;
  for (const Worker& w : workers_) {
    if (!w.running && w.exit_code == 0 && w.signal == 0) options.finished_ranks.push_back(w.place.rank);
  }
  const DumpVerdict verdict = dumpVerdict(torch_dumps_->dumps(), options);
  std::string text = verdict.text();
  while (!text.empty() && text.back() == '\n') text.pop_back();
  if (verdict.culprits.empty()) {
    log_->warn("{}; the flight-recorder dumps name no rank behind: {}", trigger, printable(text));
    return {};
  }
  log_->error("{}; {}", trigger, text);
  emit("hang_verdict", JsonObject()
                           .add("trigger", trigger)
                           .add("verdict", text)
                           .add("source", "flight_recorder")
                           .add("culprits", rankRanges(verdict.culprits))
                           .add("attempt", attempt_));
  hang_culprits_ = verdict.culprits;
  // One line for the report: the findings' sentences (the last one names the root cause when
  // there are several).
  std::string sentences;
  for (const GroupFinding& f : verdict.findings) sentences += (sentences.empty() ? "" : "; ") + f.line;
  if (verdict.findings.size() > 1) sentences += "; root cause rank " + rankRanges(verdict.culprits);
  return sentences;
}

std::string ElasticAgent::Impl::judgePythonHang(const std::string& trigger) {
  std::vector<RankFrames> ranks;
  for (const Worker& w : workers_) {
    RankFrames r;
    r.rank = w.place.rank;
    // An exception's traceback first (the rank failed, or is failing: its stacks may have been
    // taken in its excepthook), then the stacks taken while it ran, then its stderr's traceback.
    if (w.python_hook) r.frames = lastTraceback(readPythonException(w.dir));
    if (r.frames.empty()) {
      if (auto error = readErrorFile(w.error_file)) r.frames = lastTraceback(error->traceback);
    }
    r.failed = !r.frames.empty() || !w.running;
    if (r.frames.empty() && !w.python_stack.empty()) r.frames = mainThreadFrames(w.python_stack);
    if (r.frames.empty() && !w.running && w.stderr_record) r.frames = lastTraceback(w.stderr_record->tail.text());
    ranks.push_back(std::move(r));
  }
  const auto verdict = pythonHangVerdict(ranks, &sourceLine);
  if (!verdict) {
    log_->warn("{}; the Python stacks name no rank behind", trigger);
    return {};
  }
  log_->error("{}; {}", trigger, verdict->text);
  emit("hang_verdict", JsonObject()
                           .add("trigger", trigger)
                           .add("verdict", verdict->text)
                           .add("source", "python_stacks")
                           .add("culprits", rankRanges(verdict->culprits))
                           .add("attempt", attempt_));
  hang_culprits_ = verdict->culprits;
  return verdict->text;
}

std::string ElasticAgent::Impl::judgeHang(const std::string& trigger) {
  if (hang_judged_) return {};
  hang_judged_ = true;
  std::vector<RankPosition> positions = localPositions();
  if (current_ && current_->group_world_size > 1) {
    size_t nodes = 0;
    std::vector<int> local_ranks;
    for (const Worker& w : workers_) local_ranks.push_back(w.place.rank);
    for (const std::string& answer : rendezvous_->gatherHangSummaries(kHangSummaryWait)) {
      ++nodes;
      SummaryPositions summary = decodeSummary(answer, current_->world_size, local_ranks);
      if (summary.rejected > 0) {
        log_->warn(
            "hang verdict: ignored {} position(s) of another node's summary that no rank of this job of {} "
            "can hold",
            summary.rejected, current_->world_size);
      }
      positions.insert(positions.end(), summary.positions.begin(), summary.positions.end());
    }
    if (nodes + 1 < static_cast<size_t>(current_->group_world_size)) {
      log_->warn("hang verdict without {} of {} nodes (no answer within {} s)", current_->group_world_size - 1 - nodes,
                 current_->group_world_size,
                 std::chrono::duration_cast<std::chrono::seconds>(kHangSummaryWait).count());
    }
  }
  const auto verdict = hangVerdict(positions);
  if (!verdict) {
    // Python workers keep no rings of ddprun's: their verdict comes from their stacks.
    log_->log(positions.empty() && config_.python_workers ? spdlog::level::debug : spdlog::level::warn,
              "{}; the flight recorder shows no operation pending on this node", trigger);
    return {};
  }
  log_->error("{}; {}", trigger, verdict->text);
  emit("hang_verdict", JsonObject().add("trigger", trigger).add("verdict", verdict->text).add("attempt", attempt_));
  hang_culprits_ = verdict->culprits;
  return verdict->text;
}

void ElasticAgent::Impl::checkHangTimeout() {
  const double timeout_s = std::chrono::duration<double>(*config_.hang_timeout).count();
  const std::vector<RankPosition> positions = localPositions();
  if (positions.empty()) {
    // Only workers on ddprun's C++ runtime keep a flight recorder: say so once, rather than
    // let the user believe a Python job is watched.
    if (!no_rings_warned_ && Clock::now() - attempt_started_ >= *config_.hang_timeout) {
      no_rings_warned_ = true;
      log_->warn(
          "--hang_timeout {:g} s: no worker on this node keeps a flight recorder (only C++ workers on ddprun's "
          "runtime do), so hangs cannot be judged here; Python workers can use torch's file timer "
          "(TORCHELASTIC_ENABLE_FILE_TIMER=1)",
          timeout_s);
    }
    return;
  }
  if (!noProgressFor(positions, timeout_s)) return;
  const std::string trigger = fmt::format(
      "--hang_timeout: no rank on this node completed an operation for {:g} s while one was pending", timeout_s);
  const std::string verdict = judgeHang(trigger);
  std::vector<std::pair<Worker*, pid_t>> targets;
  for (Worker& w : workers_) {
    if (w.running) targets.emplace_back(&w, w.pid);
  }
  log_->warn("taking the stacks of {} worker(s), then SIGKILL", targets.size());
  stopHung(targets, SIGKILL, verdict.empty() ? trigger : verdict);
}

void ElasticAgent::Impl::stopHung(const std::vector<std::pair<Worker*, pid_t>>& targets, int signal,
                                  const std::string& reason, std::chrono::milliseconds kill_after) {
  std::vector<HungWorker> hung;
  for (const auto& [w, pid] : targets) {
    // With its Python stacks in hand, no SIGABRT (and its 3 s grace) is needed for them.
    hung.push_back(
        HungWorker{pid, w->place.rank, w->place.local_rank, w->dir, w->python_faulthandler && w->python_stack.empty()});
  }
  std::vector<HungStop> stops = hung_stopper_.stop(hung, signal, "before stopping it: " + reason, kill_after);
  // The report and the log point to stacks.txt, so a temporary run directory stays, even
  // when ddprun is killed.
  if (layout_->isTemporary()) {
    layout_->keep();
    guard_.forgetDirectory(layout_->runDir());
    log_->info("keeping the run directory {} for the stacks in it", layout_->runDir());
  }
  for (size_t i = 0; i < targets.size(); ++i) {
    Worker& w = *targets[i].first;
    w.hang_reason = reason;
    w.hang = std::move(stops[i]);
  }
}

// A worker's children may outlive it in its process group; none may outlive the attempt.
void ElasticAgent::Impl::clearProcessGroups() {
  std::vector<pid_t> alive;
  for (const Worker& w : workers_) {
    // pid -1: a worker that never started (a failed start ends the attempt) has no group.
    if (w.pid > 1 && groupAlive(w.pid)) alive.push_back(w.pid);
  }
  if (!alive.empty()) {
    log_->debug("{} worker process group(s) still have members; sending SIGTERM", alive.size());
    for (pid_t pgid : alive) signalGroup(pgid, SIGTERM);
    const auto deadline = Clock::now() + config_.term_timeout;
    for (;;) {
      std::erase_if(alive, [](pid_t pgid) { return !groupAlive(pgid); });
      if (alive.empty() || Clock::now() >= deadline) break;
      runFor(kGroupPollInterval);
    }
    for (pid_t pgid : alive) signalGroup(pgid, SIGKILL);
    const auto kill_deadline = Clock::now() + killWait();
    for (;;) {
      std::erase_if(alive, [](pid_t pgid) { return !groupAlive(pgid); });
      if (alive.empty()) break;
      if (Clock::now() >= kill_deadline) {
        // Processes in uninterruptible sleep: reported, not waited for.
        for (pid_t pgid : alive) {
          log_->error("process group {} of a worker still has processes {} ms after SIGKILL; going on without them",
                      pgid, std::chrono::duration_cast<std::chrono::milliseconds>(killWait()).count());
        }
        break;
      }
      runFor(kGroupPollInterval);
    }
  }
  stopAdoptedOrphans();
  removeWorkerCgroups();
  forgetEscaped();
  // One that outlived SIGKILL stays with the guard, which kills it if ddprun dies first.
  for (const Worker& w : workers_) {
    if (w.pid > 1 && !w.abandoned) guard_.forget(w.pid);
  }
}

// What is still in the workers' cgroups now ignored SIGTERM or was out of reach of the group
// and orphan stops above (a daemon whose parent still runs): SIGKILL, then remove the cgroups.
void ElasticAgent::Impl::removeWorkerCgroups() {
  const auto deadline = Clock::now() + kCgroupRemoveTimeout;
  for (;;) {
    cgroups_->killAll();
    // The killed may be the agent's children: running the loop reaps them.
    if (cgroups_->removeEmpty()) return;
    if (Clock::now() >= deadline) break;
    runFor(kGroupPollInterval);
  }
  log_->warn("cannot remove the workers' cgroups under {}: processes still in them after {} s", cgroups_->root(),
             std::chrono::duration_cast<std::chrono::seconds>(kCgroupRemoveTimeout).count());
}

// Where workers are contained by cgroups the kernel keeps every descendant in; else by
// process groups. A descendant can leave either (setsid; a write to another cgroup's
// cgroup.procs, as root), so the agent watches for those that leave their process group in
// both cases: the scan is the second net under the cgroups.
void ElasticAgent::Impl::setUpContainment() {
  cgroups_ = std::make_unique<WorkerCgroups>(::getpid(), config_.cgroups);
  if (cgroups_->enabled()) {
    log_->debug("workers are contained by cgroups under {}", cgroups_->root());
    guard_.watchCgroup(cgroups_->root());
  } else {
    log_->debug("workers are contained by process groups only ({}); processes that leave them are found every {} ms",
                cgroups_->whyNot(), kEscapeScanInterval.count());
  }
  armEscapeScan();
}

void ElasticAgent::Impl::armEscapeScan() {
  escape_scan_.expires_after(kEscapeScanInterval);
  escape_scan_.async_wait([this](const boost::system::error_code& ec) {
    if (ec) return;
    scanEscaped();
    armEscapeScan();
  });
}

// Tells the guard which of the workers' descendants are outside every worker's process
// group now, so that a kill -9 of ddprun takes them too; and which are gone.
void ElasticAgent::Impl::scanEscaped() {
  if (!anyRunning()) return;
  std::vector<pid_t> groups;
  for (const Worker& w : workers_) groups.push_back(w.pid);
  std::set<ProcessStamp> now = escapedDescendants(guard_.pid(), groups);
  for (const ProcessStamp& p : escaped_) {
    if (!now.count(p)) guard_.forgetProcess(p);
  }
  for (const ProcessStamp& p : now) {
    if (escaped_.count(p)) continue;
    guard_.watchProcess(p);
    log_->debug("the orphan guard now watches pid {}: it left its worker's process group", p.pid);
  }
  escaped_ = std::move(now);
}

// The attempt's leftovers are stopped: nothing of it is left for the guard to kill.
void ElasticAgent::Impl::forgetEscaped() {
  for (const ProcessStamp& p : escaped_) guard_.forgetProcess(p);
  escaped_.clear();
}

// Descendants that left their worker's process group (setsid daemons) escaped the group kill
// and, their parents gone, came to the agent as subreaper. They may not outlive the attempt
// either: SIGTERM, then SIGKILL after --term_timeout. Stopping one can hand its own children
// to the agent in turn, so this repeats (a bounded number of times) until none is left.
void ElasticAgent::Impl::stopAdoptedOrphans() {
  // Neither the guard nor a worker (even one somehow still running) is an orphan.
  std::vector<pid_t> ours = {guard_.pid()};
  for (const Worker& w : workers_) {
    if (w.pid > 1) ours.push_back(w.pid);
  }
  auto orphansNow = [&ours] { return liveChildren(ours); };
  for (int round = 0; round < kMaxOrphanRounds; ++round) {
    std::vector<pid_t> orphans = orphansNow();
    if (orphans.empty()) return;
    log_->warn("stopping {} process(es) that left their worker's process group and outlived it (pid {}{})",
               orphans.size(), orphans.front(), orphans.size() > 1 ? ", ..." : "");
    for (pid_t pid : orphans) signalProcess(pid, SIGTERM);
    const auto deadline = Clock::now() + config_.term_timeout;
    while (!orphansNow().empty() && Clock::now() < deadline) runFor(kGroupPollInterval);
    for (pid_t pid : orphansNow()) signalProcess(pid, SIGKILL);
    const auto reap_deadline = Clock::now() + std::chrono::seconds(5);
    while (!orphansNow().empty() && Clock::now() < reap_deadline) runFor(kGroupPollInterval);
  }
}

void ElasticAgent::Impl::drainOutput() {
  auto pending = [this] {
    for (const auto& f : forwarders_) {
      if (!f->finished()) return true;
    }
    return false;
  };
  runWhile(pending, kDrainTimeout);
  for (auto& f : forwarders_) f->close();
}

void ElasticAgent::Impl::endAttempt() {
  // What the attempt's processes asked for ends with them.
  hung_stopper_.cancel();
  if (timer_server_) timer_server_->clearTimers();
  if (flight_dir_) flight_dir_->clear();
  hang_judged_ = false;
  hang_culprits_.clear();
  collective_line_.clear();
  python_stacks_taken_ = false;
  torch_dumps_.reset();
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
    if (w.hang) {
      f.hang_reason = w.hang_reason;
      f.hang_python_abort = w.hang->aborted_first;
      f.stacks = w.hang->stacks.text;
      f.stacks_note = w.hang->stacks.problem;
      f.stacks_tool = w.hang->stacks.tool;
      f.stacks_file = w.hang->stacks_file;
    }
    if (w.python_hook) f.python_exception = readPythonException(w.dir);
    // A worker that failed by itself says where with its traceback; stacks taken on its way
    // out would only show its exit.
    if (!w.python_stack.empty() && !f.error && f.python_exception.empty()) {
      std::string frames;
      for (const PyFrame& frame : mainThreadFrames(w.python_stack)) {
        frames += fmt::format("File \"{}\", line {}, in {}\n", frame.file, frame.line, frame.function);
        if (std::string source = sourceLine(frame); !source.empty()) frames += "  " + source + "\n";
      }
      f.python_stack = frames.empty() ? w.python_stack : frames;
      f.python_stack_file = w.python_stack_file;
    }
    failures.push_back(std::move(f));
  }
  sortRootCauseFirst(failures);
  putRanksFirst(failures, hang_culprits_);
  return failures;
}

// Called once the attempt's output is drained, so that the tails hold the last lines.
void ElasticAgent::Impl::addStderrTails(std::vector<WorkerFailure>& failures) const {
  for (WorkerFailure& f : failures) {
    for (const Worker& w : workers_) {
      if (w.pid != f.pid || !w.stderr_record) continue;
      f.stderr_tail = w.stderr_record->tail.text();
      f.stderr_file = w.stderr_record->file;
      f.stderr_file_error = w.stderr_record->file_error;
    }
  }
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
      ~Notify() {
        asio::post(self->io_, [r = ready] { *r = true; });
      }
    } notify{this, ready};
    return rendezvous_->nextRound();
  });
  // The node's status record keeps its heartbeat while it waits for the round.
  auto next_beat = Clock::now() + settings_.keep_alive_interval;
  while (!*ready && stop_signal_ == 0) {
    runFor(std::max<Clock::duration>(next_beat - Clock::now(), std::chrono::milliseconds(1)));
    if (!*ready && Clock::now() >= next_beat) {
      rendezvous_->publishStatus(statusRecord());
      next_beat = Clock::now() + settings_.keep_alive_interval;
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
    asio::post(io_, [this, event] {
      if (event.round == round_ && !round_event_) round_event_ = event;
    });
  });
}

// Ends the job for this node: the exit barrier, then the exit code.
int ElasticAgent::Impl::finishJob(int exit_code) {
  exit_code_ = exit_code;
  // Published before the exit barrier: once everyone has checked out, the store's host leaves.
  setState("exited");
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

void ElasticAgent::Impl::emit(const std::string& event, const JsonObject& fields) {
  if (events_) events_->emit(event, fields);
}

rendezvous::AgentRecord ElasticAgent::Impl::statusRecord() const {
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
  return r;
}

void ElasticAgent::Impl::setState(const std::string& state) {
  state_ = state;
  if (rendezvous_ && !store_lost_) rendezvous_->publishStatus(statusRecord());
  refreshHealth();
}

void ElasticAgent::Impl::refreshHealth() {
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
  for (const Worker& w : workers_) {
    JsonObject o;
    o.add("rank", w.place.rank).add("local_rank", w.place.local_rank).add("pid", w.pid).add("running", w.running);
    workers.push_back(std::move(o));
  }
  body.add("workers", workers);
  health_->update(healthy, body.str());
}

void ElasticAgent::Impl::emitRound(const rendezvous::RendezvousResult& rdzv) {
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

void ElasticAgent::Impl::emitRoundEnd(const std::string& reason, bool by_this_node) {
  last_end_reason_ = reason;
  emit("round_end", JsonObject()
                        .add("round", current_ ? current_->round : -1)
                        .add("reason", reason)
                        .add("cause", causeOf(reason))
                        .add("by_this_node", by_this_node));
}

std::optional<int> ElasticAgent::Impl::sitOut(std::chrono::milliseconds duration) {
  try {
    rendezvous_->sitOut();
  } catch (const rendezvous::StoreError& e) {
    log_->error("lost the rendezvous store at {}: {}", rendezvous_->storeAddress(), e.what());
    store_lost_ = true;
    return kExitRendezvous;
  }
  const auto until = Clock::now() + duration;
  cooldown_until_ms_ = rendezvous::wallClockMillis() + duration.count();
  const double seconds = std::chrono::duration<double>(duration).count();
  log_->warn("this node's workers failed {} times in a row; it sits out of the job for {:.1f} s",
             policy_.consecutiveFailures(), seconds);
  emit("node_cooldown", JsonObject()
                            .add("consecutive_failures", policy_.consecutiveFailures())
                            .add("seconds", seconds)
                            .add("until", isoTimeUtc(cooldown_until_ms_)));
  setState("cooldown");
  // Meanwhile the job may end without this node: then so does this agent.
  auto next_check = Clock::now() + settings_.keep_alive_interval;
  for (;;) {
    if (stop_signal_ != 0) return finishJob(128 + stop_signal_);
    const auto now = Clock::now();
    if (now >= until) break;
    if (now < next_check) {
      runFor(std::min(until, next_check) - now);
      continue;
    }
    next_check = now + settings_.keep_alive_interval;
    rendezvous_->publishStatus(statusRecord());
    try {
      if (auto reason = rendezvous_->jobEndedWhileAway()) return jobEndedAway(*reason);
    } catch (const rendezvous::StoreError& e) {
      log_->error("lost the rendezvous store at {} while sitting out: {}", rendezvous_->storeAddress(), e.what());
      store_lost_ = true;
      return kExitRendezvous;
    }
  }
  cooldown_until_ms_ = 0;
  log_->info("cooldown over; this node rejoins the job");
  emit("cooldown_end", JsonObject().add("consecutive_failures", policy_.consecutiveFailures()));
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
  emit("job_ended_while_away", JsonObject().add("reason", reason));
  return finishJob(done ? kExitOk : kExitWorkersFailed);
}

int ElasticAgent::Impl::run() {
  ::signal(SIGPIPE, SIG_IGN);
  // Orphaned grandchildren of workers come to us, so we can reap and account for them.
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  setUpContainment();
  armChildSignals();
  armStopSignals();
  armUserSignals();

  rendezvous_ = rendezvous::openRendezvous(config_.rendezvous, config_.nproc_per_node);  // c10d, static or etcd
  const std::string& node = rendezvous_->nodeName();
  base_env_ = currentEnvironment();
  startFileTimers();
  flight_dir_ = std::make_unique<FlightDir>(config_.rendezvous.run_id);
  if (flight_dir_->path().empty()) {
    log_->warn("no flight recorder rings ({}); hang verdicts will have nothing to read", flight_dir_->problem());
    base_env_.erase(env::kFlightDir);
  } else {
    base_env_[env::kFlightDir] = flight_dir_->path();
    // A kill -9 of ddprun must not leave it on /dev/shm either.
    guard_.watchDirectory(flight_dir_->path());
  }
  auto prefix_env = base_env_.find(env::kLogLinePrefixTemplate);
  prefix_template_ = prefix_env != base_env_.end() ? prefix_env->second : kDefaultPrefixTemplate;
  const bool keep_logs = config_.redirects.anyStream() || config_.tee.anyStream();
  layout_ = std::make_unique<LogLayout>(config_.log_dir, config_.rendezvous.run_id, keep_logs);
  if (!layout_->isTemporary()) log_->info("worker logs in {}", layout_->runDir());
  // Removed at exit; the guard removes it (rpc_secret files included) if ddprun is killed.
  if (layout_->isTemporary()) guard_.watchDirectory(layout_->runDir());
  if (config_.python_workers && config_.python_stacks) {
    try {
      writePythonHook(layout_->runDir() + "/python_hook");
      python_hook_dir_ = layout_->runDir() + "/python_hook";
    } catch (const SystemError& e) {
      log_->warn("no Python stacks when a collective fails: {}", e.what());
    }
  }
  if (setsOmpNumThreads(base_env_, config_.nproc_per_node)) {
    log_->warn(
        "setting OMP_NUM_THREADS=1 for each worker to avoid overloading the machine; "
        "tune it for your application as needed");
  }
  settings_ = rendezvous::parseRendezvousSettings(config_.rendezvous.conf);
  std::vector<std::string> event_files;
  if (!layout_->isTemporary()) event_files.push_back(layout_->runDir() + "/" + kEventsFileName);
  if (config_.events_file) event_files.push_back(*config_.events_file);
  events_ = std::make_unique<EventLog>(event_files, config_.rendezvous.run_id);
  events_->setNode(node);
  if (config_.health_check_port) {
    health_ = std::make_unique<HealthServer>(config_.health_check_addr, *config_.health_check_port);
    log_->info("health check at http://{}:{}/", config_.health_check_addr, health_->port());
  }
  JsonObject start;
  start.add("store", rendezvous_->storeAddress())
      .add("hosts_store", rendezvous_->hostsStore())
      .add("nproc_per_node", config_.nproc_per_node)
      .add("min_nodes", config_.rendezvous.min_nodes)
      .add("max_nodes", config_.rendezvous.max_nodes)
      .add("max_restarts", config_.max_restarts)
      .add("node_cooldown_s", std::chrono::duration<double>(config_.node_cooldown).count())
      .add("node_cooldown_max_s", std::chrono::duration<double>(config_.node_cooldown_max).count());
  if (health_) start.add("health_check_port", health_->port());
  emit("agent_start", start);

  int code = 0;
  try {
    code = runRounds();
  } catch (const DdprunError& e) {
    exit_code_ = dynamic_cast<const RendezvousError*>(&e) ? kExitRendezvous : kExitWorkersFailed;
    state_ = "exited";
    refreshHealth();
    emit("agent_exit", JsonObject().add("exit_code", exit_code_).add("error", e.what()));
    throw;
  }
  exit_code_ = code;
  state_ = "exited";
  refreshHealth();
  emit("agent_exit", JsonObject().add("exit_code", code));
  return code;
}

int ElasticAgent::Impl::runRounds() {
  const std::string& node = rendezvous_->nodeName();
  for (;; ++attempt_) {
    setState("joining");
    std::optional<rendezvous::RendezvousResult> rdzv;
    try {
      rdzv = formRound();
    } catch (const rendezvous::JobEndedError& e) {
      return jobEndedAway(e.reason());
    }
    if (!rdzv) return 128 + stop_signal_;
    emitRound(*rdzv);
    current_ = rdzv;
    try {
      startWorkers(attempt_, *rdzv);
    } catch (const DdprunError& e) {
      log_->error("cannot start workers: {}", e.what());
      stopWorkers(SIGKILL);
      endAttempt();
      emitRoundEnd(rendezvous_->endRound(rendezvous::RoundEnd::finalFailure(node)), true);
      return finishJob(kExitWorkersFailed);
    }
    policy_.attemptStarted();
    setState("running");
    watchRound(rdzv->round);
    Outcome outcome = waitForWorkers();
    if (outcome == Outcome::kSucceeded) {
      endAttempt();
      setState("succeeded");
      afterSuccess();
      if (stop_signal_ == 0 && round_event_->kind == rendezvous::RoundEvent::Kind::kEnded &&
          policy_.afterRoundEnd(round_event_->reason, true).action == RestartPolicy::Action::kSucceed) {
        log_->info("all {} workers finished successfully", workers_.size());
        emitRoundEnd(round_event_->reason, false);
        return finishJob(kExitOk);
      }
      outcome = stop_signal_ != 0                                            ? Outcome::kStoppedBySignal
                : round_event_->kind == rendezvous::RoundEvent::Kind::kEnded ? Outcome::kRoundEnded
                                                                             : Outcome::kStoreLost;
    }
    if (outcome == Outcome::kStoppedBySignal) {
      setState("stopping");
      stopWorkers(stop_signal_);
      endAttempt();
      const auto mine = rendezvous::RoundEnd::abort(node, signalName(stop_signal_));
      const std::string standing = rendezvous_->endRound(mine);
      emitRoundEnd(standing, standing == mine.format());
      return finishJob(128 + stop_signal_);
    }
    if (outcome == Outcome::kStoreLost) {
      log_->error("lost the rendezvous store at {}: {}; stopping the workers", rendezvous_->storeAddress(),
                  round_event_->reason);
      store_lost_ = true;
      emit("store_lost", JsonObject().add("round", rdzv->round).add("error", round_event_->reason));
      setState("stopping");
      stopWorkers(SIGTERM);
      endAttempt();
      return kExitRendezvous;
    }
    if (outcome == Outcome::kRoundEnded) {
      const std::string reason = round_event_->reason;
      emitRoundEnd(reason, false);
      setState("stopping");
      stopWorkers(SIGTERM);
      endAttempt();
      if (policy_.afterRoundEnd(reason, false).action == RestartPolicy::Action::kFail) {
        log_->error("the job failed on another node ({}); stopping", reason);
        return finishJob(kExitWorkersFailed);
      }
      if (stop_signal_ != 0) return 128 + stop_signal_;
      log_->warn("re-forming the job ({})", reason);
      continue;
    }
    // A local worker failed. Workers ddprun stopped as hung were all sent SIGKILL together:
    // wait for the others too, so that the verdict's culprit is among the failures.
    auto hungRunning = [this] {
      return std::any_of(workers_.begin(), workers_.end(), [](const Worker& w) { return w.running && w.hang; });
    };
    runWhile(hungRunning, killWait());
    std::vector<WorkerFailure> failures = collectFailures();
    // A collective that timed out or failed is a hang seen from inside: take the Python
    // stacks of the ranks still running (unless a stderr line already had them taken), say
    // where every rank stands, then stop the others as hung, before the round ends.
    bool maybe = false;
    if (const std::string trigger = collectiveFailureTrigger(failures, maybe); !trigger.empty()) {
      if (!python_stacks_taken_) takePythonStacks();
      std::string verdict = judgeHang(trigger);
      if (verdict.empty()) verdict = judgeTorchDumps(trigger);
      if (verdict.empty()) verdict = judgePythonHang(trigger);
      std::vector<std::pair<Worker*, pid_t>> targets;
      for (Worker& w : workers_) {
        if (w.running) targets.emplace_back(&w, w.pid);
      }
      // An abort that no verdict ties to a collective may be any crash: the others get the
      // ordinary stop (SIGTERM first), not the hung one.
      if (!targets.empty() && !(maybe && verdict.empty())) {
        stopHung(targets, SIGKILL, verdict.empty() ? trigger : verdict);
        runWhile([this] { return anyRunning(); }, killWait());
      }
      failures = collectFailures();
    }
    if (failures.empty()) {
      // A stderr line said a collective failed, and no worker failed even when stopped.
      log_->error("{}; yet no worker failed; ending the job", collective_line_);
      setState("stopping");
      stopWorkers(SIGTERM);
      endAttempt();
      emitRoundEnd(rendezvous_->endRound(rendezvous::RoundEnd::finalFailure(node)), true);
      return finishJob(kExitWorkersFailed);
    }
    const rendezvous::RoundEnd mine = policy_.endForFailure(node, rdzv->restart_count);
    const std::string standing = rendezvous_->endRound(mine);
    emitRoundEnd(standing, standing == mine.format());
    setState("stopping");
    stopWorkers(SIGTERM);
    endAttempt();
    if (stop_signal_ != 0) return 128 + stop_signal_;
    const RestartPolicy::Decision decision = policy_.afterFailure(mine, standing);
    if (decision.action == RestartPolicy::Action::kReform) {
      log_->warn("re-forming the job ({}); rank {} failed meanwhile", standing, failures.front().rank);
      continue;
    }
    if (decision.action == RestartPolicy::Action::kRestart) {
      log_->warn("restarting the worker group after rank {} failed (restart {} of {})", failures.front().rank,
                 rdzv->restart_count + 1, config_.max_restarts);
      if (decision.sit_out.count() > 0) {
        if (auto code = sitOut(decision.sit_out)) return *code;
      }
      continue;
    }
    addStderrTails(failures);
    console().write(ConsoleStream::kStderr, formatFailureReport(config_.entry_name, failures));
    return finishJob(kExitWorkersFailed);
  }
}

}  // namespace ddprun::agent
