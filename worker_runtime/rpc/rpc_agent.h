// The RPC agent of one worker (one per process, between init_rpc and shutdown): it
// publishes its address in the store and learns its peers' there, listens for and admits
// inbound connections, opens one outbound connection per callee on first use, sends calls
// and keeps them in its pending-call table, dispatches incoming requests to the function
// registry (on its thread pool, or inline for built-ins), sends replies, owns the values of
// this worker's RRefs, and runs the store-agreed graceful shutdown.
//
// Threads: one I/O thread runs Asio (accepting, handshakes, reading and decoding every
// connection in arrival order, inline built-ins, the 20 ms sweep that times out calls and
// stalled reads); the pool (ThreadPool) runs registered functions; callers' threads encode
// and write their own requests, and connect (with the client handshake) on first use.
//
// Thread-safety: every public method is thread-safe once start() has returned, except
// start(), serve() and stop() themselves (once each, from the thread that owns the
// agent), and the methods marked "I/O thread".
#pragma once

// First: Boost 1.74's asio/awaitable.hpp uses std::exchange without including <utility>, which
// GCC 13's <atomic> no longer brings in (the GPU machine's compiler).
#include <utility>

#include <atomic>
#include <boost/asio.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "rendezvous/store/tcp_store_client.h"
#include "worker_runtime/rpc/message_codec.h"
#include "worker_runtime/rpc/pending_calls.h"
#include "worker_runtime/rpc/rpc.h"
#include "worker_runtime/rpc/rpc_environment.h"
#include "worker_runtime/rpc/rref_owner_table.h"
#include "worker_runtime/rpc/thread_pool.h"
#include "worker_runtime/rpc/wire.h"

namespace ddprun::rpc::detail {

class Connection;

class RpcAgent {
 public:
  RpcAgent(std::string name, int rank, int world_size, RpcBackendOptions options);

  // Meets every peer through the store (blocks up to options.init_timeout) and listens.
  // Throws DdprunError (no store named, duplicate worker name, bad address) or
  // StoreError (store unreachable, a worker missing). Peers may connect from here on, but
  // the kernel holds their connections until serve().
  void start();
  // Accepts connections and dispatches requests (starts the I/O thread). Apart from start()
  // because handlers find the agent through currentAgent(): init_rpc makes this agent
  // current in between, else a peer's first request could meet "init_rpc has not been
  // called".
  void serve();
  // Closes everything at once: pending calls fail with RpcError, owned values are freed.
  // Joins the I/O and pool threads (not the calling one). Idempotent.
  void stop();
  // Blocks until no worker in the job has a call outstanding, agreed through the store.
  // Throws RpcError when this worker's calls do not drain or a peer does not arrive
  // within rpc_timeout.
  void gracefulShutdown();

  // Sends `func` to `rank` and returns its future at once (after connecting on first use:
  // blocks up to rpc_timeout). `rref_id`: the value the callee keeps for remote().
  // Throws PeerError (cannot connect, connection broken), RpcError (shut down),
  // DdprunError (unknown rank, a value that cannot be sent); a failed write fails the
  // future instead.
  Future call(int rank, const std::string& func, const Args& args, std::chrono::milliseconds timeout,
              int64_t context_id, std::optional<std::pair<int64_t, int64_t>> rref_id = std::nullopt);
  // Runs `func` on `rank`, which keeps the result; returns at once.
  RRef remote(int rank, const std::string& func, const Args& args, std::chrono::milliseconds timeout);

  // I/O thread: a whole message arrived on `conn`. Throws DdprunError on a malformed one
  // (the connection then fails).
  void onMessage(const std::shared_ptr<Connection>& conn, const wire::Header& h, const std::string& meta,
                 size_t body_offset, std::vector<at::Tensor>& tensors);
  // I/O thread: `conn` failed; an outbound one fails the calls pending on it.
  void onConnectionLost(const std::shared_ptr<Connection>& conn, const std::string& reason);
  // I/O thread: logs a refused handshake, at most once per 10 s (a scanner must not flood
  // the log).
  void noteRefused(const std::string& reason);

  int rank() const { return rank_; }
  int worldSize() const { return world_size_; }
  const std::string& name() const { return name_; }
  // Throws DdprunError for a name no worker has.
  int rankOf(const std::string& name) const;
  // Throws DdprunError for a rank outside the job.
  WorkerInfo info(int rank) const;
  // "worker 'w1' (rank 1, 10.0.0.2:41234)" for messages; safe on any int.
  std::string describe(int rank) const;
  // `t`, or the default rpc_timeout for kDefaultTimeout.
  std::chrono::milliseconds timeoutOr(std::chrono::milliseconds t) const {
    return t.count() < 0 ? options_.rpc_timeout : t;
  }
  // Runs `fn` on the pool.
  void post(std::function<void()> fn) { pool_.post(std::move(fn)); }
  // Runs `send` (which makes calls) on the pool; shutdown counts it as a pending call.
  void sendInBackground(std::function<void()> send);
  const std::string& secret() const { return secret_; }
  // How long a message may go without a byte arriving once it has begun.
  std::chrono::milliseconds readTimeout() const { return options_.rpc_timeout; }
  // The values this worker owns for RRefs.
  RRefOwnerTable& owners() { return owners_; }
  // Between start() and stop().
  bool running() const { return running_.load(); }

 private:
  std::shared_ptr<Connection> connectionTo(int rank);
  void accept();
  void admit(boost::asio::ip::tcp::socket socket);
  void sweep();
  void checkDeadlines();
  void loadSecret();
  void dispatchRequest(const std::shared_ptr<Connection>& conn, const wire::Header& h, Reader& in,
                       std::vector<at::Tensor>& tensors);
  void respond(const std::shared_ptr<Connection>& conn, uint64_t id, int peer, int64_t context_id, const Future& result,
               const std::string& func);
  void callsSettled(size_t n);
  void finishIncoming();

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

  boost::asio::io_context io_;
  boost::asio::ip::tcp::acceptor acceptor_;
  boost::asio::steady_timer sweep_timer_;
  std::thread io_thread_;
  ThreadPool pool_;
  std::atomic<bool> running_{false};
  std::atomic<bool> stopping_{false};

  std::mutex conn_mutex_;
  std::vector<std::shared_ptr<Connection>> outbound_;
  std::vector<std::shared_ptr<Connection>> inbound_;
  std::vector<std::unique_ptr<std::mutex>> connect_mutex_;

  PendingCalls pending_;

  // What shutdown waits on, under idle_mutex_.
  std::mutex idle_mutex_;
  std::condition_variable idle_cv_;
  int64_t inflight_incoming_ = 0;
  int64_t completed_incoming_ = 0;
  int64_t sent_requests_ = 0;
  size_t pending_count_ = 0;  // calls in pending_ plus background sends not yet made

  RRefOwnerTable owners_;
};

// The agent of this process's RPC session, or null before init_rpc and after shutdown.
// Thread-safe.
std::shared_ptr<RpcAgent> currentAgentOrNull();
// The same; throws DdprunError when there is none.
std::shared_ptr<RpcAgent> currentAgent();
// Makes `agent` (null: none) the session's agent. Thread-safe.
void setCurrentAgent(std::shared_ptr<RpcAgent> agent);

}  // namespace ddprun::rpc::detail
