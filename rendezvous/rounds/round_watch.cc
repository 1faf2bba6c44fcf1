// The watcher of a running round (DynamicRendezvous::watch): this node's keep-alives,
// its successor's, and the round's end. PROTOCOL.md: "While a round runs".
#include <chrono>
#include <string>

#include "common/text_escape.h"
#include "rendezvous/rounds/dynamic_rendezvous.h"
#include "rendezvous/rounds/round_liveness.h"

namespace ddprun::rendezvous {

void DynamicRendezvous::watch(std::function<void(RoundEvent)> on_event) {
  stopWatching();
  stop_watching_ = false;
  try {
    // The watcher's operations are the keep-alives, which torch bounds by heartbeat_timeout.
    StoreClientOptions options = clientOptions(settings_.read_timeout);
    options.timeout = settings_.heartbeat_timeout.value_or(settings_.read_timeout);
    watcher_client_ = backend_->connect(options);
  } catch (const StoreError& e) {
    on_event(RoundEvent{RoundEvent::Kind::kStoreLost, round_, e.what()});
    return;
  }
  const int round = round_;
  const int n = participants_;
  const int me = group_rank_;
  watcher_ = std::thread([this, on_event = std::move(on_event), round, n, me] {
    StoreClient& store = *watcher_client_;
    const std::string end = key(round, "end");
    const std::string my_beat = key(round, "hb/" + std::to_string(me));
    const int successor = (me + 1) % n;
    // The successor's host:pid, from its entry in the round (for end reasons and the log).
    const auto successorName = [&] { return seatName(store, round, successor + 1); };
    int64_t last_seen = -1;
    int misses = 0;
    // Failed keep-alive attempts in a row (a timed-out or broken store operation). One is not
    // a lost store: a loaded machine can hold a reply past heartbeat_timeout, and the
    // connection is made afresh on the next attempt. The store is lost after as many failures
    // in a row as the others allow this node missed keep-alives (keep_alive_max_attempt); on the
    // store's own host a timeout never counts (the store is in this process: a slow reply is
    // CPU starvation, and taking it for a loss would end the whole job).
    int failures = 0;
    const bool own_store = backend_->hostsStore();
    try {
      // The store's own keep-alives where the backend has them (etcd: leases;
      // round_liveness.h); otherwise the counters below.
      std::unique_ptr<RoundLiveness> lease = backend_->liveness([&] {
        RoundLivenessSpec spec;
        spec.own_key = key(round, "alive/" + std::to_string(me));
        if (n > 1) {
          spec.successor_key = key(round, "alive/" + std::to_string(successor));
          spec.successor_name = successorName();
          spec.evict_reason = RoundEnd::evict(spec.successor_name).format();
        }
        spec.end_key = end;
        spec.keep_alive_interval = settings_.keep_alive_interval;
        spec.ttl = settings_.keep_alive_interval * settings_.keep_alive_max_attempt;
        return spec;
      });
      if (!lease) store.add(my_beat, 1);
      tickKeepAlive();
      for (;;) {
        try {
          try {
            store.wait({end}, settings_.keep_alive_interval);
            std::string reason = store.get(end);
            {
              std::lock_guard lock(end_mutex_);
              end_reason_ = reason;
            }
            if (!stop_watching_) on_event(RoundEvent{RoundEvent::Kind::kEnded, round, reason});
            return;
          } catch (const StoreTimeout&) {
            if (stop_watching_) return;
          }
          if (lease) {
            tickKeepAlive();
            continue;
          }
          store.add(my_beat, 1);
          tickKeepAlive();
          if (n >= 2) {
            // Each node watches the next one's keep-alives: linear cost over the job.
            int64_t seen = store.add(key(round, "hb/" + std::to_string(successor)), 0);
            misses = seen == last_seen ? misses + 1 : 0;
            last_seen = seen;
            if (misses >= settings_.keep_alive_max_attempt) {
              const std::string name = successorName();
              log_->warn("node {} missed {} keep-alives; evicting it", name, misses);
              store.compareSet(end, "", RoundEnd::evict(name).format());
            }
          }
          failures = 0;
        } catch (const StoreError& e) {
          if (stop_watching_) throw;
          const bool own_store_slow = own_store && dynamic_cast<const StoreTimeout*>(&e) != nullptr;
          if (!own_store_slow && ++failures >= settings_.keep_alive_max_attempt) throw;
          if (own_store_slow) {
            log_->warn("keep-alive to this host's own rendezvous store timed out ({}); trying again", e.what());
          } else {
            log_->warn("keep-alive to the rendezvous store failed ({} of {} in a row): {}; trying again", failures,
                       settings_.keep_alive_max_attempt, e.what());
          }
        }
      }
    } catch (const StoreError& e) {
      if (!stop_watching_) on_event(RoundEvent{RoundEvent::Kind::kStoreLost, round, e.what()});
    } catch (const std::exception& e) {
      // Store errors (a reply that cannot be read included) are StoreErrors; anything else
      // from this thread would end the process (std::terminate). It ends the round's watch
      // as a lost store does: the agent stops its workers and exits 3 with the reason.
      if (!stop_watching_) {
        on_event(RoundEvent{RoundEvent::Kind::kStoreLost, round, "the round's watcher failed: " + printable(e.what())});
      }
    }
  });
}

void DynamicRendezvous::stopWatching() {
  stop_watching_ = true;
  if (watcher_client_) watcher_client_->interrupt();
  if (watcher_.joinable()) watcher_.join();
  watcher_client_.reset();
}

void DynamicRendezvous::tickKeepAlive() {
  std::lock_guard lock(keep_alive_mutex_);
  if (on_keep_alive_) on_keep_alive_();
}

void DynamicRendezvous::onKeepAlive(std::function<void()> tick) {
  std::lock_guard lock(keep_alive_mutex_);
  on_keep_alive_ = std::move(tick);
}

}  // namespace ddprun::rendezvous
