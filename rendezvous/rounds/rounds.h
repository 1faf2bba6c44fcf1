// The rounds of one node of a ddprun job, as its agent takes part in them: join the next
// round, watch it, end it, sit out, leave. Each re-formation of the job is a numbered round,
// which ends for every node at once when any node writes its end reason (rendezvous/
// PROTOCOL.md). DynamicRendezvous (dynamic_rendezvous.h) is the job's; the agent's round-loop
// tests script their own (tests/agent/scripted_rendezvous.h).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <utility>

#include "common/error.h"
#include "rendezvous/rounds/rendezvous_config.h"
#include "rendezvous/rounds/round_end.h"

namespace ddprun::rendezvous {

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

// nextRound() runs on a thread of its own while the agent's loop waits; the others run on
// the agent's thread, interrupt() from either.
class Rounds {
 public:
  virtual ~Rounds() = default;

  // Joins the next round and blocks until it forms (up to join_timeout). Throws
  // RendezvousError naming the round, the store and what was missing.
  virtual RendezvousResult nextRound() = 0;
  // Starts watching the current round: keep-alives for this node, eviction of a silent
  // peer, and the round's end. `on_event` runs once, on the watcher's thread.
  virtual void watch(std::function<void(RoundEvent)> on_event) = 0;
  // Ends the current round with `end` unless another node ended it first; returns the
  // reason that stands, as stored (`end`'s text when the store cannot be reached). Stops
  // the watcher first.
  virtual std::string endRound(const RoundEnd& end) = 0;
  // This node's workers all succeeded; the last node to say so ends the round with "done".
  virtual void markDone() = 0;
  // The job is over for this node (however it ended): the exit barrier. Non-hosts check
  // out; the store's host waits up to close_timeout for everyone to check out.
  virtual void finish() = 0;
  // From another thread: makes a blocked nextRound() fail at once (ddprun was signalled).
  virtual void interrupt() = 0;

  // Leaves the current round without ending it and stays out of the next ones (cooldown
  // of a flapping node): the next nextRound() starts from the job's latest round, and
  // throws JobEndedError if the job ended meanwhile. Stops the watcher. Throws
  // StoreError when the store cannot count this node as away. Calling it again while away
  // prolongs the absence (it is counted once).
  virtual void sitOut() = 0;
  // While sitting out: the reason the job ended ("done", "final:...", "abort:..."), or
  // nothing while it goes on. A few store round trips on a connection of its own that
  // gives up within a keep-alive interval or two; throws StoreError.
  virtual std::optional<std::string> jobEndedWhileAway() = 0;

  // This node's name in end reasons and logs: host:pid.
  virtual const std::string& nodeName() const = 0;
  // "host:port" of the rendezvous store.
  virtual std::string storeAddress() const = 0;
  virtual bool hostsStore() const = 0;
};

}  // namespace ddprun::rendezvous
