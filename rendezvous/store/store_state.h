// The data of one store and its bookkeeping of waiting and watching connections, with
// no sockets in sight: the server feeds it parsed requests and sends what it returns.
// Semantics follow torch's TCPStore server exactly (see rendezvous/PROTOCOL.md):
// ADD keeps a decimal string, COMPARE_SET's reply rules, num_keys counts every key.
// Not thread-safe: the server uses it from its one I/O thread.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace ddprun::rendezvous {

using ConnectionId = uint64_t;

// What a mutation means for other connections.
struct StoreEffects {
  std::vector<ConnectionId> woken;                                   // their WAIT is satisfied now
  std::vector<std::pair<ConnectionId, std::string>> watch_messages;  // torch 1.13 watch frames
};

class StoreState {
 public:
  void set(const std::string& key, std::string value, StoreEffects& effects);
  // Returns the reply: the new value when swapped, else the current one; for a missing
  // key, `desired` when `expected` is empty (and the key is created), else `expected`.
  // Wakes the key's waiters in every case, as torch's (libuv) server does.
  std::string compareSet(const std::string& key, const std::string& expected, std::string desired,
                         StoreEffects& effects);
  // Returns the new total, or nothing when the stored value is not a decimal integer.
  std::optional<int64_t> add(const std::string& key, int64_t amount, StoreEffects& effects);
  const std::string* get(const std::string& key) const;
  bool check(const std::vector<std::string>& keys) const;
  // Registers `connection` to wait for all `keys`; returns true when they all exist
  // already (nothing is registered then).
  bool wait(ConnectionId connection, const std::vector<std::string>& keys);
  // Forgets the connection's pending wait; returns whether it had one.
  bool cancelWait(ConnectionId connection);
  int64_t numKeys() const { return static_cast<int64_t>(data_.size()); }
  bool deleteKey(const std::string& key, StoreEffects& effects);
  void append(const std::string& key, const std::string& value, StoreEffects& effects);
  // Wakes one waiter of the queue's name.
  void queuePush(const std::string& key, std::string value, StoreEffects& effects);
  std::optional<std::string> queuePop(const std::string& key);
  // BARRIER: counts `connection` in at `key`; returns true when `world_size` have arrived
  // (then every earlier arrival is woken), else registers the connection as a waiter.
  bool barrier(ConnectionId connection, const std::string& key, int64_t world_size, StoreEffects& effects);
  int64_t queueLength(const std::string& key) const;
  std::vector<std::string> listKeys() const;
  // torch 1.13's WATCH_KEY: `connection` hears of every later change to `key`.
  void watch(ConnectionId connection, const std::string& key);
  // The connection is gone: no wait or watch of it may remain.
  void dropConnection(ConnectionId connection);

  size_t waitingConnections() const { return awaited_.size(); }

 private:
  bool exists(const std::string& key) const;
  std::optional<int64_t> sumWith(const std::string& key, int64_t amount) const;
  void keyBecameReady(const std::string& key, StoreEffects& effects);
  void wakeOne(const std::string& key, StoreEffects& effects);
  void notifyWatchers(const std::string& key, uint8_t kind, const std::string* old_value, const std::string* new_value,
                      StoreEffects& effects);

  std::unordered_map<std::string, std::string> data_;
  std::unordered_map<std::string, std::deque<std::string>> queues_;
  // A wait is one request of one connection, numbered so that a cancelled one's entries can
  // stay in the keys' lists until enough of a list is stale to sweep it: withdrawing a wait
  // costs O(its keys), not O(every waiter of the key) (16,384 agents' watchers withdraw their
  // wait on a round's `end` at every keep-alive).
  struct Waiter {
    ConnectionId connection;
    uint64_t wait;
  };
  struct WaitList {
    std::vector<Waiter> waiters;
    size_t stale = 0;  // entries of withdrawn waits
  };
  struct Awaiting {
    size_t missing = 0;  // keys still to come
    uint64_t wait = 0;
    std::vector<std::string> keys;  // those it waits on
  };
  bool live(const Waiter& w) const {
    auto a = awaited_.find(w.connection);
    return a != awaited_.end() && a->second.wait == w.wait;
  }
  std::unordered_map<std::string, WaitList> waiting_;   // key -> waiters
  std::unordered_map<ConnectionId, Awaiting> awaited_;  // waiter -> its wait
  uint64_t next_wait_ = 0;
  std::unordered_map<std::string, std::vector<ConnectionId>> watchers_;
};

}  // namespace ddprun::rendezvous
