// The store server: torch's TCPStore protocol (both generations) on Boost.Asio, one I/O
// thread, no thread per connection. Hosted inside the agent; also usable on its own
// (build/bin/ddprun_store_server). Bad input closes only the offending connection, with
// a logged reason: malformed or oversized frames, unknown commands, requests left
// incomplete past a deadline (slow clients), unauthenticated commands when a token is set.
// Memory and descriptors are bounded for all clients together too: see the limits in
// rendezvous/PROTOCOL.md.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "common/clock.h"
#include "rendezvous/store/request_parser.h"

namespace ddprun::rendezvous {

struct StoreServerOptions {
  std::string host = "0.0.0.0";                       // address to listen on (IPv4/IPv6 literal or "localhost").
  int port = 0;                                       // 0: let the kernel pick a free port (see port()).
  std::string token;                                  // empty: open, like torch's store; else clients must prove it.
  StoreLimits limits;                                 // per-request limits, checked before allocating.
  std::chrono::milliseconds request_timeout{30000};   // a started request must complete within this.
  size_t max_pending_reply_bytes = 64 * 1024 * 1024;  // stop reading a client that does not read.
  // Reply bytes queued for all clients together. Past it, the connection holding the most is
  // closed (see PROTOCOL.md). 512 MiB: twice the largest single reply (limits.max_reply_bytes),
  // so one maximal reply always fits beside others' traffic, and eight connections' worth of
  // max_pending_reply_bytes; rendezvous and c10d traffic queues kilobytes, so only clients
  // that ask for large values and do not read reach it, and the agent's host, which also runs
  // the training processes, is not pushed towards the OOM killer.
  size_t max_total_pending_reply_bytes = 512 * 1024 * 1024;
  // Clients expected at once (the workers' store: the world size); 0: not known. Only for the
  // start-up check of the descriptor limit: with a number, a hard limit too low to hold that
  // many connections is logged as a warning that says what to raise. The soft limit is raised
  // to the hard one either way (see rendezvous/store/descriptor_limit.h).
  size_t expected_clients = 0;
};

// What the server holds, read field by field (each exact, the set not one instant's).
struct StoreServerCounters {
  size_t connections = 0;               // open client connections
  size_t incomplete_requests = 0;       // connections holding a request not yet complete
  size_t incomplete_request_bytes = 0;  // bytes of those requests received and held so far
  size_t waiting_clients = 0;           // clients blocked in a WAIT, a queue pop or a BARRIER
  size_t pending_reply_bytes = 0;       // reply bytes held for all clients (queued or being written)
  size_t peak_pending_reply_bytes = 0;  // the most pending_reply_bytes since the start
};

class StoreServer {
 public:
  // Raises the process's soft descriptor limit to its hard one, binds, listens (with the largest
  // backlog the kernel allows: net.core.somaxconn) and starts the I/O thread. Throws
  // SystemError (e.g. EADDRINUSE). Request deadlines (options.request_timeout) and how long a
  // stranger has been silent run on `clock`, which outlives the server; tests give a manual one.
  explicit StoreServer(StoreServerOptions options, Clock& clock = Clock::real());
  // Closes every connection and joins the I/O thread.
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  int port() const;
  // Number of open client connections (for tests and logs). Thread-safe.
  size_t connectionCount() const;
  // Connections holding a request not yet complete (whose request_timeout runs), and clients
  // blocked in a WAIT, a queue pop or a BARRIER (for tests and logs). Thread-safe.
  size_t incompleteRequests() const;
  size_t waitingClients() const;
  // Reply bytes the server holds for all clients (queued or being written), now and at
  // most since it started (for tests and logs). Thread-safe.
  size_t pendingReplyBytes() const;
  size_t peakPendingReplyBytes() const;
  // All of the above, and the bytes held of incomplete requests. Thread-safe.
  StoreServerCounters counters() const;

  // Blocks until `holds` is true of the counters, or `timeout` of real time passes; returns
  // whether it held. For tests, and any caller that must wait for the server's state (a client
  // seen waiting, a connection gone) without polling it: the I/O thread wakes the waiters at
  // each change of a counter, so the wait ends at the change itself, on whichever clock the
  // server runs. `timeout` is only a bound for a caller that must not hang: it runs on the
  // steady clock, not on the server's (a manual clock would never reach it). With nobody
  // waiting a change costs one atomic load. `holds` runs under the waiters' lock, on this
  // thread: it must not call the server's waitFor. Thread-safe.
  bool waitFor(const std::function<bool(const StoreServerCounters&)>& holds, std::chrono::milliseconds timeout) const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun::rendezvous
