// The RPC agent: addresses through the store, one TCP connection per (caller,
// callee) pair, framed messages, a pool for incoming calls, pending calls with
// deadlines, the RRef owner table, and the store-agreed graceful shutdown.
//
// Threads: one Asio I/O thread reads every socket (header, meta, then the
// tensors straight into their storage with one scatter read) and decodes
// messages in arrival order, so RRef reference additions and releases sent over
// one connection are applied in the order they were sent. Writes do not go
// through the I/O thread: the thread that has a message writes it with one gathering sendmsg
// under the connection's write mutex (one hand-off less per call, and the
// tensors' storage is written from where it lies). Incoming calls run on the
// pool.
#include "worker_runtime/rpc/rpc.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio.hpp>
#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <shared_mutex>
#include <thread>
#include <unordered_map>

#include "common/env_names.h"
#include "common/logging.h"
#include "rendezvous/tcp_store_client.h"
#include "worker_runtime/rpc/auth.h"
#include "worker_runtime/rpc/dist_autograd.h"
#include "worker_runtime/rpc/internal.h"
#include "worker_runtime/rpc/wire.h"

namespace ddprun::rpc {

namespace asio = boost::asio;
using asio::ip::tcp;
using detail::FutureState;
using detail::RRefState;

namespace {

auto log() {
  static auto l = logger("rpc");
  return l;
}

using wire::Kind;
using WireHeader = wire::Header;
constexpr uint32_t kMagic = wire::kMagic;
constexpr uint32_t kMaxMeta = wire::kMaxMetaBytes;
// Tensors of a message are allocated in batches that at most double what has arrived.
constexpr uint64_t kFirstTensorBatch = 1u << 20;

// ---- value codec ----

class Writer {
 public:
  template <class T>
  void pod(const T& v) {
    const auto* p = reinterpret_cast<const char*>(&v);
    out_.append(p, sizeof(T));
  }
  void str(const std::string& s) {
    pod(static_cast<uint32_t>(s.size()));
    out_.append(s);
  }
  std::string& out() { return out_; }

 private:
  std::string out_;
};

class Reader {
 public:
  Reader(const char* data, size_t size) : p_(data), end_(data + size) {}
  template <class T>
  T pod() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, p_, sizeof(T));
    p_ += sizeof(T);
    return v;
  }
  size_t consumed(const char* begin) const { return static_cast<size_t>(p_ - begin); }
  std::string str() {
    auto n = pod<uint32_t>();
    need(n);
    std::string s(p_, n);
    p_ += n;
    return s;
  }

 private:
  void need(size_t n) const {
    if (static_cast<size_t>(end_ - p_) < n) throw DdprunError("rpc: malformed message (truncated)");
  }
  const char* p_;
  const char* end_;
};

enum class Tag : uint8_t { kNone, kBool, kInt, kDouble, kString, kTensor, kList, kRRef };

// A message ready for a gathering write: header, meta (tensor table + body), tensor blobs.
struct OutMessage {
  WireHeader header;
  std::string meta;
  std::vector<at::Tensor> tensors;
};

struct EncodeTarget {
  int dst;
  int64_t context_id;
};

struct Encoder {
  EncodeTarget target;
  Writer table;
  Writer body;
  std::vector<at::Tensor> tensors;

  void value(const Value& v);
  OutMessage finish(Kind kind, uint64_t id, uint8_t flags = 0) {
    OutMessage m;
    m.header.kind = static_cast<uint8_t>(kind);
    m.header.flags = flags;
    m.header.src = detail::selfRank();
    m.header.id = id;
    Writer head;
    head.pod(static_cast<uint32_t>(tensors.size()));
    m.meta = std::move(head.out());
    m.meta += table.out();
    m.meta += body.out();
    if (m.meta.size() > kMaxMeta) throw DdprunError("rpc: message metadata over 256 MiB");
    m.header.meta_bytes = static_cast<uint32_t>(m.meta.size());
    uint64_t bytes = 0;
    for (auto& t : tensors) bytes += t.nbytes();
    m.header.tensor_bytes = bytes;
    m.tensors = std::move(tensors);
    return m;
  }
};

void forkRRef(const RRefState& state, int dst);

Future readyNone() {
  auto s = std::make_shared<FutureState>();
  s->done = true;
  return Future(std::move(s));
}

void Encoder::value(const Value& v) {
  const auto& s = v.storage();
  switch (s.index()) {
    case 0:
      body.pod(Tag::kNone);
      break;
    case 1:
      body.pod(Tag::kBool);
      body.pod(static_cast<uint8_t>(std::get<bool>(s)));
      break;
    case 2:
      body.pod(Tag::kInt);
      body.pod(std::get<int64_t>(s));
      break;
    case 3:
      body.pod(Tag::kDouble);
      body.pod(std::get<double>(s));
      break;
    case 4:
      body.pod(Tag::kString);
      body.str(std::get<std::string>(s));
      break;
    case 5: {
      const at::Tensor& t = std::get<at::Tensor>(s);
      if (!t.defined()) {
        body.pod(Tag::kNone);
        break;
      }
      if (!t.device().is_cpu()) throw DdprunError("rpc: only CPU tensors can be sent");
      if (t.is_sparse()) throw DdprunError("rpc: sparse tensors cannot be sent");
      int64_t send_id = -1;
      if (target.context_id >= 0 && t.requires_grad()) {
        send_id = detail::recordSend(target.context_id, target.dst, t);
      }
      // Contiguous tensors go out from their own storage; others through one
      // copy.
      at::Tensor data = t.detach();
      if (!data.is_contiguous()) data = data.contiguous();
      body.pod(Tag::kTensor);
      body.pod(static_cast<uint32_t>(tensors.size()));
      body.pod(send_id);
      table.pod(static_cast<int8_t>(data.scalar_type()));
      table.pod(static_cast<uint8_t>(data.dim()));
      for (auto d : data.sizes()) table.pod(static_cast<int64_t>(d));
      tensors.push_back(std::move(data));
      break;
    }
    case 6: {
      const auto& list = std::get<Value::List>(s);
      body.pod(Tag::kList);
      body.pod(static_cast<uint32_t>(list.size()));
      for (const auto& e : list) value(e);
      break;
    }
    case 7: {
      const auto& st = std::get<std::shared_ptr<RRefState>>(s);
      forkRRef(*st, target.dst);
      body.pod(Tag::kRRef);
      body.pod(static_cast<int32_t>(st->owner));
      body.pod(st->creator);
      body.pod(st->serial);
      break;
    }
    case 8:
      throw DdprunError("rpc: a " + std::get<std::shared_ptr<Object>>(s)->typeName() +
                        " lives on its owner and cannot be sent (use an RRef)");
  }
}

struct Decoder {
  Reader& in;
  std::vector<at::Tensor>& tensors;
  int src;
  int64_t context_id;
  Value value(int depth = 0);
};

std::shared_ptr<RRefState> adoptRRef(int owner, int64_t creator, int64_t serial, int src);

Value Decoder::value(int depth) {
  if (depth > 64) throw DdprunError("rpc: malformed message (nesting too deep)");
  switch (in.pod<Tag>()) {
    case Tag::kNone:
      return {};
    case Tag::kBool:
      return Value(in.pod<uint8_t>() != 0);
    case Tag::kInt:
      return Value(in.pod<int64_t>());
    case Tag::kDouble:
      return Value(in.pod<double>());
    case Tag::kString:
      return Value(in.str());
    case Tag::kTensor: {
      auto index = in.pod<uint32_t>();
      auto send_id = in.pod<int64_t>();
      if (index >= tensors.size()) throw DdprunError("rpc: malformed message (tensor index)");
      at::Tensor t = tensors[index];
      if (send_id >= 0 && context_id >= 0) t = detail::recordRecv(context_id, src, send_id, std::move(t));
      return Value(std::move(t));
    }
    case Tag::kList: {
      auto n = in.pod<uint32_t>();
      Value::List list;
      list.reserve(std::min<uint32_t>(n, 1 << 16));
      for (uint32_t i = 0; i < n; ++i) list.push_back(value(depth + 1));
      return Value(std::move(list));
    }
    case Tag::kRRef: {
      auto owner = in.pod<int32_t>();
      auto creator = in.pod<int64_t>();
      auto serial = in.pod<int64_t>();
      return Value(RRef(adoptRRef(owner, creator, serial, src)));
    }
  }
  throw DdprunError("rpc: malformed message (unknown value tag)");
}

// ---- thread pool ----

class Pool {
 public:
  explicit Pool(int threads) {
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { loop(); });
  }
  ~Pool() { stop(); }
  void post(std::function<void()> fn) {
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(std::move(fn));
    }
    cv_.notify_one();
  }
  void stop() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) {
      if (t.joinable() && t.get_id() != std::this_thread::get_id()) t.join();
      if (t.joinable()) t.detach();
    }
    threads_.clear();
  }

 private:
  void loop() {
    while (true) {
      std::function<void()> fn;
      {
        std::unique_lock lock(mutex_);
        cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;
        fn = std::move(queue_.front());
        queue_.pop_front();
      }
      try {
        fn();
      } catch (const std::exception& e) {
        log()->error("rpc worker thread: uncaught exception: {}", e.what());
      }
    }
  }
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  std::vector<std::thread> threads_;
  bool stopping_ = false;
};

// ---- function registry ----

struct Registered {
  AsyncFunction fn;
  bool run_inline = false;
};

struct Registry {
  std::shared_mutex mutex;
  std::unordered_map<std::string, Registered> functions;
};
Registry& registry() {
  static Registry r;
  return r;
}

thread_local int t_caller = -1;

// ---- the agent ----

class Agent;

// One parsed entry of a message's tensor table.
struct TensorSpec {
  c10::ScalarType dtype;
  std::vector<int64_t> sizes;
  uint64_t bytes = 0;
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  // Outbound connections are authenticated before they are made (connectionTo); inbound
  // ones run the callee's side of the handshake first.
  Connection(Agent& agent, tcp::socket socket, int peer, bool outbound)
      : agent_(agent), socket_(std::move(socket)), peer_(peer), outbound_(outbound), authenticated_(outbound) {
    socket_.set_option(tcp::no_delay(true));
    socket_.non_blocking(true);
    fd_ = socket_.native_handle();
    opened_ = Clock::now();
  }
  void start();
  // Writes the whole message; throws PeerError when the connection is broken.
  void write(const OutMessage& m, Clock::time_point deadline);
  void close() {
    closed_ = true;
    boost::system::error_code ec;
    socket_.shutdown(tcp::socket::shutdown_both, ec);
    socket_.close(ec);
  }
  // Fails the connection (once): records the reason and tells the agent.
  void fail(const std::string& reason);
  // I/O thread: closes the connection when its handshake or the message it is reading
  // made no progress in time (a stalled or partial message must not hold it forever).
  void checkDeadline(Clock::time_point now) {
    if (deadline_ && now > *deadline_) fail(deadline_reason_);
  }
  int peer() const { return peer_; }
  bool outbound() const { return outbound_; }
  bool authenticated() const { return authenticated_.load(); }
  Clock::time_point opened() const { return opened_; }
  bool broken() const { return broken_.load(); }
  std::string brokenReason() {
    std::lock_guard lock(reason_mutex_);
    return reason_;
  }
  tcp::socket& socket() { return socket_; }

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
  bool lost(const boost::system::error_code& ec) {
    if (!ec) return false;
    fail(ec == asio::error::eof ? "peer closed the connection" : ec.message());
    return true;
  }

  Agent& agent_;
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
  WireHeader header_;
  size_t header_received_ = 0;
  std::string meta_;
  size_t meta_received_ = 0;
  std::vector<TensorSpec> specs_;
  size_t next_tensor_ = 0;
  uint64_t tensor_received_ = 0;
  std::vector<asio::mutable_buffer> batch_;
  size_t batch_index_ = 0;
  std::vector<at::Tensor> in_tensors_;
  size_t body_offset_ = 0;
};

struct PendingCall {
  Future future;
  int peer;
  std::string func;
  int64_t context_id;
  Clock::time_point deadline;
  std::chrono::milliseconds timeout;
  std::shared_ptr<Connection> connection;
};

struct OwnerEntry {
  Future value;
  int64_t refs = 0;
};

struct PeerAddress {
  std::string name;
  std::string host;
  int port = 0;
};

class Agent : public std::enable_shared_from_this<Agent> {
 public:
  Agent(std::string name, int rank, int world_size, RpcBackendOptions options)
      : name_(std::move(name)),
        rank_(rank),
        world_size_(world_size),
        options_(std::move(options)),
        acceptor_(io_),
        sweep_timer_(io_),
        pool_(std::max(1, options_.num_worker_threads)) {}

  void start();
  void stop();
  void gracefulShutdown();

  Future call(int rank, const std::string& func, const Args& args, std::chrono::milliseconds timeout,
              int64_t context_id, std::optional<std::pair<int64_t, int64_t>> rref_id = std::nullopt);
  RRef remote(int rank, const std::string& func, const Args& args, std::chrono::milliseconds timeout);

  void onMessage(const std::shared_ptr<Connection>& conn, const WireHeader& h, const std::string& meta,
                 size_t body_offset, std::vector<at::Tensor>& tensors);
  void onConnectionLost(const std::shared_ptr<Connection>& conn, const std::string& reason);

  int rank() const { return rank_; }
  int worldSize() const { return world_size_; }
  const std::string& name() const { return name_; }
  int rankOf(const std::string& name) const {
    auto it = by_name_.find(name);
    if (it == by_name_.end()) throw DdprunError(fmt::format("rpc: unknown worker '{}'", name));
    return it->second;
  }
  WorkerInfo info(int rank) const {
    if (rank < 0 || rank >= world_size_) throw DdprunError(fmt::format("rpc: no worker with rank {}", rank));
    return {peers_[rank].name, rank};
  }
  // Ranks from the wire are checked before use; this is still safe on any int.
  std::string describe(int rank) const {
    if (rank < 0 || rank >= static_cast<int>(peers_.size())) return fmt::format("unknown rank {}", rank);
    const auto& p = peers_[rank];
    return fmt::format("worker '{}' (rank {}, {}:{})", p.name, rank, p.host, p.port);
  }
  std::chrono::milliseconds timeoutOr(std::chrono::milliseconds t) const {
    return t.count() < 0 ? options_.rpc_timeout : t;
  }
  void post(std::function<void()> fn) { pool_.post(std::move(fn)); }
  // Runs `send` (which makes calls) on the pool; shutdown counts it as a pending call.
  void sendInBackground(std::function<void()> send) {
    {
      std::lock_guard lock(idle_mutex_);
      ++pending_count_;
    }
    pool_.post([this, send = std::move(send)] {
      try {
        send();
      } catch (const std::exception& e) {
        log()->debug("rpc: background send: {}", e.what());
      }
      {
        std::lock_guard lock(idle_mutex_);
        --pending_count_;
      }
      idle_cv_.notify_all();
    });
  }
  const std::string& secret() const { return secret_; }
  // How long a message may go without a byte arriving once it has begun.
  std::chrono::milliseconds readTimeout() const { return options_.rpc_timeout; }
  // Logs a refused handshake, at most once per 10 s (a scanner must not flood the log).
  void noteRefused(const std::string& reason);

  // RRef owner table.
  std::pair<int64_t, int64_t> newRRefId() { return {rank_, next_rref_serial_.fetch_add(1)}; }
  void ownerAdd(int64_t creator, int64_t serial, int64_t n);
  void ownerRegister(int64_t creator, int64_t serial, Future value, int64_t refs);
  void ownerRelease(int64_t creator, int64_t serial);
  Future ownerValue(int64_t creator, int64_t serial);
  int64_t ownedCount() {
    std::lock_guard lock(owner_mutex_);
    return static_cast<int64_t>(owned_.size());
  }
  bool running() const { return running_.load(); }

 private:
  std::shared_ptr<Connection> connectionTo(int rank);
  void accept();
  void admit(tcp::socket socket);
  void sweep();
  void checkDeadlines();
  void loadSecret();
  void dispatchRequest(const std::shared_ptr<Connection>& conn, const WireHeader& h, Reader& in,
                       std::vector<at::Tensor>& tensors);
  void respond(const std::shared_ptr<Connection>& conn, uint64_t id, int peer, int64_t context_id, const Future& result,
               const std::string& func);
  void finishIncoming() {
    std::lock_guard lock(idle_mutex_);
    --inflight_incoming_;
    ++completed_incoming_;
    idle_cv_.notify_all();
  }

  std::string name_;
  int rank_;
  int world_size_;
  RpcBackendOptions options_;
  std::vector<PeerAddress> peers_;
  std::unordered_map<std::string, int> by_name_;
  std::unique_ptr<rendezvous::TcpStoreClient> store_;
  std::string prefix_;
  std::string secret_;
  std::atomic<int64_t> refused_{0};
  Clock::time_point last_refusal_log_{};
  int sweeps_ = 0;

  asio::io_context io_;
  tcp::acceptor acceptor_;
  asio::steady_timer sweep_timer_;
  std::thread io_thread_;
  Pool pool_;
  std::atomic<bool> running_{false};
  std::atomic<bool> stopping_{false};

  std::mutex conn_mutex_;
  std::vector<std::shared_ptr<Connection>> outbound_;
  std::vector<std::shared_ptr<Connection>> inbound_;
  std::vector<std::unique_ptr<std::mutex>> connect_mutex_;

  std::mutex pending_mutex_;
  std::unordered_map<uint64_t, PendingCall> pending_;
  std::atomic<uint64_t> next_id_{1};

  std::mutex idle_mutex_;
  std::condition_variable idle_cv_;
  int64_t inflight_incoming_ = 0;
  int64_t completed_incoming_ = 0;
  int64_t sent_requests_ = 0;
  size_t pending_count_ = 0;  // mirror of pending_.size() under idle_mutex_

  std::mutex owner_mutex_;
  std::map<std::pair<int64_t, int64_t>, OwnerEntry> owned_;
  std::atomic<int64_t> next_rref_serial_{0};
};

// Never destroyed: a process that exits without shutdown() must not join (or
// destroy under) the agent's threads from a static destructor.
std::mutex& g_agent_mutex = *new std::mutex;
std::shared_ptr<Agent>& g_agent = *new std::shared_ptr<Agent>;

std::shared_ptr<Agent> agentOrNull() {
  std::lock_guard lock(g_agent_mutex);
  return g_agent;
}
std::shared_ptr<Agent> agent() {
  auto a = agentOrNull();
  if (!a) throw DdprunError("rpc: init_rpc has not been called (or shutdown already ran)");
  return a;
}

// ---- connection ----

void Connection::write(const OutMessage& m, Clock::time_point deadline) {
  std::vector<iovec> iov;
  iov.reserve(2 + m.tensors.size());
  iov.push_back({const_cast<WireHeader*>(&m.header), sizeof(WireHeader)});
  if (!m.meta.empty()) iov.push_back({const_cast<char*>(m.meta.data()), m.meta.size()});
  for (const auto& t : m.tensors) {
    if (t.nbytes() > 0) iov.push_back({t.data_ptr(), t.nbytes()});
  }
  std::lock_guard lock(write_mutex_);
  if (broken_) throw PeerError(brokenReason());
  size_t first = 0;
  while (first < iov.size()) {
    const int count = static_cast<int>(std::min<size_t>(iov.size() - first, IOV_MAX));
    // sendmsg with MSG_NOSIGNAL, not writev: a peer that closed early must fail this
    // write with EPIPE, not kill the worker with SIGPIPE.
    msghdr mh{};
    mh.msg_iov = iov.data() + first;
    mh.msg_iovlen = static_cast<size_t>(count);
    ssize_t n = ::sendmsg(fd_, &mh, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (closed_) throw PeerError("rpc: connection closed");
        if (Clock::now() > deadline) {
          throw RpcTimeout(fmt::format("rpc: write to {} timed out", agent_.describe(peer_)));
        }
        pollfd p{fd_, POLLOUT, 0};
        ::poll(&p, 1, 100);
        continue;
      }
      const std::string reason = fmt::format("connection to {} lost: {}", agent_.describe(peer_), std::strerror(errno));
      {
        std::lock_guard rl(reason_mutex_);
        if (reason_.empty()) reason_ = reason;
      }
      broken_ = true;
      throw PeerError("rpc: " + reason);
    }
    auto left = static_cast<size_t>(n);
    while (first < iov.size() && left >= iov[first].iov_len) {
      left -= iov[first].iov_len;
      ++first;
    }
    if (left > 0) {
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + left;
      iov[first].iov_len -= left;
    }
  }
}

void Connection::fail(const std::string& reason) {
  if (failed_.exchange(true)) return;
  {
    std::lock_guard lock(reason_mutex_);
    if (reason_.empty()) reason_ = reason;
  }
  broken_ = true;
  deadline_.reset();
  agent_.onConnectionLost(shared_from_this(), reason);
}

void Connection::start() {
  if (outbound_) return readHeader();
  deadline_ = opened_ + auth::kHandshakeTimeout;
  deadline_reason_ = fmt::format("no handshake within {} s", auth::kHandshakeTimeout.count());
  readHello();
}

void Connection::progress(const char* what) {
  deadline_ = Clock::now() + agent_.readTimeout();
  deadline_reason_ = fmt::format("{} stalled for {} ms", what, agent_.readTimeout().count());
}

// The callee's side of the handshake (rpc/auth.h); nothing else is read before it ends.
void Connection::readHello() {
  auto self = shared_from_this();
  asio::async_read(socket_, asio::buffer(&hello_, sizeof hello_), [self](const boost::system::error_code& ec, size_t) {
    if (self->lost(ec)) return;
    const auto& h = self->hello_;
    if (h.magic != auth::kHelloMagic || h.dst != self->agent_.rank() || h.src < 0 ||
        h.src >= self->agent_.worldSize()) {
      self->agent_.noteRefused("a connection that did not open with this job's handshake");
      return self->fail("no valid handshake");
    }
    self->client_nonce_.assign(reinterpret_cast<const char*>(h.nonce), auth::kNonceBytes);
    self->server_nonce_ = auth::randomNonce();
    auto& answer = self->server_hello_;
    answer.src = self->agent_.rank();
    std::memcpy(answer.nonce, self->server_nonce_.data(), auth::kNonceBytes);
    const std::string proof = auth::serverProof(self->agent_.secret(), h.src, self->agent_.rank(),
                                                self->client_nonce_, self->server_nonce_);
    std::memcpy(answer.proof, proof.data(), auth::kProofBytes);
    asio::async_write(self->socket_, asio::buffer(&answer, sizeof answer),
                      [self](const boost::system::error_code& ec2, size_t) {
                        if (!self->lost(ec2)) self->readProof();
                      });
  });
}

void Connection::readProof() {
  auto self = shared_from_this();
  asio::async_read(socket_, asio::buffer(&proof_, sizeof proof_), [self](const boost::system::error_code& ec, size_t) {
    if (self->lost(ec)) return;
    const int caller = self->hello_.src;
    const std::string expected = auth::clientProof(self->agent_.secret(), caller, self->agent_.rank(),
                                                   self->client_nonce_, self->server_nonce_);
    const std::string got(reinterpret_cast<const char*>(self->proof_.proof), auth::kProofBytes);
    if (!auth::proofsEqual(got, expected)) {
      self->agent_.noteRefused(fmt::format("a caller claiming rank {} without the job secret", caller));
      return self->fail("wrong proof");
    }
    asio::async_write(self->socket_, asio::buffer(&self->verdict_, 1),
                      [self, caller](const boost::system::error_code& ec2, size_t) {
                        if (self->lost(ec2)) return;
                        self->peer_ = caller;
                        self->authenticated_ = true;
                        self->deadline_.reset();
                        self->readHeader();
                      });
  });
}

// Reads the header in pieces so that a partial one is caught by the read deadline.
void Connection::readHeader() {
  header_received_ = 0;
  readHeaderPart();
}

void Connection::readHeaderPart() {
  auto self = shared_from_this();
  auto* base = reinterpret_cast<char*>(&header_);
  socket_.async_read_some(asio::buffer(base + header_received_, sizeof(WireHeader) - header_received_),
                          [self](const boost::system::error_code& ec, size_t n) {
                            if (self->lost(ec)) return;
                            self->header_received_ += n;
                            self->progress("a message header");
                            if (self->header_received_ < sizeof(WireHeader)) return self->readHeaderPart();
                            self->checkHeader();
                          });
}

void Connection::checkHeader() {
  const auto& h = header_;
  const bool known_kind =
      h.kind >= static_cast<uint8_t>(Kind::kRequest) && h.kind <= static_cast<uint8_t>(Kind::kError);
  if (h.magic != kMagic || h.meta_bytes > kMaxMeta || !known_kind) {
    return fail("malformed message (bad magic, kind or size)");
  }
  if (h.src != peer_) {
    return fail(fmt::format("malformed message (sender {} on the connection of rank {})", h.src, peer_));
  }
  readMeta();
}

// The metadata grows as its bytes arrive: an announced size costs nothing until sent.
void Connection::readMeta() {
  const size_t total = header_.meta_bytes;
  if (meta_received_ == total) return parseTable();
  const size_t target = std::min(total, std::max(wire::kFirstMetaChunk, meta_received_ * 2));
  meta_.resize(target);
  auto self = shared_from_this();
  socket_.async_read_some(asio::buffer(meta_.data() + meta_received_, target - meta_received_),
                          [self](const boost::system::error_code& ec, size_t n) {
                            if (self->lost(ec)) return;
                            self->meta_received_ += n;
                            self->progress("a message");
                            self->readMeta();
                          });
}

// Checks the whole tensor table (count, dtypes, dimensions, byte total) before any
// tensor is allocated.
void Connection::parseTable() {
  specs_.clear();
  in_tensors_.clear();
  try {
    Reader in(meta_.data(), meta_.size());
    const auto count = in.pod<uint32_t>();
    if (count > wire::kMaxTensors) {
      throw DdprunError(fmt::format("rpc: malformed message ({} tensors, at most {})", count, wire::kMaxTensors));
    }
    uint64_t total = 0;
    for (uint32_t i = 0; i < count; ++i) {
      const auto dtype = in.pod<int8_t>();
      const auto ndim = in.pod<uint8_t>();
      if (dtype < 0 || dtype >= static_cast<int8_t>(c10::ScalarType::NumOptions)) {
        throw DdprunError("rpc: malformed message (dtype)");
      }
      if (ndim > wire::kMaxDims) throw DdprunError("rpc: malformed message (too many dimensions)");
      TensorSpec spec{static_cast<c10::ScalarType>(dtype), std::vector<int64_t>(ndim), 0};
      uint64_t bytes = c10::elementSize(spec.dtype);
      for (auto& d : spec.sizes) {
        d = in.pod<int64_t>();
        if (d < 0) throw DdprunError("rpc: malformed message (negative size)");
        if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes)) {
          throw DdprunError("rpc: malformed message (tensor size overflows)");
        }
      }
      spec.bytes = bytes;
      if (__builtin_add_overflow(total, bytes, &total)) throw DdprunError("rpc: malformed message (tensor bytes)");
      specs_.push_back(std::move(spec));
    }
    body_offset_ = in.consumed(meta_.data());  // the body starts where the tensor table ends
    if (total != header_.tensor_bytes) throw DdprunError("rpc: malformed message (tensor bytes)");
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  next_tensor_ = 0;
  tensor_received_ = 0;
  readTensorBatch();
}

// Allocates the next tensors, at most as many bytes as have arrived so far (1 MiB at
// first), and reads into their storage with scatter reads. A single large tensor is
// allocated whole but not touched: its pages come into memory as its bytes arrive.
void Connection::readTensorBatch() {
  if (next_tensor_ == specs_.size()) return deliver();
  batch_.clear();
  batch_index_ = 0;
  const uint64_t budget = std::max(kFirstTensorBatch, tensor_received_);
  uint64_t bytes = 0;
  try {
    while (next_tensor_ < specs_.size()) {
      const auto& spec = specs_[next_tensor_];
      if (!batch_.empty() && bytes + spec.bytes > budget) break;
      at::Tensor t = at::empty(spec.sizes, at::TensorOptions().dtype(spec.dtype));
      if (spec.bytes > 0) batch_.emplace_back(t.data_ptr(), spec.bytes);
      in_tensors_.push_back(std::move(t));
      bytes += spec.bytes;
      ++next_tensor_;
    }
  } catch (const std::exception& e) {
    return fail(fmt::format("cannot allocate a received tensor: {}", e.what()));
  }
  readBatch();
}

void Connection::readBatch() {
  while (batch_index_ < batch_.size() && batch_[batch_index_].size() == 0) ++batch_index_;
  if (batch_index_ == batch_.size()) return readTensorBatch();
  // Asio reads at most 64 buffers per call.
  const size_t end = std::min(batch_.size(), batch_index_ + 64);
  std::vector<asio::mutable_buffer> view(batch_.begin() + static_cast<std::ptrdiff_t>(batch_index_),
                                         batch_.begin() + static_cast<std::ptrdiff_t>(end));
  auto self = shared_from_this();
  socket_.async_read_some(view, [self](const boost::system::error_code& ec, size_t n) {
    if (self->lost(ec)) return;
    self->tensor_received_ += n;
    self->progress("a message's tensors");
    while (n > 0) {
      auto& b = self->batch_[self->batch_index_];
      const size_t used = std::min(n, b.size());
      b += used;
      n -= used;
      if (b.size() == 0) ++self->batch_index_;
    }
    self->readBatch();
  });
}

void Connection::deliver() {
  deadline_.reset();
  try {
    agent_.onMessage(shared_from_this(), header_, meta_, body_offset_, in_tensors_);
  } catch (const std::exception& e) {
    return fail(std::string("bad message: ") + e.what());
  }
  in_tensors_.clear();
  specs_.clear();
  meta_received_ = 0;
  // A connection idle after a big message does not keep its buffer.
  if (meta_.capacity() > (1u << 20)) std::string().swap(meta_);
  if (!closed_) readHeader();
}

// ---- agent ----

void Agent::start() {
  // Meet through the store: MASTER_ADDR/MASTER_PORT (the agent's store under
  // ddprun).
  std::string host = options_.store_host;
  int store_port = options_.store_port;
  if (host.empty()) {
    const char* a = std::getenv(env::kMasterAddr);
    const char* p = std::getenv(env::kMasterPort);
    if (!a || !p)
      throw DdprunError(
          "init_rpc: MASTER_ADDR and MASTER_PORT must be set "
          "(start with ddprun)");
    host = a;
    store_port = std::atoi(p);
  }
  rendezvous::StoreClientOptions so;
  so.host = host;
  so.port = store_port;
  so.timeout = options_.init_timeout;
  so.connect_timeout = options_.init_timeout;
  store_ = std::make_unique<rendezvous::TcpStoreClient>(so);
  const char* attempt = std::getenv(env::kRestartCount);
  prefix_ = fmt::format("ddprun/rpc/{}/", attempt ? attempt : "0");
  loadSecret();
  // Listen only on the address peers reach this worker at (the one its store connection
  // uses), not the wildcard: a one-node job stays on loopback, as torch's TensorPipe does.
  const std::string my_host = store_->localAddress();
  boost::system::error_code ec;
  const auto my_address = asio::ip::make_address(my_host, ec);
  if (ec) throw DdprunError(fmt::format("init_rpc: this worker's address '{}' is not an IP address", my_host));
  acceptor_.open(my_address.is_v4() ? tcp::v4() : tcp::v6());
  acceptor_.set_option(tcp::acceptor::reuse_address(true));
  acceptor_.bind(tcp::endpoint(my_address, 0));
  acceptor_.listen(1024);
  const int port = acceptor_.local_endpoint().port();
  store_->set(prefix_ + "worker/" + std::to_string(rank_), fmt::format("{}\n{}\n{}", name_, my_host, port));

  std::vector<std::string> keys;
  for (int r = 0; r < world_size_; ++r) keys.push_back(prefix_ + "worker/" + std::to_string(r));
  peers_.resize(world_size_);
  for (int r = 0; r < world_size_; ++r) {
    std::string v;
    try {
      v = store_->get(keys[r]);
    } catch (const rendezvous::StoreError& e) {
      throw rendezvous::StoreError(
          fmt::format("init_rpc: worker with rank {} never published its address: {}", r, e.what()));
    }
    auto a = v.find('\n'), b = v.rfind('\n');
    if (a == std::string::npos || a == b)
      throw DdprunError("init_rpc: malformed address entry for rank " + std::to_string(r));
    peers_[r] = {v.substr(0, a), v.substr(a + 1, b - a - 1), std::atoi(v.c_str() + b + 1)};
    if (!by_name_.emplace(peers_[r].name, r).second) {
      throw DdprunError(fmt::format("init_rpc: worker name '{}' is used by ranks {} and {}", peers_[r].name,
                                    by_name_[peers_[r].name], r));
    }
  }
  outbound_.resize(world_size_);
  for (int r = 0; r < world_size_; ++r) connect_mutex_.push_back(std::make_unique<std::mutex>());
  running_ = true;
  accept();
  sweep();
  io_thread_ = std::thread([this] {
    try {
      io_.run();
    } catch (const std::exception& e) {
      log()->error("rpc I/O thread: {}", e.what());
    }
  });
  log()->debug("rpc agent '{}' (rank {}) listening on {}:{}", name_, rank_, my_host, port);
}

// The secret the launcher handed over, else one agreed through the store (the first
// worker to arrive makes it): then the RPC is as private as the store.
void Agent::loadSecret() {
  if (auto secret = auth::secretFromEnvironment()) {
    secret_ = *secret;
    return;
  }
  secret_ = store_->compareSet(prefix_ + "secret", "", auth::randomSecret());
  if (rank_ == 0) {
    log()->info("rpc: no job secret from the launcher ({}); peers authenticate with one shared through the store",
                env::kRpcSecretFile);
  }
}

void Agent::noteRefused(const std::string& reason) {
  const int64_t n = refused_.fetch_add(1) + 1;
  const auto now = Clock::now();
  if (now - last_refusal_log_ < std::chrono::seconds(10)) return;  // I/O thread only
  last_refusal_log_ = now;
  log()->warn("rpc: refused {} ({} refused so far)", reason, n);
}

void Agent::accept() {
  acceptor_.async_accept([this](const boost::system::error_code& ec, tcp::socket socket) {
    if (ec) {
      if (stopping_) return;
      // Out of descriptors or similar: try again shortly instead of spinning.
      log()->warn("rpc accept: {}", ec.message());
      auto timer = std::make_shared<asio::steady_timer>(io_, std::chrono::milliseconds(100));
      timer->async_wait([this, timer](const boost::system::error_code&) {
        if (!stopping_) accept();
      });
      return;
    }
    try {
      admit(std::move(socket));
    } catch (const std::exception& e) {
      log()->warn("rpc accept: {}", e.what());
    }
    if (!stopping_) accept();
  });
}

// Past kMaxUnauthenticated connections in the handshake, the oldest of them is closed:
// callers finish the handshake in milliseconds, so the oldest is the likeliest stranger.
void Agent::admit(tcp::socket socket) {
  auto conn = std::make_shared<Connection>(*this, std::move(socket), -1, false);
  std::shared_ptr<Connection> oldest;
  {
    std::lock_guard lock(conn_mutex_);
    size_t waiting = 0;
    for (const auto& c : inbound_) {
      if (c->authenticated()) continue;
      ++waiting;
      if (!oldest || c->opened() < oldest->opened()) oldest = c;
    }
    if (waiting < auth::kMaxUnauthenticated) oldest.reset();
    inbound_.push_back(conn);
  }
  if (oldest) {
    noteRefused("connections that did not authenticate (too many waiting; closing the oldest)");
    oldest->fail("too many connections waiting to authenticate");
  }
  conn->start();
}

void Agent::checkDeadlines() {
  std::vector<std::shared_ptr<Connection>> all;
  {
    std::lock_guard lock(conn_mutex_);
    all = inbound_;
    for (const auto& c : outbound_) {
      if (c) all.push_back(c);
    }
  }
  const auto now = Clock::now();
  for (const auto& c : all) c->checkDeadline(now);
}

void Agent::sweep() {
  sweep_timer_.expires_after(std::chrono::milliseconds(20));
  sweep_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec || stopping_) return;
    const auto now = Clock::now();
    std::vector<PendingCall> expired;
    {
      std::lock_guard lock(pending_mutex_);
      for (auto it = pending_.begin(); it != pending_.end();) {
        if (it->second.deadline <= now) {
          expired.push_back(std::move(it->second));
          it = pending_.erase(it);
        } else {
          ++it;
        }
      }
    }
    if (!expired.empty()) {
      {
        std::lock_guard lock(idle_mutex_);
        pending_count_ -= expired.size();
      }
      idle_cv_.notify_all();
    }
    for (auto& p : expired) {
      p.future.set_exception(std::make_exception_ptr(RpcTimeout(
          fmt::format("rpc '{}' to {}: timed out after {} ms", p.func, describe(p.peer), p.timeout.count()))));
    }
    if (++sweeps_ % 10 == 0) checkDeadlines();
    sweep();
  });
}

std::shared_ptr<Connection> Agent::connectionTo(int rank) {
  if (rank < 0 || rank >= world_size_) throw DdprunError(fmt::format("rpc: no worker with rank {}", rank));
  {
    std::lock_guard lock(conn_mutex_);
    if (outbound_[rank]) return outbound_[rank];
  }
  std::lock_guard connect_lock(*connect_mutex_[rank]);
  {
    std::lock_guard lock(conn_mutex_);
    if (outbound_[rank]) return outbound_[rank];
  }
  const auto& p = peers_[rank];
  tcp::socket socket(io_);
  boost::system::error_code ec;
  auto address = asio::ip::make_address(p.host, ec);
  if (ec) throw PeerError(fmt::format("rpc: bad address of {}: {}", describe(rank), ec.message()));
  socket.open(tcp::v4());
  // Connect with a deadline (a peer on a vanished host must not hang us).
  const int fd = socket.native_handle();
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(p.port));
  sa.sin_addr.s_addr = htonl(address.to_v4().to_uint());
  int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa);
  if (rc != 0 && errno == EINPROGRESS) {
    pollfd pfd{fd, POLLOUT, 0};
    rc = ::poll(&pfd, 1, static_cast<int>(options_.rpc_timeout.count()));
    if (rc == 0) throw PeerError(fmt::format("rpc: connecting to {} timed out", describe(rank)));
    int err = 0;
    socklen_t len = sizeof err;
    ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) {
      throw PeerError(fmt::format("rpc: cannot connect to {}: {}", describe(rank), std::strerror(err)));
    }
  } else if (rc != 0) {
    throw PeerError(fmt::format("rpc: cannot connect to {}: {}", describe(rank), std::strerror(errno)));
  }
  auth::clientHandshake(fd, secret_, rank_, rank, Clock::now() + std::min<std::chrono::milliseconds>(options_.rpc_timeout, auth::kHandshakeTimeout),
                        describe(rank));
  auto conn = std::make_shared<Connection>(*this, std::move(socket), rank, true);
  {
    std::lock_guard lock(conn_mutex_);
    outbound_[rank] = conn;
  }
  asio::post(io_, [conn] { conn->start(); });
  return conn;
}

Future Agent::call(int rank, const std::string& func, const Args& args, std::chrono::milliseconds timeout,
                   int64_t context_id, std::optional<std::pair<int64_t, int64_t>> rref_id) {
  if (stopping_) throw RpcError(fmt::format("rpc '{}' to {}: the agent is shut down", func, describe(rank)));
  timeout = timeoutOr(timeout);
  Future future;
  auto conn = connectionTo(rank);
  if (conn->broken()) throw PeerError(fmt::format("rpc '{}' to {}: {}", func, describe(rank), conn->brokenReason()));
  const uint64_t id = next_id_.fetch_add(1);
  Encoder enc{{rank, context_id}, {}, {}, {}};
  enc.body.str(func);
  enc.body.pod(context_id);
  enc.body.pod(rref_id ? rref_id->first : int64_t{-1});
  enc.body.pod(rref_id ? rref_id->second : int64_t{-1});
  if (context_id >= 0) detail::touchContext(context_id, rank);
  enc.value(Value(Value::List(args.begin(), args.end())));
  OutMessage msg = enc.finish(Kind::kRequest, id);
  const auto deadline = Clock::now() + timeout;
  {
    std::lock_guard lock(pending_mutex_);
    pending_.emplace(id, PendingCall{future, rank, func, context_id, deadline, timeout, conn});
  }
  {
    std::lock_guard lock(idle_mutex_);
    ++pending_count_;
    ++sent_requests_;
  }
  try {
    conn->write(msg, deadline);
  } catch (const RpcError& e) {
    bool mine = false;
    {
      std::lock_guard lock(pending_mutex_);
      mine = pending_.erase(id) > 0;
    }
    if (mine) {
      {
        std::lock_guard lock(idle_mutex_);
        --pending_count_;
      }
      idle_cv_.notify_all();
      future.set_exception(
          std::make_exception_ptr(PeerError(fmt::format("rpc '{}' to {}: {}", func, describe(rank), e.what()))));
    }
  }
  return future;
}

RRef Agent::remote(int rank, const std::string& func, const Args& args, std::chrono::milliseconds timeout) {
  auto [creator, serial] = newRRefId();
  auto state = std::make_shared<RRefState>();
  state->owner = rank;
  state->creator = creator;
  state->serial = serial;
  if (rank == rank_) {
    // The owner is this worker: run here, no wire (and no race between
    // registration and a release of the handle we return).
    Future value;
    ownerRegister(creator, serial, value, 1);
    state->local = value;
    state->has_local = true;
    Registered reg;
    {
      std::shared_lock lock(registry().mutex);
      auto it = registry().functions.find(func);
      if (it == registry().functions.end()) {
        value.set_exception(std::make_exception_ptr(
            RemoteError(fmt::format("remote '{}' on {}: no such function", func, describe(rank)))));
        return RRef(state);
      }
      reg = it->second;
    }
    post([reg, args, value, func, this] {
      try {
        Future f = reg.fn(args);
        f.add_done_callback([value](const Future& done) {
          if (auto e = done.exception()) {
            value.set_exception(e);
          } else {
            value.set_result(done.value());
          }
        });
      } catch (const std::exception& e) {
        value.set_exception(std::make_exception_ptr(
            RemoteError(fmt::format("remote '{}' on {}: {}", func, describe(rank_), e.what()))));
      }
    });
    return RRef(state);
  }
  // The request itself registers the reference on the owner, before any later
  // release sent over the same connection.
  call(rank, func, args, timeout, -1, std::make_pair(creator, serial));
  return RRef(state);
}

void Agent::onConnectionLost(const std::shared_ptr<Connection>& conn, const std::string& reason) {
  conn->close();
  if (!conn->outbound()) {
    {
      std::lock_guard lock(conn_mutex_);
      std::erase(inbound_, conn);
    }
    if (!stopping_) log()->debug("rpc: incoming connection from rank {} closed: {}", conn->peer(), reason);
    return;
  }
  std::vector<PendingCall> failed;
  {
    std::lock_guard lock(pending_mutex_);
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->second.connection == conn) {
        failed.push_back(std::move(it->second));
        it = pending_.erase(it);
      } else {
        ++it;
      }
    }
  }
  if (!failed.empty()) {
    {
      std::lock_guard lock(idle_mutex_);
      pending_count_ -= failed.size();
    }
    idle_cv_.notify_all();
    log()->warn("rpc: lost {} ({}); failing {} pending call(s)", describe(conn->peer()), reason, failed.size());
  }
  for (auto& p : failed) {
    p.future.set_exception(std::make_exception_ptr(
        PeerError(fmt::format("rpc '{}' to {}: connection lost ({})", p.func, describe(p.peer), reason))));
  }
}

void Agent::onMessage(const std::shared_ptr<Connection>& conn, const WireHeader& h, const std::string& meta,
                      size_t body_offset, std::vector<at::Tensor>& tensors) {
  Reader in(meta.data() + body_offset, meta.size() - body_offset);
  const auto kind = static_cast<Kind>(h.kind);
  if (kind == Kind::kRequest) return dispatchRequest(conn, h, in, tensors);
  if (kind != Kind::kResponse && kind != Kind::kError) throw DdprunError("rpc: unknown message kind");
  PendingCall call;
  {
    std::lock_guard lock(pending_mutex_);
    auto it = pending_.find(h.id);
    if (it == pending_.end()) return;  // timed out already
    // A reply counts only on the connection its call went out on: ids are guessable.
    if (it->second.connection != conn) {
      throw DdprunError(fmt::format("a reply to call {} that was not sent on this connection", h.id));
    }
    call = std::move(it->second);
    pending_.erase(it);
  }
  {
    std::lock_guard lock(idle_mutex_);
    --pending_count_;
  }
  idle_cv_.notify_all();
  if (kind == Kind::kError) {
    call.future.set_exception(std::make_exception_ptr(RemoteError(in.str())));
    return;
  }
  try {
    Decoder dec{in, tensors, conn->peer(), call.context_id};
    call.future.set_result(dec.value());
  } catch (const std::exception& e) {
    call.future.set_exception(std::current_exception());
  }
}

void Agent::dispatchRequest(const std::shared_ptr<Connection>& conn, const WireHeader& h, Reader& in,
                            std::vector<at::Tensor>& tensors) {
  const std::string func = in.str();
  const auto context_id = in.pod<int64_t>();
  const auto rref_creator = in.pod<int64_t>();
  const auto rref_serial = in.pod<int64_t>();
  const int src = h.src;
  // remote(): the caller names the value it creates; it can only be one of its own.
  if (rref_creator >= 0 && (rref_creator != src || rref_serial < 0)) {
    throw DdprunError(fmt::format("malformed request (RRef {}:{} created by rank {})", rref_creator, rref_serial, src));
  }
  const uint64_t id = h.id;
  {
    std::lock_guard lock(idle_mutex_);
    ++inflight_incoming_;
  }
  Future result;
  Future owned;  // for remote(): the value kept here
  if (rref_creator >= 0) ownerRegister(rref_creator, rref_serial, owned, 1);
  auto finish = [this, conn, id, src, context_id, func, rref_creator](const Future& result, Future owned) {
    if (rref_creator >= 0) {
      if (auto e = result.exception()) {
        owned.set_exception(e);
      } else {
        owned.set_result(result.value());
      }
      respond(conn, id, src, -1, readyNone(), func);
    } else {
      respond(conn, id, src, context_id, result, func);
    }
  };
  Args args;
  Registered reg;
  try {
    if (context_id >= 0) detail::touchContext(context_id, src);
    Decoder dec{in, tensors, src, context_id};
    Value v = dec.value();
    args = std::move(v.toList());
    std::shared_lock lock(registry().mutex);
    auto it = registry().functions.find(func);
    if (it == registry().functions.end()) throw DdprunError("no such function");
    reg = it->second;
  } catch (const std::exception& e) {
    result.set_exception(std::current_exception());
    finish(result, owned);
    return;
  }
  auto run = [this, reg, args = std::move(args), src, context_id, finish, owned]() mutable {
    Future out;
    const int previous_caller = t_caller;
    t_caller = src;
    detail::setCurrentContext(context_id);
    try {
      out = reg.fn(args);
    } catch (const std::exception&) {
      out = Future();
      out.set_exception(std::current_exception());
    }
    detail::setCurrentContext(-1);
    t_caller = previous_caller;
    args.clear();
    out.add_done_callback([finish, owned](const Future& done) { finish(done, owned); });
  };
  if (reg.run_inline) {
    run();
  } else {
    pool_.post(std::move(run));
  }
}

void Agent::respond(const std::shared_ptr<Connection>& conn, uint64_t id, int peer, int64_t context_id,
                    const Future& result, const std::string& func) {
  OutMessage msg;
  auto error = result.exception();
  if (!error) {
    try {
      Encoder enc{{peer, context_id}, {}, {}, {}};
      enc.value(result.value());
      msg = enc.finish(Kind::kResponse, id);
    } catch (const std::exception&) {
      error = std::current_exception();
    }
  }
  if (error) {
    std::string text;
    try {
      std::rethrow_exception(error);
    } catch (const RemoteError& e) {
      text = e.what();  // already names where it came from
    } catch (const std::exception& e) {
      text = fmt::format("'{}' on worker '{}' (rank {}) raised: {}", func, name_, rank_, e.what());
    }
    Encoder enc{{peer, -1}, {}, {}, {}};
    enc.body.str(text);
    msg = enc.finish(Kind::kError, id);
  }
  try {
    conn->write(msg, Clock::now() + options_.rpc_timeout);
  } catch (const std::exception& e) {
    log()->debug("rpc: reply to rank {} for '{}' not delivered: {}", peer, func, e.what());
  }
  finishIncoming();
}

void Agent::ownerRegister(int64_t creator, int64_t serial, Future value, int64_t refs) {
  std::lock_guard lock(owner_mutex_);
  auto& e = owned_[{creator, serial}];
  e.value = value;
  e.refs += refs;
}

void Agent::ownerAdd(int64_t creator, int64_t serial, int64_t n) {
  OwnerEntry dropped;
  {
    std::lock_guard lock(owner_mutex_);
    auto it = owned_.find({creator, serial});
    if (it == owned_.end()) {
      if (n > 0) log()->warn("rpc: reference added to RRef {}:{}:{} that no longer exists", rank_, creator, serial);
      return;
    }
    it->second.refs += n;
    if (it->second.refs <= 0) {
      dropped = std::move(it->second);
      owned_.erase(it);
    }
  }
  // `dropped` (and any RRefs inside its value) is released here, outside the
  // lock.
}

void Agent::ownerRelease(int64_t creator, int64_t serial) { ownerAdd(creator, serial, -1); }

Future Agent::ownerValue(int64_t creator, int64_t serial) {
  std::lock_guard lock(owner_mutex_);
  auto it = owned_.find({creator, serial});
  if (it == owned_.end()) {
    throw DdprunError(fmt::format("rpc: RRef {}:{}:{} does not exist on its owner (released)", rank_, creator, serial));
  }
  return it->second.value;
}

void Agent::gracefulShutdown() {
  // Rounds until two in a row agree that every worker is idle and every request
  // sent in the job was answered: a worker idle when it reported can be woken
  // only by a request, which shows up as sent-but-not-served in the sums.
  int64_t last_sent = -1, last_done = -1;
  for (int round = 0;; ++round) {
    {
      std::unique_lock lock(idle_mutex_);
      if (!idle_cv_.wait_for(lock, options_.rpc_timeout,
                             [&] { return pending_count_ == 0 && inflight_incoming_ == 0; })) {
        throw RpcError(fmt::format("rpc shutdown: calls still outstanding after {} ms on '{}'",
                                   options_.rpc_timeout.count(), name_));
      }
    }
    int64_t sent, done;
    {
      std::lock_guard lock(idle_mutex_);
      sent = sent_requests_;
      done = completed_incoming_;
    }
    const std::string base = fmt::format("{}shutdown/{}/", prefix_, round);
    store_->set(base + std::to_string(rank_), fmt::format("{} {}", sent, done));
    int64_t total_sent = 0, total_done = 0;
    for (int r = 0; r < world_size_; ++r) {
      std::string v;
      try {
        v = store_->get(base + std::to_string(r));
      } catch (const rendezvous::StoreError& e) {
        throw RpcError(fmt::format("rpc shutdown: {} did not reach shutdown: {}", describe(r), e.what()));
      }
      long long s = 0, d = 0;
      std::sscanf(v.c_str(), "%lld %lld", &s, &d);
      total_sent += s;
      total_done += d;
    }
    if (total_sent == total_done && total_sent == last_sent && total_done == last_done) break;
    last_sent = total_sent;
    last_done = total_done;
  }
}

void Agent::stop() {
  if (stopping_.exchange(true)) return;
  running_ = false;
  boost::system::error_code ec;
  asio::post(io_, [this] {
    boost::system::error_code ec2;
    acceptor_.close(ec2);
    sweep_timer_.cancel();
    std::lock_guard lock(conn_mutex_);
    for (auto& c : outbound_) {
      if (c) c->close();
    }
    for (auto& c : inbound_) c->close();
  });
  io_.stop();
  if (io_thread_.joinable()) io_thread_.join();
  {
    std::lock_guard lock(conn_mutex_);
    for (auto& c : outbound_) {
      if (c) c->close();
    }
    for (auto& c : inbound_) c->close();
  }
  pool_.stop();
  std::vector<PendingCall> failed;
  {
    std::lock_guard lock(pending_mutex_);
    for (auto& [id, p] : pending_) failed.push_back(std::move(p));
    pending_.clear();
  }
  for (auto& p : failed) {
    p.future.set_exception(std::make_exception_ptr(RpcError(fmt::format("rpc '{}': the agent shut down", p.func))));
  }
  std::map<std::pair<int64_t, int64_t>, OwnerEntry> owned;
  {
    std::lock_guard lock(owner_mutex_);
    owned.swap(owned_);
  }
  owned.clear();
  store_.reset();
}

// ---- RRef plumbing ----

void forkRRef(const RRefState& state, int dst) {
  auto a = agent();
  if (state.owner == a->rank()) {
    a->ownerAdd(state.creator, state.serial,
                1);  // the receiver's new reference, counted now
  } else if (dst != state.owner) {
    // A third worker: the owner must count it before this message can reach it.
    a->call(state.owner, "ddprun.rref.add", {state.creator, state.serial}, kDefaultTimeout, -1).wait();
  }
  // dst == owner: the owner counts it when it decodes the message (same
  // connection order).
}

std::shared_ptr<RRefState> adoptRRef(int owner, int64_t creator, int64_t serial, int src) {
  auto a = agent();
  if (owner < 0 || owner >= a->worldSize() || creator < 0 || creator >= a->worldSize() || serial < 0) {
    throw DdprunError(fmt::format("rpc: malformed message (RRef {}:{}:{} in a job of {})", owner, creator, serial,
                                  a->worldSize()));
  }
  auto state = std::make_shared<RRefState>();
  state->owner = owner;
  state->creator = creator;
  state->serial = serial;
  if (owner == a->rank()) {
    if (src != owner) a->ownerAdd(creator, serial, 1);
    try {
      state->local = a->ownerValue(creator, serial);
      state->has_local = true;
    } catch (const DdprunError&) {
      state->has_local = false;
    }
  }
  return state;
}

}  // namespace

// ---- Value ----

Value::Value(std::vector<at::Tensor> v) {
  List list;
  list.reserve(v.size());
  for (auto& t : v) list.emplace_back(std::move(t));
  v_ = std::move(list);
}
Value::Value(const RRef& v) : v_(v.state()) {}

std::string Value::typeName() const {
  static const char* names[] = {"none", "bool", "int", "double", "string", "tensor", "list", "RRef", "object"};
  if (isObject()) return "object " + toObject()->typeName();
  return names[v_.index()];
}
void Value::throwType(const char* expected) const {
  throw DdprunError(fmt::format("rpc value: expected {}, got {}", expected, typeName()));
}
bool Value::toBool() const {
  if (!isBool()) throwType("bool");
  return std::get<bool>(v_);
}
int64_t Value::toInt() const {
  if (!isInt()) throwType("int");
  return std::get<int64_t>(v_);
}
double Value::toDouble() const {
  if (isInt()) return static_cast<double>(std::get<int64_t>(v_));
  if (!isDouble()) throwType("double");
  return std::get<double>(v_);
}
const std::string& Value::toString() const {
  if (!isString()) throwType("string");
  return std::get<std::string>(v_);
}
const at::Tensor& Value::toTensor() const {
  if (!isTensor()) throwType("tensor");
  return std::get<at::Tensor>(v_);
}
const Value::List& Value::toList() const {
  if (!isList()) throwType("list");
  return std::get<List>(v_);
}
Value::List& Value::toList() {
  if (!isList()) throwType("list");
  return std::get<List>(v_);
}
std::vector<at::Tensor> Value::toTensorList() const {
  std::vector<at::Tensor> out;
  for (const auto& v : toList()) out.push_back(v.toTensor());
  return out;
}
RRef Value::toRRef() const {
  if (!isRRef()) throwType("RRef");
  return RRef(std::get<std::shared_ptr<detail::RRefState>>(v_));
}
const std::shared_ptr<Object>& Value::toObject() const {
  if (!isObject()) throwType("object");
  return std::get<std::shared_ptr<Object>>(v_);
}

// ---- Future ----

Future::Future() : state_(std::make_shared<FutureState>()) {}

Value Future::wait() const {
  std::unique_lock lock(state_->mutex);
  state_->cv.wait(lock, [&] { return state_->done; });
  if (state_->error) std::rethrow_exception(state_->error);
  return state_->value;
}
bool Future::wait_for(std::chrono::milliseconds timeout) const {
  std::unique_lock lock(state_->mutex);
  return state_->cv.wait_for(lock, timeout, [&] { return state_->done; });
}
bool Future::done() const {
  std::lock_guard lock(state_->mutex);
  return state_->done;
}
Value Future::value() const {
  std::lock_guard lock(state_->mutex);
  DDPRUN_CHECK(state_->done, "Future::value() on a pending future");
  if (state_->error) std::rethrow_exception(state_->error);
  return state_->value;
}
std::exception_ptr Future::exception() const {
  std::lock_guard lock(state_->mutex);
  return state_->error;
}
void Future::add_done_callback(std::function<void(const Future&)> fn) const {
  {
    std::lock_guard lock(state_->mutex);
    if (!state_->done) {
      state_->callbacks.push_back([fn = std::move(fn), self = *this] { fn(self); });
      return;
    }
  }
  fn(*this);
}
Future Future::then(std::function<Value(Future)> fn) const {
  Future next;
  add_done_callback([fn = std::move(fn), next](const Future& done) {
    detail::post([fn, next, done] {
      try {
        next.set_result(fn(done));
      } catch (...) {
        next.set_exception(std::current_exception());
      }
    });
  });
  return next;
}
void Future::set_result(Value value) const {
  std::vector<std::function<void()>> callbacks;
  {
    std::lock_guard lock(state_->mutex);
    DDPRUN_CHECK(!state_->done, "Future completed twice");
    state_->value = std::move(value);
    state_->done = true;
    callbacks.swap(state_->callbacks);
  }
  state_->cv.notify_all();
  for (auto& cb : callbacks) cb();
}
void Future::set_exception(std::exception_ptr error) const {
  std::vector<std::function<void()>> callbacks;
  {
    std::lock_guard lock(state_->mutex);
    DDPRUN_CHECK(!state_->done, "Future completed twice");
    state_->error = std::move(error);
    state_->done = true;
    callbacks.swap(state_->callbacks);
  }
  state_->cv.notify_all();
  for (auto& cb : callbacks) cb();
}

std::vector<Value> wait_all(const std::vector<Future>& futures) {
  std::vector<Value> out;
  std::exception_ptr first;
  for (const auto& f : futures) {
    try {
      out.push_back(f.wait());
    } catch (...) {
      if (!first) first = std::current_exception();
      out.emplace_back();
    }
  }
  if (first) std::rethrow_exception(first);
  return out;
}

// ---- RRef ----

detail::RRefState::~RRefState() {
  auto a = agentOrNull();
  if (!a || !a->running() || owner < 0) return;
  try {
    if (owner == a->rank()) {
      local = Future();  // drop our hold on the value before the owner may free it
      a->ownerRelease(creator, serial);
    } else {
      // On the pool: the last handle may die on the I/O thread (a decoded message), which
      // must not wait to connect to the owner. Counted as a pending call until sent, so
      // shutdown waits for it.
      a->sendInBackground([a, owner = owner, creator = creator, serial = serial] {
        a->call(owner, "ddprun.rref.release", {creator, serial}, kDefaultTimeout, -1);
      });
    }
  } catch (const std::exception& e) {
    log()->debug("rpc: releasing RRef {}:{}:{}: {}", owner, creator, serial, e.what());
  }
}

RRef::RRef(Value value) {
  auto a = agent();
  auto [creator, serial] = a->newRRefId();
  Future f;
  f.set_result(std::move(value));
  a->ownerRegister(creator, serial, f, 1);
  auto s = std::make_shared<detail::RRefState>();
  s->owner = a->rank();
  s->creator = creator;
  s->serial = serial;
  s->local = f;
  s->has_local = true;
  state_ = std::move(s);
}

WorkerInfo RRef::owner() const {
  DDPRUN_CHECK(state_, "RRef::owner() on an empty RRef");
  return agent()->info(state_->owner);
}
bool RRef::is_owner() const { return state_ && state_->owner == agent()->rank(); }
std::string RRef::id() const {
  DDPRUN_CHECK(state_, "RRef::id() on an empty RRef");
  return fmt::format("{}:{}:{}", state_->owner, state_->creator, state_->serial);
}
Value RRef::to_here(std::chrono::milliseconds timeout) const {
  DDPRUN_CHECK(state_, "RRef::to_here() on an empty RRef");
  auto a = agent();
  if (state_->owner == a->rank()) {
    if (!state_->has_local) throw DdprunError("rpc: RRef " + id() + " no longer exists on its owner");
    Future f = state_->local;
    if (!f.wait_for(a->timeoutOr(timeout))) throw RpcTimeout("rpc: RRef " + id() + ": value not ready in time");
    return f.value();
  }
  return a
      ->call(state_->owner, "ddprun.rref.fetch", {state_->creator, state_->serial}, timeout,
             dist_autograd::current_context_id())
      .wait();
}
Value RRef::local_value() const {
  DDPRUN_CHECK(state_, "RRef::local_value() on an empty RRef");
  if (!state_->has_local) {
    throw DdprunError(fmt::format("rpc: RRef {} is owned by {}, not this worker", id(), owner().name));
  }
  return state_->local.wait();
}

// ---- public functions ----

void register_function(const std::string& name, Function fn) {
  register_async_function(name, [fn = std::move(fn)](const Args& args) {
    Future f;
    f.set_result(fn(args));
    return f;
  });
}
void register_async_function(const std::string& name, AsyncFunction fn) {
  std::unique_lock lock(registry().mutex);
  registry().functions[name] = {std::move(fn), false};
}

void detail::registerBuiltin(const std::string& name, AsyncFunction fn, bool run_inline) {
  std::unique_lock lock(registry().mutex);
  registry().functions[name] = {std::move(fn), run_inline};
}

namespace {
Future ready(Value v) {
  Future f;
  f.set_result(std::move(v));
  return f;
}

void registerRRefBuiltins() {
  using detail::registerBuiltin;
  registerBuiltin(
      "ddprun.rref.add",
      [](const Args& a) {
        agent()->ownerAdd(a.at(0).toInt(), a.at(1).toInt(), 1);
        return ready({});
      },
      true);
  registerBuiltin(
      "ddprun.rref.release",
      [](const Args& a) {
        agent()->ownerRelease(a.at(0).toInt(), a.at(1).toInt());
        return ready({});
      },
      true);
  registerBuiltin(
      "ddprun.rref.fetch", [](const Args& a) { return agent()->ownerValue(a.at(0).toInt(), a.at(1).toInt()); }, true);
  registerBuiltin(
      "ddprun.rref.wait",
      [](const Args& a) {
        Future created;
        agent()->ownerValue(a.at(0).toInt(), a.at(1).toInt()).add_done_callback([created](const Future& v) {
          if (auto e = v.exception()) {
            created.set_exception(e);
          } else {
            created.set_result({});
          }
        });
        return created;
      },
      true);
  registerBuiltin(
      "ddprun.rref.owned_count", [](const Args&) { return ready(Value(agent()->ownedCount())); }, true);
}
}  // namespace

void init_rpc(const std::string& name, int rank, int world_size, const RpcBackendOptions& options) {
  if (name.empty()) throw DdprunError("init_rpc: the worker name is empty");
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    throw DdprunError(fmt::format("init_rpc: rank {} of world size {}", rank, world_size));
  }
  {
    std::lock_guard lock(g_agent_mutex);
    if (g_agent) throw DdprunError("init_rpc: RPC is already initialized");
  }
  registerRRefBuiltins();
  detail::registerAutogradBuiltins();
  detail::registerModuleBuiltins();
  detail::registerOptimizerBuiltins();
  auto a = std::make_shared<Agent>(name, rank, world_size, options);
  a->start();
  std::lock_guard lock(g_agent_mutex);
  g_agent = a;
}

bool is_initialized() { return agentOrNull() != nullptr; }

void shutdown() {
  auto a = agent();
  std::exception_ptr error;
  try {
    a->gracefulShutdown();
  } catch (...) {
    error = std::current_exception();
  }
  detail::clearContexts();
  a->stop();
  {
    std::lock_guard lock(g_agent_mutex);
    g_agent.reset();
  }
  if (error) std::rethrow_exception(error);
}

WorkerInfo get_worker_info() {
  auto a = agent();
  return a->info(a->rank());
}
WorkerInfo get_worker_info(const std::string& name) {
  auto a = agent();
  return a->info(a->rankOf(name));
}
std::vector<WorkerInfo> get_all_worker_infos() {
  auto a = agent();
  std::vector<WorkerInfo> out;
  for (int r = 0; r < a->worldSize(); ++r) out.push_back(a->info(r));
  return out;
}

Future rpc_async(const std::string& to, const std::string& func, const Args& args, std::chrono::milliseconds timeout) {
  auto a = agent();
  return a->call(a->rankOf(to), func, args, timeout, dist_autograd::current_context_id());
}
Value rpc_sync(const std::string& to, const std::string& func, const Args& args, std::chrono::milliseconds timeout) {
  return rpc_async(to, func, args, timeout).wait();
}
RRef remote(const std::string& to, const std::string& func, const Args& args, std::chrono::milliseconds timeout) {
  auto a = agent();
  return a->remote(a->rankOf(to), func, args, timeout);
}
int64_t owned_rref_count() { return agent()->ownedCount(); }

// ---- detail ----

int detail::selfRank() { return agent()->rank(); }
WorkerInfo detail::workerInfo(int rank) { return agent()->info(rank); }
Future detail::callRank(int rank, const std::string& func, const Args& args, std::chrono::milliseconds timeout,
                        int64_t context_id) {
  return agent()->call(rank, func, args, timeout, context_id);
}
int detail::currentCaller() { return t_caller; }
void detail::post(std::function<void()> fn) {
  if (auto a = agentOrNull()) {
    a->post(std::move(fn));
  } else {
    fn();
  }
}
void detail::waitCreated(const RRef& r) {
  auto a = agent();
  const auto& s = r.state();
  if (s->owner == a->rank()) {
    r.local_value();
  } else {
    a->call(s->owner, "ddprun.rref.wait", {s->creator, s->serial}, kDefaultTimeout, -1).wait();
  }
}
Value detail::ownedValue(int64_t creator, int64_t serial) { return agent()->ownerValue(creator, serial).wait(); }

}  // namespace ddprun::rpc
