#include "worker_runtime/transport/tcp_mesh.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include <fmt/format.h>

namespace ddprun::runtime {
namespace {

constexpr uint32_t kHelloMagic = 0xDD9A11E5;

struct Hello {
  uint32_t magic;
  int32_t rank;
  uint8_t channel;
};

int remainingMs(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<int64_t>(left, 1 << 30));
}

void tune(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  // Socket buffers are left to the kernel's autotuning (up to tcp_rmem's maximum):
  // setting them by hand would switch autotuning off and cap them lower.
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
}

// Blocking-with-deadline exact write/read for the small hello frames.
void writeExact(int fd, const void* data, size_t bytes, Clock::time_point deadline, const std::string& peer) {
  auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = ::send(fd, p, bytes, MSG_NOSIGNAL);
    if (n > 0) {
      p += n;
      bytes -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd pfd{fd, POLLOUT, 0};
      if (::poll(&pfd, 1, remainingMs(deadline)) == 0) throw PeerError("connecting to " + peer + ": timed out");
      continue;
    }
    throw PeerError("connecting to " + peer + ": " + std::strerror(errno));
  }
}

void readExact(int fd, void* data, size_t bytes, Clock::time_point deadline, const std::string& peer) {
  auto* p = static_cast<char*>(data);
  while (bytes > 0) {
    ssize_t n = ::recv(fd, p, bytes, 0);
    if (n > 0) {
      p += n;
      bytes -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) throw PeerError("handshake with " + peer + ": connection closed");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      pollfd pfd{fd, POLLIN, 0};
      if (::poll(&pfd, 1, remainingMs(deadline)) == 0) throw PeerError("handshake with " + peer + ": timed out");
      continue;
    }
    throw PeerError("handshake with " + peer + ": " + std::strerror(errno));
  }
}

int connectTo(const std::string& address, Clock::time_point deadline, const std::string& peer) {
  auto colon = address.rfind(':');
  std::string host = address.substr(0, colon);
  std::string port = address.substr(colon + 1);
  if (!host.empty() && host.front() == '[') host = host.substr(1, host.size() - 2);
  auto backoff = std::chrono::milliseconds(5);
  for (;;) {
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    if (::getaddrinfo(host.c_str(), port.c_str(), &hints, &found) == 0) {
      for (addrinfo* ai = found; ai; ai = ai->ai_next) {
        int fd = ::socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) continue;
        if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
          ::freeaddrinfo(found);
          return fd;
        }
        ::close(fd);
      }
      ::freeaddrinfo(found);
    }
    if (Clock::now() + backoff >= deadline) throw PeerError("cannot connect to " + peer + " at " + address);
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
  }
}

}  // namespace

TcpMesh::TcpMesh(rendezvous::Store& store, const std::string& prefix, int rank, int size, const std::string& address,
                 std::chrono::milliseconds timeout)
    : rank_(rank), size_(size), addresses_(size), collective_fds_(size, -1), p2p_fds_(size, -1) {
  const auto deadline = Clock::now() + timeout;
  if (size == 1) return;
  // Listen on this rank's address, on a port the kernel picks.
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (::getaddrinfo(address.c_str(), "0", &hints, &found) != 0 || !found) {
    throw PeerError("rank " + std::to_string(rank) + ": cannot resolve its own address '" + address + "'");
  }
  int listener = ::socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listener < 0 || ::bind(listener, found->ai_addr, found->ai_addrlen) != 0 || ::listen(listener, 2 * size) != 0) {
    int err = errno;
    ::freeaddrinfo(found);
    if (listener >= 0) ::close(listener);
    throw PeerError("rank " + std::to_string(rank) + ": cannot listen on " + address + ": " + std::strerror(err));
  }
  ::freeaddrinfo(found);
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&bound), &len);
  int port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                               : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  const bool v6 = address.find(':') != std::string::npos;
  addresses_[rank] = (v6 ? "[" + address + "]" : address) + ":" + std::to_string(port);
  store.set(prefix + "addr/" + std::to_string(rank), addresses_[rank]);

  try {
    // Connect to every lower rank, twice (one socket per channel).
    for (int peer = 0; peer < rank; ++peer) {
      addresses_[peer] = store.get(prefix + "addr/" + std::to_string(peer));
      const std::string name = fmt::format("rank {} ({})", peer, addresses_[peer]);
      for (Channel channel : {Channel::kCollective, Channel::kPointToPoint}) {
        int fd = connectTo(addresses_[peer], deadline, name);
        Hello hello{kHelloMagic, rank, static_cast<uint8_t>(channel)};
        writeExact(fd, &hello, sizeof hello, deadline, name);
        tune(fd);
        (channel == Channel::kCollective ? collective_fds_ : p2p_fds_)[peer] = fd;
      }
    }
    // Accept every higher rank's two connections.
    int expected = 2 * (size - 1 - rank);
    while (expected > 0) {
      pollfd pfd{listener, POLLIN, 0};
      if (::poll(&pfd, 1, remainingMs(deadline)) == 0) {
        std::string missing;
        for (int peer = rank + 1; peer < size; ++peer) {
          if (collective_fds_[peer] < 0 || p2p_fds_[peer] < 0) missing += " " + std::to_string(peer);
        }
        throw PeerError(fmt::format("rank {}: ranks{} did not connect within {} ms", rank, missing, timeout.count()));
      }
      int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      Hello hello{};
      readExact(fd, &hello, sizeof hello, deadline, "a connecting peer");
      if (hello.magic != kHelloMagic || hello.rank <= rank || hello.rank >= size || hello.channel > 1) {
        ::close(fd);  // not one of ours
        continue;
      }
      auto& slot = (hello.channel == 0 ? collective_fds_ : p2p_fds_)[hello.rank];
      if (slot >= 0) ::close(slot);
      slot = fd;
      tune(fd);
      --expected;
    }
    for (int peer = rank + 1; peer < size; ++peer) {
      addresses_[peer] = store.get(prefix + "addr/" + std::to_string(peer));
    }
  } catch (...) {
    ::close(listener);
    for (int fd : collective_fds_) if (fd >= 0) ::close(fd);
    for (int fd : p2p_fds_) if (fd >= 0) ::close(fd);
    throw;
  }
  ::close(listener);
}

TcpMesh::~TcpMesh() {
  for (int fd : collective_fds_) if (fd >= 0) ::close(fd);
  for (int fd : p2p_fds_) if (fd >= 0) ::close(fd);
}

int TcpMesh::fd(int peer, Channel channel) const {
  return (channel == Channel::kCollective ? collective_fds_ : p2p_fds_)[peer];
}

void TcpMesh::exchange(std::span<Transfer> transfers, Clock::time_point deadline, const char* what) {
  std::vector<pollfd> fds;
  std::vector<Transfer*> owners;
  auto fail = [&](const Transfer& t, const std::string& why) {
    throw PeerError(fmt::format("{}: {} rank {} ({}) {}", what, t.send ? "sending to" : "receiving from", t.peer,
                                addresses_[t.peer], why));
  };
  size_t pending = 0;
  for (auto& t : transfers) {
    t.done = 0;
    if (t.bytes > 0) ++pending;
  }
  while (pending > 0) {
    fds.clear();
    owners.clear();
    for (auto& t : transfers) {
      if (t.done == t.bytes) continue;
      fds.push_back({collective_fds_[t.peer], static_cast<short>(t.send ? POLLOUT : POLLIN), 0});
      owners.push_back(&t);
    }
    int ready = ::poll(fds.data(), fds.size(), remainingMs(deadline));
    if (ready == 0) fail(*owners.front(), "timed out (peer hung or dead?)");
    if (ready < 0) {
      if (errno == EINTR) continue;
      fail(*owners.front(), std::string("poll failed: ") + std::strerror(errno));
    }
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      Transfer& t = *owners[i];
      // Drain as much as the socket takes now; other transfers get their turn next loop.
      while (t.done < t.bytes) {
        char* base = static_cast<char*>(t.data) + t.done;
        size_t want = t.bytes - t.done;
        ssize_t n = t.send ? ::send(fds[i].fd, base, want, MSG_NOSIGNAL) : ::recv(fds[i].fd, base, want, 0);
        if (n > 0) {
          size_t before = t.done;
          t.done += static_cast<size_t>(n);
          if (!t.send && t.on_progress &&
              (t.done == t.bytes || t.progress_step == 0 || t.done / t.progress_step != before / t.progress_step)) {
            t.on_progress(t.done);
          }
          continue;
        }
        if (n == 0) fail(t, "closed the connection (peer died?)");
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        fail(t, std::strerror(errno));
      }
      if (t.done == t.bytes) --pending;
    }
  }
}

}  // namespace ddprun::runtime
