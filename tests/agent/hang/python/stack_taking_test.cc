// The Python stacks taken before a kill (agent/hang/python/stack_taking.h) alone, over
// stand-in workers in directories of their own, a manual clock that the caller's loop moves,
// and a stand-in kill(2) that plays the hook's faulthandler: whom it signals, when it takes a
// file, how long it waits at most, and what it says. No worker has torch's server here (its
// asks: worker_server_test.cc). Nothing sleeps.
#include "agent/hang/python/stack_taking.h"

#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "tests/support/agent_log.h"
#include "tests/support/manual_clock.h"
#include "tests/support/test_process.h"

namespace ddprun::agent {
namespace {

using std::chrono::milliseconds;

// What takePythonStacks reads and writes of the agent's Worker.
struct FakeWorker {
  struct {
    int rank = 0;
  } place;
  pid_t pid = -1;
  std::string dir;
  bool running = true;
  bool python_hook = true;
  std::string python_stack;
  std::string python_stack_file;
};

const std::string kStacks =
    "Current thread 0x1 (most recent call first):\n  File \"/job/train.py\", line 12 in <module>\n";

void append(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::app) << text; }

// This test process as a worker whose hook registered (an empty py_stacks.<pid>), in `dir`.
FakeWorker hookedWorker(const testing::TempDir& dir) {
  FakeWorker w;
  w.pid = ::getpid();
  w.dir = dir.path();
  append(pythonStacksFile(dir.path(), w.pid), "");
  return w;
}

// The caller's side: the loop moves the clock (and runs `each_step`); kill(2) is recorded and
// answered by `on_signal`.
struct Loop {
  testing::ManualClock clock;
  std::vector<std::pair<pid_t, int>> signals;
  std::function<int(pid_t)> on_signal = [](pid_t) { return 0; };
  std::function<void()> each_step = [] {};
  StackTakingLoop loop{clock,
                       [this](Clock::Duration d) {
                         each_step();
                         clock.advance(d);
                       },
                       [this](pid_t pid, int signal) {
                         signals.emplace_back(pid, signal);
                         return on_signal(pid);
                       }};
};

}  // namespace

TEST_CASE("stack taking: a worker whose hook registered is signalled and its file taken once it holds still",
          "[unit]") {
  testing::AgentLog log;
  testing::TempDir dir;
  std::vector<FakeWorker> workers = {hookedWorker(dir)};
  Loop loop;
  // faulthandler writes every thread's traceback at once, from its signal handler.
  loop.on_signal = [&](pid_t pid) {
    append(pythonStacksFile(dir.path(), pid), kStacks);
    return 0;
  };
  const auto start = loop.clock.now();

  CHECK(takePythonStacks(workers, loop.loop).empty());

  CHECK(loop.signals == std::vector<std::pair<pid_t, int>>{{::getpid(), kPythonStacksSignal}});
  CHECK(workers[0].python_stack == kStacks);
  CHECK(workers[0].python_stack_file == pythonStacksFile(dir.path(), ::getpid()));
  // The first look sees it written, the next that it did not grow.
  CHECK(loop.clock.now() - start == 2 * kPythonStacksPoll);
  CHECK(log.lines() == std::vector<std::string>{"info: took the Python stacks of 1 of 1 worker(s) in 40 ms (0 from "
                                                "torch's worker server)"});
}

TEST_CASE("stack taking: a file still empty or still growing is waited for two seconds at most", "[unit]") {
  testing::AgentLog log;
  testing::TempDir dir;
  std::vector<FakeWorker> workers = {hookedWorker(dir)};
  Loop loop;
  const auto start = loop.clock.now();

  SECTION("empty: nothing taken") {
    takePythonStacks(workers, loop.loop);
    CHECK(workers[0].python_stack.empty());
    CHECK(workers[0].python_stack_file.empty());
    CHECK(log.count("took the Python stacks of 0 of 1 worker(s) in 2000 ms") == 1);
  }
  SECTION("growing: what it holds then") {
    loop.each_step = [&] { append(pythonStacksFile(dir.path(), ::getpid()), "x"); };
    takePythonStacks(workers, loop.loop);
    CHECK(workers[0].python_stack == std::string(100, 'x'));
    CHECK(log.count("took the Python stacks of 1 of 1 worker(s) in 2000 ms") == 1);
  }
  CHECK(loop.clock.now() - start == kPythonStacksWait);
}

TEST_CASE("stack taking: a worker that ends meanwhile is not waited for", "[unit]") {
  testing::AgentLog log;
  testing::TempDir dir;
  std::vector<FakeWorker> workers = {hookedWorker(dir)};
  Loop loop;
  loop.each_step = [&] { workers[0].running = false; };  // reaped while the loop ran
  const auto start = loop.clock.now();
  takePythonStacks(workers, loop.loop);
  CHECK(loop.clock.now() - start == kPythonStacksPoll);
  CHECK(workers[0].python_stack.empty());
  CHECK(log.count("took the Python stacks of 0 of 1 worker(s) in 20 ms") == 1);
}

TEST_CASE("stack taking: only a process of the worker that registered the hook is signalled", "[unit]") {
  testing::AgentLog log;
  testing::TempDir dir;
  FakeWorker w;
  w.pid = ::getpid();
  w.dir = dir.path();
  std::vector<FakeWorker> workers = {w};
  Loop loop;
  const auto start = loop.clock.now();

  SECTION("none registered: nobody is signalled, nothing waited for, nothing said") {
    takePythonStacks(workers, loop.loop);
    CHECK(loop.signals.empty());
    CHECK(loop.clock.now() == start);
    CHECK(log.text().empty());
  }
  SECTION("processes outside the worker registered: never signalled") {
    append(pythonStacksFile(dir.path(), 1), "");
    append(pythonStacksFile(dir.path(), ::getppid()), "");
    CHECK(hookedProcess(dir.path(), ::getpid()) == -1);
    takePythonStacks(workers, loop.loop);
    CHECK(loop.signals.empty());
    CHECK(loop.clock.now() == start);
  }
  SECTION("the worker itself registered too: it is the one signalled") {
    append(pythonStacksFile(dir.path(), ::getppid()), "");
    append(pythonStacksFile(dir.path(), ::getpid()), "");
    takePythonStacks(workers, loop.loop);
    CHECK(loop.signals == std::vector<std::pair<pid_t, int>>{{::getpid(), kPythonStacksSignal}});
  }
  SECTION("a worker that ended, has no hook or has its stacks already is not asked") {
    append(pythonStacksFile(dir.path(), ::getpid()), "");
    workers = {w, w, w};
    workers[0].running = false;
    workers[1].python_hook = false;
    workers[2].python_stack = kStacks;
    takePythonStacks(workers, loop.loop);
    CHECK(loop.signals.empty());
    CHECK(loop.clock.now() == start);
  }
  SECTION("a signal that fails: not waited for") {
    append(pythonStacksFile(dir.path(), ::getpid()), "");
    loop.on_signal = [](pid_t) { return ESRCH; };
    takePythonStacks(workers, loop.loop);
    CHECK(loop.signals.size() == 1);
    CHECK(loop.clock.now() == start);
    CHECK(workers[0].python_stack.empty());
  }
}

}  // namespace ddprun::agent
