// A Store held in this process: StoreState (the TCP server's own data and semantics) behind
// a mutex, with blocking calls woken by a condition variable. For tests that run ranks or
// rendezvous nodes as threads of one process: no sockets, no server thread.
// Every method is thread-safe. get/wait/multiGet/queuePop block until their keys exist or
// the timeout passes (the store's for get/multiGet), then throw StoreTimeout naming the keys.
// add on a value that is not a decimal integer throws StoreError, as the TCP client does.
#pragma once

#include <condition_variable>
#include <mutex>

#include "rendezvous/store.h"
#include "rendezvous/store_state.h"

namespace ddprun::rendezvous {

class InMemoryStore final : public Store {
 public:
  explicit InMemoryStore(std::chrono::milliseconds timeout = std::chrono::milliseconds(300000));

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

 private:
  // Blocks (lock held by the caller) until every key exists; throws StoreTimeout naming `op`.
  void waitLocked(std::unique_lock<std::mutex>& lock, const char* op, const std::vector<std::string>& keys,
                  std::chrono::milliseconds timeout);

  const std::chrono::milliseconds timeout_;
  std::mutex mutex_;
  std::condition_variable changed_;
  StoreState state_;
};

}  // namespace ddprun::rendezvous
