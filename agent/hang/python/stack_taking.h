// The Python stacks of a node's workers, taken before any of them is stopped (the hang watch's,
// agent/hang_watch.h, once per attempt): first from torch's worker server where a worker runs
// one (worker_server_stacks.h), with the flight recorder's live traces (live_traces.h); then,
// of the running workers with ddprun's hook still without stacks, through the hook's signal
// (kPythonStacksSignal), faulthandler writing py_stacks.<pid> into the worker's directory at
// once, even in a blocked call. Only a process that registered the hook and is the worker or
// below it is signalled, never a pid outside the worker. A file is taken once it holds
// something that did not grow since the last look, or its worker ended (its exception's
// traceback serves then); kPythonStacksWait at most from the start, the caller's loop run
// meanwhile. Thread-safety: none; the caller's thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "agent/hang/python/live_traces.h"
#include "agent/hang/python/python_hook.h"
#include "agent/hang/python/worker_server_stacks.h"
#include "agent/torch_trace/flight_dump.h"
#include "common/clock.h"
#include "common/logging.h"

namespace ddprun::agent {

inline constexpr auto kPythonStacksWait = std::chrono::seconds(2);
inline constexpr auto kPythonStacksPoll = std::chrono::milliseconds(20);

// The caller's side: the clock its loop runs on, its loop run for a while (the workers served
// and reaped meanwhile: a worker's `running` may change), and kill(2) (0 or errno).
struct StackTakingLoop {
  Clock& clock;
  std::function<void(Clock::Duration)> run_for;
  std::function<int(pid_t, int)> signal;
};

// The process of the worker `worker_pid` (its directory `dir`) to signal for its stacks: the
// worker itself when it registered the hook, else the first registered process below it (a
// wrapper: sh -c python ...); -1 when none did.
pid_t hookedProcess(const std::string& dir, pid_t worker_pid);

// Runs the loop kPythonStacksPoll at a time until each of `files` holds something that did
// not grow since the last look or `ended(i)` says its worker ended, or until `deadline`.
void waitForStackFiles(const std::vector<std::string>& files, const std::function<bool(size_t)>& ended,
                       const StackTakingLoop& loop, Clock::TimePoint deadline);

// Says how many stacks were taken of how many asked, and in how long (the agent's log).
void logStacksTaken(size_t taken, size_t asked, size_t served, Clock::Duration took);

// Takes the stacks of `workers` (the agent's: running, python_hook, pid, dir, place.rank,
// python_stack, python_stack_file): sets python_stack and python_stack_file of each whose
// stacks came. Returns the live traces the worker servers gave.
template <class Workers>
std::vector<FlightDump> takePythonStacks(Workers& workers, const StackTakingLoop& loop) {
  const auto start = loop.clock.now();
  const WaitStep wait = [&](std::chrono::milliseconds step) {
    loop.run_for(step);
    return loop.clock.now() - start;
  };
  const size_t served = stacksFromWorkerServers(workers, wait);
  // The flight recorder's own record too, while every rank still stands where it hung.
  std::vector<FlightDump> live_traces = tracesFromWorkerServers(workers, wait);
  if (!live_traces.empty()) {
    logger("agent")->info("took {} live flight-recorder trace(s) from torch's worker servers", live_traces.size());
  }
  std::vector<decltype(&*std::begin(workers))> asked;
  std::vector<std::string> files;
  for (auto& w : workers) {
    if (!w.running || !w.python_hook || !w.python_stack.empty()) continue;
    const pid_t target = hookedProcess(w.dir, w.pid);
    if (target <= 1) continue;
    if (loop.signal(target, kPythonStacksSignal) != 0) continue;
    asked.push_back(&w);
    files.push_back(pythonStacksFile(w.dir, target));
  }
  if (asked.empty() && served == 0) return live_traces;
  waitForStackFiles(
      files, [&](size_t i) { return !asked[i]->running; }, loop, start + kPythonStacksWait);
  size_t taken = 0;
  for (size_t i = 0; i < asked.size(); ++i) {
    asked[i]->python_stack = readSmallFile(files[i]);
    if (asked[i]->python_stack.empty()) continue;
    asked[i]->python_stack_file = files[i];
    ++taken;
  }
  logStacksTaken(taken, asked.size(), served, loop.clock.now() - start);
  return live_traces;
}

}  // namespace ddprun::agent
