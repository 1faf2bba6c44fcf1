#include "agent/restart_policy.h"

namespace ddprun::agent {

using rendezvous::RoundEnd;

RestartPolicy::RestartPolicy(int max_restarts, NodeCooldown cooldown, Clock& clock)
    : max_restarts_(max_restarts), cooldown_(cooldown), clock_(clock), attempt_start_(clock.now()) {}

void RestartPolicy::attemptStarted() { attempt_start_ = clock_.now(); }

RoundEnd RestartPolicy::endForFailure(const std::string& node, int restart_count) const {
  return restart_count >= max_restarts_ ? RoundEnd::finalFailure(node) : RoundEnd::failure(node);
}

RestartPolicy::Decision RestartPolicy::afterFailure(const RoundEnd& mine, const std::string& standing) {
  const bool decided_here = standing == mine.format();
  const auto end = RoundEnd::parse(standing);
  // The round had already ended for another reason (a node joined, or failed first): that
  // reason decides, and this failure is no restart of its own, nor part of a streak.
  if (!decided_here && !(end && end->failsJob())) return {Action::kReform};
  const auto pause =
      cooldown_.onFailure(std::chrono::duration_cast<std::chrono::milliseconds>(clock_.now() - attempt_start_));
  if (decided_here && mine.kind == RoundEnd::Kind::kFail) return {Action::kRestart, pause};
  return {Action::kFail};
}

RestartPolicy::Decision RestartPolicy::afterRoundEnd(const std::string& reason, bool workers_succeeded) {
  const auto end = RoundEnd::parse(reason);
  if (workers_succeeded && end && end->kind == RoundEnd::Kind::kDone) {
    cooldown_.onSuccess();
    return {Action::kSucceed};
  }
  if (end && end->failsJob()) return {Action::kFail};
  return {Action::kReform};
}

}  // namespace ddprun::agent
