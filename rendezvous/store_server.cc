#include "rendezvous/store_server.h"

#include <pthread.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <limits>
#include <optional>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>

#include "common/error.h"
#include "common/logging.h"
#include "common/port_holder.h"
#include "common/sha256.h"
#include "rendezvous/descriptor_limit.h"
#include "rendezvous/store_state.h"
#include "rendezvous/token_auth.h"

namespace ddprun::rendezvous {
namespace asio = boost::asio;
using asio::ip::tcp;
using wire::Command;
using wire::put;
using wire::putBytes;

namespace {

// Complete requests are handled straight from one buffer the server shares; a connection
// holds a buffer of its own only while a request of its is incomplete, grown to what that
// request needs, so thousands of idle clients cost little.
constexpr size_t kMinReadSpace = 4096;
constexpr size_t kScratchBytes = 64 * 1024;
// The largest request an unauthenticated connection may have outstanding (the handshake's
// frames are a few dozen bytes).
constexpr size_t kMaxHandshakeBytes = 1024;
// A reply buffer larger than this is freed once written: a connection that was sent one
// 48 MiB value once kept that much capacity for as long as it stayed connected.
constexpr size_t kKeptReplyCapacity = 64 * 1024;
using Clock = std::chrono::steady_clock;
// Out of descriptors, an unauthenticated connection is closed only once it has been silent
// this long: a client in the middle of the handshake waits one round trip, not a second.
constexpr std::chrono::seconds kMinStrangerIdle{1};

const char* commandName(Command c) {
  switch (c) {
    case Command::kValidate: return "VALIDATE";
    case Command::kSet: return "SET";
    case Command::kCompareSet: return "COMPARE_SET";
    case Command::kGet: return "GET";
    case Command::kAdd: return "ADD";
    case Command::kCheck: return "CHECK";
    case Command::kWait: return "WAIT";
    case Command::kGetNumKeys: return "GETNUMKEYS";
    case Command::kDeleteKey: return "DELETE_KEY";
    case Command::kAppend: return "APPEND";
    case Command::kMultiGet: return "MULTI_GET";
    case Command::kMultiSet: return "MULTI_SET";
    case Command::kCancelWait: return "CANCEL_WAIT";
    case Command::kPing: return "PING";
    case Command::kQueuePush: return "QUEUE_PUSH";
    case Command::kQueuePop: return "QUEUE_POP";
    case Command::kQueueLen: return "QUEUE_LEN";
    case Command::kListKeys: return "LIST_KEYS";
    case Command::kBarrier: return "BARRIER";
    case Command::kAuthHello: return "AUTH_HELLO";
    case Command::kAuthProof: return "AUTH_PROOF";
  }
  return "?";
}

}  // namespace

class StoreServer::Impl {
 public:
  explicit Impl(StoreServerOptions options);
  ~Impl();
  int port() const { return port_; }
  size_t connectionCount() const { return connection_count_.load(); }
  size_t pendingReplyBytes() const { return queued_bytes_seen_.load(); }
  size_t peakPendingReplyBytes() const { return peak_queued_bytes_.load(); }

 private:
  class Connection;
  friend class Connection;

  void accept();
  bool closeIdleStranger();
  void sweepStalled();
  void closeConnection(ConnectionId id, const std::string& reason, bool is_error);
  void deliver(const StoreEffects& effects);
  void send(ConnectionId id, std::string bytes);
  bool makeRoom(Connection& receiver, size_t bytes);
  void queued(size_t bytes);
  void unqueued(size_t bytes);

  StoreServerOptions options_;
  std::shared_ptr<spdlog::logger> log_;
  asio::io_context io_;
  tcp::acceptor acceptor_;
  tcp::endpoint accept_peer_;  // filled by each accept
  asio::steady_timer sweep_timer_;
  asio::steady_timer accept_timer_{io_};
  std::chrono::milliseconds accept_backoff_{0};
  uint64_t accept_failures_ = 0;
  Clock::time_point last_accept_log_{};
  static constexpr std::chrono::seconds kAcceptLogInterval{10};
  uint64_t strangers_closed_ = 0;
  Clock::time_point last_stranger_log_{};
  int port_ = 0;
  StoreState state_;
  std::vector<uint8_t> scratch_ = std::vector<uint8_t>(kScratchBytes);  // see Connection::onReadable
  std::unordered_map<ConnectionId, std::shared_ptr<Connection>> connections_;
  ConnectionId next_id_ = 1;
  std::atomic<size_t> connection_count_{0};
  // Reply bytes held for all connections (pending_ and writing_), and copies for other threads.
  size_t queued_bytes_ = 0;
  std::atomic<size_t> queued_bytes_seen_{0};
  std::atomic<size_t> peak_queued_bytes_{0};
  std::thread thread_;
};

class StoreServer::Impl::Connection : public std::enable_shared_from_this<Connection> {
 public:
  // `remote` comes from accept() itself: a getpeername() per connection and a string per
  // connection cost time and memory that 100,000 clients multiply; the text is made when logged.
  Connection(Impl& server, ConnectionId id, tcp::socket socket, const tcp::endpoint& remote)
      : server_(server), id_(id), socket_(std::move(socket)), remote_(remote) {
    boost::system::error_code ec;
    socket_.set_option(tcp::no_delay(true), ec);
    authenticated_ = server_.options_.token.empty();
  }

  void start() { readMore(); }
  ConnectionId id() const { return id_; }
  std::string peer() const { return remote_.address().to_string() + ":" + std::to_string(remote_.port()); }
  bool authenticated() const { return authenticated_; }
  // When bytes last came from the client (or it connected).
  Clock::time_point lastHeard() const { return last_heard_; }

  void close() {
    if (!closed_) {
      // A write in flight keeps writing_ until its handler runs, but no longer counts.
      server_.unqueued(queuedBytes());
      std::string().swap(pending_);
    }
    boost::system::error_code ignored;
    socket_.close(ignored);
    closed_ = true;
  }

  void send(std::string bytes) {
    if (closed_ || !server_.makeRoom(*this, bytes.size())) return;
    server_.queued(bytes.size());
    if (pending_.empty()) {
      pending_ = std::move(bytes);
    } else {
      pending_ += bytes;
    }
    flush();
  }

  // Reply bytes this connection holds: queued, and being written.
  size_t queuedBytes() const { return pending_.size() + writing_.size(); }

  void waitSatisfied() { send(std::string(1, static_cast<char>(wire::WaitResponse::kStopWaiting))); }

  // A torch 1.13 watch notification. A watcher cannot be paused (changes come from other
  // clients), so one that lets more than max_pending_reply_bytes pile up is closed instead:
  // four watchers that never read once took the server to 1 GB over thirty 4 MiB SETs.
  void notify(std::string frame) {
    if (closed_) return;
    const size_t queued = pending_.size() + writing_.size() + frame.size();
    if (queued > server_.options_.max_pending_reply_bytes) {
      server_.closeConnection(
          id_, fmt::format("watcher does not read its notifications ({} bytes would be queued)", queued), true);
      return;
    }
    send(std::move(frame));
  }

  // True when a request has been incomplete for longer than the request timeout.
  bool stalled(Clock::time_point now) const {
    return partial_since_ && now - *partial_since_ > server_.options_.request_timeout;
  }

 private:
  // Reading peeks at the kernel's queue and drops what was peeked only after the replies
  // to it are sent. A request that arrives as several small segments (torch's client sends
  // the command byte on its own) makes Linux acknowledge it the moment a read empties the
  // socket; while the bytes are still queued it does not, so the acknowledgement rides on
  // the reply instead of costing a packet of its own each way.
  void readMore() {
    if (closed_ || reading_ || paused()) return;
    reading_ = true;
    // A wait, not async_read_some: Asio's speculative read would cost a failed recv() right
    // after every reply, when the client cannot have sent its next request yet.
    socket_.async_wait(tcp::socket::wait_read,
                       [self = shared_from_this()](const boost::system::error_code& ec) { self->onReadable(ec); });
  }

  void onReadable(const boost::system::error_code& ec) {
    reading_ = false;
    if (closed_) return;
    if (ec) {
      server_.closeConnection(id_, ec.message(), false);
      return;
    }
    // A read that fills the buffer may have left more queued: read again before waiting.
    for (;;) {
      // With no partial request held, bytes land in the server's shared buffer: an idle
      // connection then owns no buffer at all.
      const bool into_scratch = in_len_ == 0;
      uint8_t* dst;
      size_t space;
      if (into_scratch) {
        dst = server_.scratch_.data();
        space = server_.scratch_.size();
      } else {
        // Grow at most twofold per read: a header announcing 64 MiB costs memory only as its
        // bytes arrive (it was once zero-filled at once, before any of them came).
        size_t target = std::max(in_len_ + kMinReadSpace, need_at_least_);
        size_t want = std::min(target, std::max(in_len_ * 2, in_len_ + kMinReadSpace));
        if (in_.size() < want) in_.resize(want);
        dst = in_.data() + in_len_;
        space = in_.size() - in_len_;
      }
      const int fd = socket_.native_handle();
      ssize_t n = ::recv(fd, dst, space, MSG_PEEK | MSG_DONTWAIT);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      if (n < 0) {
        server_.closeConnection(id_, std::string("read failed: ") + std::strerror(errno), false);
        return;
      }
      if (n == 0) {
        server_.closeConnection(id_, "client closed the connection", false);
        return;
      }
      const size_t got = static_cast<size_t>(n);
      last_heard_ = Clock::now();
      if (into_scratch) {
        auto consumed = handleRequests({dst, got});
        if (!consumed) return;
        if (*consumed < got) in_.assign(dst + *consumed, dst + got);
        in_len_ = got - *consumed;
        noteProgress(*consumed);
      } else {
        in_len_ += got;
        if (!processBuffered()) return;
      }
      // Replies are out; now the peeked bytes can go (the unprocessed rest is in in_). On TCP,
      // MSG_TRUNC discards them without a copy and without a buffer. recv() as the raw system
      // call: the sanitizers' recv() wrappers take the null buffer for `got` bytes written
      // (ThreadSanitizer then reports any two store servers' threads as racing on address 0).
      ssize_t dropped;
      do {
        dropped = ::syscall(SYS_recvfrom, fd, nullptr, got, MSG_TRUNC | MSG_DONTWAIT, nullptr, nullptr);
      } while (dropped < 0 && errno == EINTR);
      if (dropped != n) {
        server_.closeConnection(id_, "read failed: the socket lost queued bytes", true);
        return;
      }
      if (got < space || paused()) break;
    }
    readMore();
  }

  // A client that does not read its replies is not read from either, so its replies
  // cannot pile up without bound.
  bool paused() const { return queuedBytes() > server_.options_.max_pending_reply_bytes; }

  // Handles the complete requests held in in_ and keeps the rest. Returns false when the
  // connection closed.
  bool processBuffered() {
    auto consumed = handleRequests({in_.data(), in_len_});
    if (!consumed) return false;
    if (*consumed > 0) {
      std::memmove(in_.data(), in_.data() + *consumed, in_len_ - *consumed);
      in_len_ -= *consumed;
    }
    if (in_len_ == 0) {
      in_.clear();
      in_.shrink_to_fit();
    }
    noteProgress(*consumed);
    return true;
  }

  // Handles every complete request at the front of `bytes` (until the client's unread
  // replies reach the limit). Returns the bytes they took, or nothing when the connection
  // closed.
  std::optional<size_t> handleRequests(std::span<const uint8_t> bytes) {
    size_t offset = 0;
    need_at_least_ = 0;
    while (offset < bytes.size() && !paused()) {
      std::span<const uint8_t> rest = bytes.subspan(offset);
      if (generation_ == wire::Generation::kUnknown) {
        generation_ = detectGeneration(rest);
        if (generation_ == wire::Generation::kUnknown) break;
        if (generation_ == wire::Generation::kLegacy && !authenticated_) {
          server_.closeConnection(id_, "a torch 1.13 client cannot authenticate, and this store requires a token",
                                  true);
          return std::nullopt;
        }
      }
      Request request;
      ParseResult parsed = parseRequest(rest, generation_, server_.options_.limits, request);
      if (parsed.status == ParseStatus::kError) {
        server_.closeConnection(id_, "bad request: " + parsed.error, true);
        return std::nullopt;
      }
      if (parsed.status == ParseStatus::kNeedMore) {
        // Before the handshake only the handshake's own small frames are waited for.
        if (!authenticated_ && (!isHandshake(rest[0]) || parsed.need_at_least > kMaxHandshakeBytes)) {
          server_.closeConnection(id_,
                                  fmt::format("unauthenticated {} of {} bytes on a store that requires a token",
                                              commandName(static_cast<Command>(rest[0])), parsed.need_at_least),
                                  true);
          return std::nullopt;
        }
        need_at_least_ = parsed.need_at_least;
        break;
      }
      offset += parsed.consumed;
      bool open = false;
      try {
        open = handle(request);
      } catch (const std::exception& e) {
        // Out of memory, say: this client's request fails and its connection closes; the
        // store, and the agent whose thread this is, go on.
        server_.closeConnection(id_, std::string("request failed: ") + e.what(), true);
        return std::nullopt;
      }
      if (!open) return std::nullopt;
    }
    return offset;
  }

  // The deadline covers one request: it restarts whenever a request completes.
  void noteProgress(size_t consumed) {
    if (in_len_ == 0) {
      partial_since_.reset();
    } else if (consumed > 0 || !partial_since_) {
      partial_since_ = Clock::now();
    }
  }

  // The commands a connection may send before it has proved the token (current generation:
  // the first byte of a request is the command).
  static bool isHandshake(uint8_t command_byte) {
    auto command = static_cast<Command>(command_byte);
    return command == Command::kValidate || command == Command::kAuthHello || command == Command::kAuthProof;
  }

  bool reject(const std::string& reason) {
    server_.closeConnection(id_, reason, true);
    return false;
  }

  bool handle(Request& r) {
    StoreState& state = server_.state_;
    const bool legacy = generation_ == wire::Generation::kLegacy;
    if (!authenticated_ && r.command != Command::kValidate && r.command != Command::kAuthHello &&
        r.command != Command::kAuthProof) {
      return reject(std::string("unauthenticated ") + commandName(r.command) + " on a store that requires a token");
    }
    if (legacy && r.watch_key) {
      state.watch(id_, r.keys[0]);
      send(std::string(1, static_cast<char>(wire::WatchResponse::kCallbackRegistered)));
      return true;
    }
    StoreEffects effects;
    std::string reply;
    switch (r.command) {
      case Command::kValidate:
        if (r.word != wire::kValidationMagic) return reject("VALIDATE with a wrong magic number");
        return true;
      case Command::kAuthHello: {
        client_nonce_ = r.blob;
        server_nonce_ = randomNonce();
        const std::string& token = server_.options_.token;
        reply = server_nonce_;
        reply +=
            token.empty() ? std::string(wire::kAuthMacBytes, '\0') : serverProof(token, client_nonce_, server_nonce_);
        break;
      }
      case Command::kAuthProof: {
        const std::string& token = server_.options_.token;
        if (token.empty()) {
          reply.push_back(1);
          break;
        }
        if (server_nonce_.empty()) return reject("AUTH_PROOF before AUTH_HELLO");
        if (!constantTimeEqual(r.blob, clientProof(token, client_nonce_, server_nonce_))) {
          return reject("wrong token proof (the client's token differs from this store's)");
        }
        authenticated_ = true;
        reply.push_back(1);
        break;
      }
      case Command::kSet: state.set(r.keys[0], std::move(r.values[0]), effects); break;
      case Command::kCompareSet:
        putBytes(reply, state.compareSet(r.keys[0], r.values[0], std::move(r.values[1]), effects));
        break;
      case Command::kGet: {
        // torch's server answers a missing key with an empty value (clients WAIT first).
        const std::string* value = state.get(r.keys[0]);
        putBytes(reply, value ? *value : std::string());
        break;
      }
      case Command::kAdd: {
        auto total = state.add(r.keys[0], r.amount, effects);
        if (!total) return reject("ADD to key '" + r.keys[0] + "' whose value is not an integer");
        put<int64_t>(reply, *total);
        break;
      }
      case Command::kCheck:
        put<uint8_t>(reply, static_cast<uint8_t>(state.check(r.keys) ? wire::CheckResponse::kReady
                                                                     : wire::CheckResponse::kNotReady));
        break;
      case Command::kWait:
        if (state.wait(id_, r.keys)) put<uint8_t>(reply, static_cast<uint8_t>(wire::WaitResponse::kStopWaiting));
        break;
      case Command::kGetNumKeys: put<int64_t>(reply, state.numKeys()); break;
      case Command::kDeleteKey: put<int64_t>(reply, state.deleteKey(r.keys[0], effects) ? 1 : 0); break;
      case Command::kAppend: state.append(r.keys[0], r.values[0], effects); break;
      case Command::kMultiGet: {
        // The reply's size is known before anything is copied into it.
        std::vector<const std::string*> values;
        values.reserve(r.keys.size());
        uint64_t reply_bytes = 0;
        for (const auto& key : r.keys) {
          values.push_back(state.get(key));
          reply_bytes += sizeof(uint64_t) + (values.back() ? values.back()->size() : 0);
        }
        if (reply_bytes > server_.options_.limits.max_reply_bytes) {
          return reject(fmt::format("MULTI_GET of {} keys needs a {}-byte reply, over the {}-byte limit", r.keys.size(),
                                    reply_bytes, server_.options_.limits.max_reply_bytes));
        }
        reply.reserve(reply_bytes);
        for (const std::string* value : values) putBytes(reply, value ? *value : std::string());
        break;
      }
      case Command::kMultiSet:
        for (size_t i = 0; i < r.keys.size(); ++i) state.set(r.keys[i], std::move(r.values[i]), effects);
        break;
      case Command::kCancelWait:
        state.cancelWait(id_);
        put<uint8_t>(reply, static_cast<uint8_t>(wire::WaitResponse::kWaitCanceled));
        break;
      case Command::kPing: put<uint32_t>(reply, r.word); break;
      case Command::kQueuePush: state.queuePush(r.keys[0], std::move(r.values[0]), effects); break;
      case Command::kQueuePop: {
        // Never blocks: the length before the pop, then the element if there was one.
        put<int64_t>(reply, state.queueLength(r.keys[0]));
        if (auto value = state.queuePop(r.keys[0])) putBytes(reply, *value);
        break;
      }
      case Command::kQueueLen: put<int64_t>(reply, state.queueLength(r.keys[0])); break;
      case Command::kListKeys: {
        auto keys = state.listKeys();
        put<int64_t>(reply, static_cast<int64_t>(keys.size()));
        for (const auto& key : keys) putBytes(reply, key);
        break;
      }
      case Command::kBarrier:
        if (state.barrier(id_, r.keys[0], r.amount, effects)) {
          put<uint8_t>(reply, static_cast<uint8_t>(wire::WaitResponse::kStopWaiting));
        }
        break;
    }
    if (!reply.empty()) send(std::move(reply));
    server_.deliver(effects);
    return !closed_;
  }

  void flush() {
    if (writing_in_flight_ || pending_.empty() || closed_) return;
    writing_.swap(pending_);
    pending_.clear();
    writing_in_flight_ = true;
    asio::async_write(socket_, asio::buffer(writing_),
                      [self = shared_from_this()](const boost::system::error_code& ec, size_t) {
                        self->writing_in_flight_ = false;
                        const size_t written = self->writing_.size();
                        if (self->writing_.capacity() > kKeptReplyCapacity) {
                          std::string().swap(self->writing_);
                        } else {
                          self->writing_.clear();
                        }
                        if (self->closed_) return;
                        self->server_.unqueued(written);
                        if (ec) {
                          self->server_.closeConnection(self->id_, "write failed: " + ec.message(), false);
                          return;
                        }
                        self->flush();
                        // Requests held back while the client's replies piled up.
                        if (!self->paused() && self->in_len_ > 0 && !self->processBuffered()) return;
                        self->readMore();
                      });
  }

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
  std::optional<Clock::time_point> partial_since_;
  bool closed_ = false;
  bool authenticated_ = false;
  Clock::time_point last_heard_ = Clock::now();
  wire::Generation generation_ = wire::Generation::kUnknown;
  std::string client_nonce_;
  std::string server_nonce_;
};

StoreServer::Impl::Impl(StoreServerOptions options)
    : options_(std::move(options)),
      log_(logger("store")),
      // Sockets are only ever used from the one I/O thread, so their per-operation locks
      // can go; the scheduler keeps its lock for the post() from the destructor.
      io_(BOOST_ASIO_CONCURRENCY_HINT_UNSAFE_IO),
      acceptor_(io_),
      sweep_timer_(io_) {
  // Every client holds a descriptor: the soft limit (often 1024) would cap the store far below
  // what the hard limit allows.
  DescriptorLimit limit;
  DescriptorPlan plan = raiseDescriptorLimit(options_.expected_clients, &limit);
  if (!plan.warning.empty()) log_->warn("{}", plan.warning);
  boost::system::error_code ec;
  std::string host = options_.host == "localhost" ? "127.0.0.1" : options_.host;
  auto address = asio::ip::make_address(host, ec);
  if (ec) throw DdprunError("store server: cannot listen on '" + options_.host + "': not an IP address");
  tcp::endpoint endpoint(address, static_cast<unsigned short>(options_.port));
  acceptor_.open(endpoint.protocol(), ec);
  if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor_.bind(endpoint, ec);
  // Thousands of ranks connect at once when a job starts. Asio's default backlog is SOMAXCONN
  // (4096); a connection that finds the queue full has its SYN dropped and retries only after a
  // second (then 3, 7, ...). The kernel caps what is asked at net.core.somaxconn, so ask for the
  // most and let that setting decide (rendezvous/PROTOCOL.md, README: what to raise).
  if (!ec) acceptor_.listen(std::numeric_limits<int>::max(), ec);
  if (ec) {
    // Many jobs share a machine: say which process took the port.
    const std::string holder =
        ec == boost::asio::error::address_in_use ? portHolderSuffix(options_.port) : std::string();
    throw SystemError("store server: listen on " + options_.host + ":" + std::to_string(options_.port), ec.value(),
                      holder);
  }
  port_ = acceptor_.local_endpoint().port();
  accept();
  sweepStalled();
  thread_ = std::thread([this] {
    // A named thread shows up as such in top, perf and gdb.
    pthread_setname_np(pthread_self(), "ddprun-store");
    // No exception may leave this thread: it would terminate the agent and its workers.
    for (;;) {
      try {
        io_.run();
        return;
      } catch (const std::exception& e) {
        log_->error("store I/O thread: {}; serving on", e.what());
      }
    }
  });
  log_->debug("store listening on {}:{}{} (descriptor limit {}, hard {})", options_.host, port_,
              options_.token.empty() ? "" : " (token required)", limit.soft, limit.hard);
}

StoreServer::Impl::~Impl() {
  asio::post(io_, [this] {
    boost::system::error_code ignored;
    acceptor_.close(ignored);
    sweep_timer_.cancel();
    accept_timer_.cancel();
    for (auto& [id, connection] : connections_) connection->close();
    connections_.clear();
    connection_count_ = 0;
    io_.stop();
  });
  if (thread_.joinable()) thread_.join();
}

void StoreServer::Impl::accept() {
  acceptor_.async_accept(accept_peer_, [this](const boost::system::error_code& ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted) return;
    if (!ec) {
      auto connection = std::make_shared<Connection>(*this, next_id_++, std::move(socket), accept_peer_);
      connections_.emplace(connection->id(), connection);
      connection_count_ = connections_.size();
      log_->trace("store: client {} connected", connection->peer());
      connection->start();
      accept_backoff_ = std::chrono::milliseconds(0);
      accept();
      return;
    }
    // With a token, connections that have not proved it are strangers: out of descriptors, the
    // longest-silent one makes room for the connection waiting, so that strangers holding
    // descriptors cannot lock the job's agents out. Without a token nothing is closed: torch
    // 1.13 opens a second connection for watch callbacks that sends nothing until a key is
    // watched, and torch stores have no way to tell such a client from a stranger.
    const bool out_of_descriptors =
        ec == asio::error::no_descriptors || ec == boost::system::errc::too_many_files_open_in_system;
    if (out_of_descriptors && !options_.token.empty() && closeIdleStranger()) {
      accept();
      return;
    }
    // Out of descriptors, say: retrying at once spun a core and wrote a million log lines in
    // six seconds. Back off (doubling up to a second) and log once per interval with a count.
    accept_backoff_ = std::clamp(accept_backoff_ * 2, std::chrono::milliseconds(10), std::chrono::milliseconds(1000));
    ++accept_failures_;
    const auto now = Clock::now();
    if (now - last_accept_log_ >= kAcceptLogInterval) {
      DescriptorLimit limit;
      if (out_of_descriptors) raiseDescriptorLimit(0, &limit);
      log_->warn(
          "store: accept failed: {} ({} failures since the last report; next try in {} ms, backing off to 1 s){}{}",
          ec.message(), accept_failures_, accept_backoff_.count(), out_of_descriptors ? "; " : "",
          out_of_descriptors ? outOfDescriptorsAdvice(limit) : std::string());
      accept_failures_ = 0;
      last_accept_log_ = now;
    }
    accept_timer_.expires_after(accept_backoff_);
    accept_timer_.async_wait([this](const boost::system::error_code& timer_ec) {
      if (!timer_ec) accept();
    });
  });
}

// Closes the unauthenticated connection silent the longest, if one has been silent for
// kMinStrangerIdle; returns whether one was closed. One warning per kAcceptLogInterval
// with a count: strangers connecting in a loop would otherwise write a line each.
bool StoreServer::Impl::closeIdleStranger() {
  const auto now = Clock::now();
  const Connection* idlest = nullptr;
  for (const auto& [id, connection] : connections_) {
    if (connection->authenticated() || now - connection->lastHeard() < kMinStrangerIdle) continue;
    if (!idlest || connection->lastHeard() < idlest->lastHeard()) idlest = connection.get();
  }
  if (!idlest) return false;
  const auto idle_ms = std::chrono::duration_cast<std::chrono::milliseconds>(now - idlest->lastHeard()).count();
  ++strangers_closed_;
  if (now - last_stranger_log_ >= kAcceptLogInterval) {
    log_->warn(
        "store: out of descriptors: closed the longest-idle unauthenticated connection, from {} (silent for {} ms), "
        "to accept a new one ({} closed since the last report)",
        idlest->peer(), idle_ms, strangers_closed_);
    strangers_closed_ = 0;
    last_stranger_log_ = now;
  }
  closeConnection(idlest->id(), fmt::format("out of descriptors; unauthenticated and silent for {} ms", idle_ms),
                  false);
  return true;
}

// One timer for all connections (not one per request): every quarter of the request
// timeout, close the connections whose current request has been incomplete too long.
void StoreServer::Impl::sweepStalled() {
  auto period = std::max(std::chrono::milliseconds(20), options_.request_timeout / 4);
  sweep_timer_.expires_after(period);
  sweep_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec) return;
    const auto now = Clock::now();
    std::vector<ConnectionId> stalled;
    for (const auto& [id, connection] : connections_) {
      if (connection->stalled(now)) stalled.push_back(id);
    }
    for (ConnectionId id : stalled) {
      closeConnection(id,
                      "request incomplete after " + std::to_string(options_.request_timeout.count()) +
                          " ms (slow or stalled client)",
                      true);
    }
    sweepStalled();
  });
}

void StoreServer::Impl::closeConnection(ConnectionId id, const std::string& reason, bool is_error) {
  auto it = connections_.find(id);
  if (it == connections_.end()) return;
  if (is_error) {
    log_->warn("store: closing connection from {}: {}", it->second->peer(), reason);
  } else {
    log_->trace("store: connection from {} ended: {}", it->second->peer(), reason);
  }
  it->second->close();
  state_.dropConnection(id);
  connections_.erase(it);
  connection_count_ = connections_.size();
}

void StoreServer::Impl::deliver(const StoreEffects& effects) {
  // A copy of each pointer: a connection may be closed, and dropped from connections_, while
  // it queues (see makeRoom).
  for (ConnectionId id : effects.woken) {
    auto it = connections_.find(id);
    if (it == connections_.end()) continue;
    auto connection = it->second;
    connection->waitSatisfied();
  }
  for (const auto& [id, frame] : effects.watch_messages) {
    auto it = connections_.find(id);
    if (it == connections_.end()) continue;
    auto connection = it->second;
    connection->notify(frame);
  }
}

void StoreServer::Impl::send(ConnectionId id, std::string bytes) {
  auto it = connections_.find(id);
  if (it == connections_.end()) return;
  auto connection = it->second;
  connection->send(std::move(bytes));
}

// Who goes when the total is reached: the connection holding the most, the receiver of the
// new reply included (it wins no ties). torch's clients read each reply before sending the
// next request, so a well-behaved client holds at most one reply, while a client that does
// not read holds up to max_pending_reply_bytes plus one reply: the largest holder is the one
// not reading, and closing it frees the most. Closing the receiver instead would be simpler,
// but once a few clients that never read had filled the budget, it would close every
// well-behaved client asking for anything, and the clients that never read would stay.
bool StoreServer::Impl::makeRoom(Connection& receiver, size_t bytes) {
  while (queued_bytes_ + bytes > options_.max_total_pending_reply_bytes) {
    Connection* victim = &receiver;
    size_t most = receiver.queuedBytes() + bytes;
    for (const auto& [id, connection] : connections_) {
      if (connection.get() != &receiver && connection->queuedBytes() >= most) {
        victim = connection.get();
        most = connection->queuedBytes();
      }
    }
    const bool receiver_goes = victim == &receiver;
    closeConnection(victim->id(),
                    fmt::format("it holds {} bytes of unread replies, the most of any client, and the replies queued "
                                "for all clients would reach {} bytes, over max_total_pending_reply_bytes ({})",
                                most, queued_bytes_ + bytes, options_.max_total_pending_reply_bytes),
                    true);
    if (receiver_goes) return false;
  }
  return true;
}

void StoreServer::Impl::queued(size_t bytes) {
  queued_bytes_ += bytes;
  queued_bytes_seen_ = queued_bytes_;
  if (queued_bytes_ > peak_queued_bytes_.load()) peak_queued_bytes_ = queued_bytes_;
}

void StoreServer::Impl::unqueued(size_t bytes) {
  queued_bytes_ -= bytes;
  queued_bytes_seen_ = queued_bytes_;
}

StoreServer::StoreServer(StoreServerOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}
StoreServer::~StoreServer() = default;
int StoreServer::port() const { return impl_->port(); }
size_t StoreServer::connectionCount() const { return impl_->connectionCount(); }
size_t StoreServer::pendingReplyBytes() const { return impl_->pendingReplyBytes(); }
size_t StoreServer::peakPendingReplyBytes() const { return impl_->peakPendingReplyBytes(); }

}  // namespace ddprun::rendezvous
