#include "tests/rpc/rpc_wire_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "worker_runtime/rpc/auth.h"

namespace ddprun::testing::rpcwire {
namespace {

void recvAll(int fd, void* data, size_t size) {
  auto* p = static_cast<char*>(data);
  while (size > 0) {
    const ssize_t n = ::recv(fd, p, size, 0);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      throw std::runtime_error(n == 0 ? "connection closed by the peer" : std::string("recv: ") + std::strerror(errno));
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
}

std::string bytes(const uint8_t* p, size_t n) { return std::string(reinterpret_cast<const char*>(p), n); }

}  // namespace

std::string requestMeta(const std::string& func, const std::vector<std::string>& args) {
  return pod(uint32_t{0}) + str(func) + pod(int64_t{-1}) + pod(int64_t{-1}) + pod(int64_t{-1}) + listValue(args);
}

std::string frame(rpc::wire::Kind kind, int32_t src, uint64_t id, const std::string& meta, const std::string& tensor_bytes) {
  rpc::wire::Header h;
  h.kind = static_cast<uint8_t>(kind);
  h.src = src;
  h.id = id;
  h.meta_bytes = static_cast<uint32_t>(meta.size());
  h.tensor_bytes = tensor_bytes.size();
  return pod(h) + meta + tensor_bytes;
}

int connectTo(const std::string& host, int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error("socket failed");
  timeval tv{20, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, host.c_str(), &sa.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    const int err = errno;
    ::close(fd);
    throw std::runtime_error("connect to " + host + ":" + std::to_string(port) + ": " + std::strerror(err));
  }
  return fd;
}

void sendAll(int fd, const std::string& data) {
  size_t off = 0;
  while (off < data.size()) {
    const ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      throw std::runtime_error(std::string("send: ") + std::strerror(errno));
    }
    off += static_cast<size_t>(n);
  }
}

bool closedByPeer(int fd) {
  char buf[4096];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n == 0) return true;
    if (n > 0) continue;  // whatever the peer still sends (a handshake answer)
    if (errno == EINTR) continue;
    return errno == ECONNRESET;  // EAGAIN: the receive timeout passed with the connection open
  }
}

void handshake(int fd, const std::string& secret, int caller, int callee) {
  rpc::auth::ClientHello hello;
  hello.src = caller;
  hello.dst = callee;
  const std::string cn = rpc::auth::randomNonce();
  std::memcpy(hello.nonce, cn.data(), cn.size());
  sendAll(fd, pod(hello));
  rpc::auth::ServerHello answer;
  recvAll(fd, &answer, sizeof answer);
  const std::string sn = bytes(answer.nonce, rpc::auth::kNonceBytes);
  if (bytes(answer.proof, rpc::auth::kProofBytes) != rpc::auth::serverProof(secret, caller, callee, cn, sn)) {
    throw std::runtime_error("the worker's proof is wrong");
  }
  sendAll(fd, rpc::auth::clientProof(secret, caller, callee, cn, sn));
  uint8_t verdict = 0;
  recvAll(fd, &verdict, 1);
  if (verdict != rpc::auth::kAccepted) throw std::runtime_error("handshake refused");
}

int serveHandshake(int fd, const std::string& secret, int callee) {
  rpc::auth::ClientHello hello;
  recvAll(fd, &hello, sizeof hello);
  if (hello.magic != rpc::auth::kHelloMagic || hello.dst != callee) throw std::runtime_error("bad client hello");
  const std::string cn = bytes(hello.nonce, rpc::auth::kNonceBytes);
  const std::string sn = rpc::auth::randomNonce();
  rpc::auth::ServerHello answer;
  answer.src = callee;
  std::memcpy(answer.nonce, sn.data(), sn.size());
  const std::string proof = rpc::auth::serverProof(secret, hello.src, callee, cn, sn);
  std::memcpy(answer.proof, proof.data(), proof.size());
  sendAll(fd, pod(answer));
  rpc::auth::ClientProof client;
  recvAll(fd, &client, sizeof client);
  if (bytes(client.proof, rpc::auth::kProofBytes) != rpc::auth::clientProof(secret, hello.src, callee, cn, sn)) {
    throw std::runtime_error("the caller's proof is wrong");
  }
  sendAll(fd, std::string(1, static_cast<char>(rpc::auth::kAccepted)));
  return hello.src;
}

Message readMessage(int fd) {
  Message m;
  recvAll(fd, &m.header, sizeof m.header);
  if (m.header.magic != rpc::wire::kMagic) throw std::runtime_error("bad magic in a reply");
  std::string meta(m.header.meta_bytes, '\0');
  recvAll(fd, meta.data(), meta.size());
  std::string tensors(m.header.tensor_bytes, '\0');
  recvAll(fd, tensors.data(), tensors.size());
  uint32_t count = 0;
  std::memcpy(&count, meta.data(), sizeof count);
  if (count != 0) throw std::runtime_error("a reply with tensors");
  m.body = meta.substr(sizeof count);
  return m;
}

int64_t intResult(const Message& m) {
  if (m.header.kind != static_cast<uint8_t>(rpc::wire::Kind::kResponse)) {
    throw std::runtime_error("an error reply: " + errorText(m));
  }
  if (m.body.size() != 9 || m.body[0] != static_cast<char>(kInt)) throw std::runtime_error("not an int reply");
  int64_t v = 0;
  std::memcpy(&v, m.body.data() + 1, sizeof v);
  return v;
}

std::string errorText(const Message& m) {
  if (m.header.kind != static_cast<uint8_t>(rpc::wire::Kind::kError) || m.body.size() < 4) return "";
  uint32_t n = 0;
  std::memcpy(&n, m.body.data(), sizeof n);
  return m.body.substr(4, n);
}

}  // namespace ddprun::testing::rpcwire
