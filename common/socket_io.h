// Moving bytes over a socket with a deadline, written once for every hand-written socket
// in ddprun (the TCP mesh, the P2P engine, the store client, the health check, the test
// clients): partial writes, EINTR, EAGAIN, SIGPIPE and poll()'s remaining time live here.
// Sockets that Asio owns stay Asio's; connectWithin() takes a bare descriptor, so it serves
// those too.
//
// Every call is non-blocking underneath (MSG_DONTWAIT, a non-blocking connect), so the
// socket may be in either mode and no call waits past its deadline. Failures throw
// SocketError; its kind tells a timeout and a peer that closed from a failed call, so a
// caller can put them in its own words (the store's "the server closed the connection").
// Functions are as thread-safe as the system calls under them: one reader and one writer
// per socket at a time.
#pragma once

#include <poll.h>
#include <sys/socket.h>

#include <chrono>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>

#include "common/error.h"
#include "common/unique_fd.h"

namespace ddprun {

using SocketClock = std::chrono::steady_clock;

class SocketError : public DdprunError {
 public:
  enum class Kind {
    kTimedOut,    // the deadline passed first; what(): "timed out"
    kPeerClosed,  // the peer closed its end (end of stream); what(): "connection closed by the peer"
    kFailed,      // a call failed; what(): "<call> failed: <strerror>" or "cannot resolve host: ..."
  };
  SocketError(Kind kind, const std::string& what, int code);
  Kind kind() const { return kind_; }
  // The errno behind the error: the failed call's, ETIMEDOUT for a timeout, 0 for a closed
  // peer and for a name that did not resolve.
  int code() const { return code_; }
  bool timedOut() const { return kind_ == Kind::kTimedOut; }
  bool peerClosed() const { return kind_ == Kind::kPeerClosed; }

 private:
  Kind kind_;
  int code_;
};

// The timeout to give poll() to wait until `deadline`: rounded up to whole milliseconds
// (a poll that returns 0 has waited until the deadline), 0 once it has passed, at most
// 2^30 ms (poll takes an int), and -1 (no limit) for time_point::max().
int pollTimeoutMs(SocketClock::time_point deadline);

// Waits until `fd` is ready for `events` (POLLIN, POLLOUT), or has an error or hangup to
// report. Returns true then, false when the deadline passed first. Blocks up to the
// deadline; retries EINTR. Throws SocketError(kFailed) when poll itself fails.
bool waitReady(int fd, short events, SocketClock::time_point deadline);

// One send without blocking: returns how many bytes the socket took, 0 when its buffer is
// full (or `bytes` is empty). Retries EINTR; never raises SIGPIPE. Throws SocketError
// kFailed "send failed: ..." (EPIPE, ECONNRESET: the peer is gone).
size_t sendSome(int fd, std::span<const std::byte> bytes);

// One receive without blocking: returns how many bytes arrived, 0 when none are waiting
// (or `buffer` is empty). Retries EINTR. Throws SocketError kPeerClosed at the end of the
// stream, kFailed "receive failed: ..." on an error (ECONNRESET).
size_t recvSome(int fd, std::span<std::byte> buffer);

// Sends all of `bytes`, waiting for room until `deadline`. Blocks up to the deadline.
// Throws SocketError kTimedOut or kFailed ("send failed: ...", "poll failed: ..."); after a
// throw an unknown part has been sent, so the stream is out of step.
void sendAll(int fd, std::span<const std::byte> bytes, SocketClock::time_point deadline);
inline void sendAll(int fd, std::string_view bytes, SocketClock::time_point deadline) {
  sendAll(fd, std::as_bytes(std::span(bytes.data(), bytes.size())), deadline);
}

// Fills all of `buffer`, waiting for data until `deadline`. Blocks up to the deadline.
// Throws SocketError kTimedOut, kPeerClosed (the stream ended first) or kFailed; after a
// throw the buffer holds an unknown part of the data.
void recvAll(int fd, std::span<std::byte> buffer, SocketClock::time_point deadline);

// Connects `fd`, a socket of addr's family in either mode, to `addr` and leaves it
// non-blocking. Blocks up to `deadline`. Throws SocketError kTimedOut or kFailed
// ("connect failed: Connection refused").
void connectWithin(int fd, const sockaddr* addr, socklen_t length, SocketClock::time_point deadline);

// Resolves host:port (a name or a numeric IPv4/IPv6 address) and connects to the first of
// its addresses that accepts, trying each for at most `per_address` (a peer black-holing
// SYNs on its first address leaves time for the next) and all within `deadline`. One pass,
// no retry: a caller waiting for a server to come up retries with its own backoff.
// Returns a connected, non-blocking, close-on-exec socket. Throws SocketError: the last
// address's, as connectWithin() throws it, or kFailed "cannot resolve host: <why>".
UniqueFd connectTcp(const std::string& host, const std::string& port, SocketClock::time_point deadline,
                    std::chrono::milliseconds per_address = std::chrono::milliseconds::max());

}  // namespace ddprun
