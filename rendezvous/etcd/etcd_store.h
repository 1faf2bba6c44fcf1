// The Store interface over etcd's v3 API (EtcdHttp: the JSON gateway), so DynamicRendezvous
// runs its rounds on etcd unchanged (PROTOCOL.md: "etcd"). Every store key k is the etcd
// key <key_prefix>/k. Reads are linearizable (served through the leader's quorum); writes
// that depend on what is stored are transactions: ADD and APPEND compare the key's
// mod_revision, COMPARE_SET its value or its absence. Waits are watches, never polls: a
// watch runs in segments of attempt_timeout, each resumed from the revision it read, so a
// member that froze is noticed and left within a segment.
//
// An ADD's transaction also writes a marker beside its key (on a short lease):
// when a member failed after applying it but before answering, the retry on another member
// finds the marker and returns the sum instead of adding twice.
//
// The queue operations are not part of the rendezvous and are refused (StoreError).
// Thread-safe; interrupt() stops a blocked call on another thread.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "rendezvous/etcd/etcd_http.h"
#include "rendezvous/store/store_client.h"

namespace ddprun::rendezvous::etcd {

class EtcdStore final : public StoreClient {
 public:
  // `key_prefix` starts with '/'. Nothing is sent until the first call.
  EtcdStore(EtcdConnectionOptions connection, std::string key_prefix, std::chrono::milliseconds timeout);

  // Asks any member for its status (no leader needed) within `timeout`. Throws StoreError
  // naming the members and why none answered, or that what answered is not etcd.
  void probe(std::chrono::milliseconds timeout);

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
  void deletePrefix(const std::string& prefix) override;
  std::chrono::milliseconds timeout() const override { return timeout_; }
  void interrupt() override { http_.interrupt(); }
  std::string localAddress() const override;

  // etcd's own: a lease of `ttl_seconds` (etcd may raise it to its minimum); its id.
  int64_t grantLease(int64_t ttl_seconds);
  // One keep-alive of `lease`; the TTL left (0: the lease has expired).
  int64_t keepAlive(int64_t lease);
  // SET with the key attached to `lease`: etcd deletes it when the lease expires.
  void setWithLease(const std::string& key, const std::string& value, int64_t lease);
  // Waits (a watch) until `key` is deleted after `since_revision`, until `deadline`:
  // returns true when it was, false when the deadline passed first.
  bool waitDeleted(const std::string& key, int64_t since_revision, Deadline deadline);
  // The key's value and mod_revision, or nothing; one linearizable read.
  std::optional<KeyValue> read(const std::string& key);
  // Waits for the key to exist (until `deadline`; StoreTimeout after) and returns it.
  KeyValue waitFor(const std::string& key, Deadline deadline);

  const std::string& keyPrefix() const { return root_; }

 private:
  Deadline deadlineFrom(std::chrono::milliseconds timeout) const { return std::chrono::steady_clock::now() + timeout; }
  std::string full(const std::string& key) const { return root_ + key; }
  // A read-modify-write of one key (ADD, APPEND) as a transaction on its mod_revision,
  // retried on contention; `next` maps the current value (nothing: absent) to the new one.
  std::string update(const std::string& key, const std::function<std::string(const std::optional<std::string>&)>& next);
  int64_t markerLease();

  EtcdHttp http_;
  std::string root_;  // key_prefix + "/"
  std::chrono::milliseconds timeout_;
  std::chrono::milliseconds segment_;
  std::mutex lease_mutex_;
  int64_t marker_lease_ = 0;
  std::chrono::steady_clock::time_point marker_lease_granted_;
  mutable std::mutex address_mutex_;
  mutable std::string local_address_;
};

}  // namespace ddprun::rendezvous::etcd
