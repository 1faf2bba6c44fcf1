#include "agent/line_forwarder.h"

#include <unistd.h>

#include <cerrno>

#include <boost/asio/read.hpp>

namespace ddprun::agent {

bool writeAll(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

LineForwarder::LineForwarder(boost::asio::io_context& io, int pipe_fd, int file_fd,
                             std::optional<ConsoleStream> console, std::string prefix)
    : pipe_(io, pipe_fd), file_fd_(file_fd), console_(console), prefix_(std::move(prefix)) {}

LineForwarder::~LineForwarder() {
  boost::system::error_code ignored;
  pipe_.close(ignored);
  if (file_fd_ >= 0) ::close(file_fd_);
}

void LineForwarder::start() { readMore(); }

void LineForwarder::readMore() {
  pipe_.async_read_some(boost::asio::buffer(buffer_), [this](const boost::system::error_code& ec, size_t n) {
    if (finished_) return;
    if (n > 0) {
      std::string_view chunk(buffer_.data(), n);
      if (file_fd_ >= 0) writeAll(file_fd_, chunk);
      if (console_) {
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

void LineForwarder::finish() {
  if (finished_) return;
  finished_ = true;
  if (console_) {
    splitter_.flush([this](std::string_view line) { emitLine(line); });
  }
  boost::system::error_code ignored;
  pipe_.close(ignored);
}

void LineForwarder::close() { finish(); }

// One write per line: the prefix and the line reach the console together.
void LineForwarder::emitLine(std::string_view line) {
  line_out_.assign(prefix_);
  line_out_.append(line);
  console().write(*console_, line_out_);
}

}  // namespace ddprun::agent
