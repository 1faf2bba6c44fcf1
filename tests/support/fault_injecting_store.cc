#include "tests/support/fault_injecting_store.h"

#include <fnmatch.h>

#include <algorithm>

#include <fmt/format.h>

namespace ddprun::rendezvous {
namespace {

std::string subject(const std::vector<std::string>& keys) {
  std::string out;
  for (const auto& key : keys) out += (out.empty() ? "" : ",") + key;
  return out;
}

bool matches(const Fault& fault, StoreOp op, const std::vector<std::string>& keys) {
  if (fault.op && *fault.op != op) return false;
  if (fault.keys == "*") return true;
  return std::any_of(keys.begin(), keys.end(),
                     [&](const std::string& key) { return ::fnmatch(fault.keys.c_str(), key.c_str(), 0) == 0; });
}

}  // namespace

const char* storeOpName(StoreOp op) {
  switch (op) {
    case StoreOp::kSet: return "set";
    case StoreOp::kGet: return "get";
    case StoreOp::kAdd: return "add";
    case StoreOp::kCompareSet: return "compare_set";
    case StoreOp::kCheck: return "check";
    case StoreOp::kWait: return "wait";
    case StoreOp::kNumKeys: return "num_keys";
    case StoreOp::kDeleteKey: return "delete_key";
    case StoreOp::kAppend: return "append";
    case StoreOp::kMultiGet: return "multi_get";
    case StoreOp::kMultiSet: return "multi_set";
    case StoreOp::kQueuePush: return "queue_push";
    case StoreOp::kQueuePop: return "queue_pop";
    case StoreOp::kQueueLength: return "queue_len";
    case StoreOp::kListKeys: return "list_keys";
  }
  return "?";
}

size_t FaultPlan::add(Fault fault) {
  std::lock_guard lock(mutex_);
  rules_.push_back(Rule{std::move(fault)});
  return rules_.size() - 1;
}

// Lock order: the plan, then a wrapper's own mutex, then its client's (nothing takes the
// plan's while holding either).
void FaultPlan::failAll() {
  std::lock_guard lock(mutex_);
  rules_.push_back(Rule{Fault::fail().always()});
  for (FaultInjectingStore* store : stores_) store->interrupt();
}

void FaultPlan::attach(FaultInjectingStore* store) {
  std::lock_guard lock(mutex_);
  stores_.push_back(store);
}

void FaultPlan::detach(FaultInjectingStore* store) {
  std::lock_guard lock(mutex_);
  std::erase(stores_, store);
}

void FaultPlan::clear() {
  std::lock_guard lock(mutex_);
  rules_.clear();
}

int FaultPlan::hits(size_t index) const {
  std::lock_guard lock(mutex_);
  return index < rules_.size() ? rules_[index].hits : 0;
}

int FaultPlan::calls() const {
  std::lock_guard lock(mutex_);
  return calls_;
}

// Every rule counts every call it matches, even one an earlier rule hits, so that "the
// 3rd get" means the 3rd get whatever other rules did to the first two.
std::optional<Fault> FaultPlan::onCall(StoreOp op, const std::vector<std::string>& keys) {
  std::lock_guard lock(mutex_);
  ++calls_;
  std::optional<Fault> decided;
  for (Rule& rule : rules_) {
    if (!matches(rule.fault, op, keys)) continue;
    const int n = ++rule.matched;
    const bool hit = n >= rule.fault.nth && n - rule.fault.nth < rule.fault.times;
    if (hit && !decided) {
      ++rule.hits;
      decided = rule.fault;
    }
  }
  return decided;
}

FaultInjectingStore::FaultInjectingStore(Store& inner, Clock& clock, std::shared_ptr<FaultPlan> plan)
    : inner_(inner), clock_(clock), plan_(std::move(plan)) {
  plan_->attach(this);
}

FaultInjectingStore::FaultInjectingStore(std::unique_ptr<StoreClient> inner, Clock& clock,
                                         std::shared_ptr<FaultPlan> plan)
    : inner_(*inner), owned_(std::move(inner)), clock_(clock), plan_(std::move(plan)) {
  plan_->attach(this);
}

FaultInjectingStore::~FaultInjectingStore() { plan_->detach(this); }

void FaultInjectingStore::pause(StoreOp op, const std::vector<std::string>& keys, std::chrono::milliseconds duration) {
  const auto deadline = clock_.now() + duration;
  std::unique_lock lock(mutex_);
  while (!interrupted_) {
    if (clock_.waitUntil(lock, interrupted_cv_, deadline) == std::cv_status::timeout) return;
  }
  throw StoreError(fmt::format("store {}(key={}): interrupted (fault injection)", storeOpName(op), subject(keys)));
}

void FaultInjectingStore::misbehave(StoreOp op, const std::vector<std::string>& keys,
                                    std::chrono::milliseconds timeout) {
  if (interrupted_) {
    throw StoreError(fmt::format("store {}(key={}): interrupted (fault injection)", storeOpName(op), subject(keys)));
  }
  const auto fault = plan_->onCall(op, keys);
  if (!fault) return;
  switch (fault->action) {
    case Fault::Action::kFail:
      throw StoreError(fmt::format("store {}(key={}): injected failure", storeOpName(op), subject(keys)));
    case Fault::Action::kDrop:
      pause(op, keys, timeout);
      throw StoreTimeout(fmt::format("store {}(key={}): timed out after {} ms (request dropped by fault injection)",
                                     storeOpName(op), subject(keys), timeout.count()));
    case Fault::Action::kDelay: pause(op, keys, fault->delay); return;
  }
}

void FaultInjectingStore::set(const std::string& key, const std::string& value) {
  misbehave(StoreOp::kSet, {key}, timeout());
  inner_.set(key, value);
}

std::string FaultInjectingStore::get(const std::string& key) {
  misbehave(StoreOp::kGet, {key}, timeout());
  return inner_.get(key);
}

int64_t FaultInjectingStore::add(const std::string& key, int64_t amount) {
  misbehave(StoreOp::kAdd, {key}, timeout());
  return inner_.add(key, amount);
}

std::string FaultInjectingStore::compareSet(const std::string& key, const std::string& expected,
                                            const std::string& desired) {
  misbehave(StoreOp::kCompareSet, {key}, timeout());
  return inner_.compareSet(key, expected, desired);
}

bool FaultInjectingStore::check(const std::vector<std::string>& keys) {
  misbehave(StoreOp::kCheck, keys, timeout());
  return inner_.check(keys);
}

void FaultInjectingStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  misbehave(StoreOp::kWait, keys, timeout);
  inner_.wait(keys, timeout);
}

int64_t FaultInjectingStore::numKeys() {
  misbehave(StoreOp::kNumKeys, {}, timeout());
  return inner_.numKeys();
}

bool FaultInjectingStore::deleteKey(const std::string& key) {
  misbehave(StoreOp::kDeleteKey, {key}, timeout());
  return inner_.deleteKey(key);
}

void FaultInjectingStore::append(const std::string& key, const std::string& value) {
  misbehave(StoreOp::kAppend, {key}, timeout());
  inner_.append(key, value);
}

std::vector<std::string> FaultInjectingStore::multiGet(const std::vector<std::string>& keys) {
  misbehave(StoreOp::kMultiGet, keys, timeout());
  return inner_.multiGet(keys);
}

void FaultInjectingStore::multiSet(const std::vector<std::string>& keys, const std::vector<std::string>& values) {
  misbehave(StoreOp::kMultiSet, keys, timeout());
  inner_.multiSet(keys, values);
}

void FaultInjectingStore::queuePush(const std::string& key, const std::string& value) {
  misbehave(StoreOp::kQueuePush, {key}, timeout());
  inner_.queuePush(key, value);
}

std::string FaultInjectingStore::queuePop(const std::string& key, std::chrono::milliseconds timeout) {
  misbehave(StoreOp::kQueuePop, {key}, timeout);
  return inner_.queuePop(key, timeout);
}

int64_t FaultInjectingStore::queueLength(const std::string& key) {
  misbehave(StoreOp::kQueueLength, {key}, timeout());
  return inner_.queueLength(key);
}

std::vector<std::string> FaultInjectingStore::listKeys() {
  misbehave(StoreOp::kListKeys, {}, timeout());
  return inner_.listKeys();
}

// Under the mutex, so a pause that has just found the flag clear is already waiting when
// the notification comes.
void FaultInjectingStore::interrupt() {
  {
    std::lock_guard lock(mutex_);
    interrupted_ = true;
    interrupted_cv_.notify_all();
  }
  if (owned_) owned_->interrupt();
}

std::string FaultInjectingStore::localAddress() const { return owned_ ? owned_->localAddress() : "127.0.0.1"; }

}  // namespace ddprun::rendezvous
