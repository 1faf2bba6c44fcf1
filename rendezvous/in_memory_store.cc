#include "rendezvous/in_memory_store.h"

#include <fmt/format.h>

namespace ddprun::rendezvous {
namespace {

std::string joined(const std::vector<std::string>& keys) {
  std::string out;
  for (const auto& key : keys) out += (out.empty() ? "" : ",") + key;
  return out;
}

}  // namespace

InMemoryStore::InMemoryStore(std::chrono::milliseconds timeout) : timeout_(timeout) {}

// StoreState reports which connections a change wakes; here every blocked caller
// re-checks its own keys, so the effects only need to trigger one broadcast.
void InMemoryStore::set(const std::string& key, const std::string& value) {
  std::lock_guard lock(mutex_);
  StoreEffects effects;
  state_.set(key, value, effects);
  changed_.notify_all();
}

std::string InMemoryStore::get(const std::string& key) {
  std::unique_lock lock(mutex_);
  waitLocked(lock, "get", {key}, timeout_);
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

std::string InMemoryStore::compareSet(const std::string& key, const std::string& expected,
                                      const std::string& desired) {
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
  std::unique_lock lock(mutex_);
  waitLocked(lock, "wait", keys, timeout);
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
  std::unique_lock lock(mutex_);
  waitLocked(lock, "multi_get", keys, timeout_);
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
  std::unique_lock lock(mutex_);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (auto value = state_.queuePop(key)) return std::move(*value);
    if (changed_.wait_until(lock, deadline) == std::cv_status::timeout && state_.queueLength(key) == 0) {
      throw StoreTimeout(fmt::format("store queue_pop(key={}): timed out after {} ms (in-memory)", key,
                                     timeout.count()));
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

void InMemoryStore::waitLocked(std::unique_lock<std::mutex>& lock, const char* op,
                               const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!state_.check(keys)) {
    if (changed_.wait_until(lock, deadline) == std::cv_status::timeout && !state_.check(keys)) {
      throw StoreTimeout(fmt::format("store {}(key={}): timed out after {} ms (in-memory)", op, joined(keys),
                                     timeout.count()));
    }
  }
}

}  // namespace ddprun::rendezvous
