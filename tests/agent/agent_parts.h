// One node's agent parts (agent/worker_group.h, agent/job_reporter.h, agent/hang_watch.h,
// agent/containment.h) over fake workers on a manual clock (manual_agent_env.h) and a
// scripted round (scripted_rendezvous.h), without the round loop: each test drives the part
// it tests as the loop (agent/elastic_agent.cc) does, and reads what a user would see: the
// workers' signals, the events file, the failures of the report. Nothing is spawned and
// nothing sleeps; the log directory goes with the parts.
#pragma once

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "agent/agent_config.h"
#include "agent/containment.h"
#include "agent/hang_watch.h"
#include "agent/hang_watch_ports.h"
#include "agent/job_reporter.h"
#include "agent/node_cooldown.h"
#include "agent/output/log_layout.h"
#include "agent/restart_policy.h"
#include "agent/round_hang_ports.h"
#include "agent/worker_group.h"
#include "tests/agent/manual_agent_env.h"
#include "tests/agent/scripted_rendezvous.h"
#include "tests/support/agent_log.h"

namespace ddprun::agent::testing {

class AgentParts {
 public:
  // `nproc` fake workers, each doing what `scripter` says. Set `config` before start().
  AgentParts(int nproc, ManualAgentEnv::Scripter scripter) : env(std::move(scripter)), rdzv(rounds, env, nproc) {
    static std::atomic<int> count{0};
    const std::string id = "agent-parts-" + std::to_string(::getpid()) + "-" + std::to_string(count++);
    dir_ = std::filesystem::temp_directory_path() / ("ddprun_" + id);
    std::filesystem::create_directories(dir_);
    config.entrypoint = {"/fake/worker"};
    config.entry_name = "worker";
    config.nproc_per_node = nproc;
    config.term_timeout = std::chrono::milliseconds(2000);
    config.cgroups = false;
    config.log_dir = (dir_ / "logs").string();
    config.events_file = (dir_ / "events.jsonl").string();
    config.rendezvous.run_id = id;
    // As the round loop: each exit is reaped and reported when SIGCHLD comes.
    env.onSignals({SIGCHLD}, [this](int) {
      for (const Worker* w : group.reap()) reporter.workerExited(*w);
    });
  }
  ~AgentParts() {
    hang.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  AgentParts(const AgentParts&) = delete;
  AgentParts& operator=(const AgentParts&) = delete;

  // Sets the parts up as the round loop's setUp() does (with the hang watch when `watch`),
  // forms round 1 and starts attempt 0's workers.
  void start(bool watch = false) {
    layout = std::make_unique<LogLayout>(config.log_dir, config.rendezvous.run_id, true);
    WorkerGroupSetup setup;
    setup.layout = layout.get();
    if (watch) {
      // As the round loop: over the worker group and, unless the test gives its own, the job reporter.
      hang_workers = std::make_unique<GroupHangWorkers>(group);
      if (!hang_reports) {
        reporter_reports = std::make_unique<ReporterHangReports>(reporter);
        hang_reports = reporter_reports.get();
      }
      hang = std::make_unique<HangWatch>(config, env, *hang_workers, *hang_reports, nullptr);
      if (hang_board) {
        hang->setUp(*hang_board, "node-a", setup.base_env);
      } else {
        hang->setUp(rdzv, setup.base_env);
      }
      base_env = setup.base_env;
    }
    group.setUp(std::move(setup));
    if (hang) hang->setLayout(*layout);
    reporter.open(rdzv, {*config.events_file});
    round = rdzv.nextRound();
    reporter.setRound(round);
    if (hang) hang->attemptStarting();
    group.begin(0, round);
    for (size_t i = 0; i < group.workers().size(); ++i) {
      group.startOne(i, "");
      reporter.workerStarted(group.workers()[i], round);
    }
    if (hang) hang->workersStarted();
  }

  // Runs the loop until `done()` or `limit` of manual time has passed.
  template <typename Done>
  void runUntil(Done done, Clock::Duration limit = std::chrono::hours(1)) {
    const auto until = env.clock().now() + limit;
    while (!done() && env.clock().now() < until) env.runFor(until - env.clock().now());
  }
  // Ticks the hang watch as the round loop does while the workers run, until `done()` or
  // `limit` of manual time has passed.
  template <typename Done>
  void watchUntil(Done done, Clock::Duration limit) {
    const auto until = env.clock().now() + limit;
    while (!done() && env.clock().now() < until) {
      const HangWatch::Wake wake = hang->wake(until);
      env.runFor(std::max<Clock::Duration>(wake.at - env.clock().now(), Clock::Duration::zero()));
      hang->tick(wake);
    }
  }

  // The lines of the events file for `event`.
  std::vector<std::string> events(const std::string& event) const {
    std::vector<std::string> found;
    std::ifstream in(*config.events_file);
    for (std::string line; std::getline(in, line);) {
      if (line.find("\"event\":\"" + event + "\"") != std::string::npos) found.push_back(line);
    }
    return found;
  }
  const std::filesystem::path& dir() const { return dir_; }

 private:
  std::filesystem::path dir_;

 public:
  AgentConfig config;
  ManualAgentEnv env;
  RoundScript rounds;
  ScriptedRendezvous rdzv;
  RestartPolicy policy{0, NodeCooldown(std::chrono::seconds(0), std::chrono::seconds(0)), env.clock()};
  // The hang watch's round and findings (agent/hang_watch_ports.h), and the other nodes' hang
  // summaries (a job board of the test's own: this node is "node-a" on it), when a test gives
  // its own (set before start()); none: the job reporter and the scripted round.
  HangReports* hang_reports = nullptr;
  rendezvous::Board* hang_board = nullptr;
  std::unique_ptr<GroupHangWorkers> hang_workers;         // over `group`
  std::unique_ptr<ReporterHangReports> reporter_reports;  // over `reporter`, unless the test gave hang_reports
  std::unique_ptr<HangWatch> hang;                        // made by start(true)
  WorkerGroup group{config, env, nullptr, [this](int rank, std::string_view line) {
                      if (hang) hang->onStderrLine(rank, line);
                    }};
  JobReporter reporter{config, group, policy};
  std::unique_ptr<LogLayout> layout;
  std::map<std::string, std::string> base_env;  // the workers' environment as the hang watch named it
  rendezvous::RendezvousResult round;
};

// The "agent" logger's lines, at debug level (tests/support/agent_log.h).
using ddprun::testing::AgentLog;

inline bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// A worker that ends by itself after `after` with `code`.
inline ManualAgentEnv::Script exits(std::chrono::milliseconds after, int code) {
  ManualAgentEnv::Script s;
  s.exit_after = after;
  s.exit_code = code;
  return s;
}

}  // namespace ddprun::agent::testing
