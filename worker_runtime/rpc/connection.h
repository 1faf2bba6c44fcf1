// One TCP connection between two workers, in one direction: the caller's outbound
// connection carries its requests and their replies, the callee's inbound one the same
// bytes from the other end. Reading is asynchronous on the agent's I/O thread: an inbound
// connection first runs the callee's side of the handshake (auth.h), then every connection
// reads messages (header, metadata, tensors straight into their storage with scatter
// reads) and hands each whole message to the agent, in arrival order. Writing is
// synchronous on the thread that has the message (one gathering sendmsg).
//
// A connection fails once (lost, stalled, malformed input, refused handshake): it records
// the reason, stops reading and tells the agent, which fails the calls pending on it.
//
// Thread-safety: write(), close(), broken(), brokenReason(), authenticated(), outbound()
// and opened() may be called from any thread (writes are serialized by the connection's
// write mutex). start(), fail() and checkDeadline() run on the I/O thread only, and so
// does peer() on an inbound connection (its handshake sets it there).
#pragma once

// First: Boost 1.74's asio/awaitable.hpp uses std::exchange without including <utility>, which
// GCC 13's <atomic> no longer brings in (the GPU machine's compiler).
#include <utility>

#include <atomic>
#include <boost/asio.hpp>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "worker_runtime/rpc/auth.h"
#include "worker_runtime/rpc/message_codec.h"
#include "worker_runtime/rpc/rpc.h"
#include "worker_runtime/rpc/wire.h"

namespace ddprun::rpc::detail {

class RpcAgent;

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  using tcp = boost::asio::ip::tcp;

  // Outbound connections are authenticated before they are made (RpcAgent::connectionTo);
  // inbound ones run the callee's side of the handshake first and learn their peer from it.
  Connection(RpcAgent& agent, tcp::socket socket, int peer, bool outbound);

  // I/O thread: starts reading (the handshake first on an inbound connection).
  void start();
  // Writes the whole message; blocks while the socket is full. Throws PeerError when the
  // connection is broken, RpcTimeout past `deadline`. Thread-safe.
  void write(const OutMessage& m, Clock::time_point deadline);
  // Shuts the socket down (reads end with an error on the I/O thread). Thread-safe.
  void close();
  // I/O thread: fails the connection (once): records the reason and tells the agent.
  void fail(const std::string& reason);
  // I/O thread: closes the connection when its handshake or the message it is reading
  // made no progress in time (a stalled or partial message must not hold it forever).
  void checkDeadline(Clock::time_point now) {
    if (deadline_ && now > *deadline_) fail(deadline_reason_);
  }
  // The peer's rank (-1 on an inbound connection until it authenticated).
  int peer() const { return peer_; }
  bool outbound() const { return outbound_; }
  bool authenticated() const { return authenticated_.load(); }
  Clock::time_point opened() const { return opened_; }
  bool broken() const { return broken_.load(); }
  std::string brokenReason() {
    std::lock_guard lock(reason_mutex_);
    return reason_;
  }

 private:
  void readHello();
  void readProof();
  void readHeader();
  void readHeaderPart();
  void checkHeader();
  void readMeta();
  void parseTable();
  void readTensorBatch();
  void readBatch();
  void deliver();
  void progress(const char* what);
  bool lost(const boost::system::error_code& ec);

  RpcAgent& agent_;
  tcp::socket socket_;
  int fd_ = -1;
  int peer_;
  bool outbound_;
  std::atomic<bool> authenticated_;
  Clock::time_point opened_;
  std::mutex write_mutex_;
  std::atomic<bool> closed_{false};
  std::atomic<bool> broken_{false};
  std::atomic<bool> failed_{false};
  std::mutex reason_mutex_;
  std::string reason_;
  // Reader state (I/O thread only).
  std::optional<Clock::time_point> deadline_;
  std::string deadline_reason_;
  auth::ClientHello hello_;
  auth::ServerHello server_hello_;
  auth::ClientProof proof_;
  uint8_t verdict_ = auth::kAccepted;
  std::string client_nonce_, server_nonce_;
  wire::Header header_;
  size_t header_received_ = 0;
  std::string meta_;
  size_t meta_received_ = 0;
  std::vector<TensorSpec> specs_;
  size_t next_tensor_ = 0;
  uint64_t tensor_received_ = 0;
  std::vector<boost::asio::mutable_buffer> batch_;
  size_t batch_index_ = 0;
  std::vector<at::Tensor> in_tensors_;
  size_t body_offset_ = 0;
};

}  // namespace ddprun::rpc::detail
