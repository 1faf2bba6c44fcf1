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

#include "common/socket_io.h"

namespace ddprun::runtime {
namespace {

constexpr uint32_t kHelloMagic = 0xDD9A11E5;

struct Hello {
  uint32_t magic;
  int32_t rank;
  uint8_t channel;
};

void tune(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  // Socket buffers are left to the kernel's autotuning (up to tcp_rmem's maximum):
  // setting them by hand would switch autotuning off and cap them lower.
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
}

// The mesh's words for a failed socket call: "timed out", `closed`, or strerror alone.
std::string reason(const SocketError& e, const char* closed) {
  if (e.timedOut()) return "timed out";
  if (e.peerClosed()) return closed;
  return std::strerror(e.code());
}

void sendHello(int fd, const Hello& hello, Clock::time_point deadline, const std::string& peer) {
  try {
    sendAll(fd, std::as_bytes(std::span(&hello, 1)), deadline);
  } catch (const SocketError& e) {
    throw PeerError("connecting to " + peer + ": " + reason(e, "connection closed"));
  }
}

// Bounded by the deadline even when the peer connects and then sends nothing: a stray
// connection once held the accepting rank in a blocking recv() for good.
Hello receiveHello(int fd, Clock::time_point deadline, const std::string& peer) {
  Hello hello{};
  try {
    recvAll(fd, std::as_writable_bytes(std::span(&hello, 1)), deadline);
  } catch (const SocketError& e) {
    throw PeerError("handshake with " + peer + ": " + reason(e, "connection closed"));
  }
  return hello;
}

UniqueFd connectTo(const std::string& address, Clock::time_point deadline, const std::string& peer) {
  auto colon = address.rfind(':');
  std::string host = address.substr(0, colon);
  std::string port = address.substr(colon + 1);
  if (!host.empty() && host.front() == '[') host = host.substr(1, host.size() - 2);
  auto backoff = std::chrono::milliseconds(5);
  for (;;) {
    try {
      return connectTcp(host, port, deadline);
    } catch (const SocketError&) {
      // Not listening yet (or not reachable yet): try again until the deadline.
    }
    if (Clock::now() + backoff >= deadline) throw PeerError("cannot connect to " + peer + " at " + address);
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
  }
}

}  // namespace

TcpMesh::TcpMesh(rendezvous::Store& store, const std::string& prefix, int rank, int size, const std::string& address,
                 std::chrono::milliseconds timeout)
    : rank_(rank), size_(size), addresses_(size), collective_fds_(size), p2p_fds_(size) {
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
  UniqueFd listener(::socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!listener || ::bind(listener.get(), found->ai_addr, found->ai_addrlen) != 0 ||
      ::listen(listener.get(), 2 * size) != 0) {
    int err = errno;
    ::freeaddrinfo(found);
    throw PeerError("rank " + std::to_string(rank) + ": cannot listen on " + address + ": " + std::strerror(err));
  }
  ::freeaddrinfo(found);
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  ::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&bound), &len);
  int port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                               : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  const bool v6 = address.find(':') != std::string::npos;
  addresses_[rank] = (v6 ? "[" + address + "]" : address) + ":" + std::to_string(port);
  store.set(prefix + "addr/" + std::to_string(rank), addresses_[rank]);

  // Connect to every lower rank, twice (one socket per channel).
  for (int peer = 0; peer < rank; ++peer) {
    addresses_[peer] = store.get(prefix + "addr/" + std::to_string(peer));
    const std::string name = fmt::format("rank {} ({})", peer, addresses_[peer]);
    for (Channel channel : {Channel::kCollective, Channel::kPointToPoint}) {
      UniqueFd fd = connectTo(addresses_[peer], deadline, name);
      sendHello(fd.get(), Hello{kHelloMagic, rank, static_cast<uint8_t>(channel)}, deadline, name);
      tune(fd.get());
      (channel == Channel::kCollective ? collective_fds_ : p2p_fds_)[peer] = std::move(fd);
    }
  }
  // Accept every higher rank's two connections.
  int expected = 2 * (size - 1 - rank);
  while (expected > 0) {
    bool ready = false;
    try {
      ready = waitReady(listener.get(), POLLIN, deadline);
    } catch (const SocketError& e) {
      throw PeerError(fmt::format("rank {}: waiting for ranks to connect: {}", rank, e.what()));
    }
    if (!ready) {
      std::string missing;
      for (int peer = rank + 1; peer < size; ++peer) {
        if (!collective_fds_[peer] || !p2p_fds_[peer]) missing += " " + std::to_string(peer);
      }
      throw PeerError(fmt::format("rank {}: ranks{} did not connect within {} ms", rank, missing, timeout.count()));
    }
    UniqueFd fd(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!fd) continue;
    const Hello hello = receiveHello(fd.get(), deadline, "a connecting peer");
    if (hello.magic != kHelloMagic || hello.rank <= rank || hello.rank >= size || hello.channel > 1) {
      continue;  // not one of ours: closed as `fd` goes
    }
    tune(fd.get());
    (hello.channel == 0 ? collective_fds_ : p2p_fds_)[hello.rank] = std::move(fd);
    --expected;
  }
  for (int peer = rank + 1; peer < size; ++peer) {
    addresses_[peer] = store.get(prefix + "addr/" + std::to_string(peer));
  }
}

TcpMesh::~TcpMesh() = default;

int TcpMesh::fd(int peer, Channel channel) const {
  return (channel == Channel::kCollective ? collective_fds_ : p2p_fds_)[peer].get();
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
      fds.push_back({collective_fds_[t.peer].get(), static_cast<short>(t.send ? POLLOUT : POLLIN), 0});
      owners.push_back(&t);
    }
    int ready = ::poll(fds.data(), fds.size(), pollTimeoutMs(deadline));
    if (ready == 0) fail(*owners.front(), "timed out (peer hung or dead?)");
    if (ready < 0) {
      if (errno == EINTR) continue;
      fail(*owners.front(), std::string("poll failed: ") + std::strerror(errno));
    }
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      Transfer& t = *owners[i];
      // Drain as much as the socket takes now; other transfers get their turn next loop.
      try {
        while (t.done < t.bytes) {
          std::span<std::byte> rest(static_cast<std::byte*>(t.data) + t.done, t.bytes - t.done);
          const size_t n = t.send ? sendSome(fds[i].fd, rest) : recvSome(fds[i].fd, rest);
          if (n == 0) break;  // the socket would block
          size_t before = t.done;
          t.done += n;
          if (!t.send && t.on_progress &&
              (t.done == t.bytes || t.progress_step == 0 || t.done / t.progress_step != before / t.progress_step)) {
            t.on_progress(t.done);
          }
          // A short send means the socket's buffer is full: asking again only fails with
          // EAGAIN, and on loopback that failed call slowed large transfers by up to 20%
          // (3 ranks, 32-128 MiB broadcast). A short receive is no such sign: the sender
          // may be filling the buffer meanwhile.
          if (t.send && n < rest.size()) break;
        }
      } catch (const SocketError& e) {
        fail(t, reason(e, "closed the connection (peer died?)"));
      }
      if (t.done == t.bytes) --pending;
    }
  }
}

}  // namespace ddprun::runtime
