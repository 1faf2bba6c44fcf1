// When a node whose workers keep failing sits out of the job. Every failure of this
// node's workers that ended a round (the round's end reason is this node's fail:) counts;
// a failure after an attempt that ran for at least `max` starts the count over, as does
// a success. From the second failure in a row on, the node sits out for
// base, 2*base, 4*base, ... up to `max`, so a node that flaps can no longer restart the
// whole job again and again: the others go on without it (as long as --nnodes MIN are
// left) and take it back when its cooldown is over. base == 0 turns this off (torchrun's
// behaviour: every failure restarts the job with every node).
#pragma once

#include <chrono>

namespace ddprun::agent {

class NodeCooldown {
 public:
  using Duration = std::chrono::milliseconds;
  NodeCooldown(Duration base, Duration max) : base_(base), max_(max < base ? base : max) {}

  // Records a failure of this node's workers after an attempt that ran `attempt_length`.
  // Returns how long the node should now sit out (zero: rejoin at once). Pure: no clock.
  Duration onFailure(Duration attempt_length);
  // This node's workers succeeded: the streak is over.
  void onSuccess() { consecutive_ = 0; }

  int consecutiveFailures() const { return consecutive_; }
  bool enabled() const { return base_.count() > 0; }

 private:
  Duration base_;
  Duration max_;
  int consecutive_ = 0;
};

}  // namespace ddprun::agent
