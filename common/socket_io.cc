#include "common/socket_io.h"

#include <fcntl.h>
#include <netdb.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

namespace ddprun {
namespace {

using Kind = SocketError::Kind;

// Builds the error before anything else can change errno.
SocketError failed(const char* call, int err) {
  return SocketError(Kind::kFailed, std::string(call) + " failed: " + std::strerror(err), err);
}

SocketError timedOut() { return SocketError(Kind::kTimedOut, "timed out", ETIMEDOUT); }

}  // namespace

SocketError::SocketError(Kind kind, const std::string& what, int code) : DdprunError(what), kind_(kind), code_(code) {}

int pollTimeoutMs(SocketClock::time_point deadline) {
  if (deadline == SocketClock::time_point::max()) return -1;
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - SocketClock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, int64_t{1} << 30));
}

bool waitReady(int fd, short events, SocketClock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, pollTimeoutMs(deadline));
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) throw failed("poll", errno);
    // A timeout that ends a hair early (or EINTR) waits again for what is left.
    if (r == 0 && SocketClock::now() >= deadline) return false;
  }
}

size_t sendSome(int fd, std::span<const std::byte> bytes) {
  if (bytes.empty()) return 0;
  for (;;) {
    const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) return static_cast<size_t>(n);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    throw failed("send", errno);
  }
}

size_t recvSome(int fd, std::span<std::byte> buffer) {
  if (buffer.empty()) return 0;
  for (;;) {
    const ssize_t n = ::recv(fd, buffer.data(), buffer.size(), MSG_DONTWAIT);
    if (n > 0) return static_cast<size_t>(n);
    if (n == 0) throw SocketError(Kind::kPeerClosed, "connection closed by the peer", 0);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    throw failed("receive", errno);
  }
}

void sendAll(int fd, std::span<const std::byte> bytes, SocketClock::time_point deadline) {
  while (!bytes.empty()) {
    const size_t n = sendSome(fd, bytes);
    if (n > 0) {
      bytes = bytes.subspan(n);
    } else if (!waitReady(fd, POLLOUT, deadline)) {
      throw timedOut();
    }
  }
}

void recvAll(int fd, std::span<std::byte> buffer, SocketClock::time_point deadline) {
  while (!buffer.empty()) {
    const size_t n = recvSome(fd, buffer);
    if (n > 0) {
      buffer = buffer.subspan(n);
    } else if (!waitReady(fd, POLLIN, deadline)) {
      throw timedOut();
    }
  }
}

void connectWithin(int fd, const sockaddr* addr, socklen_t length, SocketClock::time_point deadline) {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) throw failed("fcntl", errno);
  if (::connect(fd, addr, length) == 0) return;
  // EINTR: the connection goes on being made in the background, as for EINPROGRESS.
  if (errno != EINPROGRESS && errno != EINTR) throw failed("connect", errno);
  if (!waitReady(fd, POLLOUT, deadline)) throw timedOut();
  int err = 0;
  socklen_t len = sizeof err;
  if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
  if (err != 0) throw failed("connect", err);
}

UniqueFd connectTcp(const std::string& host, const std::string& port, SocketClock::time_point deadline,
                    std::chrono::milliseconds per_address) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_family = AF_UNSPEC;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &found);
  if (rc != 0) throw SocketError(Kind::kFailed, std::string("cannot resolve host: ") + ::gai_strerror(rc), 0);
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> list(found, &::freeaddrinfo);
  SocketError last = failed("socket", EAFNOSUPPORT);
  for (const addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    UniqueFd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol));
    if (!fd) {
      last = failed("socket", errno);
      continue;
    }
    // Compared in milliseconds: per_address may be milliseconds::max(), which overflows
    // in the clock's nanoseconds.
    const auto now = SocketClock::now();
    const bool capped = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now) > per_address;
    const auto attempt_deadline = capped ? now + per_address : deadline;
    try {
      connectWithin(fd.get(), ai->ai_addr, ai->ai_addrlen, attempt_deadline);
      return fd;
    } catch (const SocketError& e) {
      last = e;
    }
  }
  throw last;
}

}  // namespace ddprun
