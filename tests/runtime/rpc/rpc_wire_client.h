// The RPC wire protocol spoken by hand, for tests that play a peer (or a stranger):
// sockets moved through common/socket_io.h, each call waiting for the worker at most kWait
// (a worker that stalls fails the test instead of hanging it), frames built byte by byte
// from worker_runtime/rpc/wire.h, and both sides of the handshake from rpc/auth.h.
// Errors of the sockets are SocketErrors ("connection closed by the peer", "timed out");
// the rest are std::runtime_errors. The functions keep no state.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "common/unique_fd.h"
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

// How long each call below waits for the worker.
inline constexpr std::chrono::seconds kWait{20};

// A connection to host:port (a numeric address), non-blocking. Throws std::runtime_error
// "connect to host:port: connect failed: <strerror>" when it is refused or times out.
UniqueFd connectTo(const std::string& host, int port);
// Sends all of `bytes` within kWait (the fd in either mode). Throws SocketError.
void sendAll(int fd, const std::string& bytes);
// Reads and drops what arrives until the peer closes; true when it closed the connection
// (end of stream or reset) within `within`, false when it is still open then.
bool closedByPeer(int fd, std::chrono::milliseconds within = kWait);

// The caller's side of the handshake as rank `caller` to rank `callee`; throws on refusal.
void handshake(int fd, const std::string& secret, int caller, int callee);
// The callee's side on an accepted connection (either mode), within `within`; returns the
// caller's rank; throws on failure.
int serveHandshake(int fd, const std::string& secret, int callee, std::chrono::milliseconds within = kWait);

struct Message {
  rpc::wire::Header header;
  std::string body;  // the metadata after the tensor table (no tensors expected)
};
// Reads one message within kWait; throws when the connection closes first.
Message readMessage(int fd);
// The int in a response body ("1 int"); throws on other shapes.
int64_t intResult(const Message& m);
// The text of an error reply.
std::string errorText(const Message& m);

}  // namespace ddprun::testing::rpcwire
