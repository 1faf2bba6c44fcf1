// The store server: accepting clients (and shedding idle strangers when out of descriptors),
// sweeping stalled requests, and routing each request's effects to the connections it wakes.
// One client's connection is store_connection.cc.
#include "rendezvous/store/store_server.h"

#include <pthread.h>

#include <future>
#include <limits>

#include <boost/asio/post.hpp>

#include "common/error.h"
#include "common/logging.h"
#include "common/port_holder.h"
#include "rendezvous/store/descriptor_limit.h"
#include "rendezvous/store/store_server_impl.h"

namespace ddprun::rendezvous {
namespace asio = boost::asio;

namespace {

// Out of descriptors, an unauthenticated connection is closed only once it has been silent
// this long: a client in the middle of the handshake waits one round trip, not a second.
constexpr std::chrono::seconds kMinStrangerIdle{1};

}  // namespace

StoreServer::Impl::Impl(StoreServerOptions options, Clock& clock)
    : options_(std::move(options)),
      clock_(clock),
      log_(logger("store")),
      // Sockets are only ever used from the one I/O thread, so their per-operation locks
      // can go; the scheduler keeps its lock for the post() from the destructor.
      io_(BOOST_ASIO_CONCURRENCY_HINT_UNSAFE_IO),
      acceptor_(io_) {
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
  sweeper_ = std::thread([this] { runSweeper(); });
  log_->debug("store listening on {}:{}{} (descriptor limit {}, hard {})", options_.host, port_,
              options_.token.empty() ? "" : " (token required)", limit.soft, limit.hard);
}

StoreServer::Impl::~Impl() {
  // The sweeper first: it may be waiting for a sweep it posted, which needs the I/O thread.
  {
    std::lock_guard lock(sweep_mutex_);
    stopping_ = true;
  }
  sweep_cv_.notify_all();
  if (sweeper_.joinable()) sweeper_.join();
  asio::post(io_, [this] {
    boost::system::error_code ignored;
    acceptor_.close(ignored);
    accept_timer_.cancel();
    for (auto& [id, connection] : connections_) connection->close();
    connections_.clear();
    noteConnections();
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
      noteConnections();
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
    const auto now = clock_.now();
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
  const auto now = clock_.now();
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

// One sweep for all connections (not a timer per request): every quarter of the request
// timeout on clock_, close the connections whose current request has been incomplete too
// long. The sweep itself runs on the I/O thread, which owns the connections, and this thread
// waits for it: on a manual clock, a test knows the sweeps due by the time it moved to are
// done once this thread waits on the clock again.
void StoreServer::Impl::runSweeper() {
  pthread_setname_np(pthread_self(), "ddprun-sweep");
  const Clock::Duration period = std::max<Clock::Duration>(std::chrono::milliseconds(20), options_.request_timeout / 4);
  std::unique_lock lock(sweep_mutex_);
  while (!stopping_) {
    const auto deadline = clock_.now() + period;
    while (!stopping_ && clock_.waitUntil(lock, sweep_cv_, deadline) != std::cv_status::timeout) {
    }
    if (stopping_) return;
    std::promise<void> swept;
    asio::post(io_, [this, &swept] {
      sweepStalled();
      swept.set_value();
    });
    lock.unlock();
    swept.get_future().wait();
    lock.lock();
  }
}

void StoreServer::Impl::sweepStalled() {
  const auto now = clock_.now();
  std::vector<ConnectionId> stalled;
  for (const auto& [id, connection] : connections_) {
    if (connection->stalled(now)) stalled.push_back(id);
  }
  for (ConnectionId id : stalled) {
    closeConnection(
        id,
        "request incomplete after " + std::to_string(options_.request_timeout.count()) + " ms (slow or stalled client)",
        true);
  }
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
  noteWaiters();
  connections_.erase(it);
  noteConnections();
}

void StoreServer::Impl::noteWaiters() {
  // After every request: most change nothing, and then neither the store nor a wake is paid.
  const size_t waiting = state_.waitingConnections();
  if (waiting == waiting_clients_.load(std::memory_order_relaxed)) return;
  waiting_clients_ = waiting;
  countersChanged();
}

void StoreServer::Impl::noteConnections() {
  connection_count_ = connections_.size();
  countersChanged();
}

// The counters are stored (sequentially consistent) before counter_waiters_ is read here, and
// a waiter counts itself before it reads them: either this sees the waiter, or the waiter sees
// the change. A waiter reads the counters under counters_mutex_ until it sleeps, so taking the
// mutex before the notify cannot fall between its reading and its sleep.
void StoreServer::Impl::countersChanged() const {
  if (counter_waiters_.load() == 0) return;
  { std::lock_guard lock(counters_mutex_); }
  counters_cv_.notify_all();
}

StoreServerCounters StoreServer::Impl::counters() const {
  StoreServerCounters c;
  c.connections = connection_count_.load();
  c.incomplete_requests = incomplete_requests_.load();
  c.incomplete_request_bytes = incomplete_request_bytes_.load();
  c.waiting_clients = waiting_clients_.load();
  c.pending_reply_bytes = queued_bytes_seen_.load();
  c.peak_pending_reply_bytes = peak_queued_bytes_.load();
  return c;
}

bool StoreServer::Impl::waitFor(const std::function<bool(const StoreServerCounters&)>& holds,
                                std::chrono::milliseconds timeout) const {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  ++counter_waiters_;
  struct Uncount {
    std::atomic<size_t>& waiters;
    ~Uncount() { --waiters; }
  } uncount{counter_waiters_};
  std::unique_lock lock(counters_mutex_);
  return counters_cv_.wait_until(lock, deadline, [&] { return holds(counters()); });
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
  countersChanged();
}

void StoreServer::Impl::unqueued(size_t bytes) {
  queued_bytes_ -= bytes;
  queued_bytes_seen_ = queued_bytes_;
  countersChanged();
}

StoreServer::StoreServer(StoreServerOptions options, Clock& clock)
    : impl_(std::make_unique<Impl>(std::move(options), clock)) {}
StoreServer::~StoreServer() = default;
int StoreServer::port() const { return impl_->port(); }
size_t StoreServer::connectionCount() const { return impl_->connectionCount(); }
size_t StoreServer::incompleteRequests() const { return impl_->incompleteRequests(); }
size_t StoreServer::waitingClients() const { return impl_->waitingClients(); }
size_t StoreServer::pendingReplyBytes() const { return impl_->pendingReplyBytes(); }
size_t StoreServer::peakPendingReplyBytes() const { return impl_->peakPendingReplyBytes(); }
StoreServerCounters StoreServer::counters() const { return impl_->counters(); }
bool StoreServer::waitFor(const std::function<bool(const StoreServerCounters&)>& holds,
                          std::chrono::milliseconds timeout) const {
  return impl_->waitFor(holds, timeout);
}

}  // namespace ddprun::rendezvous
