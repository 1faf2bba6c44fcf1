// A store that misbehaves on purpose, for tests of what uses a store (the rendezvous):
// FaultInjectingStore wraps a store and, for the calls a FaultPlan picks by operation, key
// and count, fails them (StoreError at once, as a reset connection), drops them (the
// request is lost: nothing happens to the store and the caller waits out its timeout, then
// gets StoreTimeout, as over a partitioned network) or delays them (then performs them).
// Waits run on the Clock given, so a manual clock makes them instant and deterministic.
// One plan may drive several wrappers (a node's connections, every node's connections to
// one host), so "the 3rd get of rdzv/*/alive" counts across all of them, and
// failAll() models the loss of the store's host: calls blocked in a store at that moment
// fail too, as a reset connection's would.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "rendezvous/store/store_client.h"

namespace ddprun::rendezvous {

enum class StoreOp {
  kSet,
  kGet,
  kAdd,
  kCompareSet,
  kCheck,
  kWait,
  kNumKeys,
  kDeleteKey,
  kAppend,
  kMultiGet,
  kMultiSet,
  kQueuePush,
  kQueuePop,
  kQueueLength,
  kListKeys,
};

// The operation's name in torch's terms ("get", "compare_set", ...), as errors spell it.
const char* storeOpName(StoreOp op);

// Which calls misbehave, and how. A rule counts the calls it matches from the moment it
// is added; it hits matches number `nth` to `nth + times - 1`. Built in one line:
//   Fault::fail().only(StoreOp::kGet).matching("rdzv/*/alive").from(3)  // the 3rd such get fails
//   Fault::drop().matching("rdzv/job/r0/hb/1").always()                 // these are all lost
//   Fault::delayBy(3s).only(StoreOp::kAdd)                              // the next add is late
struct Fault {
  enum class Action {
    kFail,   // throws StoreError at once; the store is not touched.
    kDrop,   // the request is lost: waits out the call's timeout, then throws StoreTimeout.
    kDelay,  // waits `delay`, then performs the call.
  };
  static constexpr int kForever = 1 << 30;

  Action action = Action::kFail;  // how it misbehaves (default: fail).
  std::optional<StoreOp> op;      // which operation; unset (the default): every operation.
  // A glob (fnmatch, '*' also matches '/') that some key the call names must match.
  // "*" (the default) matches every call, those that name no key (numKeys, listKeys) too.
  std::string keys = "*";
  int nth = 1;                         // the first matching call it hits (default 1: the next one).
  int times = 1;                       // how many matching calls in a row it hits (default 1); kForever: all.
  std::chrono::milliseconds delay{0};  // kDelay: how long (default: none).

  static Fault fail() { return Fault{}; }
  static Fault drop() {
    Fault f;
    f.action = Action::kDrop;
    return f;
  }
  static Fault delayBy(std::chrono::milliseconds duration) {
    Fault f;
    f.action = Action::kDelay;
    f.delay = duration;
    return f;
  }
  Fault& only(StoreOp operation) {
    op = operation;
    return *this;
  }
  Fault& matching(std::string glob) {
    keys = std::move(glob);
    return *this;
  }
  Fault& from(int n) {
    nth = n;
    return *this;
  }
  Fault& repeat(int n) {
    times = n;
    return *this;
  }
  Fault& always() { return repeat(kForever); }
};

// The rules of one or more FaultInjectingStores. Thread-safe.
class FaultInjectingStore;

class FaultPlan {
 public:
  // Adds a rule after the others (the first rule that hits a call decides); returns its
  // index, for hits().
  size_t add(Fault fault);
  // Every call fails from now on (StoreError): the store's host is gone. Calls blocked
  // now fail at once too, as on a reset connection: each wrapper using the plan is
  // interrupted (with the client it owns), so those wrappers stay failed even after
  // clear(); new ones work.
  void failAll();
  // Forgets every rule: calls through wrappers that failAll() did not reset go through again.
  void clear();
  // Calls that rule `index` has made misbehave so far.
  int hits(size_t index) const;
  // Calls checked against the plan so far (each call of each wrapper once).
  int calls() const;

  // For FaultInjectingStore: counts the call against every rule and returns the fault
  // that hits it, if any.
  std::optional<Fault> onCall(StoreOp op, const std::vector<std::string>& keys);

 private:
  struct Rule {
    Fault fault;
    int matched = 0;
    int hits = 0;
  };
  friend class FaultInjectingStore;
  void attach(FaultInjectingStore* store);
  void detach(FaultInjectingStore* store);

  mutable std::mutex mutex_;
  std::vector<Rule> rules_;
  std::vector<FaultInjectingStore*> stores_;  // the wrappers using this plan, for failAll()
  int calls_ = 0;
};

class FaultInjectingStore final : public StoreClient {
 public:
  // Wraps `inner` (not owned; it must outlive this). interrupt() ends this wrapper's own
  // drops and delays only.
  FaultInjectingStore(Store& inner, Clock& clock, std::shared_ptr<FaultPlan> plan);
  // Wraps and owns a client: interrupt() reaches its calls too, and localAddress() is its.
  FaultInjectingStore(std::unique_ptr<StoreClient> inner, Clock& clock, std::shared_ptr<FaultPlan> plan);
  ~FaultInjectingStore() override;

  // The Store methods: each asks the plan first, then (unless it fails or drops) calls
  // the inner store. Thread-safe as the inner store is.
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
  std::chrono::milliseconds timeout() const override { return inner_.timeout(); }

  // Ends a drop or delay blocked on another thread with StoreError, and every later call;
  // interrupts the owned client too. Thread-safe.
  void interrupt() override;
  // The owned client's; "127.0.0.1" when the inner store is not a client.
  std::string localAddress() const override;

  FaultPlan& plan() { return *plan_; }

 private:
  // Asks the plan about this call: throws for kFail, waits and throws for kDrop, waits
  // for kDelay. `timeout` is how long the caller would wait for a reply.
  void misbehave(StoreOp op, const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  // Waits on the clock for `duration`; throws StoreError if interrupted meanwhile.
  void pause(StoreOp op, const std::vector<std::string>& keys, std::chrono::milliseconds duration);

  Store& inner_;
  std::unique_ptr<StoreClient> owned_;
  Clock& clock_;
  std::shared_ptr<FaultPlan> plan_;
  std::mutex mutex_;
  std::condition_variable interrupted_cv_;
  std::atomic<bool> interrupted_{false};
};

}  // namespace ddprun::rendezvous
