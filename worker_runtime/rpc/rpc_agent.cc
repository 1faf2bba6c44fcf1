#include "worker_runtime/rpc/rpc_agent.h"

#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "common/env_names.h"
#include "common/socket_io.h"
#include "worker_runtime/rpc/auth.h"
#include "worker_runtime/rpc/connection.h"
#include "worker_runtime/rpc/function_registry.h"
#include "worker_runtime/rpc/internal.h"

namespace ddprun::rpc::detail {

namespace asio = boost::asio;
using asio::ip::tcp;
using wire::Kind;

namespace {

// The rank whose request this thread is serving (currentCaller()).
thread_local int t_caller = -1;

// Never destroyed: a process that exits without shutdown() must not join (or
// destroy under) the agent's threads from a static destructor.
std::mutex& g_agent_mutex = *new std::mutex;
std::shared_ptr<RpcAgent>& g_agent = *new std::shared_ptr<RpcAgent>;

}  // namespace

std::shared_ptr<RpcAgent> currentAgentOrNull() {
  std::lock_guard lock(g_agent_mutex);
  return g_agent;
}

std::shared_ptr<RpcAgent> currentAgent() {
  auto a = currentAgentOrNull();
  if (!a) throw DdprunError("rpc: init_rpc has not been called (or shutdown already ran)");
  return a;
}

void setCurrentAgent(std::shared_ptr<RpcAgent> agent) {
  std::lock_guard lock(g_agent_mutex);
  g_agent = std::move(agent);
}

int currentCaller() { return t_caller; }

RpcAgent::RpcAgent(std::string name, int rank, int world_size, RpcBackendOptions options)
    : name_(std::move(name)),
      rank_(rank),
      world_size_(world_size),
      options_(std::move(options)),
      acceptor_(io_),
      sweep_timer_(io_),
      pool_(std::max(1, options_.num_worker_threads)),
      pending_([this](size_t n) { callsSettled(n); }),
      owners_(rank) {}

int RpcAgent::rankOf(const std::string& name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) throw DdprunError(fmt::format("rpc: unknown worker '{}'", name));
  return it->second;
}

WorkerInfo RpcAgent::info(int rank) const {
  if (rank < 0 || rank >= world_size_) throw DdprunError(fmt::format("rpc: no worker with rank {}", rank));
  return {peers_[rank].name, rank};
}

// Ranks from the wire are checked before use; this is still safe on any int.
std::string RpcAgent::describe(int rank) const {
  if (rank < 0 || rank >= static_cast<int>(peers_.size())) return fmt::format("unknown rank {}", rank);
  const auto& p = peers_[rank];
  return fmt::format("worker '{}' (rank {}, {}:{})", p.name, rank, p.host, p.port);
}

void RpcAgent::sendInBackground(std::function<void()> send) {
  {
    std::lock_guard lock(idle_mutex_);
    ++pending_count_;
  }
  pool_.post([this, send = std::move(send)] {
    try {
      send();
    } catch (const std::exception& e) {
      rpcLog()->debug("rpc: background send: {}", e.what());
    }
    callsSettled(1);
  });
}

void RpcAgent::callsSettled(size_t n) {
  {
    std::lock_guard lock(idle_mutex_);
    pending_count_ -= n;
  }
  idle_cv_.notify_all();
}

void RpcAgent::finishIncoming() {
  std::lock_guard lock(idle_mutex_);
  --inflight_incoming_;
  ++completed_incoming_;
  idle_cv_.notify_all();
}

void RpcAgent::start() {
  // Meet through the store: MASTER_ADDR/MASTER_PORT (the agent's store under
  // ddprun).
  const auto environment = RpcEnvironment::fromEnvironment(options_.store_host, options_.store_port);
  rendezvous::StoreClientOptions so;
  so.host = environment.store_host;
  so.port = environment.store_port;
  so.timeout = options_.init_timeout;
  so.connect_timeout = options_.init_timeout;
  store_ = std::make_unique<rendezvous::TcpStoreClient>(so);
  prefix_ = fmt::format("ddprun/rpc/{}/", environment.restart_count);
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
  store_->set(prefix_ + "worker/" + std::to_string(rank_), PeerAddress{name_, my_host, port}.entry());

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
    peers_[r] = PeerAddress::parse(r, v);
    if (!by_name_.emplace(peers_[r].name, r).second) {
      throw DdprunError(fmt::format("init_rpc: worker name '{}' is used by ranks {} and {}", peers_[r].name,
                                    by_name_[peers_[r].name], r));
    }
  }
  outbound_.resize(world_size_);
  for (int r = 0; r < world_size_; ++r) connect_mutex_.push_back(std::make_unique<std::mutex>());
  running_ = true;
  rpcLog()->debug("rpc agent '{}' (rank {}) listening on {}:{}", name_, rank_, my_host, port);
}

void RpcAgent::serve() {
  accept();
  sweep();
  io_thread_ = std::thread([this] {
    try {
      io_.run();
    } catch (const std::exception& e) {
      rpcLog()->error("rpc I/O thread: {}", e.what());
    }
  });
}

// The secret the launcher handed over, else one agreed through the store (the first
// worker to arrive makes it): then the RPC is as private as the store.
void RpcAgent::loadSecret() {
  if (auto secret = auth::secretFromEnvironment()) {
    secret_ = *secret;
    return;
  }
  secret_ = store_->compareSet(prefix_ + "secret", "", auth::randomSecret());
  if (rank_ == 0) {
    rpcLog()->info("rpc: no job secret from the launcher ({}); peers authenticate with one shared through the store",
                   env::kRpcSecretFile);
  }
}

void RpcAgent::noteRefused(const std::string& reason) {
  const int64_t n = refused_.fetch_add(1) + 1;
  const auto now = Clock::now();
  if (now - last_refusal_log_ < std::chrono::seconds(10)) return;  // I/O thread only
  last_refusal_log_ = now;
  rpcLog()->warn("rpc: refused {} ({} refused so far)", reason, n);
}

void RpcAgent::accept() {
  acceptor_.async_accept([this](const boost::system::error_code& ec, tcp::socket socket) {
    if (ec) {
      if (stopping_) return;
      // Out of descriptors or similar: try again shortly instead of spinning.
      rpcLog()->warn("rpc accept: {}", ec.message());
      auto timer = std::make_shared<asio::steady_timer>(io_, std::chrono::milliseconds(100));
      timer->async_wait([this, timer](const boost::system::error_code&) {
        if (!stopping_) accept();
      });
      return;
    }
    try {
      admit(std::move(socket));
    } catch (const std::exception& e) {
      rpcLog()->warn("rpc accept: {}", e.what());
    }
    if (!stopping_) accept();
  });
}

// Past kMaxUnauthenticated connections in the handshake, the oldest of them is closed:
// callers finish the handshake in milliseconds, so the oldest is the likeliest stranger.
void RpcAgent::admit(tcp::socket socket) {
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

void RpcAgent::checkDeadlines() {
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

void RpcAgent::sweep() {
  sweep_timer_.expires_after(std::chrono::milliseconds(20));
  sweep_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec || stopping_) return;
    const auto now = Clock::now();
    pending_.failMatching([now](const PendingCall& p) { return p.deadline <= now; },
                          [this](const PendingCall& p) {
                            return std::make_exception_ptr(RpcTimeout(fmt::format(
                                "rpc '{}' to {}: timed out after {} ms", p.func, describe(p.peer), p.timeout.count())));
                          });
    if (++sweeps_ % 10 == 0) checkDeadlines();
    sweep();
  });
}

std::shared_ptr<Connection> RpcAgent::connectionTo(int rank) {
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
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(p.port));
  sa.sin_addr.s_addr = htonl(address.to_v4().to_uint());
  try {
    connectWithin(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof sa, Clock::now() + options_.rpc_timeout);
  } catch (const SocketError& e) {
    if (e.timedOut()) throw PeerError(fmt::format("rpc: connecting to {} timed out", describe(rank)));
    throw PeerError(fmt::format("rpc: cannot connect to {}: {}", describe(rank), std::strerror(e.code())));
  }
  auth::clientHandshake(
      fd, secret_, rank_, rank,
      Clock::now() + std::min<std::chrono::milliseconds>(options_.rpc_timeout, auth::kHandshakeTimeout),
      describe(rank));
  auto conn = std::make_shared<Connection>(*this, std::move(socket), rank, true);
  {
    std::lock_guard lock(conn_mutex_);
    outbound_[rank] = conn;
  }
  asio::post(io_, [conn] { conn->start(); });
  return conn;
}

Future RpcAgent::call(int rank, const std::string& func, const Args& args, std::chrono::milliseconds timeout,
                      int64_t context_id, std::optional<std::pair<int64_t, int64_t>> rref_id) {
  if (stopping_) throw RpcError(fmt::format("rpc '{}' to {}: the agent is shut down", func, describe(rank)));
  timeout = timeoutOr(timeout);
  Future future;
  auto conn = connectionTo(rank);
  if (conn->broken()) throw PeerError(fmt::format("rpc '{}' to {}: {}", func, describe(rank), conn->brokenReason()));
  const uint64_t id = pending_.nextId();
  MessageEncoder enc{{rank_, rank, context_id}, {}, {}, {}};
  enc.body.str(func);
  enc.body.pod(context_id);
  enc.body.pod(rref_id ? rref_id->first : int64_t{-1});
  enc.body.pod(rref_id ? rref_id->second : int64_t{-1});
  if (context_id >= 0) touchContext(context_id, rank);
  enc.value(Value(Value::List(args.begin(), args.end())));
  OutMessage msg = enc.finish(Kind::kRequest, id);
  const auto deadline = Clock::now() + timeout;
  pending_.add(id, PendingCall{future, rank, func, context_id, deadline, timeout, conn});
  {
    std::lock_guard lock(idle_mutex_);
    ++pending_count_;
    ++sent_requests_;
  }
  // A write that failed (PeerError, RpcTimeout) fails the call as a lost peer, unless the
  // sweep or the lost connection failed it first.
  auto failed_write = [&](const std::exception& e) {
    pending_.fail(
        id, std::make_exception_ptr(PeerError(fmt::format("rpc '{}' to {}: {}", func, describe(rank), e.what()))));
  };
  try {
    conn->write(msg, deadline);
  } catch (const PeerError& e) {
    failed_write(e);
  } catch (const RpcError& e) {
    failed_write(e);
  }
  return future;
}

RRef RpcAgent::remote(int rank, const std::string& func, const Args& args, std::chrono::milliseconds timeout) {
  auto [creator, serial] = owners_.newId();
  auto state = std::make_shared<RRefState>();
  state->owner = rank;
  state->creator = creator;
  state->serial = serial;
  if (rank == rank_) {
    // The owner is this worker: run here, no wire (and no race between
    // registration and a release of the handle we return).
    Future value;
    owners_.registerValue(creator, serial, value, 1);
    state->local = value;
    state->has_local = true;
    auto reg = FunctionRegistry::instance().find(func);
    if (!reg) {
      value.set_exception(std::make_exception_ptr(
          RemoteError(fmt::format("remote '{}' on {}: no such function", func, describe(rank)))));
      return RRef(state);
    }
    post([reg = *reg, args, value, func, this] {
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

void RpcAgent::onConnectionLost(const std::shared_ptr<Connection>& conn, const std::string& reason) {
  conn->close();
  if (!conn->outbound()) {
    {
      std::lock_guard lock(conn_mutex_);
      std::erase(inbound_, conn);
    }
    if (!stopping_) rpcLog()->debug("rpc: incoming connection from rank {} closed: {}", conn->peer(), reason);
    return;
  }
  const size_t failed = pending_.failMatching(
      [&conn](const PendingCall& p) { return p.connection == conn; },
      [this, &reason](const PendingCall& p) {
        return std::make_exception_ptr(
            PeerError(fmt::format("rpc '{}' to {}: connection lost ({})", p.func, describe(p.peer), reason)));
      });
  if (failed > 0) {
    rpcLog()->warn("rpc: lost {} ({}); failing {} pending call(s)", describe(conn->peer()), reason, failed);
  }
}

void RpcAgent::onMessage(const std::shared_ptr<Connection>& conn, const wire::Header& h, const std::string& meta,
                         size_t body_offset, std::vector<at::Tensor>& tensors) {
  Reader in(meta.data() + body_offset, meta.size() - body_offset);
  const auto kind = static_cast<Kind>(h.kind);
  if (kind == Kind::kRequest) return dispatchRequest(conn, h, in, tensors);
  if (kind != Kind::kResponse && kind != Kind::kError) throw DdprunError("rpc: unknown message kind");
  // A reply counts only on the connection its call went out on: ids are guessable.
  auto call = pending_.takeReply(h.id, conn);
  if (!call) return;  // timed out already
  if (kind == Kind::kError) {
    call->future.set_exception(std::make_exception_ptr(RemoteError(in.str())));
    return;
  }
  try {
    MessageDecoder dec{in, tensors, conn->peer(), call->context_id};
    call->future.set_result(dec.value());
  } catch (const std::exception& e) {
    call->future.set_exception(std::current_exception());
  }
}

void RpcAgent::dispatchRequest(const std::shared_ptr<Connection>& conn, const wire::Header& h, Reader& in,
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
  if (rref_creator >= 0) owners_.registerValue(rref_creator, rref_serial, owned, 1);
  auto finish = [this, conn, id, src, context_id, func, rref_creator](const Future& result, Future owned) {
    if (rref_creator >= 0) {
      if (auto e = result.exception()) {
        owned.set_exception(e);
      } else {
        owned.set_result(result.value());
      }
      respond(conn, id, src, -1, readyFuture(), func);
    } else {
      respond(conn, id, src, context_id, result, func);
    }
  };
  Args args;
  RegisteredFunction reg;
  try {
    if (context_id >= 0) touchContext(context_id, src);
    MessageDecoder dec{in, tensors, src, context_id};
    Value v = dec.value();
    args = std::move(v.toList());
    auto found = FunctionRegistry::instance().find(func);
    if (!found) throw DdprunError("no such function");
    reg = std::move(*found);
  } catch (const std::exception& e) {
    result.set_exception(std::current_exception());
    finish(result, owned);
    return;
  }
  auto run = [this, reg, args = std::move(args), src, context_id, finish, owned]() mutable {
    Future out;
    const int previous_caller = t_caller;
    t_caller = src;
    setCurrentContext(context_id);
    try {
      out = reg.fn(args);
    } catch (const std::exception&) {
      out = Future();
      out.set_exception(std::current_exception());
    }
    setCurrentContext(-1);
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

void RpcAgent::respond(const std::shared_ptr<Connection>& conn, uint64_t id, int peer, int64_t context_id,
                       const Future& result, const std::string& func) {
  OutMessage msg;
  auto error = result.exception();
  if (!error) {
    try {
      MessageEncoder enc{{rank_, peer, context_id}, {}, {}, {}};
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
    MessageEncoder enc{{rank_, peer, -1}, {}, {}, {}};
    enc.body.str(text);
    msg = enc.finish(Kind::kError, id);
  }
  try {
    conn->write(msg, Clock::now() + options_.rpc_timeout);
  } catch (const std::exception& e) {
    rpcLog()->debug("rpc: reply to rank {} for '{}' not delivered: {}", peer, func, e.what());
  }
  finishIncoming();
}

void RpcAgent::gracefulShutdown() {
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

void RpcAgent::stop() {
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
  pending_.failMatching(
      [](const PendingCall&) { return true; },
      [](const PendingCall& p) {
        return std::make_exception_ptr(RpcError(fmt::format("rpc '{}': the agent shut down", p.func)));
      });
  owners_.clear();
  store_.reset();
}

}  // namespace ddprun::rpc::detail
