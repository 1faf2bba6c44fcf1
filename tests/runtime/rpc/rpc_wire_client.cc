#include "tests/runtime/rpc/rpc_wire_client.h"

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <span>
#include <stdexcept>

#include "common/socket_io.h"
#include "worker_runtime/rpc/auth.h"

namespace ddprun::testing::rpcwire {
namespace {

SocketClock::time_point within(std::chrono::milliseconds wait) { return SocketClock::now() + wait; }

void recvInto(int fd, void* data, size_t size, SocketClock::time_point deadline) {
  recvAll(fd, std::span(static_cast<std::byte*>(data), size), deadline);
}

std::string bytes(const uint8_t* p, size_t n) { return std::string(reinterpret_cast<const char*>(p), n); }

}  // namespace

std::string requestMeta(const std::string& func, const std::vector<std::string>& args) {
  return pod(uint32_t{0}) + str(func) + pod(int64_t{-1}) + pod(int64_t{-1}) + pod(int64_t{-1}) + listValue(args);
}

std::string frame(rpc::wire::Kind kind, int32_t src, uint64_t id, const std::string& meta,
                  const std::string& tensor_bytes) {
  rpc::wire::Header h;
  h.kind = static_cast<uint8_t>(kind);
  h.src = src;
  h.id = id;
  h.meta_bytes = static_cast<uint32_t>(meta.size());
  h.tensor_bytes = tensor_bytes.size();
  return pod(h) + meta + tensor_bytes;
}

UniqueFd connectTo(const std::string& host, int port) {
  try {
    return connectTcp(host, std::to_string(port), within(kWait));
  } catch (const SocketError& e) {
    throw std::runtime_error("connect to " + host + ":" + std::to_string(port) + ": " + e.what());
  }
}

void sendAll(int fd, const std::string& data) { ddprun::sendAll(fd, data, within(kWait)); }

bool closedByPeer(int fd, std::chrono::milliseconds wait) {
  const auto deadline = within(wait);
  std::byte buf[4096];
  try {
    for (;;) {
      if (recvSome(fd, buf) > 0) continue;                 // whatever the peer still sends (a handshake answer)
      if (!waitReady(fd, POLLIN, deadline)) return false;  // still open at the deadline
    }
  } catch (const SocketError& e) {
    return e.peerClosed() || e.code() == ECONNRESET;
  }
}

void handshake(int fd, const std::string& secret, int caller, int callee) {
  const auto deadline = within(kWait);
  rpc::auth::ClientHello hello;
  hello.src = caller;
  hello.dst = callee;
  const std::string cn = rpc::auth::randomNonce();
  std::memcpy(hello.nonce, cn.data(), cn.size());
  ddprun::sendAll(fd, pod(hello), deadline);
  rpc::auth::ServerHello answer;
  recvInto(fd, &answer, sizeof answer, deadline);
  const std::string sn = bytes(answer.nonce, rpc::auth::kNonceBytes);
  if (bytes(answer.proof, rpc::auth::kProofBytes) != rpc::auth::serverProof(secret, caller, callee, cn, sn)) {
    throw std::runtime_error("the worker's proof is wrong");
  }
  ddprun::sendAll(fd, rpc::auth::clientProof(secret, caller, callee, cn, sn), deadline);
  uint8_t verdict = 0;
  recvInto(fd, &verdict, 1, deadline);
  if (verdict != rpc::auth::kAccepted) throw std::runtime_error("handshake refused");
}

int serveHandshake(int fd, const std::string& secret, int callee, std::chrono::milliseconds wait) {
  const auto deadline = within(wait);
  rpc::auth::ClientHello hello;
  recvInto(fd, &hello, sizeof hello, deadline);
  if (hello.magic != rpc::auth::kHelloMagic || hello.dst != callee) throw std::runtime_error("bad client hello");
  const std::string cn = bytes(hello.nonce, rpc::auth::kNonceBytes);
  const std::string sn = rpc::auth::randomNonce();
  rpc::auth::ServerHello answer;
  answer.src = callee;
  std::memcpy(answer.nonce, sn.data(), sn.size());
  const std::string proof = rpc::auth::serverProof(secret, hello.src, callee, cn, sn);
  std::memcpy(answer.proof, proof.data(), proof.size());
  ddprun::sendAll(fd, pod(answer), deadline);
  rpc::auth::ClientProof client;
  recvInto(fd, &client, sizeof client, deadline);
  if (bytes(client.proof, rpc::auth::kProofBytes) != rpc::auth::clientProof(secret, hello.src, callee, cn, sn)) {
    throw std::runtime_error("the caller's proof is wrong");
  }
  ddprun::sendAll(fd, std::string(1, static_cast<char>(rpc::auth::kAccepted)), deadline);
  return hello.src;
}

Message readMessage(int fd) {
  const auto deadline = within(kWait);
  Message m;
  recvInto(fd, &m.header, sizeof m.header, deadline);
  if (m.header.magic != rpc::wire::kMagic) throw std::runtime_error("bad magic in a reply");
  std::string meta(m.header.meta_bytes, '\0');
  recvInto(fd, meta.data(), meta.size(), deadline);
  std::string tensors(m.header.tensor_bytes, '\0');
  recvInto(fd, tensors.data(), tensors.size(), deadline);
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
