// The calls this worker sent and has no answer for yet: each waits in the table under its
// id until its reply arrives on the connection it went out on, its deadline passes, its
// connection is lost, or the agent stops; whichever comes first takes it out of the table
// and completes its future. A call leaves the table exactly once, so its future completes
// exactly once.
//
// Thread-safety: every method is thread-safe (one mutex). Futures are completed, and
// `on_settled` runs, after that mutex is released, so a future's callbacks may call back
// into the table.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "worker_runtime/rpc/rpc.h"

namespace ddprun::rpc::detail {

class Connection;

struct PendingCall {
  Future future;
  int peer;
  std::string func;
  int64_t context_id;
  Clock::time_point deadline;
  std::chrono::milliseconds timeout;
  std::shared_ptr<Connection> connection;
};

class PendingCalls {
 public:
  // `on_settled(n)` is told each time n calls left the table, outside its lock.
  explicit PendingCalls(std::function<void(size_t)> on_settled) : on_settled_(std::move(on_settled)) {}

  // A fresh call id (ids start at 1 and are never reused).
  uint64_t nextId() { return next_id_.fetch_add(1); }
  // Enters a call under `id`; nothing else may be pending under it.
  void add(uint64_t id, PendingCall call);
  // The reply to `id` arrived on `conn`: removes and returns the call, or nullopt when it
  // is no longer pending (it timed out or failed already). Throws DdprunError, leaving the
  // call pending, when it went out on another connection (ids are guessable).
  std::optional<PendingCall> takeReply(uint64_t id, const std::shared_ptr<Connection>& conn);
  // Fails call `id` with `error` if it is still pending; returns whether it was.
  bool fail(uint64_t id, std::exception_ptr error);
  // Fails every pending call that `match` selects with `error(call)`; returns how many.
  // The one way calls are failed in bulk: a lost connection, passed deadlines, shutdown.
  size_t failMatching(const std::function<bool(const PendingCall&)>& match,
                      const std::function<std::exception_ptr(const PendingCall&)>& error);

 private:
  std::function<void(size_t)> on_settled_;
  std::atomic<uint64_t> next_id_{1};
  std::mutex mutex_;
  std::unordered_map<uint64_t, PendingCall> calls_;
};

}  // namespace ddprun::rpc::detail
