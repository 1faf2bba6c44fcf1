#include "bench/store_scale_clients.h"

#include <arpa/inet.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace ddprun::bench::store_scale {
namespace {

constexpr uint32_t kValidationMagic = 0x3C85F7CE;

// Command bytes of the two generations (rendezvous/store/wire_protocol.h, rendezvous/PROTOCOL.md).
struct Codes {
  uint8_t set, get, add, wait;
};
Codes codesOf(Wire wire) { return wire == Wire::kCurrent ? Codes{1, 3, 4, 6} : Codes{0, 2, 3, 5}; }

template <class T>
void put(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof value);
}
void putBytes(std::string& out, const std::string& bytes) {
  put<uint64_t>(out, bytes.size());
  out += bytes;
}

std::string keyOf(int rank) { return "rank/" + std::to_string(rank); }
// What a rank publishes at start-up: an address, as torch's ranks do.
std::string valueOf(int rank) {
  return "127.0.0.1:" + std::to_string(20000 + rank % 40000) + "/rank" + std::to_string(rank);
}

class ClientProcess {
 public:
  ClientProcess(int first_rank, int count, int world, int port, Wire wire, int64_t deadline_ns)
      : first_(first_rank), world_(world), port_(port), codes_(codesOf(wire)), wire_(wire), deadline_(deadline_ns) {
    clients_.resize(static_cast<size_t>(count));
  }

  ClientReport run() {
    epoll_ = epoll_create1(EPOLL_CLOEXEC);
    if (epoll_ < 0) return failAll(std::string("epoll_create1: ") + std::strerror(errno));
    for (size_t i = 0; i < clients_.size(); ++i) start(i);
    std::vector<epoll_event> events(1024);
    while (open_ > 0) {
      const int64_t left_ms = (deadline_ - nowNs()) / 1000000;
      if (left_ms <= 0) break;
      const int n = epoll_wait(epoll_, events.data(), static_cast<int>(events.size()), static_cast<int>(left_ms));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        error(std::string("epoll_wait: ") + std::strerror(errno));
        break;
      }
      for (int e = 0; e < n; ++e) onEvent(events[e].data.u32, events[e].events);
    }
    report_.unfinished = open_;
    return report_;
  }

 private:
  enum class Phase : uint8_t { kConnecting, kAdd, kWait, kGet, kDone, kFailed };
  struct Client {
    int fd = -1;
    Phase phase = Phase::kConnecting;
    std::string in;
    std::string out;
  };

  ClientReport failAll(const std::string& why) {
    error(why);
    report_.failed = static_cast<int32_t>(clients_.size());
    return report_;
  }

  void error(const std::string& why) {
    if (report_.first_error[0] == 0) std::snprintf(report_.first_error, sizeof report_.first_error, "%s", why.c_str());
  }

  int rankOf(size_t i) const { return first_ + static_cast<int>(i); }

  void start(size_t i) {
    Client& c = clients_[i];
    const int rank = rankOf(i);
    c.fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c.fd < 0) return fail(i, std::string("socket: ") + std::strerror(errno));
    ++open_;
    const int one = 1;
    setsockopt(c.fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
    setsockopt(c.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    sockaddr_in source{};
    source.sin_family = AF_INET;
    source.sin_addr.s_addr = sourceAddress(rank);
    if (::bind(c.fd, reinterpret_cast<sockaddr*>(&source), sizeof source) != 0) {
      return fail(i, "bind " + addressText(source.sin_addr.s_addr) + ": " + std::strerror(errno));
    }
    sockaddr_in server{};
    server.sin_family = AF_INET;
    server.sin_port = htons(static_cast<uint16_t>(port_));
    server.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(c.fd, reinterpret_cast<sockaddr*>(&server), sizeof server) != 0 && errno != EINPROGRESS) {
      return fail(i, std::string("connect: ") + std::strerror(errno));
    }
    epoll_event ev{};
    ev.events = EPOLLOUT;
    ev.data.u32 = static_cast<uint32_t>(i);
    if (epoll_ctl(epoll_, EPOLL_CTL_ADD, c.fd, &ev) != 0) fail(i, std::string("epoll_ctl: ") + std::strerror(errno));
  }

  void fail(size_t i, const std::string& why) {
    error("rank " + std::to_string(rankOf(i)) + ": " + why);
    ++report_.failed;
    finish(i, Phase::kFailed);
  }

  // The connection stays open until the process exits (torch's clients keep theirs), but is
  // no longer watched.
  void finish(size_t i, Phase phase) {
    Client& c = clients_[i];
    if (c.fd >= 0) {
      epoll_ctl(epoll_, EPOLL_CTL_DEL, c.fd, nullptr);
      if (phase == Phase::kFailed) {
        ::close(c.fd);
        c.fd = -1;
      }
      --open_;
    }
    c.phase = phase;
    std::string().swap(c.in);
    std::string().swap(c.out);
  }

  void watch(size_t i) {
    Client& c = clients_[i];
    epoll_event ev{};
    ev.events = EPOLLIN | (c.out.empty() ? 0u : static_cast<uint32_t>(EPOLLOUT));
    ev.data.u32 = static_cast<uint32_t>(i);
    epoll_ctl(epoll_, EPOLL_CTL_MOD, c.fd, &ev);
  }

  void send(size_t i, std::string bytes) {
    Client& c = clients_[i];
    const bool was_empty = c.out.empty();
    c.out += bytes;
    flush(i);
    if (c.phase != Phase::kFailed && was_empty != c.out.empty()) watch(i);
  }

  void flush(size_t i) {
    Client& c = clients_[i];
    while (!c.out.empty()) {
      const ssize_t n = ::send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      if (n < 0) return fail(i, std::string("send: ") + std::strerror(errno));
      c.out.erase(0, static_cast<size_t>(n));
    }
  }

  void onEvent(uint32_t i, uint32_t events) {
    Client& c = clients_[i];
    if (c.phase == Phase::kDone || c.phase == Phase::kFailed) return;
    if (c.phase == Phase::kConnecting) {
      int err = 0;
      socklen_t len = sizeof err;
      getsockopt(c.fd, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) return fail(i, std::string("connect: ") + std::strerror(err));
      if (!(events & EPOLLOUT)) return;
      c.phase = Phase::kAdd;
      report_.last_connect_ns = std::max(report_.last_connect_ns, nowNs());
      std::string request;
      if (wire_ == Wire::kCurrent) {
        put<uint8_t>(request, 0);
        put<uint32_t>(request, kValidationMagic);
      }
      const int rank = rankOf(i);
      put<uint8_t>(request, codes_.set);
      putBytes(request, keyOf(rank));
      putBytes(request, valueOf(rank));
      put<uint8_t>(request, codes_.add);
      putBytes(request, "count");
      put<int64_t>(request, 1);
      c.out = std::move(request);
      flush(i);
      if (c.phase != Phase::kFailed) watch(i);
      return;
    }
    if (events & EPOLLOUT) {
      flush(i);
      if (c.phase == Phase::kFailed) return;
      if (c.out.empty()) watch(i);
    }
    if (!(events & (EPOLLIN | EPOLLERR | EPOLLHUP))) return;
    char buffer[4096];
    for (;;) {
      const ssize_t n = ::recv(c.fd, buffer, sizeof buffer, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      if (n < 0) return fail(i, std::string("recv: ") + std::strerror(errno));
      if (n == 0) return fail(i, "the server closed the connection");
      c.in.append(buffer, static_cast<size_t>(n));
      if (static_cast<size_t>(n) < sizeof buffer) break;
    }
    advance(i);
  }

  // Consumes the replies that have arrived and sends the next request.
  void advance(uint32_t i) {
    Client& c = clients_[i];
    for (;;) {
      if (c.phase == Phase::kAdd) {
        if (c.in.size() < sizeof(int64_t)) return;
        int64_t total = 0;
        std::memcpy(&total, c.in.data(), sizeof total);
        c.in.erase(0, sizeof total);
        c.phase = Phase::kWait;
        report_.last_add_ns = std::max(report_.last_add_ns, nowNs());
        std::string request;
        if (total == world_) {
          put<uint8_t>(request, codes_.set);
          putBytes(request, "barrier");
          putBytes(request, "go");
        }
        put<uint8_t>(request, codes_.wait);
        put<uint64_t>(request, 1);
        putBytes(request, "barrier");
        send(i, std::move(request));
      } else if (c.phase == Phase::kWait) {
        if (c.in.empty()) return;
        if (c.in[0] != 0) return fail(i, "WAIT answered " + std::to_string(static_cast<uint8_t>(c.in[0])));
        c.in.erase(0, 1);
        c.phase = Phase::kGet;
        std::string request;
        put<uint8_t>(request, codes_.get);
        putBytes(request, keyOf((rankOf(i) + 1) % world_));
        send(i, std::move(request));
      } else if (c.phase == Phase::kGet) {
        if (c.in.size() < sizeof(uint64_t)) return;
        uint64_t len = 0;
        std::memcpy(&len, c.in.data(), sizeof len);
        if (c.in.size() < sizeof len + len) return;
        const bool right = c.in.compare(sizeof len, len, valueOf((rankOf(i) + 1) % world_)) == 0;
        report_.last_release_ns = std::max(report_.last_release_ns, nowNs());
        if (right) {
          ++report_.released;
        } else {
          ++report_.wrong;
          error("rank " + std::to_string(rankOf(i)) + ": wrong value for its peer's key");
        }
        return finish(i, Phase::kDone);
      } else {
        return;
      }
      if (c.phase == Phase::kFailed) return;
    }
  }

  int first_;
  int world_;
  int port_;
  Codes codes_;
  Wire wire_;
  int64_t deadline_;
  int epoll_ = -1;
  int open_ = 0;
  std::vector<Client> clients_;
  ClientReport report_;
};

}  // namespace

const char* wireName(Wire wire) { return wire == Wire::kCurrent ? "current" : "1.13"; }

int64_t nowNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

in_addr_t sourceAddress(int rank) {
  const uint32_t k = static_cast<uint32_t>(rank / kClientsPerAddress);
  const uint32_t host = (1u << 16) + (k / 254) * 256 + 1 + k % 254;
  return htonl((127u << 24) | host);
}

std::string addressText(in_addr_t address) {
  char text[INET_ADDRSTRLEN] = {};
  in_addr a{};
  a.s_addr = address;
  inet_ntop(AF_INET, &a, text, sizeof text);
  return text;
}

ClientReport runClients(int first_rank, int count, int world, int port, Wire wire, int64_t deadline_ns) {
  ClientProcess client(first_rank, count, world, port, wire, deadline_ns);
  return client.run();
}

}  // namespace ddprun::bench::store_scale
