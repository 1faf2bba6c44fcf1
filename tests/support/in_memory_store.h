// A Store held in this process: StoreState (the TCP server's own data and semantics) behind
// a mutex, with blocking calls woken by a condition variable. For tests that run ranks or
// rendezvous nodes as threads of one process: no sockets, no server thread.
// Every method is thread-safe. get/wait/multiGet/queuePop block until their keys exist or
// the timeout passes (the store's for get/multiGet), then throw StoreTimeout naming the keys.
// Timeouts run on the Clock given (a manual one in tests; the real one by default).
// add on a value that is not a decimal integer throws StoreError, as the TCP client does.
// connect() gives clients of the store, each with its own timeout and interrupt(), as
// TcpStoreClients of one server are.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>

#include "common/clock.h"
#include "rendezvous/store/store.h"
#include "rendezvous/store/store_client.h"
#include "rendezvous/store/store_state.h"

namespace ddprun::rendezvous {

class InMemoryStore final : public Store {
 public:
  // Waits on the real clock.
  explicit InMemoryStore(std::chrono::milliseconds timeout = std::chrono::milliseconds(300000));
  // Waits on `clock`, which must outlive the store.
  explicit InMemoryStore(Clock& clock, std::chrono::milliseconds timeout = std::chrono::milliseconds(300000));

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t amount) override;
  std::string compareSet(const std::string& key, const std::string& expected, const std::string& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  int64_t numKeys() override;
  bool deleteKey(const std::string& key) override;
  void append(const std::string& key, const std::string& value) override;
  std::vector<std::string> multiGet(const std::vector<std::string>& keys) override;
  void multiSet(const std::vector<std::string>& keys, const std::vector<std::string>& values) override;
  void queuePush(const std::string& key, const std::string& value) override;
  std::string queuePop(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t queueLength(const std::string& key) override;
  std::vector<std::string> listKeys() override;
  std::chrono::milliseconds timeout() const override { return timeout_; }

  // A new client of this store, whose get/multiGet wait up to `timeout` and whose
  // interrupt() ends its own blocked call (and every later one) with StoreError, not
  // other clients'. Its localAddress() is `local_address`. The store must outlive it.
  std::unique_ptr<StoreClient> connect(std::chrono::milliseconds timeout, std::string local_address = "127.0.0.1");

 private:
  class Client;
  // Blocks (lock held by the caller) until every key exists; throws StoreTimeout naming
  // `op`, or StoreError once `*interrupted` is set.
  void waitLocked(std::unique_lock<std::mutex>& lock, const char* op, const std::vector<std::string>& keys,
                  std::chrono::milliseconds timeout, const std::atomic<bool>* interrupted);
  std::string getWith(const std::string& key, std::chrono::milliseconds timeout, const std::atomic<bool>* interrupted);
  void waitWith(const std::vector<std::string>& keys, std::chrono::milliseconds timeout,
                const std::atomic<bool>* interrupted);
  std::vector<std::string> multiGetWith(const std::vector<std::string>& keys, std::chrono::milliseconds timeout,
                                        const std::atomic<bool>* interrupted);
  std::string queuePopWith(const std::string& key, std::chrono::milliseconds timeout,
                           const std::atomic<bool>* interrupted);
  // Sets `*flag` and wakes its holder's blocked call.
  void interrupt(std::atomic<bool>& flag);

  Clock& clock_;
  const std::chrono::milliseconds timeout_;
  std::mutex mutex_;
  std::condition_variable changed_;
  StoreState state_;
};

}  // namespace ddprun::rendezvous
