#include "tests/support/in_memory_store.h"

#include <fmt/format.h>

namespace ddprun::rendezvous {
namespace {

std::string joined(const std::vector<std::string>& keys) {
  std::string out;
  for (const auto& key : keys) out += (out.empty() ? "" : ",") + key;
  return out;
}

}  // namespace

// One client's view of the store: its own timeout and interrupt flag over the shared data.
class InMemoryStore::Client final : public StoreClient {
 public:
  Client(InMemoryStore& store, std::chrono::milliseconds timeout, std::string local_address)
      : store_(store), timeout_(timeout), local_address_(std::move(local_address)) {}

  void set(const std::string& key, const std::string& value) override {
    live("set", key);
    store_.set(key, value);
  }
  std::string get(const std::string& key) override {
    live("get", key);
    return store_.getWith(key, timeout_, &interrupted_);
  }
  int64_t add(const std::string& key, int64_t amount) override {
    live("add", key);
    return store_.add(key, amount);
  }
  std::string compareSet(const std::string& key, const std::string& expected, const std::string& desired) override {
    live("compare_set", key);
    return store_.compareSet(key, expected, desired);
  }
  bool check(const std::vector<std::string>& keys) override {
    live("check", joined(keys));
    return store_.check(keys);
  }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    live("wait", joined(keys));
    store_.waitWith(keys, timeout, &interrupted_);
  }
  int64_t numKeys() override {
    live("num_keys", "");
    return store_.numKeys();
  }
  bool deleteKey(const std::string& key) override {
    live("delete_key", key);
    return store_.deleteKey(key);
  }
  void append(const std::string& key, const std::string& value) override {
    live("append", key);
    store_.append(key, value);
  }
  std::vector<std::string> multiGet(const std::vector<std::string>& keys) override {
    live("multi_get", joined(keys));
    return store_.multiGetWith(keys, timeout_, &interrupted_);
  }
  void multiSet(const std::vector<std::string>& keys, const std::vector<std::string>& values) override {
    live("multi_set", joined(keys));
    store_.multiSet(keys, values);
  }
  void queuePush(const std::string& key, const std::string& value) override {
    live("queue_push", key);
    store_.queuePush(key, value);
  }
  std::string queuePop(const std::string& key, std::chrono::milliseconds timeout) override {
    live("queue_pop", key);
    return store_.queuePopWith(key, timeout, &interrupted_);
  }
  int64_t queueLength(const std::string& key) override {
    live("queue_len", key);
    return store_.queueLength(key);
  }
  std::vector<std::string> listKeys() override {
    live("list_keys", "");
    return store_.listKeys();
  }
  std::chrono::milliseconds timeout() const override { return timeout_; }
  void interrupt() override { store_.interrupt(interrupted_); }
  std::string localAddress() const override { return local_address_; }

 private:
  // An interrupted client fails every later call, as TcpStoreClient does.
  void live(const char* op, const std::string& subject) const {
    if (interrupted_) throw StoreError(fmt::format("store {}(key={}): interrupted (in-memory)", op, subject));
  }

  InMemoryStore& store_;
  const std::chrono::milliseconds timeout_;
  const std::string local_address_;
  std::atomic<bool> interrupted_{false};
};

InMemoryStore::InMemoryStore(std::chrono::milliseconds timeout) : InMemoryStore(Clock::real(), timeout) {}

InMemoryStore::InMemoryStore(Clock& clock, std::chrono::milliseconds timeout) : clock_(clock), timeout_(timeout) {}

std::unique_ptr<StoreClient> InMemoryStore::connect(std::chrono::milliseconds timeout, std::string local_address) {
  return std::make_unique<Client>(*this, timeout, std::move(local_address));
}

// StoreState reports which connections a change wakes; here every blocked caller
// re-checks its own keys, so the effects only need to trigger one broadcast.
void InMemoryStore::set(const std::string& key, const std::string& value) {
  std::lock_guard lock(mutex_);
  StoreEffects effects;
  state_.set(key, value, effects);
  changed_.notify_all();
}

std::string InMemoryStore::get(const std::string& key) { return getWith(key, timeout_, nullptr); }

std::string InMemoryStore::getWith(const std::string& key, std::chrono::milliseconds timeout,
                                   const std::atomic<bool>* interrupted) {
  std::unique_lock lock(mutex_);
  waitLocked(lock, "get", {key}, timeout, interrupted);
  return *state_.get(key);
}

int64_t InMemoryStore::add(const std::string& key, int64_t amount) {
  std::lock_guard lock(mutex_);
  StoreEffects effects;
  auto total = state_.add(key, amount, effects);
  if (!total) throw StoreError(fmt::format("store add(key={}): the stored value is not an integer (in-memory)", key));
  changed_.notify_all();
  return *total;
}

std::string InMemoryStore::compareSet(const std::string& key, const std::string& expected, const std::string& desired) {
  std::lock_guard lock(mutex_);
  StoreEffects effects;
  std::string result = state_.compareSet(key, expected, desired, effects);
  changed_.notify_all();
  return result;
}

bool InMemoryStore::check(const std::vector<std::string>& keys) {
  std::lock_guard lock(mutex_);
  return state_.check(keys);
}

void InMemoryStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  waitWith(keys, timeout, nullptr);
}

void InMemoryStore::waitWith(const std::vector<std::string>& keys, std::chrono::milliseconds timeout,
                             const std::atomic<bool>* interrupted) {
  std::unique_lock lock(mutex_);
  waitLocked(lock, "wait", keys, timeout, interrupted);
}

int64_t InMemoryStore::numKeys() {
  std::lock_guard lock(mutex_);
  return state_.numKeys();
}

bool InMemoryStore::deleteKey(const std::string& key) {
  std::lock_guard lock(mutex_);
  StoreEffects effects;
  return state_.deleteKey(key, effects);
}

void InMemoryStore::append(const std::string& key, const std::string& value) {
  std::lock_guard lock(mutex_);
  StoreEffects effects;
  state_.append(key, value, effects);
  changed_.notify_all();
}

std::vector<std::string> InMemoryStore::multiGet(const std::vector<std::string>& keys) {
  return multiGetWith(keys, timeout_, nullptr);
}

std::vector<std::string> InMemoryStore::multiGetWith(const std::vector<std::string>& keys,
                                                     std::chrono::milliseconds timeout,
                                                     const std::atomic<bool>* interrupted) {
  std::unique_lock lock(mutex_);
  waitLocked(lock, "multi_get", keys, timeout, interrupted);
  std::vector<std::string> values;
  values.reserve(keys.size());
  for (const auto& key : keys) values.push_back(*state_.get(key));
  return values;
}

void InMemoryStore::multiSet(const std::vector<std::string>& keys, const std::vector<std::string>& values) {
  if (keys.size() != values.size()) {
    throw StoreError(fmt::format("store multi_set: {} keys but {} values (in-memory)", keys.size(), values.size()));
  }
  std::lock_guard lock(mutex_);
  StoreEffects effects;
  for (size_t i = 0; i < keys.size(); ++i) state_.set(keys[i], values[i], effects);
  changed_.notify_all();
}

void InMemoryStore::queuePush(const std::string& key, const std::string& value) {
  std::lock_guard lock(mutex_);
  StoreEffects effects;
  state_.queuePush(key, value, effects);
  changed_.notify_all();
}

std::string InMemoryStore::queuePop(const std::string& key, std::chrono::milliseconds timeout) {
  return queuePopWith(key, timeout, nullptr);
}

std::string InMemoryStore::queuePopWith(const std::string& key, std::chrono::milliseconds timeout,
                                        const std::atomic<bool>* interrupted) {
  std::unique_lock lock(mutex_);
  const auto deadline = clock_.now() + timeout;
  for (;;) {
    if (auto value = state_.queuePop(key)) return std::move(*value);
    if (interrupted && *interrupted) {
      throw StoreError(fmt::format("store queue_pop(key={}): interrupted (in-memory)", key));
    }
    if (clock_.waitUntil(lock, changed_, deadline) == std::cv_status::timeout && state_.queueLength(key) == 0) {
      throw StoreTimeout(
          fmt::format("store queue_pop(key={}): timed out after {} ms (in-memory)", key, timeout.count()));
    }
  }
}

int64_t InMemoryStore::queueLength(const std::string& key) {
  std::lock_guard lock(mutex_);
  return state_.queueLength(key);
}

std::vector<std::string> InMemoryStore::listKeys() {
  std::lock_guard lock(mutex_);
  return state_.listKeys();
}

void InMemoryStore::waitLocked(std::unique_lock<std::mutex>& lock, const char* op, const std::vector<std::string>& keys,
                               std::chrono::milliseconds timeout, const std::atomic<bool>* interrupted) {
  const auto deadline = clock_.now() + timeout;
  while (!state_.check(keys)) {
    if (interrupted && *interrupted) {
      throw StoreError(fmt::format("store {}(key={}): interrupted (in-memory)", op, joined(keys)));
    }
    if (clock_.waitUntil(lock, changed_, deadline) == std::cv_status::timeout && !state_.check(keys)) {
      throw StoreTimeout(
          fmt::format("store {}(key={}): timed out after {} ms (in-memory)", op, joined(keys), timeout.count()));
    }
  }
}

// The flag is set and the broadcast sent under the mutex, so a waiter that has just
// found the flag clear is already waiting when the broadcast comes.
void InMemoryStore::interrupt(std::atomic<bool>& flag) {
  std::lock_guard lock(mutex_);
  flag = true;
  changed_.notify_all();
}

}  // namespace ddprun::rendezvous
