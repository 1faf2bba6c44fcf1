// The rendezvous of a ddprun job: its rounds (rounds.h), on the store of a backend
// (rendezvous/rounds/backend.h: seats by --node_rank with static's fixed --nnodes, or in
// arrival order with --nnodes=MIN:MAX), which rendezvous/backends.h picks by name. The state
// machine is described in rendezvous/PROTOCOL.md; in short, each re-formation of the job
// is a numbered round whose state is a handful of keys per node (no shared blob), and a
// round ends, for every node at once, when any node writes its end reason. The rounds
// (dynamic_rendezvous.cc) and the watcher that keeps a running round alive and notices its
// end (round_watch.cc) share this class.
//
// It also hosts, on the group-rank-0 node of each round, a fresh workers' store
// (MASTER_ADDR/MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE=True); the rendezvous store is
// the backend's (an agent hosts the TCP one: --standalone, static node 0, or the c10d
// endpoint's host).
//
// It keeps to rounds. What the agents post beside them (records for `ddprun status`, hang
// summaries) is rendezvous/board/job_board.h's, on a connection of its own.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "common/clock.h"
#include "common/error.h"
#include "common/logging.h"
#include "rendezvous/rounds/backend.h"
#include "rendezvous/rounds/rendezvous_config.h"
#include "rendezvous/rounds/round_end.h"
#include "rendezvous/rounds/rounds.h"
#include "rendezvous/store/store_client.h"
#include "rendezvous/store/tcp_store_client.h"

namespace ddprun::rendezvous {

class HostedStore;
class RendezvousEnv;

// Where this node stands in the round it takes part in.
struct RoundPlace {
  int round = 0;
  int group_rank = 0;    // GROUP_RANK: 0 .. participants - 1
  int participants = 0;  // nodes in the round
};

// What a part beside the rounds needs to reach the job's store and name this node there.
struct JobSite {
  Backend* backend = nullptr;  // connects to the store
  Clock* clock = nullptr;      // keeps the time
  // The job's store (address, token), with timeouts that give up within a couple of
  // keep-alive intervals: what is posted beside the rounds must never hold up the job.
  StoreClientOptions store;
  std::string prefix;   // the job's keys: rdzv/<run_id>/
  std::string node;     // this node's name (host:pid)
  std::string address;  // the address it advertises to the rendezvous
  std::chrono::milliseconds keep_alive_interval{0};
  int keep_alive_max_attempt = 0;
};

// Rounds on a backend's store: Rounds' calls behave as rounds.h says. Rounds is a virtual
// base so that the agent's one object of the rounds and the job board beside them
// (agent/agent_rendezvous.cc) takes those calls from this class, with no layer passing them on.
class DynamicRendezvous : public virtual Rounds {
 public:
  // Validates the config, makes its backend with `make_backend` (which hosts the
  // rendezvous store if this node should; rendezvous/backends.h's openBackend picks it by
  // name), and connects. Throws RendezvousError (unreachable store, bad endpoint) or
  // UsageError. In `env` (its stores, clock and node name), which must outlive this.
  DynamicRendezvous(RendezvousConfig config, int nproc_per_node, RendezvousEnv& env, const BackendMaker& make_backend);
  ~DynamicRendezvous() override;
  DynamicRendezvous(const DynamicRendezvous&) = delete;
  DynamicRendezvous& operator=(const DynamicRendezvous&) = delete;

  RendezvousResult nextRound() override;
  void watch(std::function<void(RoundEvent)> on_event) override;
  std::string endRound(const RoundEnd& end) override;
  void markDone() override;
  void finish() override;
  void interrupt() override;
  void sitOut() override;
  std::optional<std::string> jobEndedWhileAway() override;
  const std::string& nodeName() const override;
  std::string storeAddress() const override;
  bool hostsStore() const override;

  // Stops the watcher thread (idempotent).
  void stopWatching();

  // For the parts beside the rounds (rendezvous/board/job_board.h: status records, hang
  // summaries), which reach the job's store on a connection of their own.
  // The round this node takes part in; nothing before its first round and while it sits
  // out. Call from the thread that calls nextRound().
  std::optional<RoundPlace> currentRound() const;
  // The job's store and this node, as such a part needs them.
  JobSite site() const;
  // Runs `tick` on the watcher's thread at each of this node's keep-alives while a round
  // runs (the first as the watch starts); an empty function removes it. Returns once no
  // earlier tick runs any more, so that whatever `tick` uses may then go away.
  void onKeepAlive(std::function<void()> tick);

 private:
  using milliseconds = std::chrono::milliseconds;

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
  // Time left until `deadline` on the env's clock; at least 1 ms, so that a wait that
  // starts at the deadline still asks the store once.
  milliseconds remaining(Clock::TimePoint deadline) const;
  std::string key(int round, const std::string& name) const;
  // The name in seat `seat`'s entry of `round` (node/<seat>), to evict that node by. A node
  // takes its seat (an ADD) before it writes its entry, and can die in between (or lose the
  // ADD's reply and give up, as a cut link does): then "seat <seat> of round <round>", which
  // names no node, rather than a read that waits out read_timeout and fails every agent of
  // the job, the store's host included. Throws StoreError.
  std::string seatName(StoreClient& store, int round, int seat) const;
  RendezvousError error(int round, const std::string& what) const;
  // Where the store is, the backend says (Backend::connect).
  StoreClientOptions clientOptions(milliseconds connect_timeout) const;
  // Sitting out, and the parts beside the rounds: give up within a couple of keep-alive
  // intervals.
  StoreClientOptions quickClientOptions() const;

  std::string node_name_;
  std::unique_ptr<Backend> backend_;  // the job's store: where it is, how it lives

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
