// The rendezvous of a ddprun job: its rounds, on the store of a backend (rendezvous/
// backend.h: seats by --node_rank with static's fixed --nnodes, or in arrival order with
// --nnodes=MIN:MAX), which rendezvous/backends.h picks by name. The state
// machine is described in rendezvous/PROTOCOL.md; in short, each re-formation of the job
// is a numbered round whose state is a handful of keys per node (no shared blob), and a
// round ends, for every node at once, when any node writes its end reason.
//
// It also hosts, on the group-rank-0 node of each round, a fresh workers' store
// (MASTER_ADDR/MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE=True); the rendezvous store is
// the backend's (an agent hosts the TCP one: --standalone, static node 0, or the c10d
// endpoint's host).
//
// It keeps to rounds. What the agents post beside them (records for `ddprun status`, hang
// summaries) is rendezvous/board/job_board.h's, on a connection of its own.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "rendezvous/rounds/backend.h"
#include "rendezvous/rounds/rendezvous_config.h"
#include "rendezvous/rounds/round_end.h"
#include "rendezvous/store/tcp_store_client.h"

namespace ddprun::rendezvous {

class RendezvousEnv;

// How a round ended, seen by a node that did not end it itself (or did: it is delivered
// to everyone). kEnded: `reason` is the round's end as stored (RoundEnd::parse reads it);
// kStoreLost: `reason` is the store error.
struct RoundEvent {
  enum class Kind { kEnded, kStoreLost };
  Kind kind = Kind::kEnded;
  int round = 0;
  std::string reason;
};

// nextRound() of a node that sat out found the job already over ("done", "final:...",
// "abort:..."): there is no round left to join.
class JobEndedError : public RendezvousError {
 public:
  explicit JobEndedError(std::string reason)
      : RendezvousError("the job ended (" + reason + ") while this node sat out"), reason_(std::move(reason)) {}
  const std::string& reason() const { return reason_; }

 private:
  std::string reason_;
};

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

class DynamicRendezvous {
 public:
  // Validates the config, makes its backend with `make_backend` (which hosts the
  // rendezvous store if this node should; rendezvous/backends.h's openBackend picks it by
  // name), and connects. Throws RendezvousError (unreachable store, bad endpoint) or
  // UsageError. In `env` (its stores, clock and node name), which must outlive this.
  DynamicRendezvous(RendezvousConfig config, int nproc_per_node, RendezvousEnv& env, const BackendMaker& make_backend);
  ~DynamicRendezvous();
  DynamicRendezvous(const DynamicRendezvous&) = delete;
  DynamicRendezvous& operator=(const DynamicRendezvous&) = delete;

  // Joins the next round and blocks until it forms (up to join_timeout). Throws
  // RendezvousError naming the round, the store and what was missing.
  RendezvousResult nextRound();

  // Starts watching the current round: keep-alives for this node, eviction of a silent
  // peer, and the round's end. `on_event` runs once, on the watcher's thread.
  void watch(std::function<void(RoundEvent)> on_event);
  // Ends the current round with `end` unless another node ended it first; returns the
  // reason that stands, as stored (`end`'s text when the store cannot be reached). Stops
  // the watcher first.
  std::string endRound(const RoundEnd& end);
  // This node's workers all succeeded; the last node to say so ends the round with "done".
  void markDone();
  // Stops the watcher thread (idempotent).
  void stopWatching();
  // The job is over for this node (however it ended): the exit barrier. Non-hosts check
  // out; the store's host waits up to close_timeout for everyone to check out.
  void finish();
  // From another thread: makes a blocked nextRound() fail at once (ddprun was signalled).
  void interrupt();

  // Leaves the current round without ending it and stays out of the next ones (cooldown
  // of a flapping node): the next nextRound() starts from the job's latest round, and
  // throws JobEndedError if the job ended meanwhile. Stops the watcher. Throws
  // StoreError when the store cannot count this node as away. Calling it again while away
  // prolongs the absence (it is counted once).
  void sitOut();
  // While sitting out: the reason the job ended ("done", "final:...", "abort:..."), or
  // nothing while it goes on. A few store round trips on a connection of its own that
  // gives up within a keep-alive interval or two; throws StoreError.
  std::optional<std::string> jobEndedWhileAway();

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

  // This node's name in end reasons and logs: host:pid.
  const std::string& nodeName() const;
  // "host:port" of the rendezvous store.
  std::string storeAddress() const;
  bool hostsStore() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun::rendezvous
