#include "launcher/worker_stacks.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>

#include <fmt/format.h>

#include "agent/proc_stat.h"
#include "agent/process_signals.h"
#include "agent/stack_capture.h"
#include "common/error.h"

namespace ddprun::launcher {
namespace {

// The raw text of field `key` in one of the agent's own event lines ("key":value); the
// agent writes flat objects whose strings never hold a quote before the field of interest.
std::optional<std::string> rawField(const std::string& line, const std::string& key) {
  const std::string head = "\"" + key + "\":";
  const size_t at = line.find(head);
  if (at == std::string::npos) return std::nullopt;
  size_t start = at + head.size();
  if (start < line.size() && line[start] == '"') {
    const size_t end = line.find('"', start + 1);
    if (end == std::string::npos) return std::nullopt;
    return line.substr(start + 1, end - start - 1);
  }
  const size_t end = line.find_first_of(",}", start);
  if (end == std::string::npos) return std::nullopt;
  return line.substr(start, end - start);
}

std::optional<long> intField(const std::string& line, const std::string& key) {
  const std::optional<std::string> text = rawField(line, key);
  if (!text || text->empty()) return std::nullopt;
  char* end = nullptr;
  const long value = std::strtol(text->c_str(), &end, 10);
  if (*end != '\0') return std::nullopt;
  return value;
}

std::string hostName() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "";
  return buf;
}

}  // namespace

EventsAgent readEventsAgent(std::istream& events) {
  EventsAgent agent;
  std::string line;
  while (std::getline(events, line)) {
    const std::optional<std::string> event = rawField(line, "event");
    if (!event) continue;
    if (agent.pid == 0) {
      if (const std::optional<std::string> node = rawField(line, "node")) {
        const size_t colon = node->rfind(':');
        if (colon != std::string::npos) {
          agent.host = node->substr(0, colon);
          agent.pid = static_cast<pid_t>(std::atol(node->c_str() + colon + 1));
        }
      }
    }
    if (*event == "agent_exit") agent.exited = true;
    const std::optional<long> pid = intField(line, "pid");
    if (!pid) continue;
    if (*event == "worker_start") {
      EventsWorker w;
      w.pid = static_cast<pid_t>(*pid);
      w.rank = static_cast<int>(intField(line, "rank").value_or(-1));
      w.local_rank = static_cast<int>(intField(line, "local_rank").value_or(-1));
      w.attempt = static_cast<int>(intField(line, "attempt").value_or(-1));
      agent.running.push_back(w);
    } else if (*event == "worker_exit") {
      std::erase_if(agent.running, [&](const EventsWorker& w) { return w.pid == *pid; });
    }
  }
  return agent;
}

int printWorkerStacks(const std::string& events_file) {
  std::ifstream in(events_file);
  if (!in) throw UsageError("status --stacks: cannot read " + events_file);
  EventsAgent agent = readEventsAgent(in);
  auto none = [&](const std::string& why) {
    std::fprintf(stderr, "ddprun status --stacks: %s (%s)\n", why.c_str(), events_file.c_str());
    return 1;
  };
  if (agent.exited || agent.pid == 0) return none("the agent has exited");
  if (agent.host != hostName()) return none("the agent runs on " + agent.host + ", not here; run this there");
  if (agent::signalProcess(agent.pid, 0) == ESRCH) {
    return none("the agent (pid " + std::to_string(agent.pid) + ") is gone");
  }
  // Only the agent's own children: a pid from the file may since have been given to another process.
  std::erase_if(agent.running, [&](const EventsWorker& w) {
    const std::optional<agent::ProcStat> stat = agent::readProcStat(w.pid);
    return !stat || stat->ppid != agent.pid || stat->state == 'Z';
  });
  if (agent.running.empty()) return none("no worker is running now");
  std::vector<pid_t> pids;
  for (const EventsWorker& w : agent.running) pids.push_back(w.pid);
  const std::vector<agent::ProcessStacks> stacks = agent::captureNativeStacks(pids);
  for (size_t i = 0; i < stacks.size(); ++i) {
    const EventsWorker& w = agent.running[i];
    const std::string text = agent::formatStacksFile(
        w.rank, w.local_rank, stacks[i], fmt::format("in attempt {} for ddprun status --stacks", w.attempt));
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fputs("\n", stdout);
  }
  return 0;
}

}  // namespace ddprun::launcher
