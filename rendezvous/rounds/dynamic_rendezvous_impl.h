// DynamicRendezvous' state machine, private to rendezvous/: the rounds
// (dynamic_rendezvous.cc) and the watcher that keeps a running round alive and notices its
// end (round_watch.cc) share this class.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/error.h"
#include "rendezvous/rounds/backend.h"
#include "rendezvous/rounds/dynamic_rendezvous.h"
#include "rendezvous/rounds/rendezvous_env.h"
#include "rendezvous/rounds/round_end.h"

namespace ddprun::rendezvous {

// The most one read of a quick connection may carry: its keys are round keys and records,
// kilobytes; hang summaries are at most a megabyte (rendezvous/board/job_board.cc).
constexpr size_t kMaxQuickReplyBytes = 16 << 20;

// One participant's entry in a round: "<node name>|<address>|<nproc>".
struct NodeEntry {
  std::string name;
  std::string address;
  int nproc = 0;
};

std::string encodeEntry(const NodeEntry& e);
// Throws RendezvousError on a malformed entry.
NodeEntry decodeEntry(const std::string& text);

class DynamicRendezvous::Impl {
 public:
  using milliseconds = std::chrono::milliseconds;

  Impl(RendezvousConfig config, int nproc_per_node, RendezvousEnv& env, const BackendMaker& make_backend);
  ~Impl() { stopWatching(); }

  RendezvousResult nextRound();
  void watch(std::function<void(RoundEvent)> on_event);
  std::string endRound(const RoundEnd& end);
  void markDone();
  void stopWatching();
  void finish();
  void interrupt();
  void sitOut();
  std::optional<std::string> jobEndedWhileAway();
  std::optional<RoundPlace> currentRound() const;
  JobSite site() const;
  void onKeepAlive(std::function<void()> tick);

  std::string node_name_;
  std::unique_ptr<Backend> backend_;  // the job's store: where it is, how it lives

 private:
  // Time left until `deadline` on the env's clock; at least 1 ms, so that a wait that
  // starts at the deadline still asks the store once.
  milliseconds remaining(Clock::TimePoint deadline) const {
    auto left = std::chrono::duration_cast<milliseconds>(deadline - clock_.now());
    return left.count() > 0 ? left : milliseconds(1);
  }
  std::string key(int round, const std::string& name) const {
    return prefix_ + "r" + std::to_string(round) + "/" + name;
  }
  // Where this node stands in a round it tried to join.
  struct Seat {
    bool late = false;     // arrived after the round closed: try the next one
    int index = 0;         // 1-based arrival order (static: node_rank + 1)
    int participants = 0;  // nodes in the round
    int rank_base = 0;     // RANK of this node's local rank 0
    int world_size = 0;    // all workers of the round
  };
  Seat join(int round, Clock::TimePoint deadline);
  Seat joinStatic(int round, Clock::TimePoint deadline);
  int restartCountFor(int round);
  void publishWorkerStore(int round, int world_size);
  std::optional<std::string> awaitMaster(int round);
  std::string rpcSecret(int round, int participants) const;
  // The keep-alive hook's tick, if there is one (on the watcher's thread).
  void tickKeepAlive();
  static bool jobOver(const std::string& reason) {
    const auto end = RoundEnd::parse(reason);
    return end && end->endsJob();
  }
  RendezvousError error(int round, const std::string& what) const {
    return RendezvousError(
        fmt::format("round {} of job '{}' (store {}): {}", round, config_.run_id, backend_->storeText(), what));
  }
  // Where the store is, the backend says (Backend::connect).
  StoreClientOptions clientOptions(milliseconds connect_timeout) const {
    StoreClientOptions o;
    o.timeout = settings_.read_timeout;
    o.connect_timeout = connect_timeout;
    o.token = token_;
    return o;
  }

  // Sitting out, and the parts beside the rounds: give up within a couple of keep-alive
  // intervals.
  StoreClientOptions quickClientOptions() const {
    StoreClientOptions o = clientOptions(settings_.keep_alive_interval);
    o.timeout = std::min(settings_.read_timeout, 2 * settings_.keep_alive_interval);
    // Records, round keys and hang summaries are kilobytes; a longer value is not read.
    o.max_reply_bytes = kMaxQuickReplyBytes;
    return o;
  }

  RendezvousEnv& env_;
  Clock& clock_;
  RendezvousConfig config_;
  RendezvousSettings settings_;
  int nproc_;
  std::string token_;
  std::string prefix_;
  std::string advertise_address_;
  std::shared_ptr<spdlog::logger> log_;
  std::unique_ptr<StoreClient> client_;
  std::unique_ptr<HostedStore> worker_store_;

  // The current round, as this node took part in it.
  bool in_round_ = false;
  int round_ = -1;
  int group_rank_ = 0;
  int participants_ = 0;
  int restart_count_ = 0;
  std::mutex end_mutex_;
  std::string end_reason_;  // of round_, once known

  std::thread watcher_;
  std::unique_ptr<StoreClient> watcher_client_;
  std::atomic<bool> stop_watching_{false};

  std::mutex keep_alive_mutex_;  // held while the hook runs, so that it can be removed safely
  std::function<void()> on_keep_alive_;

  // While sitting out: asks whether the job ended, and gives up quickly when the store is
  // gone (the main client would keep reconnecting for join_timeout).
  std::unique_ptr<StoreClient> away_client_;
  bool sat_out_ = false;  // left its last round for a cooldown and has not joined since
  int final_round_ = -1;  // the round whose end ended the job while this node sat out
};

}  // namespace ddprun::rendezvous
