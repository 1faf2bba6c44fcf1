#include "agent/ops/event_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>

#include "common/console_writer.h"
#include "common/env_names.h"
#include "common/error.h"
#include "common/logging.h"
#include "common/unique_fd.h"

namespace ddprun::agent {

std::string isoTimeUtc(int64_t unix_ms) {
  const std::time_t seconds = static_cast<std::time_t>(unix_ms / 1000);
  std::tm tm{};
  ::gmtime_r(&seconds, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(unix_ms % 1000));
  return buf;
}

void checkAppendable(const std::string& path) {
  const UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
  if (!fd) throw UsageError(std::string(env::kEventsFile) + "=" + path + ": cannot open: " + std::strerror(errno));
}

EventLog::EventLog(const std::vector<std::string>& paths, std::string run_id) : run_id_(std::move(run_id)) {
  for (const std::string& path : paths) {
    UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
    if (!fd) {
      const int err = errno;
      // The files opened before this one close as fds_ goes.
      throw UsageError("events file " + path + ": cannot open: " + std::strerror(err));
    }
    fds_.push_back(std::move(fd));
    paths_.push_back(path);
  }
}

EventLog::~EventLog() = default;

void EventLog::emit(const std::string& event, const JsonObject& fields) {
  if (!enabled()) return;
  const int64_t now =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  JsonObject head;
  head.add("time", isoTimeUtc(now)).add("unix_ms", now).add("event", event).add("node", node_).add("run_id", run_id_);
  std::string line = head.str();
  const std::string rest = fields.str();
  if (rest.size() > 2) line = line.substr(0, line.size() - 1) + "," + rest.substr(1);
  line += "\n";
  if (console_) console().write(ConsoleStream::kStderr, line);
  for (size_t i = 0; i < fds_.size(); ++i) {
    // One write per line: with O_APPEND, lines of agents sharing the file do not interleave.
    const ssize_t n = ::write(fds_[i].get(), line.data(), line.size());
    if (n != static_cast<ssize_t>(line.size()) && !warned_) {
      warned_ = true;
      logger("agent")->warn("cannot write to the events file {}: {}", paths_[i],
                            n < 0 ? std::strerror(errno) : "short write");
    }
  }
}

}  // namespace ddprun::agent
