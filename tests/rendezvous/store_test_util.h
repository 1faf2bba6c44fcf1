// Helpers for the store tests: frame encoders in torch's wire format, a raw socket for
// sending what no well-behaved client would, and an in-process server plus client
// options with short, bounded timeouts.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "rendezvous/store_server.h"
#include "rendezvous/tcp_store_client.h"
#include "rendezvous/wire_protocol.h"

namespace ddprun::rendezvous::testing {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// Builds one request (or several back to back) byte by byte, little-endian.
class Frame {
 public:
  Frame() = default;
  explicit Frame(wire::Command command) { u8(static_cast<uint8_t>(command)); }
  explicit Frame(wire::LegacyCommand command) { u8(static_cast<uint8_t>(command)); }

  Frame& u8(uint8_t v) { return raw(&v, sizeof v); }
  Frame& u32(uint32_t v) { return raw(&v, sizeof v); }
  Frame& u64(uint64_t v) { return raw(&v, sizeof v); }
  Frame& i64(int64_t v) { return raw(&v, sizeof v); }
  Frame& str(std::string_view s) {
    u64(s.size());
    bytes_.append(s);
    return *this;
  }
  Frame& bytes(std::string_view s) {
    bytes_.append(s);
    return *this;
  }
  Frame& keys(const std::vector<std::string>& ks) {
    u64(ks.size());
    for (const auto& k : ks) str(k);
    return *this;
  }

  const std::string& data() const { return bytes_; }
  size_t size() const { return bytes_.size(); }
  operator std::string() const { return bytes_; }

 private:
  Frame& raw(const void* p, size_t n) {
    bytes_.append(static_cast<const char*>(p), n);
    return *this;
  }
  std::string bytes_;
};

inline std::string validateFrame() { return Frame(wire::Command::kValidate).u32(wire::kValidationMagic); }

// A plain TCP connection to the server on 127.0.0.1, for hostile and hand-made input.
class RawConnection {
 public:
  explicit RawConnection(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) throw std::runtime_error("socket failed");
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      int err = errno;
      ::close(fd_);
      throw std::runtime_error(std::string("connect to the store failed: ") + std::strerror(err));
    }
    int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  ~RawConnection() { close(); }
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;

  // Sends everything within `timeout`; false when the peer is gone or it did not fit in time.
  bool send(const std::string& bytes, std::chrono::milliseconds timeout = 5s) {
    const auto deadline = Clock::now() + timeout;
    size_t sent = 0;
    while (sent < bytes.size()) {
      ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        sent += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (!pollFor(POLLOUT, deadline)) return false;
        continue;
      }
      return false;
    }
    return true;
  }

  // Exactly `n` bytes within `timeout`, or nothing (closed, reset or timed out).
  std::optional<std::string> read(size_t n, std::chrono::milliseconds timeout = 5s) {
    const auto deadline = Clock::now() + timeout;
    std::string out(n, '\0');
    size_t got = 0;
    while (got < n) {
      if (!pollFor(POLLIN, deadline)) return std::nullopt;
      ssize_t r = ::recv(fd_, out.data() + got, n - got, MSG_DONTWAIT);
      if (r > 0) {
        got += static_cast<size_t>(r);
      } else if (r == 0 || (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK)) {
        return std::nullopt;
      }
    }
    return out;
  }

  template <class T>
  std::optional<T> readValue(std::chrono::milliseconds timeout = 5s) {
    auto bytes = read(sizeof(T), timeout);
    if (!bytes) return std::nullopt;
    T value;
    std::memcpy(&value, bytes->data(), sizeof value);
    return value;
  }

  std::optional<std::string> readBytes(std::chrono::milliseconds timeout = 5s) {
    auto length = readValue<uint64_t>(timeout);
    if (!length || *length > (1u << 30)) return std::nullopt;
    return read(static_cast<size_t>(*length), timeout);
  }

  // True when the server closes (EOF or reset) within `timeout`; bytes before that are dropped.
  bool closedByPeerWithin(std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    char buf[4096];
    for (;;) {
      if (!pollFor(POLLIN, deadline)) return false;
      ssize_t r = ::recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
      if (r == 0) return true;
      if (r < 0 && errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK) return true;
    }
  }

  // True when nothing arrives and the connection stays open for `period`.
  bool quietFor(std::chrono::milliseconds period) {
    pollfd p{fd_, POLLIN, 0};
    return ::poll(&p, 1, static_cast<int>(period.count())) == 0;
  }

  int fd() const { return fd_; }

  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  bool pollFor(short events, Clock::time_point deadline) {
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left < 0) left = 0;
      pollfd p{fd_, events, 0};
      int r = ::poll(&p, 1, static_cast<int>(left));
      if (r > 0) return true;
      if (r == 0) return false;
      if (errno != EINTR) return false;
    }
  }

  int fd_ = -1;
};

inline StoreServerOptions localServerOptions() {
  StoreServerOptions options;
  options.host = "127.0.0.1";
  options.port = 0;
  return options;
}

// Short timeouts so that a broken server fails a test instead of hanging it.
inline StoreClientOptions clientOptions(int port, std::string token = "") {
  StoreClientOptions options;
  options.host = "127.0.0.1";
  options.port = port;
  options.timeout = 10s;
  options.connect_timeout = 5s;
  options.token = std::move(token);
  return options;
}

}  // namespace ddprun::rendezvous::testing
