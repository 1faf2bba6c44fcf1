#include "agent/node_cooldown.h"

namespace ddprun::agent {

NodeCooldown::Duration NodeCooldown::onFailure(Duration attempt_length) {
  // An attempt that ran for the longest cooldown was a healthy stretch, not a flap.
  if (max_.count() > 0 && attempt_length >= max_) consecutive_ = 0;
  ++consecutive_;
  if (!enabled() || consecutive_ < 2) return Duration::zero();
  Duration d = base_;
  for (int i = 2; i < consecutive_ && d < max_; ++i) d *= 2;
  return d < max_ ? d : max_;
}

}  // namespace ddprun::agent
