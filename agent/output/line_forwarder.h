// Reads one worker stream (a pipe) on the agent's io_context and sends it on: the raw
// bytes to the worker's log file (--redirects, --tee), whole prefixed lines to the console
// (when shown), the last lines to an in-memory tail (for the failure report), the lines
// matching --duplicate_*_filters to their attempt's filtered file. Event-driven:
// output appears as soon as the worker writes it.
//
// The worker only ever writes into the pipe, so nothing that happens to the log file or
// the console can fail its writes or change its exit code. Console lines go through
// console() (common/console_writer.h): a stalled console never blocks the event loop. A
// log file that cannot be written (ENOSPC) is warned about once and then left alone.
#pragma once

#include <array>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>

#include "agent/output/filtered_log.h"
#include "agent/output/line_splitter.h"
#include "agent/output/output_tail.h"
#include "common/console_writer.h"
#include "common/unique_fd.h"

namespace ddprun::agent {

// What the agent keeps of a forwarded stream after its forwarder is gone.
struct StreamRecord {
  std::string file;        // the log file; empty when the stream has none.
  std::string file_error;  // why the log file is incomplete (strerror); empty when it is not.
  OutputTail tail;         // the stream's last lines.
};

struct ForwardOptions {
  UniqueFd file_fd;                       // the log file, owned by the forwarder; default: none.
  std::string file;                       // its path, for messages.
  std::optional<ConsoleStream> console;   // where whole lines are shown; default: not shown.
  std::string prefix;                     // put before each console line; default none.
  std::shared_ptr<StreamRecord> record;   // gets the tail and file errors; default: none kept.
  std::shared_ptr<FilteredLog> filtered;  // gets prefixed lines to filter; default: none.
  // Told each whole line (with its '\n'), on the io_context's thread; default: nobody.
  std::function<void(std::string_view line)> on_line;
};

class LineForwarder {
 public:
  // Takes ownership of `pipe_fd`. Not thread-safe: use from the io_context's thread only.
  LineForwarder(boost::asio::io_context& io, int pipe_fd, ForwardOptions options);
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
  void writeFile(std::string_view chunk);
  void emitLine(std::string_view line);
  bool splitsLines() const { return options_.console || options_.record || options_.filtered || options_.on_line; }

  boost::asio::posix::stream_descriptor pipe_;
  ForwardOptions options_;
  LineSplitter splitter_;
  std::array<char, 65536> buffer_{};
  std::string line_out_;
  bool finished_ = false;
};

}  // namespace ddprun::agent
