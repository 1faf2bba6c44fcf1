#include "rendezvous/store/store_state.h"

#include <algorithm>
#include <charconv>
#include <cstring>

#include "rendezvous/store/wire_protocol.h"

namespace ddprun::rendezvous {
bool StoreState::exists(const std::string& key) const {
  if (data_.count(key)) return true;
  auto q = queues_.find(key);
  return q != queues_.end() && !q->second.empty();
}

void StoreState::keyBecameReady(const std::string& key, StoreEffects& effects) {
  auto it = waiting_.find(key);
  if (it == waiting_.end()) return;
  for (const Waiter& w : it->second.waiters) {
    auto left = awaited_.find(w.connection);
    if (left == awaited_.end() || left->second.wait != w.wait) continue;
    if (--left->second.missing == 0) {
      awaited_.erase(left);
      effects.woken.push_back(w.connection);
    }
  }
  waiting_.erase(it);
}

void StoreState::notifyWatchers(const std::string& key, uint8_t kind, const std::string* old_value,
                                const std::string* new_value, StoreEffects& effects) {
  auto it = watchers_.find(key);
  if (it == watchers_.end()) return;
  static const std::string kEmpty;
  std::string frame(1, static_cast<char>(kind));
  wire::putBytes(frame, key);
  wire::putBytes(frame, old_value ? *old_value : kEmpty);
  wire::putBytes(frame, new_value ? *new_value : kEmpty);
  for (ConnectionId watcher : it->second) effects.watch_messages.emplace_back(watcher, frame);
}

void StoreState::set(const std::string& key, std::string value, StoreEffects& effects) {
  auto [it, created] = data_.try_emplace(key);
  if (created) {
    it->second = std::move(value);
    notifyWatchers(key, static_cast<uint8_t>(wire::WatchResponse::kKeyCreated), nullptr, &it->second, effects);
  } else {
    if (watchers_.count(key)) {
      std::string old = std::move(it->second);
      it->second = std::move(value);
      notifyWatchers(key, static_cast<uint8_t>(wire::WatchResponse::kKeyUpdated), &old, &it->second, effects);
    } else {
      it->second = std::move(value);
    }
  }
  keyBecameReady(key, effects);
}

std::string StoreState::compareSet(const std::string& key, const std::string& expected, std::string desired,
                                   StoreEffects& effects) {
  auto it = data_.find(key);
  if (it == data_.end()) {
    if (!expected.empty()) {
      keyBecameReady(key, effects);
      return expected;
    }
    set(key, desired, effects);
    return desired;
  }
  if (it->second == expected) {
    std::string old = std::move(it->second);
    it->second = std::move(desired);
    notifyWatchers(key, static_cast<uint8_t>(wire::WatchResponse::kKeyUpdated), &old, &it->second, effects);
  }
  keyBecameReady(key, effects);
  return it->second;
}

// torch parses the stored value with std::stoll: optional leading whitespace and sign,
// digits, trailing junk ignored; a value with no leading number is an error.
std::optional<int64_t> StoreState::sumWith(const std::string& key, int64_t amount) const {
  auto it = data_.find(key);
  if (it == data_.end()) return amount;
  const std::string& text = it->second;
  size_t start = text.find_first_not_of(" \t\n\r\f\v");
  if (start == std::string::npos) return std::nullopt;
  const char* first = text.data() + start;
  if (*first == '+') ++first;
  int64_t current = 0;
  auto [end, ec] = std::from_chars(first, text.data() + text.size(), current);
  if (ec != std::errc() || end == first) return std::nullopt;
  return static_cast<int64_t>(static_cast<uint64_t>(current) + static_cast<uint64_t>(amount));
}

std::optional<int64_t> StoreState::add(const std::string& key, int64_t amount, StoreEffects& effects) {
  auto total = sumWith(key, amount);
  if (total) set(key, std::to_string(*total), effects);
  return total;
}

const std::string* StoreState::get(const std::string& key) const {
  auto it = data_.find(key);
  return it == data_.end() ? nullptr : &it->second;
}

bool StoreState::check(const std::vector<std::string>& keys) const {
  return std::all_of(keys.begin(), keys.end(), [this](const std::string& k) { return exists(k); });
}

bool StoreState::wait(ConnectionId connection, const std::vector<std::string>& keys) {
  cancelWait(connection);  // a new wait replaces one the connection still had
  const uint64_t wait = ++next_wait_;
  Awaiting awaiting{0, wait, {}};
  for (const auto& key : keys) {
    if (exists(key)) continue;
    auto& list = waiting_[key].waiters;
    // A key named twice in one request: its entry is the list's last one.
    if (!list.empty() && list.back().connection == connection && list.back().wait == wait) continue;
    list.push_back({connection, wait});
    awaiting.keys.push_back(key);
    ++awaiting.missing;
  }
  if (awaiting.missing == 0) return true;
  awaited_[connection] = std::move(awaiting);
  return false;
}

bool StoreState::cancelWait(ConnectionId connection) {
  auto a = awaited_.find(connection);
  if (a == awaited_.end()) return false;
  const std::vector<std::string> keys = std::move(a->second.keys);
  awaited_.erase(a);
  for (const auto& key : keys) {
    auto it = waiting_.find(key);
    if (it == waiting_.end()) continue;
    WaitList& list = it->second;
    // Swept once half the list is stale: amortised O(1) per withdrawn wait.
    if (++list.stale * 2 < list.waiters.size()) continue;
    std::erase_if(list.waiters, [this](const Waiter& w) { return !live(w); });
    list.stale = 0;
    if (list.waiters.empty()) waiting_.erase(it);
  }
  return true;
}

bool StoreState::deleteKey(const std::string& key, StoreEffects& effects) {
  auto it = data_.find(key);
  if (it == data_.end()) return false;
  std::string old = std::move(it->second);
  data_.erase(it);
  notifyWatchers(key, static_cast<uint8_t>(wire::WatchResponse::kKeyDeleted), &old, nullptr, effects);
  return true;
}

void StoreState::append(const std::string& key, const std::string& value, StoreEffects& effects) {
  auto it = data_.find(key);
  if (it == data_.end()) {
    set(key, value, effects);
    return;
  }
  it->second += value;
  keyBecameReady(key, effects);
}

void StoreState::queuePush(const std::string& key, std::string value, StoreEffects& effects) {
  queues_[key].push_back(std::move(value));
  wakeOne(key, effects);
}

// One element satisfies one popper: the first waiter whose last missing key this was.
void StoreState::wakeOne(const std::string& key, StoreEffects& effects) {
  auto it = waiting_.find(key);
  if (it == waiting_.end()) return;
  auto& waiters = it->second.waiters;
  for (auto w = waiters.begin(); w != waiters.end(); ++w) {
    auto left = awaited_.find(w->connection);
    if (left == awaited_.end() || left->second.wait != w->wait) continue;
    if (--left->second.missing == 0) {
      awaited_.erase(left);
      effects.woken.push_back(w->connection);
      waiters.erase(w);
      break;
    }
  }
  if (waiters.empty()) waiting_.erase(it);
}

bool StoreState::barrier(ConnectionId connection, const std::string& key, int64_t world_size, StoreEffects& effects) {
  // The count is stored without waking anyone: earlier arrivals wait on this very key.
  auto count = sumWith(key, 1);
  data_[key] = std::to_string(count.value_or(1));
  if (count.value_or(1) >= world_size) {
    keyBecameReady(key, effects);
    return true;
  }
  cancelWait(connection);
  const uint64_t wait = ++next_wait_;
  waiting_[key].waiters.push_back({connection, wait});
  awaited_[connection] = Awaiting{1, wait, {key}};
  return false;
}

std::optional<std::string> StoreState::queuePop(const std::string& key) {
  auto it = queues_.find(key);
  if (it == queues_.end() || it->second.empty()) return std::nullopt;
  std::string front = std::move(it->second.front());
  it->second.pop_front();
  if (it->second.empty()) queues_.erase(it);
  return front;
}

int64_t StoreState::queueLength(const std::string& key) const {
  auto it = queues_.find(key);
  return it == queues_.end() ? 0 : static_cast<int64_t>(it->second.size());
}

std::vector<std::string> StoreState::listKeys() const {
  std::vector<std::string> keys;
  keys.reserve(data_.size());
  for (const auto& [key, value] : data_) keys.push_back(key);
  std::sort(keys.begin(), keys.end());
  return keys;
}

void StoreState::watch(ConnectionId connection, const std::string& key) { watchers_[key].push_back(connection); }

void StoreState::dropConnection(ConnectionId connection) {
  cancelWait(connection);
  for (auto it = watchers_.begin(); it != watchers_.end();) {
    std::erase(it->second, connection);
    it = it->second.empty() ? watchers_.erase(it) : std::next(it);
  }
}

}  // namespace ddprun::rendezvous
