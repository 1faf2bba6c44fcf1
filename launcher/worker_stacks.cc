#include "launcher/worker_stacks.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <string_view>

#include <fmt/format.h>

#include "agent/hang/stop/stack_capture.h"
#include "agent/process/proc_stat.h"
#include "agent/process/process_signals.h"
#include "common/error.h"
#include "common/text_escape.h"

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

// A whole decimal integer that fits a long; nothing otherwise.
std::optional<long> parseLong(std::string_view text) {
  long value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

std::optional<long> intField(const std::string& line, const std::string& key) {
  const std::optional<std::string> text = rawField(line, key);
  if (!text) return std::nullopt;
  return parseLong(*text);
}

// Why `pid` is not a ddprun process of this user (empty when it is): the events file is only
// a file, and whatever it names is attached to with ptrace.
std::string notOurAgent(pid_t pid) {
  const std::string proc = "/proc/" + std::to_string(pid);
  struct stat st {};
  if (::stat(proc.c_str(), &st) != 0) return "is gone";
  if (st.st_uid != ::getuid()) return "belongs to another user (uid " + std::to_string(st.st_uid) + ")";
  std::error_code ec;
  std::string name = std::filesystem::read_symlink(proc + "/exe", ec).filename().string();
  if (ec) return "cannot be told apart (" + proc + "/exe: " + ec.message() + ")";
  // A ddprun rebuilt or upgraded while it runs still is one.
  constexpr std::string_view kDeleted = " (deleted)";
  if (name.size() > kDeleted.size() && name.ends_with(kDeleted)) name.resize(name.size() - kDeleted.size());
  // Escaped: anyone may name a program with escape codes and have it run under that pid.
  if (name != "ddprun") return "is " + printable(name) + ", not a ddprun agent";
  return {};
}

// Why `pid` is not a running worker of the ddprun agent `agent` of this user (empty when it
// is): asked once when the file is read and again just before a tool attaches.
std::string notAgentsWorker(pid_t pid, pid_t agent) {
  if (pid <= 0) return "pid " + std::to_string(pid) + " is not a process";
  if (std::string why = notOurAgent(agent); !why.empty()) return "its agent (pid " + std::to_string(agent) + ") " + why;
  const std::optional<agent::ProcStat> stat = agent::readProcStat(pid);
  if (!stat || stat->state == 'Z') return "pid " + std::to_string(pid) + " is not running";
  if (stat->ppid != agent)
    return "pid " + std::to_string(pid) + " is not a child of the agent (pid " + std::to_string(agent) + ")";
  struct stat st {};
  if (::stat(("/proc/" + std::to_string(pid)).c_str(), &st) != 0 || st.st_uid != ::getuid()) {
    return "pid " + std::to_string(pid) + " belongs to another user";
  }
  return {};
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
          const std::optional<long> pid = parseLong(std::string_view(*node).substr(colon + 1));
          agent.pid = pid && *pid > 0 && *pid <= std::numeric_limits<pid_t>::max() ? static_cast<pid_t>(*pid) : 0;
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
    std::fprintf(stderr, "ddprun status --stacks: %s (%s)\n", why.c_str(), printable(events_file).c_str());
    return 1;
  };
  if (agent.exited || agent.pid == 0) return none("the agent has exited");
  if (agent.host != hostName())
    return none("the agent runs on " + printable(agent.host) + ", not here; run this there");
  if (agent::signalProcess(agent.pid, 0) == ESRCH) {
    return none("the agent (pid " + std::to_string(agent.pid) + ") is gone");
  }
  if (const std::string why = notOurAgent(agent.pid); !why.empty()) {
    return none("the agent named there (pid " + std::to_string(agent.pid) + ") " + why);
  }
  // Only the agent's own children: a pid from the file may since have been given to another
  // process, and is checked again right before a tool attaches to it.
  std::erase_if(agent.running, [&](const EventsWorker& w) { return !notAgentsWorker(w.pid, agent.pid).empty(); });
  if (agent.running.empty()) return none("no worker is running now");
  std::vector<pid_t> pids;
  for (const EventsWorker& w : agent.running) pids.push_back(w.pid);
  const std::vector<agent::ProcessStacks> stacks =
      agent::captureNativeStacks(pids, agent::kStackCaptureTimeout, [&](pid_t pid) {
        const std::string why = notAgentsWorker(pid, agent.pid);
        return why.empty() ? why : "not attached: " + why;
      });
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
