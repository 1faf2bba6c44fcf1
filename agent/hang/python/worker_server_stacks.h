// Python stacks through torch's worker server (worker_server.h), for the hang watch: every
// thread's traceback from the dump_traceback handler, where the worker started a server (torch
// 2.4 and later), before the SIGURG faulthandler file is asked for. The same text as that file
// (torch's handler calls faulthandler.dump_traceback), with no signal sent and no file. A
// worker whose server does not answer within kWorkerServerStacksWait (its interpreter lock held
// in C++ code), or answers too much, or has none, is left to the signal.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

namespace ddprun::agent {

inline constexpr auto kWorkerServerStacksWait = std::chrono::milliseconds(1000);
// The most of one worker's stacks kept, as for the faulthandler file.
inline constexpr size_t kWorkerServerStacksBytes = size_t{1} << 20;

struct ServerStacks {
  std::string stacks;  // "" when the server gave none
  std::string socket;  // the server asked; "" when the worker has none
};

// Runs the caller's event loop for a step; returns the time since the caller began.
using WaitStep = std::function<std::chrono::nanoseconds(std::chrono::milliseconds step)>;

// Asks the server of each (worker directory, pid) that has one, all at once on threads of
// their own, each bounded by kWorkerServerStacksWait; meanwhile `wait` runs the caller's loop
// until every ask has ended. Logs one warning for each
// server that gave no usable answer. One result per ask, in order.
std::vector<ServerStacks> askWorkerServersForStacks(const std::vector<std::pair<std::string, pid_t>>& workers,
                                                    const WaitStep& wait);

// The same over the agent's workers (running ones with ddprun's hook): sets python_stack and
// python_stack_file of each that answered. Returns how many did.
template <class Workers>
size_t stacksFromWorkerServers(Workers& workers, const WaitStep& wait) {
  std::vector<std::pair<std::string, pid_t>> asks;
  std::vector<decltype(&*std::begin(workers))> asked;
  for (auto& w : workers) {
    if (!w.running || !w.python_hook) continue;
    asks.emplace_back(w.dir, w.pid);
    asked.push_back(&w);
  }
  const std::vector<ServerStacks> answers = askWorkerServersForStacks(asks, wait);
  size_t served = 0;
  for (size_t i = 0; i < answers.size(); ++i) {
    if (answers[i].stacks.empty()) continue;
    asked[i]->python_stack = answers[i].stacks;
    asked[i]->python_stack_file = answers[i].socket;
    ++served;
  }
  return served;
}

}  // namespace ddprun::agent
