// A round's keep-alives on an etcd lease (RoundLiveness): this node's key in the round is
// attached to a lease of `ttl` that a thread keeps alive every keep_alive_interval (etcd's
// LeaseKeepAlive); another thread watches the successor's key and, when etcd deletes it
// (its lease lapsed) or it never appears within ttl, ends the round with the eviction.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

#include "common/clock.h"
#include "rendezvous/etcd/etcd_store.h"
#include "rendezvous/rounds/round_liveness.h"

namespace ddprun::rendezvous::etcd {

class EtcdRoundLease final : public RoundLiveness {
 public:
  // Grants the lease and writes own_key on it before returning. Throws StoreError. The waits
  // between keep-alives (and between tries to watch the successor) run on `clock`, which
  // outlives this object; tests give a manual one.
  EtcdRoundLease(std::unique_ptr<EtcdStore> store, RoundLivenessSpec spec, Clock& clock = Clock::real());
  ~EtcdRoundLease() override;

 private:
  void keepAliveLoop();
  void watchSuccessor();
  // Waits keep_alive_interval on clock_ (lock held on entry and return); true once stopped.
  bool stoppedWithin(std::unique_lock<std::mutex>& lock);

  std::unique_ptr<EtcdStore> store_;  // its own: stopping interrupts only this object's calls
  RoundLivenessSpec spec_;
  Clock& clock_;
  int64_t lease_ = 0;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread keep_alive_;
  std::thread successor_;
};

}  // namespace ddprun::rendezvous::etcd
