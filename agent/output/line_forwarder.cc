#include "agent/output/line_forwarder.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <boost/asio/read.hpp>

#include "common/logging.h"

namespace ddprun::agent {
namespace {

// Writes all of `data` to `fd`, retrying on EINTR and short writes. Returns 0, or the
// errno that stopped it.
int writeAll(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return 0;
}

}  // namespace

LineForwarder::LineForwarder(boost::asio::io_context& io, int pipe_fd, ForwardOptions options)
    : pipe_(io, pipe_fd), options_(std::move(options)) {
  if (options_.record) options_.record->file = options_.file;
}

LineForwarder::~LineForwarder() {
  boost::system::error_code ignored;
  pipe_.close(ignored);
}

void LineForwarder::start() { readMore(); }

void LineForwarder::readMore() {
  pipe_.async_read_some(boost::asio::buffer(buffer_), [this](const boost::system::error_code& ec, size_t n) {
    if (finished_) return;
    if (n > 0) {
      std::string_view chunk(buffer_.data(), n);
      if (options_.file_fd) writeFile(chunk);
      if (splitsLines()) {
        splitter_.feed(chunk, [this](std::string_view line) { emitLine(line); });
      }
    }
    if (ec) {
      finish();
      return;
    }
    readMore();
  });
}

// A file that failed once (a full disk) is not written again: a log with a hole in it
// would look complete. The warning names it once; the tail keeps the last lines.
void LineForwarder::writeFile(std::string_view chunk) {
  const int err = writeAll(options_.file_fd.get(), chunk);
  if (err == 0) return;
  logger("agent")->warn("cannot write worker log {}: {}; the rest of this stream is not saved there", options_.file,
                        std::strerror(err));
  if (options_.record) options_.record->file_error = std::strerror(err);
  options_.file_fd.reset();
}

void LineForwarder::finish() {
  if (finished_) return;
  finished_ = true;
  if (splitsLines()) {
    splitter_.flush([this](std::string_view line) { emitLine(line); });
  }
  boost::system::error_code ignored;
  pipe_.close(ignored);
}

void LineForwarder::close() { finish(); }

// One write per line: the prefix and the line reach the console together.
void LineForwarder::emitLine(std::string_view line) {
  if (options_.record) options_.record->tail.add(line);
  if (options_.filtered) options_.filtered->offer(options_.prefix, line);
  if (options_.on_line) options_.on_line(line);
  if (!options_.console) return;
  line_out_.assign(options_.prefix);
  line_out_.append(line);
  console().write(*options_.console, line_out_);
}

}  // namespace ddprun::agent
