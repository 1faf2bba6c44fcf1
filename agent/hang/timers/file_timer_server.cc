#include "agent/hang/timers/file_timer_server.h"
#include "common/env_names.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <random>

#include <fmt/format.h>

#include "common/error.h"
#include "common/logging.h"
#include "common/text_escape.h"

namespace ddprun::agent {
namespace {

// Past this many, malformed requests are skipped without a line each: a worker writing
// garbage in a loop must not flood ddprun's log.
constexpr int kMaxWarnings = 20;
// How much of a malformed line a warning shows.
constexpr size_t kShownBytes = 200;

double wallSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

std::string FileTimerServer::defaultPath() {
  std::random_device device;
  std::uniform_int_distribution<uint32_t> dist;
  const uint32_t a = dist(device), b = dist(device), c = dist(device), d = dist(device);
  const std::string uuid = fmt::format("{:08x}-{:04x}-4{:03x}-{:04x}-{:04x}{:08x}", a, b >> 16, b & 0xfff,
                                       0x8000 | (c >> 18), c & 0xffff, d);
  const char* tmp = std::getenv(env::kTmpDir);
  return fmt::format("{}/watchdog_timer_{}", tmp && *tmp ? tmp : "/tmp", uuid);
}

FileTimerServer::FileTimerServer(boost::asio::io_context& io, std::string path, ExpiryHandler on_expiry,
                                 OwnerLookup owner_of, size_t max_timers_per_worker)
    : path_(std::move(path)),
      on_expiry_(std::move(on_expiry)),
      pipe_(io),
      expiry_timer_(io),
      owner_of_(std::move(owner_of)),
      table_(max_timers_per_worker) {
  if (::unlink(path_.c_str()) != 0 && errno != ENOENT) throw SystemError("unlink(" + path_ + ")", errno);
  if (::mkfifo(path_.c_str(), 0600) != 0) throw SystemError("mkfifo(" + path_ + ")", errno);
  // Non-blocking, so that opening needs no writer; then a writer of our own, so that the
  // pipe does not read as closed (and wake us in a loop) whenever no client has it open.
  UniqueFd read_end(::open(path_.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (!read_end) {
    const int err = errno;
    ::unlink(path_.c_str());
    throw SystemError("open(" + path_ + ")", err);
  }
  keep_open_.reset(::open(path_.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC));
  if (!keep_open_) {
    const int err = errno;
    ::unlink(path_.c_str());
    throw SystemError("open(" + path_ + ", O_WRONLY)", err);
  }
  pipe_.assign(read_end.release());
}

FileTimerServer::~FileTimerServer() {
  logCounts();
  boost::system::error_code ignored;
  expiry_timer_.cancel();
  pipe_.close(ignored);
  keep_open_.reset();
  ::unlink(path_.c_str());
}

void FileTimerServer::start() {
  logger("agent")->debug("file timer server reading {}", path_);
  readMore();
}

void FileTimerServer::clearTimers() {
  table_.clear();
  expiry_timer_.cancel();
  logCounts();
}

void FileTimerServer::logCounts() {
  auto report = [&](int64_t& count, const std::string& what, const char* outcome) {
    if (count > 1) logger("agent")->warn("file timer {}: {} {} in this attempt; {}", path_, count, what, outcome);
    count = 0;
  };
  report(not_a_worker_, "timer requests named a pid that is not a process of this node's workers",
         "ignored (the first was logged)");
  report(over_bound_, fmt::format("new timers of workers holding {} already", table_.maxPerWorker()),
         "refused (the first of each worker was logged)");
  over_bound_owners_.clear();
  report(gone_at_expiry_, "timers expired for processes no longer of this node's running workers",
         "ignored (the first was logged)");
}

void FileTimerServer::readMore() {
  pipe_.async_read_some(boost::asio::buffer(buffer_), [this](const boost::system::error_code& ec, size_t n) {
    if (ec == boost::asio::error::operation_aborted) return;
    if (ec) {
      // Cannot happen while we hold a writer; if it does, timers stop rather than spin.
      logger("agent")->error("file timer {}: read failed: {}; timers are no longer watched", path_, ec.message());
      return;
    }
    for (const TimerLineBuffer::Line& line : lines_.feed(std::string_view(buffer_.data(), n))) onLine(line);
    checkExpired();
    readMore();
  });
}

void FileTimerServer::warn(const std::string& what) {
  if (warnings_ > kMaxWarnings) return;
  if (++warnings_ > kMaxWarnings) {
    logger("agent")->warn("file timer {}: more than {} bad requests; skipping further ones without a warning", path_,
                          kMaxWarnings);
    return;
  }
  logger("agent")->warn("file timer {}: {}", path_, what);
}

void FileTimerServer::onLine(const TimerLineBuffer::Line& line) {
  if (line.overlong_size > 0) {
    warn(fmt::format("ignored a request line of {} bytes (the protocol allows {}, PIPE_BUF)", line.overlong_size,
                     TimerLineBuffer::kMaxLine));
    return;
  }
  ParsedTimerRequest parsed = parseTimerRequest(line.text);
  if (!parsed.request) {
    const bool cut = line.text.size() > kShownBytes;
    warn(fmt::format("skipped a malformed request ({}): {}{}", printable(parsed.error),
                     printable(std::string_view(line.text).substr(0, kShownBytes)), cut ? "..." : ""));
    return;
  }
  const TimerRequest& request = *parsed.request;
  const std::string scope = printable(request.scope_id);
  if (request.isRelease()) {
    logger("agent")->debug("file timer: pid {} released '{}'", request.pid, scope);
    table_.apply(request);
    return;
  }
  // Releasing needs no owner (it only ever removes); a new timer must belong to a worker,
  // or any process could fill the table, and the log, in the workers' name.
  const int64_t owner = owner_of_ ? owner_of_(request.pid) : request.pid;
  if (owner <= 0) {
    if (++not_a_worker_ == 1) {
      logger("agent")->warn(
          "file timer {}: ignored timer '{}' of pid {}: not a process of this node's running workers (further such "
          "requests are counted, the count logged when the attempt ends)",
          path_, scope, request.pid);
    }
    return;
  }
  const TimerApplied applied = table_.apply(request, owner);
  if (applied == TimerApplied::kRefused) {
    ++over_bound_;
    if (over_bound_owners_.insert(owner).second) {
      logger("agent")->warn(
          "file timer {}: refused timer '{}' of pid {}: the worker (pid {}) holds {} timers, the most one worker may "
          "hold; its further new timers are refused and counted until some are released",
          path_, scope, request.pid, owner, table_.maxPerWorker());
    }
    return;
  }
  logger("agent")->debug("file timer: pid {} {} '{}' to expire in {:.3f} s (signal {})", request.pid,
                         applied == TimerApplied::kSet ? "set" : "moved", scope,
                         request.expiration_time - wallSeconds(), request.signal);
}

void FileTimerServer::checkExpired() {
  for (const TimerExpiry& expiry : table_.takeExpired(wallSeconds())) {
    if (owner_of_ && owner_of_(expiry.pid) <= 0) {
      // It was a worker's process when it set the timer; it has exited or left since.
      if (++gone_at_expiry_ == 1) {
        logger("agent")->warn(
            "file timer {}: timer '{}' of pid {} expired, but pid {} is no longer a process of this node's running "
            "workers; ignored (further such expiries are counted)",
            path_, printable(expiry.timer.scope_id), expiry.pid, expiry.pid);
      }
      continue;
    }
    on_expiry_(expiry);
  }
  arm();
}

void FileTimerServer::arm() {
  expiry_timer_.cancel();
  const std::optional<double> next = table_.nextExpiration();
  if (!next || std::isinf(*next)) return;
  // Capped where nanoseconds since the epoch still fit in 64 bits (a timer set for the year 3000).
  const auto at = std::chrono::system_clock::time_point(std::chrono::duration_cast<std::chrono::system_clock::duration>(
      std::chrono::duration<double>(std::min(*next, 4e9))));
  expiry_timer_.expires_at(at);
  expiry_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) checkExpired();
  });
}

}  // namespace ddprun::agent
