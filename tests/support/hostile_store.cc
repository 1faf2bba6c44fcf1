#include "tests/support/hostile_store.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "common/error.h"

namespace ddprun::testing {
namespace {

constexpr uint64_t kMaxKeys = 1024;
constexpr uint64_t kMaxKeyBytes = 4096;

// Exactly `length` bytes, or false when the peer closed, failed or went quiet for 2 s
// (SO_RCVTIMEO), so that a client that stops sending never holds the store's thread.
bool readExactly(int fd, void* out, size_t length) {
  auto* p = static_cast<char*>(out);
  while (length > 0) {
    const ssize_t n = ::recv(fd, p, length, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    length -= static_cast<size_t>(n);
  }
  return true;
}

template <class T>
bool readValue(int fd, T& value) {
  return readExactly(fd, &value, sizeof value);
}

bool readKey(int fd, std::string& key) {
  uint64_t length = 0;
  if (!readValue(fd, length) || length > kMaxKeyBytes) return false;
  key.resize(length);
  return readExactly(fd, key.data(), length);
}

bool readKeys(int fd, std::vector<std::string>& keys) {
  uint64_t count = 0;
  if (!readValue(fd, count) || count > kMaxKeys) return false;
  keys.resize(count);
  for (auto& key : keys) {
    if (!readKey(fd, key)) return false;
  }
  return true;
}

void sendAllOrGiveUp(int fd, const std::string& bytes) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    sent += static_cast<size_t>(n);
  }
}

}  // namespace

HostileStore::HostileStore(Answer answer) : answer_(std::move(answer)) {
  listen_fd_ = UniqueFd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!listen_fd_) throw SystemError("hostile store: socket", errno);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (::bind(listen_fd_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(listen_fd_.get(), 16) != 0) {
    throw SystemError("hostile store: bind/listen on 127.0.0.1:0", errno);
  }
  socklen_t len = sizeof addr;
  ::getsockname(listen_fd_.get(), reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  thread_ = std::thread([this] { serve(); });
}

HostileStore::~HostileStore() {
  stop_ = true;
  thread_.join();
}

std::string HostileStore::value(uint64_t length, const std::string& bytes) {
  std::string out(reinterpret_cast<const char*>(&length), sizeof length);
  return out + bytes;
}

void HostileStore::serve() {
  while (!stop_) {
    pollfd p{listen_fd_.get(), POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    UniqueFd conn(::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!conn) continue;
    timeval quiet{2, 0};
    ::setsockopt(conn.get(), SOL_SOCKET, SO_RCVTIMEO, &quiet, sizeof quiet);
    serveConnection(conn.get());
  }
}

void HostileStore::serveConnection(int fd) {
  while (!stop_) {
    HostileRequest request;
    if (!readValue(fd, request.command)) return;
    bool framed = false;
    switch (request.command) {
      case 0: {  // VALIDATE: a magic number, no reply
        uint32_t magic = 0;
        if (!readValue(fd, magic)) return;
        continue;
      }
      case 3:  // GET
        request.keys.resize(1);
        framed = readKey(fd, request.keys[0]);
        break;
      case 5:   // CHECK
      case 6:   // WAIT
      case 10:  // MULTI_GET
        framed = readKeys(fd, request.keys);
        break;
      case 7:   // GET_NUM_KEYS
      case 17:  // LIST_KEYS
        framed = true;
        break;
      case 13: {  // PING
        uint32_t nonce = 0;
        framed = readValue(fd, nonce);
        break;
      }
      default: return;
    }
    if (!framed) return;
    ++requests_;
    const std::optional<HostileReply> reply = answer_(request);
    if (!reply) return;
    sendAllOrGiveUp(fd, reply->bytes);
    if (reply->then_close) return;
  }
}

}  // namespace ddprun::testing
