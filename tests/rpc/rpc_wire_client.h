// The RPC wire protocol spoken by hand, for tests that play a peer (or a stranger):
// blocking sockets with receive timeouts, frames built byte by byte from
// worker_runtime/rpc/wire.h, and both sides of the handshake from rpc/auth.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "worker_runtime/rpc/wire.h"

namespace ddprun::testing::rpcwire {

// Value tags of the body (worker_runtime/rpc/rpc.cc).
enum Tag : uint8_t { kNone = 0, kBool, kInt, kDouble, kString, kTensor, kList, kRRef };

template <class T>
std::string pod(const T& v) {
  return std::string(reinterpret_cast<const char*>(&v), sizeof v);
}
inline std::string str(const std::string& s) { return pod(static_cast<uint32_t>(s.size())) + s; }
inline std::string intValue(int64_t v) { return pod(kInt) + pod(v); }
inline std::string stringValue(const std::string& s) { return pod(kString) + str(s); }
inline std::string rrefValue(int32_t owner, int64_t creator, int64_t serial) {
  return pod(kRRef) + pod(owner) + pod(creator) + pod(serial);
}
inline std::string listValue(const std::vector<std::string>& items) {
  std::string out = pod(kList) + pod(static_cast<uint32_t>(items.size()));
  for (const auto& i : items) out += i;
  return out;
}

// A request's metadata: no tensors, then function, context, RRef id and arguments.
std::string requestMeta(const std::string& func, const std::vector<std::string>& args);
// A whole frame: header + metadata (+ tensor bytes).
std::string frame(rpc::wire::Kind kind, int32_t src, uint64_t id, const std::string& meta,
                  const std::string& tensor_bytes = "");

// A blocking loopback connection whose reads give up after 20 s.
int connectTo(const std::string& host, int port);
void sendAll(int fd, const std::string& bytes);
// True when the peer closed the connection (EOF or reset) within the fd's receive timeout.
bool closedByPeer(int fd);

// The caller's side of the handshake as rank `caller` to rank `callee`; throws on refusal.
void handshake(int fd, const std::string& secret, int caller, int callee);
// The callee's side on an accepted connection; returns the caller's rank; throws on failure.
int serveHandshake(int fd, const std::string& secret, int callee);

struct Message {
  rpc::wire::Header header;
  std::string body;  // the metadata after the tensor table (no tensors expected)
};
// Reads one message; throws when the connection closes first.
Message readMessage(int fd);
// The int in a response body ("1 int"); throws on other shapes.
int64_t intResult(const Message& m);
// The text of an error reply.
std::string errorText(const Message& m);

}  // namespace ddprun::testing::rpcwire
