#include "agent/hang/python/worker_server_stacks.h"

#include "agent/hang/python/python_stacks.h"
#include "agent/hang/python/worker_server.h"
#include "common/logging.h"

namespace ddprun::agent {
namespace {

constexpr auto kStacksPoll = std::chrono::milliseconds(20);

}  // namespace

std::vector<ServerStacks> askWorkerServersForStacks(const std::vector<std::pair<std::string, pid_t>>& workers,
                                                    const WaitStep& wait) {
  std::vector<ServerStacks> out(workers.size());
  std::vector<WorkerServerAsks::Ask> asks;
  std::vector<size_t> index;
  for (size_t i = 0; i < workers.size(); ++i) {
    out[i].socket = existingWorkerServerSocket(workers[i].first, workers[i].second);
    if (out[i].socket.empty()) continue;
    asks.push_back({out[i].socket, "POST", "/handler/dump_traceback"});
    index.push_back(i);
  }
  if (asks.empty()) return out;
  // Each ask ends on its own within kWorkerServerStacksWait of its start; the wait ends with
  // the last of them (the second bound only guards against a thread that never started).
  WorkerServerAsks pending(std::move(asks), WorkerServerLimits{kWorkerServerStacksWait, kWorkerServerStacksBytes});
  while (!pending.done() && wait(kStacksPoll) < 2 * kWorkerServerStacksWait) {
  }
  const std::vector<WorkerServerReply> replies = pending.take();
  for (size_t k = 0; k < replies.size(); ++k) {
    ServerStacks& answer = out[index[k]];
    if (!replies[k].ok()) {
      logger("agent")->warn("{}; its Python stacks come from its signal instead", replies[k].problem);
      continue;
    }
    if (mainThreadFrames(replies[k].body).empty()) {
      logger("agent")->warn("torch's worker server {} gave no Python frame; its stacks come from its signal instead",
                            answer.socket);
      continue;
    }
    answer.stacks = replies[k].body;
  }
  return out;
}

}  // namespace ddprun::agent
