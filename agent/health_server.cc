#include "agent/health_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "common/error.h"
#include "common/logging.h"

namespace ddprun::agent {
namespace {

using Clock = std::chrono::steady_clock;
// A probe gets this long to send its request and read the answer.
constexpr auto kClientDeadline = std::chrono::seconds(2);
constexpr size_t kMaxRequest = 8192;

int msLeft(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left > 0 ? static_cast<int>(left) : 0;
}

}  // namespace

HealthServer::HealthServer(const std::string& host, int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    throw UsageError("--health_check_addr " + host + ": not an IPv4 address");
  }
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (listen_fd_ < 0) throw SystemError("socket", errno);
  int one = 1;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(listen_fd_, 16) != 0) {
    const int err = errno;
    ::close(listen_fd_);
    throw UsageError("--health_check_port " + std::to_string(port) + ": cannot listen on " + host + ": " +
                     std::strerror(err));
  }
  socklen_t len = sizeof addr;
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  stop_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (stop_fd_ < 0) {
    const int err = errno;
    ::close(listen_fd_);
    throw SystemError("eventfd", err);
  }
  // Signals belong to the agent's main thread (its signal sets); this thread takes none.
  sigset_t all, previous;
  sigfillset(&all);
  ::pthread_sigmask(SIG_BLOCK, &all, &previous);
  thread_ = std::thread([this] { serve(); });
  ::pthread_sigmask(SIG_SETMASK, &previous, nullptr);
}

HealthServer::~HealthServer() {
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(stop_fd_, &one, sizeof one);
  if (thread_.joinable()) thread_.join();
  ::close(listen_fd_);
  ::close(stop_fd_);
}

void HealthServer::update(bool healthy, std::string body) {
  std::lock_guard lock(mutex_);
  healthy_ = healthy;
  body_ = std::move(body);
}

void HealthServer::serve() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      logger("agent")->warn("health check: poll failed: {}; no longer answering", std::strerror(errno));
      return;
    }
    if (fds[1].revents) return;
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) continue;
    answer(fd);
    ::close(fd);
  }
}

// Reads the request head (bounded in size and time), then writes the whole answer.
void HealthServer::answer(int fd) {
  const auto deadline = Clock::now() + kClientDeadline;
  std::string request;
  while (request.find("\r\n\r\n") == std::string::npos && request.find("\n\n") == std::string::npos) {
    if (request.size() > kMaxRequest) return;
    pollfd fds[2] = {{fd, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    const int ready = ::poll(fds, 2, msLeft(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0 || fds[1].revents) return;
    char buf[1024];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n <= 0) return;
    request.append(buf, static_cast<size_t>(n));
  }
  const auto line_end = request.find_first_of("\r\n");
  const std::string line = request.substr(0, line_end);
  const auto sp1 = line.find(' ');
  const auto sp2 = line.find(' ', sp1 == std::string::npos ? sp1 : sp1 + 1);
  const std::string method = line.substr(0, sp1);
  std::string path = sp1 == std::string::npos ? "" : line.substr(sp1 + 1, sp2 - sp1 - 1);
  path = path.substr(0, path.find('?'));

  std::string status;
  std::string body;
  if (method != "GET" && method != "HEAD") {
    status = "405 Method Not Allowed";
    body = "{\"error\":\"only GET\"}";
  } else if (path != "/" && path != "/health" && path != "/healthz") {
    status = "404 Not Found";
    body = "{\"error\":\"not found; GET / for the agent's health\"}";
  } else {
    std::lock_guard lock(mutex_);
    status = healthy_ ? "200 OK" : "503 Service Unavailable";
    body = body_;
  }
  body += "\n";
  std::string response = "HTTP/1.1 " + status +
                         "\r\nContent-Type: application/json\r\nCache-Control: no-store\r\nConnection: close\r\n"
                         "Content-Length: " +
                         std::to_string(body.size()) + "\r\n\r\n";
  if (method != "HEAD") response += body;
  size_t sent = 0;
  while (sent < response.size()) {
    pollfd fds[2] = {{fd, POLLOUT, 0}, {stop_fd_, POLLIN, 0}};
    const int ready = ::poll(fds, 2, msLeft(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0 || fds[1].revents) return;
    const ssize_t n = ::send(fd, response.data() + sent, response.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n <= 0) return;
    sent += static_cast<size_t>(n);
  }
  ::shutdown(fd, SHUT_WR);
}

}  // namespace ddprun::agent
