// The agent's end of torch's file timers (TORCHELASTIC_ENABLE_FILE_TIMER=1): a named pipe
// that workers write timer requests into (torch's FileTimerClient, or the C++ runtime's
// ddprun::runtime::expires), read on the agent's io_context as lines arrive, and a
// wall-clock timer armed for the earliest expiration. When a process's timer expires the
// server hands the expiry to the agent, which decides what to kill; the server kills
// nothing itself. Malformed and overlong lines are skipped with a warning. A timer set for a
// pid that is not a worker's, and a new timer of a worker that holds its bound already
// (TimerTable), are refused: the first of each kind in an attempt (for the bound: of each
// worker) is warned about, the rest counted, and the count logged when the attempt's
// timers are cleared. Every string a
// worker wrote is shown through printable() (common/text_escape.h).
#pragma once

#include <array>
#include <functional>
#include <set>
#include <string>

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/system_timer.hpp>

#include "agent/hang/timers/timer_request.h"
#include "agent/hang/timers/timer_table.h"
#include "common/unique_fd.h"

namespace ddprun::agent {

class FileTimerServer {
 public:
  using ExpiryHandler = std::function<void(const TimerExpiry&)>;
  // The pid of the running worker that `pid` is or belongs to, or -1 when none: a timer is
  // accepted only for a worker's process, and counts against that worker's bound.
  using OwnerLookup = std::function<int64_t(int64_t pid)>;

  // Creates the named pipe at `path` (mode 0600; whatever was there is replaced, as torch's
  // server does) and opens it. Throws SystemError naming the path. Reads nothing before
  // start(). `on_expiry` and `owner_of` run on `io`'s thread; without `owner_of` every pid
  // is a worker of its own. An expiry whose pid is no longer a worker's (owner_of says -1)
  // is counted, not handed on.
  FileTimerServer(boost::asio::io_context& io, std::string path, ExpiryHandler on_expiry, OwnerLookup owner_of = {},
                  size_t max_timers_per_worker = TimerTable::kDefaultMaxPerWorker);
  // Stops reading and removes the pipe.
  ~FileTimerServer();
  FileTimerServer(const FileTimerServer&) = delete;
  FileTimerServer& operator=(const FileTimerServer&) = delete;

  const std::string& path() const { return path_; }
  // Starts reading requests. Not thread-safe: call on `io`'s thread, like everything here.
  void start();
  // Drops every timer: the processes of the attempt that set them are gone. Logs the
  // counts of refused requests since the last call, if any.
  void clearTimers();
  // How many timers are held (for tests).
  size_t timerCount() const { return table_.size(); }

  // torch's choice when TORCHELASTIC_TIMER_FILE is unset: watchdog_timer_<uuid4> under
  // $TMPDIR (torch: /tmp).
  static std::string defaultPath();

 private:
  void readMore();
  void onLine(const TimerLineBuffer::Line& line);
  void checkExpired();
  void arm();
  void warn(const std::string& what);
  void logCounts();

  std::string path_;
  ExpiryHandler on_expiry_;
  boost::asio::posix::stream_descriptor pipe_;
  UniqueFd keep_open_;  // our own writer: the pipe never reads as closed between clients
  boost::asio::system_timer expiry_timer_;
  std::array<char, 8192> buffer_{};
  TimerLineBuffer lines_;
  OwnerLookup owner_of_;
  TimerTable table_;
  int warnings_ = 0;
  // Refused requests of this attempt, by kind: the first of each is warned about, the rest
  // counted and logged by clearTimers().
  int64_t not_a_worker_ = 0;             // set requests naming a pid that is not a worker's
  int64_t over_bound_ = 0;               // new timers of a worker at its bound
  std::set<int64_t> over_bound_owners_;  // the workers warned about
  int64_t gone_at_expiry_ = 0;           // expiries of pids that are no longer a worker's
};

}  // namespace ddprun::agent
