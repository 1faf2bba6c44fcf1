// Helpers for the store tests: frame encoders in torch's wire format, a raw socket for
// sending what no well-behaved client would, and an in-process server plus client
// options with short, bounded timeouts.
#pragma once

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "common/socket_io.h"
#include "rendezvous/store/store_server.h"
#include "rendezvous/store/tcp_store_client.h"
#include "rendezvous/store/wire_protocol.h"
#include "tests/support/manual_clock.h"

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
    try {
      fd_ = connectTcp("127.0.0.1", std::to_string(port), Clock::now() + 5s);
    } catch (const SocketError& e) {
      throw std::runtime_error(std::string("connect to the store failed: ") + e.what());
    }
    int one = 1;
    ::setsockopt(fd_.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }

  // Sends everything within `timeout`; false when the peer is gone or it did not fit in time.
  bool send(const std::string& bytes, std::chrono::milliseconds timeout = 5s) {
    try {
      sendAll(fd_.get(), bytes, Clock::now() + timeout);
      return true;
    } catch (const SocketError&) {
      return false;
    }
  }

  // Exactly `n` bytes within `timeout`, or nothing (closed, reset or timed out).
  std::optional<std::string> read(size_t n, std::chrono::milliseconds timeout = 5s) {
    std::string out(n, '\0');
    try {
      recvAll(fd_.get(), std::as_writable_bytes(std::span(out)), Clock::now() + timeout);
      return out;
    } catch (const SocketError&) {
      return std::nullopt;
    }
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
    try {
      while (waitReady(fd_.get(), POLLIN, deadline)) recvSome(fd_.get(), std::as_writable_bytes(std::span(buf)));
    } catch (const SocketError&) {
      return true;  // the end of the stream, or a reset
    }
    return false;
  }

  // True when nothing arrives and the connection stays open for `period`.
  bool quietFor(std::chrono::milliseconds period) { return !waitReady(fd_.get(), POLLIN, Clock::now() + period); }

  int fd() const { return fd_.get(); }

  void close() { fd_.reset(); }

 private:
  UniqueFd fd_;
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

// Moves a store server's manual clock on by `duration` as time passing would: each sweep of
// stalled requests that falls due on the way runs at its own time (the server's sweeper is
// the one thread waiting on the clock), and this returns once the last of them is done. False
// when the sweeper is not seen waiting within 30 s of real time (the test should fail).
inline bool passTime(ddprun::testing::ManualClock& clock, Clock::duration duration) {
  const auto target = clock.now() + duration;
  // The sweeper waits again, on a deadline after now, once the sweep it woke for is done.
  const auto swept = [&] {
    const auto next = clock.nextDeadline();
    return next && *next > clock.now();
  };
  for (;;) {
    if (!clock.awaitSleepers(1, swept)) return false;
    if (*clock.nextDeadline() > target) break;
    clock.advanceToNextDeadline();
  }
  clock.advance(target - clock.now());
  return true;
}

}  // namespace ddprun::rendezvous::testing
