#include "tests/agent/manual_agent_env.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <fstream>
#include <stdexcept>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>

#include "common/env_names.h"
#include "common/error.h"

namespace ddprun::agent::testing {
namespace {

// A test whose loop never ends would otherwise move the manual clock on for ever.
constexpr auto kManualTimeLimit = std::chrono::hours(24);
// The real time a post from another thread may take (a bound, not a wait the test relies on).
constexpr auto kPostLimit = std::chrono::seconds(30);

int envInt(const SpawnRequest& request, const char* name) {
  const std::string& text = request.env.at(name);
  int value = -1;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) throw std::runtime_error(std::string("bad ") + name);
  return value;
}

}  // namespace

int ManualAgentEnv::Process::rank() const { return envInt(request, env::kRank); }
int ManualAgentEnv::Process::restartCount() const { return envInt(request, env::kRestartCount); }
bool ManualAgentEnv::Process::got(int signal) const {
  return std::find(signals.begin(), signals.end(), signal) != signals.end();
}

std::string ManualAgentEnv::Process::readInherited(bool* eof) const {
  std::string bytes;
  *eof = false;
  if (!inherited) return bytes;
  char buffer[4096];
  for (;;) {
    pollfd ready{inherited->get(), POLLIN, 0};
    if (::poll(&ready, 1, 0) <= 0) return bytes;  // nothing more now
    const ssize_t n = ::read(inherited->get(), buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      *eof = n == 0;
      return bytes;
    }
    bytes.append(buffer, static_cast<size_t>(n));
  }
}

ManualAgentEnv::ManualAgentEnv(Scripter scripter) : scripter_(std::move(scripter)), started_(clock_.now()) {}
ManualAgentEnv::~ManualAgentEnv() = default;

void ManualAgentEnv::runFor(Clock::Duration limit) {
  if (poll() > 0) return;
  if (expected_posts_ > 0) {
    io_.restart();
    // Nothing else keeps the loop busy while it waits: without the guard it would not wait.
    auto busy = boost::asio::make_work_guard(io_);
    if (io_.run_one_for(kPostLimit) == 0) throw std::runtime_error("another thread's post never came");
    --expected_posts_;
    return;
  }
  // Nothing to run: time moves on to what is due next, at most to the wait's end.
  auto next = clock_.now() + std::max<Clock::Duration>(limit, Clock::Duration::zero());
  if (!actions_.empty()) next = std::min(next, actions_.begin()->first);
  for (const Process& p : processes_) {
    if (!p.exited && p.exit_at) next = std::min(next, *p.exit_at);
  }
  if (next > clock_.now()) clock_.advance(next - clock_.now());
  if (clock_.now() - started_ > kManualTimeLimit) throw std::runtime_error("the agent ran past a day of manual time");
  fireDue();
  poll();
}

// Runs the handlers ready now. One that this env did not post came from another thread (the
// rendezvous' nextRound): the post expected, when one is.
size_t ManualAgentEnv::poll() {
  io_.restart();
  const size_t own_before = own_handlers_run_;
  const size_t ran = io_.poll();
  const size_t foreign = ran - (own_handlers_run_ - own_before);
  if (foreign > 0 && expected_posts_ > 0) --expected_posts_;
  return ran;
}

bool ManualAgentEnv::fireDue() {
  bool fired = false;
  while (!actions_.empty() && actions_.begin()->first <= clock_.now()) {
    auto action = std::move(actions_.begin()->second);
    actions_.erase(actions_.begin());
    action();
    fired = true;
  }
  for (Process& p : processes_) {
    if (!p.exited && p.exit_at && *p.exit_at <= clock_.now()) {
      exit(p, p.script.exit_code << 8);
      fired = true;
    }
  }
  return fired;
}

void ManualAgentEnv::onSignals(const std::vector<int>& signals, std::function<void(int)> handler) {
  handlers_.emplace_back(signals, std::move(handler));
}

void ManualAgentEnv::sendToAgent(int signal) {
  for (const auto& [signals, handler] : handlers_) {
    if (std::find(signals.begin(), signals.end(), signal) == signals.end()) continue;
    boost::asio::post(io_, [this, h = handler, signal] {
      ++own_handlers_run_;
      h(signal);
    });
  }
}

void ManualAgentEnv::at(Clock::TimePoint at, std::function<void()> action) { actions_.emplace(at, std::move(action)); }

SpawnedProcess ManualAgentEnv::spawn(const SpawnRequest& request) {
  Script script = scripter_(request);
  if (script.spawn_fails) throw SystemError("cannot start " + request.argv.at(0), ENOENT);
  if (!script.error_file.empty()) std::ofstream(request.env.at(env::kErrorFile)) << script.error_file;
  Process p;
  p.pid = next_pid_++;
  p.request = request;
  p.script = script;
  if (script.exit_after) p.exit_at = clock_.now() + *script.exit_after;
  if (request.inherit_fd >= 0) {
    // The agent closes its copy of the spare's end once it started the spare.
    p.inherited = std::make_shared<UniqueFd>(::fcntl(request.inherit_fd, F_DUPFD_CLOEXEC, 3));
  }
  processes_.push_back(std::move(p));
  return SpawnedProcess{processes_.back().pid, -1, -1, false};
}

ManualAgentEnv::Process* ManualAgentEnv::find(pid_t pid) {
  for (Process& p : processes_) {
    if (p.pid == pid) return &p;
  }
  return nullptr;
}

void ManualAgentEnv::exit(Process& p, int status) {
  p.exited = true;
  p.status = status;
  exits_.push_back(ReapedChild{p.pid, status});
  sendToAgent(SIGCHLD);
}

int ManualAgentEnv::signalProcess(pid_t pid, int signal) {
  if (pid <= 1) return EINVAL;
  Process* p = find(pid);
  if (p == nullptr || p->reaped) return ESRCH;
  if (signal == 0) return 0;
  p->signals.push_back(signal);
  if (p->exited || p->script.unkillable) return 0;  // a zombie, or a process in D state
  switch (signal) {
    case SIGKILL: exit(*p, SIGKILL); break;
    case SIGTERM:
    case SIGINT:
    case SIGHUP:
    case SIGQUIT:
    case SIGABRT:
      if (!p->script.ignores_term) exit(*p, signal);
      break;
    default: break;  // handled by the worker (SIGUSR1), or stopping it (SIGSTOP)
  }
  return 0;
}

// A fake worker is alone in its process group.
int ManualAgentEnv::signalGroup(pid_t pgid, int signal) { return signalProcess(pgid, signal); }

std::optional<ReapedChild> ManualAgentEnv::reap() {
  if (exits_.empty()) return std::nullopt;
  const ReapedChild child = exits_.front();
  exits_.pop_front();
  if (Process* p = find(child.pid)) p->reaped = true;
  return child;
}

std::string ManualAgentEnv::processState(pid_t pid) {
  Process* p = find(pid);
  if (p == nullptr || p->exited) return "gone";
  return p->script.unkillable ? "D (disk sleep)" : "S (sleeping)";
}

std::unique_ptr<rendezvous::Store> ManualAgentEnv::connectStore(const std::string& host, int port,
                                                                std::chrono::milliseconds timeout) {
  if (!workers_store) {
    if (unreachable_store_waits) clock_.advance(timeout);
    throw rendezvous::StoreError("no store at " + host + ":" + std::to_string(port));
  }
  return workers_store->connect(timeout);
}

std::vector<HungStop> ManualAgentEnv::stopHung(const std::vector<HungWorker>& workers, int signal,
                                               const std::string& reason, std::chrono::milliseconds) {
  hung_stops_.push_back(HungStopRequest{workers, signal, reason});
  std::vector<HungStop> stops(workers.size());
  for (size_t i = 0; i < workers.size(); ++i) {
    stops[i].stacks.text = "(the fake stacks of rank " + std::to_string(workers[i].rank) + ")";
    if (signal > 0) signalProcess(workers[i].pid, signal);
  }
  return stops;
}

}  // namespace ddprun::agent::testing
