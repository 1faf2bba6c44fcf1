// Reads one worker stream (a pipe) on the agent's io_context and sends it on: the raw
// bytes to the worker's log file (when teed), whole prefixed lines to the console (when
// shown). Event-driven: output appears as soon as the worker writes it.
#pragma once

#include <array>
#include <functional>
#include <string>

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>

#include "agent/line_splitter.h"

namespace ddprun::agent {

class LineForwarder {
 public:
  // Takes ownership of `pipe_fd` and `file_fd` (-1: no file). `console_fd` (-1: not
  // shown) is borrowed. Not thread-safe: use from the io_context's thread only.
  LineForwarder(boost::asio::io_context& io, int pipe_fd, int file_fd, int console_fd, std::string prefix);
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
  int console_fd_;
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
