#include "agent/ops/health_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <vector>

#include "common/error.h"
#include "common/logging.h"
#include "common/port_holder.h"
#include "common/socket_io.h"

namespace ddprun::agent {
namespace {

using Clock = std::chrono::steady_clock;
// A probe gets this long to send its request and read the answer.
constexpr auto kClientDeadline = std::chrono::seconds(2);
constexpr size_t kMaxRequest = 8192;
// Connections served at once; a new one beyond this drops the oldest.
constexpr size_t kMaxClients = 64;

}  // namespace

HealthServer::HealthServer(const std::string& host, int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    throw UsageError("--health_check_addr " + host + ": not an IPv4 address");
  }
  listen_fd_.reset(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!listen_fd_) throw SystemError("socket", errno);
  int one = 1;
  ::setsockopt(listen_fd_.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  // The kernel's full backlog (SOMAXCONN): with 16, a burst of connections (a monitoring
  // system's, or a stalled one's) overflowed it before the serving thread ran, and a probe's
  // SYN dropped there waits 1 s, then 3 s, for its retransmission.
  if (::bind(listen_fd_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(listen_fd_.get(), SOMAXCONN) != 0) {
    const int err = errno;
    throw UsageError("--health_check_port " + std::to_string(port) + ": cannot listen on " + host + ": " +
                     std::strerror(err) + (err == EADDRINUSE ? portHolderSuffix(port) : std::string()));
  }
  socklen_t len = sizeof addr;
  ::getsockname(listen_fd_.get(), reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  stop_fd_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!stop_fd_) throw SystemError("eventfd", errno);
  // Signals belong to the agent's main thread (its signal sets); this thread takes none.
  sigset_t all, previous;
  sigfillset(&all);
  ::pthread_sigmask(SIG_BLOCK, &all, &previous);
  thread_ = std::thread([this] { serve(); });
  ::pthread_sigmask(SIG_SETMASK, &previous, nullptr);
}

HealthServer::~HealthServer() {
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(stop_fd_.get(), &one, sizeof one);
  if (thread_.joinable()) thread_.join();
}

void HealthServer::update(bool healthy, std::string body) {
  std::lock_guard lock(mutex_);
  healthy_ = healthy;
  body_ = std::move(body);
}

// Every connection is served at once, each with its own deadline, from one poll loop: an
// idle or slow client costs a slot, never the next probe's time (it once did: 10 idle
// connections delayed a probe by 20 s). At the cap the oldest connection is dropped.
void HealthServer::serve() {
  std::vector<Client> clients;
  std::vector<pollfd> fds;
  for (;;) {
    fds.clear();
    fds.push_back({listen_fd_.get(), POLLIN, 0});
    fds.push_back({stop_fd_.get(), POLLIN, 0});
    Clock::time_point next_deadline = Clock::time_point::max();
    for (const Client& c : clients) {
      fds.push_back({c.fd.get(), static_cast<short>(c.response.empty() ? POLLIN : POLLOUT), 0});
      next_deadline = std::min(next_deadline, c.deadline);
    }
    const int timeout = pollTimeoutMs(next_deadline);  // no limit while no client is open
    if (::poll(fds.data(), fds.size(), timeout) < 0) {
      if (errno == EINTR) continue;
      logger("agent")->warn("health check: poll failed: {}; no longer answering", std::strerror(errno));
      break;
    }
    if (fds[1].revents) break;
    const auto now = Clock::now();
    std::vector<Client> open;
    open.reserve(clients.size());
    for (size_t i = 0; i < clients.size(); ++i) {
      Client& c = clients[i];
      bool done = now >= c.deadline;
      if (!done && fds[i + 2].revents) done = !progress(c);
      if (!done) open.push_back(std::move(c));  // a finished client's socket closes with it
    }
    clients.swap(open);
    if (fds[0].revents) {
      for (;;) {
        UniqueFd fd(::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
        if (!fd) break;
        if (clients.size() >= kMaxClients) clients.erase(clients.begin());
        clients.push_back(Client{std::move(fd), Clock::now() + kClientDeadline, {}, {}, 0});
      }
    }
  }
}

// Reads what the client sent; once the request head is complete, builds the answer and
// writes as much as the socket takes. Returns false when the connection is finished.
bool HealthServer::progress(Client& c) {
  try {
    if (c.response.empty()) {
      char buf[1024];
      const size_t n = recvSome(c.fd.get(), std::as_writable_bytes(std::span(buf)));
      if (n == 0) return true;  // nothing yet
      c.request.append(buf, n);
      if (c.request.find("\r\n\r\n") == std::string::npos && c.request.find("\n\n") == std::string::npos) {
        return c.request.size() <= kMaxRequest;  // a head larger than the limit gets no answer
      }
      c.response = respond(c.request);
    }
    const size_t n = sendSome(c.fd.get(), std::as_bytes(std::span(c.response)).subspan(c.sent));
    c.sent += n;
    if (c.sent < c.response.size()) return true;
  } catch (const SocketError&) {
    return false;  // the client closed or reset the connection: nobody is left to answer
  }
  ::shutdown(c.fd.get(), SHUT_WR);
  return false;
}

std::string HealthServer::respond(const std::string& request) {
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
  return response;
}

}  // namespace ddprun::agent
