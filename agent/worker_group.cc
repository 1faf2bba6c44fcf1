#include "agent/worker_group.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>
#include <utility>

#include <fmt/format.h>

#include "agent/hang/python/python_hook.h"
#include "agent/hang/python/python_stacks.h"
#include "agent/ops/error_file.h"
#include "agent/placement/numa_binding.h"
#include "agent/process/orphan_guard.h"
#include "agent/secret_file.h"
#include "agent/spare_worker.h"
#include "common/console_writer.h"
#include "common/env_names.h"
#include "common/error.h"
#include "common/spare_assignment.h"
#include "common/text_escape.h"
#include "common/worker_file.h"

namespace ddprun::agent {
namespace {

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

WorkerGroup::WorkerGroup(const AgentConfig& config, AgentEnv& env, OrphanGuard* guard,
                         std::function<void(int, std::string_view)> on_stderr_line)
    : config_(config), env_(env), guard_(guard), on_stderr_line_(std::move(on_stderr_line)), log_(logger("agent")) {}

WorkerGroup::~WorkerGroup() = default;

void WorkerGroup::begin(int attempt, const rendezvous::RendezvousResult& rdzv) {
  // A warm spare of the last attempt stays: it has no rank, and its assignment (the environment
  // it lacks against a newcomer's of the attempt that hands it one) carries the new round.
  attempt_ = attempt;
  rdzv_ = rdzv;
  workers_.clear();
  forwarders_.clear();
  filtered_stdout_.reset();
  filtered_stderr_.reset();
  const LogLayout& layout = *setup_.layout;
  if (!config_.duplicate_stdout_filters.empty()) {
    filtered_stdout_ = std::make_shared<FilteredLog>(LogLayout::filteredStdoutFile(layout.attemptDir(attempt)),
                                                     config_.duplicate_stdout_filters);
  }
  if (!config_.duplicate_stderr_filters.empty()) {
    filtered_stderr_ = std::make_shared<FilteredLog>(LogLayout::filteredStderrFile(layout.attemptDir(attempt)),
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
}

void WorkerGroup::startOne(size_t i, const std::string& cgroup) { start(i, cgroup, false); }

Worker WorkerGroup::replaceOne(size_t i, const std::string& cgroup, int generation) {
  Worker failed = std::move(workers_.at(i));
  workers_[i] = Worker{};
  workers_[i].place = failed.place;
  workers_[i].generation = generation;
  if (!failed.error_file.empty()) ::unlink(failed.error_file.c_str());
  try {
    start(i, cgroup, true);
  } catch (...) {
    workers_[i] = std::move(failed);  // it stays the attempt's failure
    throw;
  }
  return failed;
}

// Where a worker's stdout or stderr goes, as --redirects, --tee and --local_ranks_filter say.
struct WorkerGroup::StreamPlan {
  bool to_file;
  bool to_console;
  bool prefixed;
  std::string file;
  ConsoleStream console;
};

std::pair<WorkerGroup::StreamPlan, WorkerGroup::StreamPlan> WorkerGroup::streamPlans(const Worker& worker) const {
  const int local_rank = worker.place.local_rank;
  const Std redirected = config_.redirects.forLocalRank(local_rank);
  const Std teed = config_.tee.forLocalRank(local_rank);
  const bool filtered_out = config_.local_ranks_filter && !config_.local_ranks_filter->count(local_rank);
  auto plan = [&](bool redirect, bool tee, std::string file, ConsoleStream console) {
    StreamPlan p{redirect || tee, (!redirect || tee) && !filtered_out, tee || config_.local_ranks_filter.has_value(),
                 std::move(file), console};
    return p;
  };
  return {
      plan(includesStdout(redirected), includesStdout(teed), LogLayout::stdoutFile(worker.dir), ConsoleStream::kStdout),
      plan(includesStderr(redirected), includesStderr(teed), LogLayout::stderrFile(worker.dir),
           ConsoleStream::kStderr)};
}

SpawnRequest WorkerGroup::request(Worker& worker) {
  const int attempt = attempt_;
  const rendezvous::RendezvousResult& rdzv = rdzv_;
  const LogLayout& layout = *setup_.layout;
  const int local_rank = worker.place.local_rank;
  const std::string dir = layout.workerDir(attempt, local_rank);
  worker.error_file = LogLayout::errorFile(dir);

  SpawnRequest request;
  request.argv = config_.entrypoint;
  request.env = workerEnvironment(setup_.base_env, config_, rdzv, worker.place, worker.error_file, worker.generation);
  worker.dir = dir;
  if (config_.python_workers && !setup_.python_hook_dir.empty()) {
    addPythonHook(request.env, setup_.python_hook_dir, dir);
    worker.python_hook = true;
  }
  if (config_.python_workers && config_.torch_flight_recorder) {
    addTorchFlightRecorder(request.env, layout.attemptDir(attempt) + "/torch_trace_rank_");
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
    const std::string secret_file = LogLayout::secretFile(dir);
    writeSecretFile(secret_file, rdzv.rpc_secret);
    // Removed at the end even where the run directory stays; if ddprun is killed first, the
    // guard removes it.
    if (guard_) guard_->watchDirectory(secret_file);
    request.env[env::kRpcSecretFile] = secret_file;
  }

  const auto [out, err] = streamPlans(worker);
  // A log file is written by the agent, never by the worker itself: a full --log_dir must
  // not fail the worker's writes (and so change its exit code).
  auto target = [](const StreamPlan& p) {
    if (p.to_file || (p.to_console && p.prefixed)) return StdioTarget{StdioTarget::Kind::kPipe, {}};
    if (p.to_console) return StdioTarget{StdioTarget::Kind::kInherit, {}};
    return StdioTarget{StdioTarget::Kind::kFile, "/dev/null"};
  };
  request.out = target(out);
  request.err = target(err);
  if (!config_.cpu_bindings.empty()) request.cpus = config_.cpu_bindings.at(static_cast<size_t>(local_rank)).cpus;
  return request;
}

void WorkerGroup::start(size_t i, const std::string& cgroup, bool append) {
  Worker& worker = workers_.at(i);
  SpawnRequest spawn_request = request(worker);
  spawn_request.cgroup = cgroup;
  SpawnedProcess spawned = env_.spawn(spawn_request);
  worker.pid = spawned.pid;
  worker.running = true;
  if (guard_) guard_->watch(spawned.pid);
  if (config_.numa_binding) {
    const CpuBinding& binding = config_.cpu_bindings.at(static_cast<size_t>(worker.place.local_rank));
    log_->info("worker rank {} (local rank {}, pid {}) bound to CPUs {} (--numa-binding={}, NUMA node {})",
               worker.place.rank, worker.place.local_rank, spawned.pid, formatCpuList(binding.cpus),
               numaModeName(*config_.numa_binding), binding.numa_node);
  } else {
    log_->debug("worker rank {} started (pid {})", worker.place.rank, spawned.pid);
  }
  forwardOutput(worker, spawned.stdout_pipe, spawned.stderr_pipe, append);
}

void WorkerGroup::forwardOutput(Worker& worker, int stdout_pipe, int stderr_pipe, bool append) {
  const int local_rank = worker.place.local_rank;
  const Std teed = config_.tee.forLocalRank(local_rank);
  const bool filtered_out = config_.local_ranks_filter && !config_.local_ranks_filter->count(local_rank);
  const std::string prefix = expandPrefix(setup_.prefix_template, config_.role, worker.place.rank, local_rank);
  const auto [out, err] = streamPlans(worker);
  auto forward = [&](int pipe_fd, const StreamPlan& p, std::shared_ptr<StreamRecord> record,
                     std::shared_ptr<FilteredLog> filtered, std::function<void(std::string_view)> on_line = {}) {
    if (pipe_fd < 0) return;
    ForwardOptions options;
    if (p.to_file) {
      options.file = p.file;
      // An earlier attempt's worker could have left a FIFO or a link where this log goes.
      std::string reason;
      options.file_fd = createWorkerFile(p.file, append ? O_APPEND : O_TRUNC, 0644, &reason);
      if (!options.file_fd) {
        log_->warn("cannot open worker log {}: {}; this stream is not saved there", p.file, reason);
        if (record) record->file_error = reason;
      }
    }
    if (p.to_console) options.console = p.console;
    if (p.prefixed) options.prefix = prefix;
    options.record = std::move(record);
    options.filtered = std::move(filtered);
    options.on_line = std::move(on_line);
    auto forwarder = std::make_unique<LineForwarder>(env_.io(), pipe_fd, std::move(options));
    forwarder->start();
    forwarders_.push_back(std::move(forwarder));
  };
  // As torchrun's: the ranks teed to the console (--tee, --local_ranks_filter) are filtered.
  auto filteredIf = [&](bool teed_here, const std::shared_ptr<FilteredLog>& log) {
    return teed_here && !filtered_out ? log : nullptr;
  };
  forward(stdout_pipe, out, nullptr, filteredIf(includesStdout(teed), filtered_stdout_));
  if (stderr_pipe >= 0) worker.stderr_record = std::make_shared<StreamRecord>();
  const int rank = worker.place.rank;
  forward(stderr_pipe, err, worker.stderr_record, filteredIf(includesStderr(teed), filtered_stderr_),
          [this, rank](std::string_view line) { on_stderr_line_(rank, line); });
}

bool WorkerGroup::startSpare() {
  if (spare_ || workers_.empty()) return false;
  // Its environment is a local worker's less the rank: worker 0's, on a copy of it.
  Worker model = workers_.front();
  SpawnRequest spawn_request = request(model);
  UniqueFd pipe_ends[2];
  makeAssignmentPipe(pipe_ends);
  spawn_request.env = spareEnvironment(std::move(spawn_request.env), setup_.base_env, pipe_ends[0].get());
  spawn_request.inherit_fd = pipe_ends[0].get();
  // Its output waits in the pipes until it knows whose it is (it says nothing before).
  spawn_request.out = StdioTarget{StdioTarget::Kind::kPipe, {}};
  spawn_request.err = StdioTarget{StdioTarget::Kind::kPipe, {}};
  spawn_request.cpus.clear();
  const SpawnedProcess spawned = env_.spawn(spawn_request);
  auto spare = std::make_unique<SpareProcess>();
  spare->pid = spawned.pid;
  spare->assignment = std::move(pipe_ends[1]);
  spare->stdout_pipe.reset(spawned.stdout_pipe);
  spare->stderr_pipe.reset(spawned.stderr_pipe);
  spare->env = std::move(spawn_request.env);
  spare_ = std::move(spare);
  if (guard_) guard_->watch(spawned.pid);
  return true;
}

pid_t WorkerGroup::sparePid() const { return spare_ && !spare_->retiring ? spare_->pid : -1; }

Worker WorkerGroup::adoptSpare(size_t i, const std::string& cgroup, int generation) {
  if (!spare_ || spare_->retiring) throw DdprunError("no spare worker to hand rank over to");
  Worker next;
  next.place = workers_.at(i).place;
  next.generation = generation;
  const SpawnRequest wanted = request(next);
  try {
    sendAssignment(spare_->assignment.get(), recovery::encodeSpareAssignment(spare_->env, wanted.env));
  } catch (const DdprunError&) {
    retireSpare();  // a spare that cannot take its assignment is no use
    throw;
  }
  spare_->assignment.reset();  // the whole assignment is in the pipe; EOF follows it
  if (!cgroup.empty()) {
    try {
      moveIntoCgroup(cgroup, spare_->pid);
    } catch (const SystemError& e) {
      log_->warn("the spare worker (pid {}) stays outside cgroup {}: {}; it is contained by its process group only",
                 spare_->pid, cgroup, e.what());
    }
  }
  Worker failed = std::move(workers_[i]);
  if (!failed.error_file.empty()) ::unlink(failed.error_file.c_str());
  workers_[i] = std::move(next);
  Worker& adopted = workers_[i];
  adopted.pid = spare_->pid;
  adopted.running = true;
  spare_deaths_ = 0;
  std::unique_ptr<SpareProcess> spare = std::move(spare_);
  forwardOutput(adopted, spare->stdout_pipe.release(), spare->stderr_pipe.release(), true);
  return failed;
}

void WorkerGroup::retireSpare() {
  if (!spare_) return;
  spare_->retiring = true;
  spare_->assignment.reset();  // a spare that reads EOF exits by itself
  env_.signalGroup(spare_->pid, SIGKILL);
  env_.signalProcess(spare_->pid, SIGKILL);
  runWhile(
      env_, [this] { return spare_ != nullptr; }, killWait());
  if (spare_) {
    log_->error("the spare worker (pid {}) still runs {} ms after SIGKILL, state {}; going on without it", spare_->pid,
                std::chrono::duration_cast<std::chrono::milliseconds>(killWait()).count(),
                env_.processState(spare_->pid));
    spare_.reset();  // the guard still has it
  }
}

// SIGCHLD may stand for several exits, and (as a subreaper) for orphaned grandchildren
// too: reap everything that has exited so no zombie is left.
std::vector<const Worker*> WorkerGroup::reap() {
  std::vector<const Worker*> ended;
  while (const std::optional<ReapedChild> child = env_.reap()) {
    const pid_t pid = child->pid;
    const int status = child->status;
    if (spare_ && spare_->pid == pid) {
      spareEnded(status);
      continue;
    }
    for (Worker& w : workers_) {
      if (w.pid != pid || !w.running) continue;
      w.running = false;
      w.exit_time = std::chrono::system_clock::now();
      if (WIFSIGNALED(status)) {
        w.signal = WTERMSIG(status);
      } else {
        w.exit_code = WEXITSTATUS(status);
      }
      ended.push_back(&w);
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
  return ended;
}

void WorkerGroup::spareEnded(int status) {
  if (!spare_->retiring) {
    ++spare_deaths_;
    const std::string how = WIFSIGNALED(status) ? "was killed by " + signalName(WTERMSIG(status))
                                                : "exited with code " + std::to_string(WEXITSTATUS(status));
    log_->warn("the spare worker (pid {}) {} while it waited for a rank; the workers run on", spare_->pid, how);
  }
  if (guard_) guard_->forget(spare_->pid);
  spare_.reset();
}

bool WorkerGroup::anyRunning() const {
  return std::any_of(workers_.begin(), workers_.end(), [](const Worker& w) { return w.running; });
}

bool WorkerGroup::signalWorker(Worker& w, int signal) {
  const int to_group = env_.signalGroup(w.pid, signal);
  const int to_worker = env_.signalProcess(w.pid, signal);
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

void WorkerGroup::signalRunning(int signal) {
  for (Worker& w : workers_) {
    if (w.running) signalWorker(w, signal);
  }
}

Clock::Duration WorkerGroup::killWait() const { return std::max<Clock::Duration>(config_.term_timeout, kMinKillWait); }

std::vector<UnkillableWorker> WorkerGroup::stop(int signal) {
  std::vector<UnkillableWorker> unkillable;
  stopping_ = true;
  for (Worker& w : workers_) {
    if (w.running) w.stopped_by_agent = true;
  }
  signalRunning(signal);
  auto running = [this] { return anyRunning(); };
  runWhile(env_, running, config_.term_timeout);
  if (anyRunning()) {
    // Each with its state: a stopped (T) or uninterruptibly sleeping (D) worker is why.
    std::string states;
    for (const Worker& w : workers_) {
      if (!w.running) continue;
      states += fmt::format("{}rank {} (pid {}) state {}", states.empty() ? "" : ", ", w.place.rank, w.pid,
                            env_.processState(w.pid));
    }
    log_->warn("workers still running {} ms after {}; sending SIGKILL: {}", config_.term_timeout.count(),
               signalName(signal), states);
    std::set<pid_t> killed;  // the workers SIGKILL reached
    for (Worker& w : workers_) {
      if (w.running && signalWorker(w, SIGKILL)) killed.insert(w.pid);
    }
    // A worker in uninterruptible sleep (D) dies only when its kernel call returns, which may
    // be never (a dead NFS server, a wedged driver): it must not hold up ddprun.
    runWhile(env_, running, killWait());
    for (Worker& w : workers_) {
      if (!w.running) continue;
      const std::string state = env_.processState(w.pid);
      const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(killWait()).count();
      if (killed.count(w.pid)) {
        log_->error("worker rank {} (pid {}) still running {} ms after SIGKILL, state {}; going on without it",
                    w.place.rank, w.pid, waited, state);
      } else {
        log_->error("worker rank {} (pid {}) could not be sent SIGKILL and still runs, state {}; going on without it",
                    w.place.rank, w.pid, state);
      }
      unkillable.push_back(UnkillableWorker{w.place.rank, w.pid, state, killed.count(w.pid) > 0});
      w.running = false;
      w.abandoned = true;
    }
  }
  stopping_ = false;
  return unkillable;
}

std::vector<WorkerFailure> WorkerGroup::collectFailures(const std::string& host,
                                                        const std::vector<int>& culprits) const {
  std::vector<WorkerFailure> failures;
  for (const Worker& w : workers_) {
    if (!w.failed()) continue;
    WorkerFailure f;
    f.rank = w.place.rank;
    f.local_rank = w.place.local_rank;
    f.host = host;
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
      const std::string frames = formatTraceback(mainThreadFrames(w.python_stack));
      f.python_stack = frames.empty() ? w.python_stack : frames;
      f.python_stack_file = w.python_stack_file;
    }
    failures.push_back(std::move(f));
  }
  sortRootCauseFirst(failures);
  putRanksFirst(failures, culprits);
  return failures;
}

// Called once the attempt's output is drained, so that the tails hold the last lines.
void WorkerGroup::addStderrTails(std::vector<WorkerFailure>& failures) const {
  for (WorkerFailure& f : failures) {
    for (const Worker& w : workers_) {
      if (w.pid != f.pid || !w.stderr_record) continue;
      f.stderr_tail = w.stderr_record->tail.text();
      f.stderr_file = w.stderr_record->file;
      f.stderr_file_error = w.stderr_record->file_error;
    }
  }
}

void WorkerGroup::drainOutput() {
  // Output still arriving after every worker's process group is gone comes from a
  // process that left its group (setsid); we stop waiting for it after this long.
  constexpr auto kDrainTimeout = std::chrono::seconds(1);
  auto pending = [this] {
    return std::any_of(forwarders_.begin(), forwarders_.end(), [](const auto& f) { return !f->finished(); });
  };
  runWhile(env_, pending, kDrainTimeout);
  for (auto& f : forwarders_) f->close();
  forwarders_.clear();
}

}  // namespace ddprun::agent
