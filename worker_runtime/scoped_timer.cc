#include "worker_runtime/scoped_timer.h"

#include <fcntl.h>
#include <limits.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>

#include <fmt/format.h>

#include "common/env_names.h"
#include "common/env_reader.h"
#include "common/error.h"
#include "common/json_writer.h"
#include "common/logging.h"
#include "common/unique_fd.h"

namespace ddprun::runtime {
namespace {

// One request per open, write and close, as torch's client does: the agent needs no
// connection state, and a write of at most PIPE_BUF bytes never mixes with another's.
void send(const std::string& pipe, const std::string& scope, const std::string& line) {
  const std::string what = "timer '" + scope + "': " + env::kTimerFile + "=" + pipe;
  if (line.size() + 1 > PIPE_BUF) {
    throw DdprunError(fmt::format("{}: the request is {} bytes, more than PIPE_BUF ({}); use a shorter scope", what,
                                  line.size() + 1, PIPE_BUF));
  }
  // Non-blocking: with no agent reading, open fails (ENXIO) instead of waiting forever.
  UniqueFd fd(::open(pipe.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC));
  if (!fd) {
    const int err = errno;
    throw DdprunError(
        fmt::format("{}: cannot open: {}{}", what, std::strerror(err), err == ENXIO ? " (no agent reads it)" : ""));
  }
  const std::string data = line + "\n";
  ssize_t n;
  do {
    n = ::write(fd.get(), data.data(), data.size());
  } while (n < 0 && errno == EINTR);
  const int err = errno;
  if (n < 0) {
    throw DdprunError(fmt::format("{}: cannot write: {}{}", what, std::strerror(err),
                                  err == EAGAIN ? " (the pipe is full: the agent does not read it)" : ""));
  }
}

double wallSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

std::string timerRequestLine(int pid, std::string_view scope, double expiration_time, int signal) {
  // Field order and spelling as json.dumps writes FileTimerRequest.to_json().
  return fmt::format("{{\"version\": 1, \"pid\": {}, \"scope_id\": {}, \"expiration_time\": {:.6f}, \"signal\": {}}}",
                     pid, jsonString(scope), expiration_time, signal);
}

ScopedTimer expires(std::chrono::duration<double> after, std::string_view scope, int signal) {
  const std::optional<std::string> pipe = env::optionalString(env::kTimerFile);
  if (!pipe) return ScopedTimer();
  const std::string name(scope);
  send(*pipe, name, timerRequestLine(::getpid(), scope, wallSeconds() + after.count(), signal));
  return ScopedTimer(*pipe, name);
}

void ScopedTimer::release() {
  if (pipe_.empty()) return;
  const std::string pipe = std::move(pipe_);
  pipe_.clear();
  send(pipe, scope_, timerRequestLine(::getpid(), scope_, -1, 0));
}

ScopedTimer::~ScopedTimer() {
  try {
    release();
  } catch (const DdprunError& e) {
    logger("runtime")->warn("{}", e.what());
  }
}

ScopedTimer::ScopedTimer(ScopedTimer&& other) noexcept
    : pipe_(std::exchange(other.pipe_, {})), scope_(std::move(other.scope_)) {}

ScopedTimer& ScopedTimer::operator=(ScopedTimer&& other) noexcept {
  if (this != &other) {
    try {
      release();
    } catch (const DdprunError& e) {
      logger("runtime")->warn("{}", e.what());
    }
    pipe_ = std::exchange(other.pipe_, {});
    scope_ = std::move(other.scope_);
  }
  return *this;
}

}  // namespace ddprun::runtime
