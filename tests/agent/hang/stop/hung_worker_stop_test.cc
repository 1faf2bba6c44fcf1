// Stopping hung workers (agent/hang/stop/hung_worker_stop.h) on fake workers and the manual
// clock (tests/agent/manual_agent_env.h), through a StopSystem (stop_system.h) that takes
// stacks as the fake "(stacks of pid N)" and notes everything done, in order, with the time:
// what a user sees of a stop is the stacks first (in the report and each worker's
// stacks.txt), then the signals, in their order and no sooner than their bounds. Nothing is
// spawned and nothing sleeps; eu-stack and gdb themselves are stack_capture_process_test.cc's.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "agent/hang/stop/hung_worker_stop.h"
#include "agent/hang/stop/stop_system.h"
#include "tests/agent/manual_agent_env.h"

namespace ddprun::agent::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// Fake processes of a ManualAgentEnv as the stop sees them.
class ManualStopSystem final : public StopSystem {
 public:
  explicit ManualStopSystem(ManualAgentEnv& env) : env_(env) {}

  std::optional<ProcStat> procStat(pid_t pid) override {
    for (const auto& p : env_.processes()) {
      if (p.pid != pid || p.reaped) continue;
      ProcStat stat;
      stat.pid = stat.pgid = pid;
      stat.ppid = ::getpid();
      stat.state = p.exited ? 'Z' : 'S';
      stat.start_time = start_times_.count(pid) ? start_times_[pid] : 1;
      return stat;
    }
    return std::nullopt;
  }
  std::vector<ProcessStacks> captureStacks(const std::vector<pid_t>& pids, milliseconds timeout) override {
    std::string line = "stacks";
    for (pid_t pid : pids) line += " " + std::to_string(pid);
    note(line);
    capture_timeouts.push_back(timeout);
    std::vector<ProcessStacks> stacks;
    for (pid_t pid : pids) {
      ProcessStacks s;
      s.pid = pid;
      s.tool = "eu-stack";
      s.text = "(stacks of pid " + std::to_string(pid) + ")\n";
      stacks.push_back(s);
    }
    return stacks;
  }
  int signal(pid_t pid, int signal) override {
    note(std::to_string(pid) + " " + sigabbrev_np(signal));
    return env_.signalProcess(pid, signal);
  }
  void suppressCoreDump(pid_t pid) override { note(std::to_string(pid) + " no core"); }
  void after(milliseconds delay, std::function<void()> action) override {
    env_.at(env_.clock().now() + delay, [this, generation = generation_, action = std::move(action)] {
      if (generation == generation_) action();
    });
  }
  void cancelTimers() override { ++generation_; }

  // `pid` is now another process (the one stopped ended and its pid was given again).
  void reuse(pid_t pid) { start_times_[pid] = 2; }
  // Everything done, "<ms since the test began> <what>".
  std::vector<std::string> done;
  std::vector<milliseconds> capture_timeouts;

 private:
  void note(const std::string& what) {
    const auto t = std::chrono::duration_cast<milliseconds>(env_.clock().now() - env_.started()).count();
    done.push_back(std::to_string(t) + " " + what);
  }
  ManualAgentEnv& env_;
  std::map<pid_t, uint64_t> start_times_;
  int generation_ = 0;
};

// The fake workers' scripts, by spawn order.
struct Stop {
  explicit Stop(std::vector<ManualAgentEnv::Script> scripts)
      : env([scripts, n = 0](const SpawnRequest&) mutable { return scripts.at(n++); }), system(env) {
    static std::atomic<int> count{0};
    dir = std::filesystem::temp_directory_path() /
          ("ddprun_hung_stop_" + std::to_string(::getpid()) + "_" + std::to_string(count++));
    std::filesystem::create_directories(dir);
    for (size_t i = 0; i < scripts.size(); ++i) {
      SpawnRequest request;
      request.argv = {"/fake/worker"};
      pids.push_back(env.spawn(request).pid);
    }
  }
  ~Stop() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  // Worker `i` as the hang watch names it: rank i, its own directory.
  HungWorker worker(size_t i, bool python_faulthandler = false) {
    const auto worker_dir = dir / ("rank" + std::to_string(i));
    std::filesystem::create_directories(worker_dir);
    return HungWorker{pids[i], static_cast<int>(i), static_cast<int>(i), worker_dir.string(), python_faulthandler};
  }
  // Runs the fake world (its timers, the workers' exits) for `d` of manual time.
  void runFor(Clock::Duration d) {
    const auto until = env.clock().now() + d;
    while (env.clock().now() < until) env.runFor(until - env.clock().now());
  }
  std::string line(pid_t pid, const std::string& what, int64_t ms) const {
    return std::to_string(ms) + " " + std::to_string(pid) + " " + what;
  }

  ManualAgentEnv env;
  ManualStopSystem system;
  std::filesystem::path dir;
  std::vector<pid_t> pids;
};

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

ManualAgentEnv::Script ignoring() {
  ManualAgentEnv::Script s;
  s.ignores_term = true;  // SIGTERM and SIGABRT do nothing: only SIGKILL ends it
  return s;
}

}  // namespace

TEST_CASE("hung worker stop: every worker's stacks are taken at once and written before any of them is signalled",
          "[unit]") {
  Stop t({ManualAgentEnv::Script{}, ManualAgentEnv::Script{}});
  HungWorkerStopper stopper(t.system, milliseconds(2500));

  const std::vector<HungStop> stops =
      stopper.stop({t.worker(0), t.worker(1)}, SIGKILL, "before stopping it: rank 1 is behind");

  // One capture of both, bounded by the stopper's capture timeout, then the signals: the
  // stop itself waits on nothing of the agent's clock.
  const std::vector<std::string> expected = {
      "0 stacks " + std::to_string(t.pids[0]) + " " + std::to_string(t.pids[1]),
      t.line(t.pids[0], "KILL", 0),
      t.line(t.pids[1], "KILL", 0),
  };
  CHECK(t.system.done == expected);
  CHECK(t.system.capture_timeouts == std::vector<milliseconds>{milliseconds(2500)});
  REQUIRE(stops.size() == 2);
  for (size_t i = 0; i < 2; ++i) {
    INFO("rank " << i);
    CHECK(stops[i].stacks.text == "(stacks of pid " + std::to_string(t.pids[i]) + ")\n");
    CHECK_FALSE(stops[i].aborted_first);
    REQUIRE(stops[i].stacks_file == (t.dir / ("rank" + std::to_string(i)) / "stacks.txt").string());
    const std::string file = readFile(stops[i].stacks_file);
    CHECK(file.find("# native stacks of rank " + std::to_string(i)) == 0);
    CHECK(file.find("before stopping it: rank 1 is behind") != std::string::npos);
    CHECK(file.find("# by eu-stack\n(stacks of pid " + std::to_string(t.pids[i]) + ")\n") != std::string::npos);
    CHECK(t.env.processes()[i].signals == std::vector<int>{SIGKILL});
  }
}

TEST_CASE("hung worker stop: a worker whose stacks.txt cannot be written is stopped all the same, the reason kept",
          "[unit]") {
  Stop t({ManualAgentEnv::Script{}});
  HungWorkerStopper stopper(t.system);
  HungWorker w = t.worker(0);
  w.worker_dir = (t.dir / "no" / "such" / "dir").string();

  const std::vector<HungStop> stops = stopper.stop({w}, SIGKILL, "timer 'step' expired");

  REQUIRE(stops.size() == 1);
  CHECK(stops[0].stacks_file.empty());
  CHECK(stops[0].stacks_file_error == "No such file or directory");
  CHECK(stops[0].stacks.text == "(stacks of pid " + std::to_string(t.pids[0]) + ")\n");  // still in the report
  CHECK(t.system.capture_timeouts == std::vector<milliseconds>{kStackCaptureTimeout});
  CHECK(t.env.processes()[0].signals == std::vector<int>{SIGKILL});
}

TEST_CASE(
    "hung worker stop: a Python worker gets SIGABRT for its tracebacks, without a core, and the stopping "
    "signal only after the grace if it is still there",
    "[unit]") {
  // Rank 0 dies of SIGABRT (faulthandler prints, then the default action); rank 1 survives it.
  Stop t({ManualAgentEnv::Script{}, ignoring()});
  HungWorkerStopper stopper(t.system, kStackCaptureTimeout, seconds(3));

  const std::vector<HungStop> stops =
      stopper.stop({t.worker(0, true), t.worker(1, true)}, SIGKILL, "before stopping it: --hang_timeout");
  REQUIRE(stops.size() == 2);
  CHECK(stops[0].aborted_first);
  CHECK(stops[1].aborted_first);

  t.runFor(milliseconds(2999));
  CHECK(t.env.processes()[1].signals == std::vector<int>{SIGABRT});  // not a moment before the grace
  t.runFor(seconds(10));

  const std::vector<std::string> expected = {
      "0 stacks " + std::to_string(t.pids[0]) + " " + std::to_string(t.pids[1]),
      t.line(t.pids[0], "no core", 0),
      t.line(t.pids[0], "ABRT", 0),
      t.line(t.pids[1], "no core", 0),
      t.line(t.pids[1], "ABRT", 0),
      t.line(t.pids[1], "KILL", 3000),  // the one still there, after the grace; rank 0 ended
  };
  CHECK(t.system.done == expected);
  CHECK(t.env.processes()[0].signals == std::vector<int>{SIGABRT});
  CHECK(t.env.processes()[1].signals == std::vector<int>{SIGABRT, SIGKILL});
}

TEST_CASE(
    "hung worker stop: a signal it may handle is followed by SIGKILL after kill_after, to the same process "
    "only",
    "[unit]") {
  // Rank 0 ends on SIGTERM; ranks 1 and 2 ignore it; rank 2's pid goes to another process
  // meanwhile, which must not be killed.
  Stop t({ManualAgentEnv::Script{}, ignoring(), ignoring()});
  HungWorkerStopper stopper(t.system);

  stopper.stop({t.worker(0), t.worker(1), t.worker(2)}, SIGTERM, "timer 'step' expired", seconds(2));
  t.system.reuse(t.pids[2]);
  t.runFor(milliseconds(1999));
  CHECK_FALSE(t.env.processes()[1].got(SIGKILL));  // not before kill_after
  t.runFor(seconds(10));

  const std::vector<std::string> expected = {
      "0 stacks " + std::to_string(t.pids[0]) + " " + std::to_string(t.pids[1]) + " " + std::to_string(t.pids[2]),
      t.line(t.pids[0], "TERM", 0),
      t.line(t.pids[1], "TERM", 0),
      t.line(t.pids[2], "TERM", 0),
      t.line(t.pids[1], "KILL", 2000),
  };
  CHECK(t.system.done == expected);
  CHECK(t.env.processes()[0].signals == std::vector<int>{SIGTERM});
  CHECK(t.env.processes()[1].signals == std::vector<int>{SIGTERM, SIGKILL});
  CHECK(t.env.processes()[2].signals == std::vector<int>{SIGTERM});
}

TEST_CASE("hung worker stop: once the attempt is over, the signals still due are not sent", "[unit]") {
  Stop t({ignoring(), ignoring()});
  HungWorkerStopper stopper(t.system, kStackCaptureTimeout, seconds(3));
  stopper.stop({t.worker(0, true)}, SIGKILL, "--hang_timeout");              // SIGKILL due after the grace
  stopper.stop({t.worker(1)}, SIGTERM, "timer 'step' expired", seconds(2));  // SIGKILL due after 2 s

  t.runFor(seconds(1));
  stopper.cancel();
  t.runFor(seconds(60));

  CHECK(t.env.processes()[0].signals == std::vector<int>{SIGABRT});
  CHECK(t.env.processes()[1].signals == std::vector<int>{SIGTERM});
}

}  // namespace ddprun::agent::testing
