// A stand-in server on a Unix socket for tests of clients that speak HTTP to one (torch's
// worker server, agent/hang/python/worker_server.h): on a thread of its own it takes one
// connection at a time, reads the request's head and hands its first line ("POST
// /handler/fr_trace_json") to the test's `answer`, then closes the connection. It stops on a
// pipe's end, wherever it waits (an accept, a read, an answer that waits with readable()),
// so that its destructor returns at once. Header-only.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <functional>
#include <string>
#include <system_error>
#include <thread>

namespace ddprun::testing {

class StandInServer {
 public:
  // Answers a connection `c` that sent `line`; may wait with readable() and test stopped().
  using Answer = std::function<void(int c, const std::string& line)>;

  // Listening on `path` at once; throws std::system_error when it cannot. `answer` runs on
  // the server's thread and must outlive the server.
  StandInServer(const std::string& path, Answer answer) : answer_(std::move(answer)) {
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path.c_str());
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd_, 8) != 0 ||
        ::pipe2(stop_pipe_, O_CLOEXEC) != 0) {
      const int error = errno;
      if (fd_ >= 0) ::close(fd_);
      throw std::system_error(error, std::generic_category(), "stand-in server on " + path);
    }
    thread_ = std::thread([this] { serve(); });
  }
  ~StandInServer() {
    stop_ = true;
    ::close(stop_pipe_[1]);  // the server's thread wakes on the end of the pipe, wherever it waits
    thread_.join();
    ::close(stop_pipe_[0]);
    ::close(fd_);
  }
  StandInServer(const StandInServer&) = delete;
  StandInServer& operator=(const StandInServer&) = delete;

  // Waits until `fd` is readable (true: data, or its peer closed) or the server is stopped
  // (false). readable(-1) waits for the stop alone.
  bool readable(int fd) const {
    pollfd p[2] = {{stop_pipe_[0], POLLIN, 0}, {fd, POLLIN, 0}};
    while (!stop_) {
      if (::poll(p, fd < 0 ? 1 : 2, -1) < 0 && errno != EINTR) return false;
      if (p[0].revents != 0) return false;
      if (fd >= 0 && p[1].revents != 0) return true;
    }
    return false;
  }
  bool stopped() const { return stop_; }

 private:
  void serve() {
    while (readable(fd_)) {
      const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      std::string request;
      char buf[4096];
      while (request.find("\r\n\r\n") == std::string::npos && readable(c)) {
        const ssize_t n = ::read(c, buf, sizeof buf);
        if (n <= 0) break;
        request.append(buf, static_cast<size_t>(n));
      }
      answer_(c, request.substr(0, request.find(" HTTP/")));
      ::close(c);
    }
  }

  Answer answer_;
  int fd_ = -1;
  int stop_pipe_[2] = {-1, -1};  // its write end closed: stop
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace ddprun::testing
