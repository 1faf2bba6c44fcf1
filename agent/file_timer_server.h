// The agent's end of torch's file timers (TORCHELASTIC_ENABLE_FILE_TIMER=1): a named pipe
// that workers write timer requests into (torch's FileTimerClient, or the C++ runtime's
// ddprun::runtime::expires), read on the agent's io_context as lines arrive, and a
// wall-clock timer armed for the earliest expiration. When a process's timer expires the
// server hands the expiry to the agent, which decides what to kill; the server kills
// nothing itself. Malformed and overlong lines are skipped with a warning.
#pragma once

#include <array>
#include <functional>
#include <string>

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/system_timer.hpp>

#include "agent/timer_request.h"
#include "agent/timer_table.h"
#include "common/unique_fd.h"

namespace ddprun::agent {

class FileTimerServer {
 public:
  using ExpiryHandler = std::function<void(const TimerExpiry&)>;

  // Creates the named pipe at `path` (mode 0600; whatever was there is replaced, as torch's
  // server does) and opens it. Throws SystemError naming the path. Reads nothing before
  // start(). `on_expiry` runs on `io`'s thread.
  FileTimerServer(boost::asio::io_context& io, std::string path, ExpiryHandler on_expiry);
  // Stops reading and removes the pipe.
  ~FileTimerServer();
  FileTimerServer(const FileTimerServer&) = delete;
  FileTimerServer& operator=(const FileTimerServer&) = delete;

  const std::string& path() const { return path_; }
  // Starts reading requests. Not thread-safe: call on `io`'s thread, like everything here.
  void start();
  // Drops every timer: the processes of the attempt that set them are gone.
  void clearTimers();

  // torch's choice when TORCHELASTIC_TIMER_FILE is unset: watchdog_timer_<uuid4> under
  // $TMPDIR (torch: /tmp).
  static std::string defaultPath();

 private:
  void readMore();
  void onLine(const TimerLineBuffer::Line& line);
  void checkExpired();
  void arm();
  void warn(const std::string& what);

  std::string path_;
  ExpiryHandler on_expiry_;
  boost::asio::posix::stream_descriptor pipe_;
  UniqueFd keep_open_;  // our own writer: the pipe never reads as closed between clients
  boost::asio::system_timer expiry_timer_;
  std::array<char, 8192> buffer_{};
  TimerLineBuffer lines_;
  TimerTable table_;
  int warnings_ = 0;
};

}  // namespace ddprun::agent
