// Reads one worker stream (a pipe) on the agent's io_context and sends it on: the raw
// bytes to the worker's log file (when teed), whole prefixed lines to the console (when
// shown). Event-driven: output appears as soon as the worker writes it. Console lines go
// through console() (common/console_writer.h), so a stalled console never blocks the
// event loop; the log file gets every byte regardless.
#pragma once

#include <array>
#include <functional>
#include <optional>
#include <string>

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>

#include "agent/line_splitter.h"
#include "common/console_writer.h"

namespace ddprun::agent {

class LineForwarder {
 public:
  // Takes ownership of `pipe_fd` and `file_fd` (-1: no file). `console`: where whole lines
  // are shown, each with `prefix` (nothing: not shown). Not thread-safe: use from the
  // io_context's thread only.
  LineForwarder(boost::asio::io_context& io, int pipe_fd, int file_fd, std::optional<ConsoleStream> console,
                std::string prefix);
  ~LineForwarder();
  LineForwarder(const LineForwarder&) = delete;
  LineForwarder& operator=(const LineForwarder&) = delete;

  void start();
  // True once the pipe reached EOF (every writer is gone) or close() was called.
  bool finished() const { return finished_; }
  // Stops reading now (a writer escaped the worker's process group); flushes what is held.
  void close();

 private:
  void readMore();
  void finish();
  void emitLine(std::string_view line);

  boost::asio::posix::stream_descriptor pipe_;
  int file_fd_;
  std::optional<ConsoleStream> console_;
  std::string prefix_;
  LineSplitter splitter_;
  std::array<char, 65536> buffer_{};
  std::string line_out_;
  bool finished_ = false;
};

// Writes all of `data` to `fd`, retrying on EINTR and short writes. Returns false when
// the descriptor is gone (EPIPE, EBADF); the caller drops the output.
bool writeAll(int fd, std::string_view data);

}  // namespace ddprun::agent
