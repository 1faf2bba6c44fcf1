// The agent's structured events: one JSON object per line, appended to
// <run dir>/events.jsonl when --log_dir is given and to the file named by
// DDPRUN_EVENTS_FILE (which several agents may share: each line is one O_APPEND write).
// Every line has "time" (UTC, ISO 8601 with milliseconds), "unix_ms", "event", "node"
// (host:pid) and "run_id", then the event's own fields; README.md lists the events.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/json_writer.h"
#include "common/unique_fd.h"

namespace ddprun::agent {

class EventLog {
 public:
  // Opens (creating, appending) each given path. A path that cannot be opened throws
  // UsageError naming it; nothing is written yet.
  EventLog(const std::vector<std::string>& paths, std::string run_id);
  ~EventLog();
  EventLog(const EventLog&) = delete;
  EventLog& operator=(const EventLog&) = delete;

  // The node name goes into every later line (it is known only once the rendezvous
  // client exists).
  void setNode(std::string node) { node_ = std::move(node); }
  // Appends one line. Never throws: a failed write is logged once and the job goes on.
  // Not thread-safe: call from the agent's main thread.
  void emit(const std::string& event, const JsonObject& fields = {});
  bool enabled() const { return !fds_.empty() || console_; }
  // --event_log_handler=console: every line also goes to stderr, through ddprun's console
  // writer (a stalled console drops lines, never the agent), as torch's console handler
  // writes each event as one line.
  void alsoToConsole() { console_ = true; }

 private:
  std::vector<UniqueFd> fds_;
  std::vector<std::string> paths_;
  std::string run_id_;
  std::string node_;
  bool warned_ = false;
  bool console_ = false;
};

// Checks that `path` (named by DDPRUN_EVENTS_FILE) can be opened for appending, creating
// it if needed. Throws UsageError naming the variable and the path.
void checkAppendable(const std::string& path);

// "2026-11-22T10:04:05.123Z" for a wall-clock time in milliseconds since the epoch.
std::string isoTimeUtc(int64_t unix_ms);

// The file name of the events log inside a run directory.
inline constexpr const char* kEventsFileName = "events.jsonl";

}  // namespace ddprun::agent
