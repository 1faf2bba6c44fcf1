#include "rendezvous/etcd/etcd_round_lease.h"

#include "common/logging.h"
#include "common/text_escape.h"
#include "rendezvous/etcd/etcd_http.h"

namespace ddprun::rendezvous::etcd {

using std::chrono::milliseconds;

EtcdRoundLease::EtcdRoundLease(std::unique_ptr<EtcdStore> store, RoundLivenessSpec spec, Clock& clock)
    : store_(std::move(store)), spec_(std::move(spec)), clock_(clock) {
  // etcd counts TTLs in whole seconds (and raises ones under its minimum).
  const int64_t ttl_seconds = std::max<int64_t>(1, (spec_.ttl.count() + 999) / 1000);
  lease_ = store_->grantLease(ttl_seconds);
  store_->setWithLease(spec_.own_key, "1", lease_);
  keep_alive_ = std::thread([this] { keepAliveLoop(); });
  if (!spec_.successor_key.empty()) successor_ = std::thread([this] { watchSuccessor(); });
}

EtcdRoundLease::~EtcdRoundLease() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  store_->interrupt();
  if (keep_alive_.joinable()) keep_alive_.join();
  if (successor_.joinable()) successor_.join();
}

bool EtcdRoundLease::stoppedWithin(std::unique_lock<std::mutex>& lock) {
  const Clock::TimePoint until = clock_.now() + spec_.keep_alive_interval;
  while (!stop_) {
    if (clock_.waitUntil(lock, wake_, until) == std::cv_status::timeout) return stop_;
  }
  return true;
}

void EtcdRoundLease::keepAliveLoop() {
  auto log = logger("rendezvous");
  std::unique_lock lock(mutex_);
  for (;;) {
    if (stoppedWithin(lock)) return;
    lock.unlock();
    try {
      if (store_->keepAlive(lease_) == 0) {
        log->error("this node's etcd lease expired; the other nodes will re-form the job without it");
        return;
      }
    } catch (const StoreError& e) {
      // A member that did not answer, or answered what etcd never sends (EtcdBadReply):
      // the next keep-alive may reach another member.
      std::lock_guard relock(mutex_);
      if (!stop_) log->warn("etcd lease keep-alive failed ({}); retrying", e.what());
    } catch (const std::exception& e) {
      // Every error of a reply is a StoreError; whatever else comes, it must not end the
      // process from this thread. The lease lapses and the other nodes re-form without this one.
      log->error("etcd lease keep-alives stopped: {}", printable(e.what()));
      return;
    }
    lock.lock();
  }
}

void EtcdRoundLease::watchSuccessor() {
  auto log = logger("rendezvous");
  try {
    bool gone = false;
    for (;;) {
      try {
        // The successor writes its key when it starts watching the round, right after it
        // formed; one that has not within a TTL is as gone as one whose lease lapsed.
        const KeyValue kv = store_->waitFor(spec_.successor_key,
                                            std::chrono::steady_clock::now() + spec_.ttl + spec_.keep_alive_interval);
        gone = store_->waitDeleted(spec_.successor_key, kv.mod_revision, Deadline::max());
        break;
      } catch (const EtcdUnavailable& e) {
        // No member answered (a leader election, a member cut off): that says nothing of the
        // successor. Try again, with a fresh window for its key, once the cluster answers.
        std::unique_lock lock(mutex_);
        if (stop_) return;
        log->warn("cannot watch node {}'s etcd lease ({}); trying again", spec_.successor_name, e.what());
        if (stoppedWithin(lock)) return;
      } catch (const StoreTimeout&) {
        gone = true;
        break;
      }
    }
    {
      std::lock_guard lock(mutex_);
      if (stop_ || !gone) return;
    }
    log->warn("node {}'s etcd lease lapsed; evicting it", spec_.successor_name);
    store_->compareSet(spec_.end_key, "", spec_.evict_reason);
  } catch (const StoreError& e) {
    // EtcdBadReply included: a reply that cannot be read says nothing of the successor, so
    // it is not evicted for it; the round's own watcher meets the same member.
    std::lock_guard lock(mutex_);
    if (!stop_) log->warn("cannot watch node {}'s etcd lease: {}", spec_.successor_name, e.what());
  } catch (const std::exception& e) {
    // As in keepAliveLoop: never the end of the process from this thread.
    log->error("stopped watching node {}'s etcd lease: {}", spec_.successor_name, printable(e.what()));
  }
}

}  // namespace ddprun::rendezvous::etcd
