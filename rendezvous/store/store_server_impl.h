// StoreServer's insides, private to rendezvous/: the server, which accepts, sweeps stalled
// requests and routes each request's effects to the connections they wake (store_server.cc),
// and one client's connection, which reads, parses and answers its requests
// (store_connection.cc), share these two classes.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <spdlog/spdlog.h>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>

#include "common/clock.h"
#include "common/fmt_extern.h"
#include "rendezvous/store/request_parser.h"
#include "rendezvous/store/store_server.h"
#include "rendezvous/store/store_state.h"

namespace ddprun::rendezvous {

// Complete requests are handled straight from one buffer the server shares (Impl::scratch_);
// a connection holds a buffer of its own only while a request of its is incomplete, so
// thousands of idle clients cost little.
inline constexpr size_t kStoreScratchBytes = 64 * 1024;

class StoreServer::Impl {
 public:
  using TimePoint = Clock::TimePoint;
  using tcp = boost::asio::ip::tcp;
  // One client's connection (store_connection.cc); as a nested class it reaches the server's
  // state, options and shared read buffer.
  class Connection;

  Impl(StoreServerOptions options, Clock& clock);
  ~Impl();
  int port() const { return port_; }
  size_t connectionCount() const { return connection_count_.load(); }
  size_t incompleteRequests() const { return incomplete_requests_.load(); }
  size_t waitingClients() const { return waiting_clients_.load(); }
  size_t pendingReplyBytes() const { return queued_bytes_seen_.load(); }
  size_t peakPendingReplyBytes() const { return peak_queued_bytes_.load(); }
  StoreServerCounters counters() const;
  bool waitFor(const std::function<bool(const StoreServerCounters&)>& holds, std::chrono::milliseconds timeout) const;

 private:
  void accept();
  bool closeIdleStranger();
  void runSweeper();
  void sweepStalled();
  void noteWaiters();
  void noteConnections();
  // Wakes the threads in waitFor, if any, once a counter changed (after the change: see waitFor).
  void countersChanged() const;
  void closeConnection(ConnectionId id, const std::string& reason, bool is_error);
  void deliver(const StoreEffects& effects);
  void send(ConnectionId id, std::string bytes);
  bool makeRoom(Connection& receiver, size_t bytes);
  void queued(size_t bytes);
  void unqueued(size_t bytes);

  StoreServerOptions options_;
  Clock& clock_;  // request deadlines and idle strangers; the accept back-off stays on the wall
  std::shared_ptr<spdlog::logger> log_;
  boost::asio::io_context io_;
  tcp::acceptor acceptor_;
  tcp::endpoint accept_peer_;  // filled by each accept
  boost::asio::steady_timer accept_timer_{io_};
  std::chrono::milliseconds accept_backoff_{0};
  uint64_t accept_failures_ = 0;
  TimePoint last_accept_log_{};
  static constexpr std::chrono::seconds kAcceptLogInterval{10};
  uint64_t strangers_closed_ = 0;
  TimePoint last_stranger_log_{};
  int port_ = 0;
  StoreState state_;
  std::vector<uint8_t> scratch_ = std::vector<uint8_t>(kStoreScratchBytes);  // see Connection::onReadable
  std::unordered_map<ConnectionId, std::shared_ptr<Connection>> connections_;
  ConnectionId next_id_ = 1;
  std::atomic<size_t> connection_count_{0};
  std::atomic<size_t> incomplete_requests_{0};       // connections whose partial_since_ is set
  std::atomic<size_t> waiting_clients_{0};           // state_.waitingConnections(), for other threads
  std::atomic<size_t> incomplete_request_bytes_{0};  // the sum of those connections' in_len_
  // Reply bytes held for all connections (pending_ and writing_), and copies for other threads.
  size_t queued_bytes_ = 0;
  std::atomic<size_t> queued_bytes_seen_{0};
  std::atomic<size_t> peak_queued_bytes_{0};
  // The threads in waitFor: counted, so that a change with nobody waiting costs one load.
  mutable std::atomic<size_t> counter_waiters_{0};
  mutable std::mutex counters_mutex_;
  mutable std::condition_variable counters_cv_;
  std::thread thread_;
  // The sweep of stalled requests is timed on clock_ by a thread of its own (runSweeper): an
  // Asio timer runs on the wall clock only, and a test on a manual clock moves time itself.
  std::mutex sweep_mutex_;
  std::condition_variable sweep_cv_;
  bool stopping_ = false;  // under sweep_mutex_
  std::thread sweeper_;
};

class StoreServer::Impl::Connection : public std::enable_shared_from_this<Connection> {
 public:
  // `remote` comes from accept() itself: a getpeername() per connection and a string per
  // connection cost time and memory that 100,000 clients multiply; the text is made when logged.
  Connection(Impl& server, ConnectionId id, tcp::socket socket, const tcp::endpoint& remote)
      : server_(server), id_(id), socket_(std::move(socket)), remote_(remote), last_heard_(server.clock_.now()) {
    boost::system::error_code ec;
    socket_.set_option(tcp::no_delay(true), ec);
    authenticated_ = server_.options_.token.empty();
  }

  void start() { readMore(); }
  ConnectionId id() const { return id_; }
  std::string peer() const { return remote_.address().to_string() + ":" + std::to_string(remote_.port()); }
  bool authenticated() const { return authenticated_; }
  // When bytes last came from the client (or it connected).
  TimePoint lastHeard() const { return last_heard_; }

  // Closes the socket; the reply bytes it held no longer count against the server's total.
  void close();
  // Queues a reply (unless the server must shed it to stay within its bound) and writes it.
  void send(std::string bytes);

  // Reply bytes this connection holds: queued, and being written.
  size_t queuedBytes() const { return pending_.size() + writing_.size(); }

  void waitSatisfied() { send(std::string(1, static_cast<char>(wire::WaitResponse::kStopWaiting))); }

  // A torch 1.13 watch notification. A watcher cannot be paused (changes come from other
  // clients), so one that lets more than max_pending_reply_bytes pile up is closed instead:
  // four watchers that never read once took the server to 1 GB over thirty 4 MiB SETs.
  void notify(std::string frame);

  // True when a request has been incomplete for longer than the request timeout.
  bool stalled(TimePoint now) const {
    return partial_since_ && now - *partial_since_ > server_.options_.request_timeout;
  }

 private:
  // Reading peeks at the kernel's queue and drops what was peeked only after the replies
  // to it are sent. A request that arrives as several small segments (torch's client sends
  // the command byte on its own) makes Linux acknowledge it the moment a read empties the
  // socket; while the bytes are still queued it does not, so the acknowledgement rides on
  // the reply instead of costing a packet of its own each way.
  void readMore();
  void onReadable(const boost::system::error_code& ec);

  // A client that does not read its replies is not read from either, so its replies
  // cannot pile up without bound.
  bool paused() const { return queuedBytes() > server_.options_.max_pending_reply_bytes; }

  // Handles the complete requests held in in_ and keeps the rest. Returns false when the
  // connection closed.
  bool processBuffered();

  // Handles every complete request at the front of `bytes` (until the client's unread
  // replies reach the limit). Returns the bytes they took, or nothing when the connection
  // closed.
  std::optional<size_t> handleRequests(std::span<const uint8_t> bytes);

  // The deadline covers one request: it restarts whenever a request completes.
  void noteProgress(size_t consumed);
  // Brings the server's incomplete_request_bytes_ to this connection's in_len_ (held_counted_
  // is what it counts of this connection); returns whether it changed.
  bool countHeld(size_t held);

  // The commands a connection may send before it has proved the token (current generation:
  // the first byte of a request is the command).
  static bool isHandshake(uint8_t command_byte) {
    auto command = static_cast<wire::Command>(command_byte);
    return command == wire::Command::kValidate || command == wire::Command::kAuthHello ||
           command == wire::Command::kAuthProof;
  }

  // Closes the connection for a client's fault; returns false (the connection is gone).
  bool reject(const std::string& reason);
  // Answers one parsed request and hands its effects (woken waiters, watchers) to the server.
  // Returns false when the connection closed.
  bool handle(Request& r);
  // Starts writing what is queued, unless a write is in flight; its completion writes the
  // rest and resumes reading and the requests held back.
  void flush();

  Impl& server_;
  ConnectionId id_;
  tcp::socket socket_;
  tcp::endpoint remote_;
  std::vector<uint8_t> in_;
  size_t in_len_ = 0;
  std::string pending_;
  std::string writing_;
  bool writing_in_flight_ = false;
  bool reading_ = false;
  size_t need_at_least_ = 0;
  std::optional<TimePoint> partial_since_;
  size_t held_counted_ = 0;
  bool closed_ = false;
  bool authenticated_ = false;
  TimePoint last_heard_;
  wire::Generation generation_ = wire::Generation::kUnknown;
  std::string client_nonce_;
  std::string server_nonce_;
};

}  // namespace ddprun::rendezvous
