// What the end of a round means for this node's next step: the agent's restart decisions
// in one place. The job's restart count is kept by the rendezvous (a round that ends in
// fail:<node> makes the next one's count one higher, on every node); this policy decides
// how this node ends a round when its workers fail (fail: while restarts remain, final:
// once --max_restarts are used), and what follows an end: re-form, restart (after sitting
// out a cooldown, agent/node_cooldown.h, when this node flaps), succeed or fail. Signals
// and the loss of the store are the agent's own business and come before any of this.
#pragma once

#include <chrono>
#include <string>

#include "agent/node_cooldown.h"
#include "common/clock.h"
#include "rendezvous/rounds/round_end.h"

namespace ddprun::agent {

class RestartPolicy {
 public:
  enum class Action {
    kReform,   // join the next round at once; this node uses no restart (a node joined or
               // was evicted, or another node's failure ended the round first).
    kRestart,  // this node's failure restarts the job: join the next round, after sitting
               // out `sit_out` when it is not zero.
    kSucceed,  // the job is done: exit 0.
    kFail,     // the job failed: exit 1.
  };
  struct Decision {
    Action action = Action::kReform;
    std::chrono::milliseconds sit_out{0};  // kRestart: how long to sit out first (default: not at all).
  };

  // `clock` (which must outlive the policy) measures attempts for the cooldown.
  RestartPolicy(int max_restarts, NodeCooldown cooldown, Clock& clock);

  // This node's workers started: an attempt's length (which decides whether a failure
  // continues a streak of them) runs from now.
  void attemptStarted();
  // How this node ends a round in which its workers failed, the job having restarted
  // `restart_count` times: fail:<node> while restarts remain, else final:<node>.
  rendezvous::RoundEnd endForFailure(const std::string& node, int restart_count) const;
  // This node's workers failed and it ended the round with `mine`; `standing` is the end
  // that stands, as stored (another node's when that one ended the round first). Counts
  // the failure for the cooldown unless another node's non-final end decides the round.
  Decision afterFailure(const rendezvous::RoundEnd& mine, const std::string& standing);
  // The round ended with `reason` (as stored) while this node's workers ran, or after
  // they had all succeeded (`workers_succeeded`): done then is the job's success (and ends
  // this node's streak of failures); final:/abort: fail the job; anything else re-forms it.
  Decision afterRoundEnd(const std::string& reason, bool workers_succeeded);

  // Failures of this node's workers in a row (for status and logs).
  int consecutiveFailures() const { return cooldown_.consecutiveFailures(); }
  int maxRestarts() const { return max_restarts_; }

 private:
  int max_restarts_;
  NodeCooldown cooldown_;
  Clock& clock_;
  Clock::TimePoint attempt_start_;
};

}  // namespace ddprun::agent
