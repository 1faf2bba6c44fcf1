// torch's file timers as the agent serves them (agent/worker_timers.h), alone over fake
// workers on the manual clock (agent_parts.h) and a real named pipe read on the AgentEnv's
// event loop: what an expired timer of a worker becomes (an event, a line, the worker ended
// as hung with the signal its timer asked for) and what a timer asking for no signal does
// not. The server's own rules (bounds, refused pids, hostile lines) are
// tests/agent/hang/timers/'s; the real workers' timers are tests/e2e/file_timer_test.cc's.
#include "agent/worker_timers.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <catch2/catch.hpp>

#include "common/env_names.h"
#include "common/unique_fd.h"
#include "tests/agent/agent_parts.h"

namespace ddprun::agent::testing {
namespace {

// A timer request as torch's FileTimerClient writes it, expired a second ago (the requests'
// times are the wall clock's, whatever clock the agent runs on).
std::string expiredRequest(pid_t pid, const std::string& scope_json, int signal) {
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  return fmt::format(
      "{{\"version\": 1, \"pid\": {}, \"scope_id\": \"{}\", \"expiration_time\": {:.3f}, \"signal\": {}}}\n", pid,
      scope_json, now - 1, signal);
}

// The parts' two workers, their timers on a pipe in the parts' directory, and the workers
// the timers said were hung: (rank, pid, signal, scope).
struct Timers {
  Timers()
      : parts(2, [](const SpawnRequest&) { return ManualAgentEnv::Script{}; }),
        workers(parts.group),
        reports(parts.reporter) {
    parts.start();
    timers = std::make_unique<WorkerTimers>(parts.env, workers, reports, nullptr,
                                            [this](Worker& w, pid_t pid, int signal, const std::string& scope) {
                                              hung.emplace_back(w.place.rank, pid, signal, scope);
                                            });
    base_env[env::kTimerFile] = (parts.dir() / "timers").string();
    timers->start(base_env);
  }

  // Writes `lines` on the pipe, then runs the agent's loop until `done()` (bounded).
  template <typename Done>
  void send(const std::string& lines, Done done) {
    UniqueFd writer(::open(base_env.at(env::kTimerFile).c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC));
    REQUIRE(writer);
    REQUIRE(::write(writer.get(), lines.data(), lines.size()) == static_cast<ssize_t>(lines.size()));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!done()) {
      parts.env.runFor(std::chrono::milliseconds(10));
      REQUIRE(std::chrono::steady_clock::now() < deadline);
    }
  }

  AgentParts parts;
  GroupHangWorkers workers;
  ReporterHangReports reports;
  std::map<std::string, std::string> base_env;
  std::unique_ptr<WorkerTimers> timers;
  std::vector<std::tuple<int, pid_t, int, std::string>> hung;
};

}  // namespace

TEST_CASE("worker timers: an expired timer of a worker is an event, a line, and the worker ended as hung", "[unit]") {
  AgentLog log;
  Timers t;
  const pid_t pid = t.parts.group.workers()[1].pid;

  // A scope with a terminal escape in it: the worker's text, shown escaped.
  t.send(expiredRequest(pid, "train_step\\u001b[2J", SIGTERM), [&] { return !t.hung.empty(); });

  REQUIRE(t.hung.size() == 1);
  CHECK(t.hung[0] == std::make_tuple(1, pid, SIGTERM, std::string("train_step\\x1b[2J")));
  const auto events = t.parts.events("timer_expired");
  REQUIRE(events.size() == 1);
  CHECK(has(events[0], "\"rank\":1,\"local_rank\":1,\"pid\":" + std::to_string(pid)));
  CHECK(has(events[0], "\"signal\":\"SIGTERM\",\"attempt\":0"));
  CHECK(log.count(fmt::format("worker rank 1 (pid {}): timer 'train_step\\x1b[2J' expired; taking its stacks, then "
                              "SIGTERM",
                              pid)) == 1);
  CHECK(log.text().find('\x1b') == std::string::npos);
  // The timers only say it: the hang watch stops the worker.
  CHECK_FALSE(t.parts.env.processes()[1].got(SIGTERM));
}

TEST_CASE("worker timers: a timer that asked for no signal is said, and its worker goes on", "[unit]") {
  AgentLog log;
  Timers t;
  const pid_t pid = t.parts.group.workers()[0].pid;

  t.send(expiredRequest(pid, "idle", 0), [&] { return !t.parts.events("timer_expired").empty(); });

  CHECK(t.hung.empty());
  CHECK(has(t.parts.events("timer_expired")[0], "\"scope\":\"idle\",\"signal\":\"none\""));
  CHECK(log.count(fmt::format("worker rank 0 (pid {}): timer 'idle' expired; it asked for no signal, so it goes on",
                              pid)) == 1);
}

TEST_CASE("worker timers: the pipe is the one named in the workers' environment, else a new one, named there",
          "[unit]") {
  Timers t;
  CHECK(t.base_env.at(env::kTimerFile) == (t.parts.dir() / "timers").string());

  AgentParts other(1, [](const SpawnRequest&) { return ManualAgentEnv::Script{}; });
  GroupHangWorkers workers(other.group);
  ReporterHangReports reports(other.reporter);
  WorkerTimers timers(other.env, workers, reports, nullptr, [](Worker&, pid_t, int, const std::string&) {});
  std::map<std::string, std::string> base_env;
  timers.start(base_env);
  REQUIRE(base_env.count(env::kTimerFile) == 1);
  CHECK(base_env.at(env::kTimerFile).find("watchdog_timer_") != std::string::npos);
  CHECK(std::filesystem::exists(base_env.at(env::kTimerFile)));

  std::map<std::string, std::string> bad = {{env::kTimerFile, "/nonexistent-dir/timers"}};
  WorkerTimers refused(other.env, workers, reports, nullptr, [](Worker&, pid_t, int, const std::string&) {});
  CHECK_THROWS_WITH(refused.start(bad), Catch::StartsWith("file timers (TORCHELASTIC_ENABLE_FILE_TIMER=1): "));
}

}  // namespace ddprun::agent::testing
