// The agent's restart decisions (agent/restart_policy.h): how a node ends a round when its
// workers fail, what every kind of round end means next, and the cooldown of a flapping
// node, with attempts timed on a manual clock.
#include "agent/restart_policy.h"

#include <catch2/catch.hpp>

#include "tests/support/manual_clock.h"

using ddprun::agent::NodeCooldown;
using ddprun::agent::RestartPolicy;
using ddprun::rendezvous::RoundEnd;
using ddprun::testing::ManualClock;
using Action = RestartPolicy::Action;
using namespace std::chrono_literals;

namespace {

constexpr const char* kMe = "me:1";

// No cooldown, as torchrun.
RestartPolicy plain(int max_restarts, ManualClock& clock) {
  return RestartPolicy(max_restarts, NodeCooldown(0ms, 0ms), clock);
}

}  // namespace

TEST_CASE("restart policy: a failure ends the round with fail: while restarts remain and then with final:",
          "[restart_policy]") {
  ManualClock clock;
  RestartPolicy policy = plain(2, clock);
  CHECK(policy.endForFailure(kMe, 0) == RoundEnd::failure(kMe));
  CHECK(policy.endForFailure(kMe, 1) == RoundEnd::failure(kMe));
  CHECK(policy.endForFailure(kMe, 2) == RoundEnd::finalFailure(kMe));
  CHECK(policy.endForFailure(kMe, 3) == RoundEnd::finalFailure(kMe));
  RestartPolicy none = plain(0, clock);
  CHECK(none.endForFailure(kMe, 0) == RoundEnd::finalFailure(kMe));
  CHECK(none.maxRestarts() == 0);
}

TEST_CASE("restart policy: a failure that ended the round restarts the job and a final one fails it",
          "[restart_policy]") {
  ManualClock clock;
  RestartPolicy policy = plain(1, clock);
  const RoundEnd mine = policy.endForFailure(kMe, 0);
  const auto restart = policy.afterFailure(mine, mine.format());
  CHECK(restart.action == Action::kRestart);
  CHECK(restart.sit_out == 0ms);
  const RoundEnd last = policy.endForFailure(kMe, 1);
  CHECK(policy.afterFailure(last, last.format()).action == Action::kFail);
}

TEST_CASE("restart policy: when another node ended the round first its end decides", "[restart_policy]") {
  ManualClock clock;
  RestartPolicy policy = plain(3, clock);
  const RoundEnd mine = policy.endForFailure(kMe, 0);
  // A node joined, was evicted or failed first: re-form, and this failure is no restart of its own.
  for (const char* standing : {"join:new:2", "evict:old:3", "fail:other:4", "done", "garbage"}) {
    INFO(standing);
    CHECK(policy.afterFailure(mine, standing).action == Action::kReform);
  }
  CHECK(policy.consecutiveFailures() == 0);  // and no part of a streak
  // Another node's final failure or a stopped agent fails the job.
  CHECK(policy.afterFailure(mine, "final:other:4").action == Action::kFail);
  CHECK(policy.afterFailure(mine, "abort:other:4:SIGTERM").action == Action::kFail);
}

TEST_CASE("restart policy: what a round's end means for a node whose workers ran or had succeeded",
          "[restart_policy]") {
  ManualClock clock;
  RestartPolicy policy = plain(3, clock);
  CHECK(policy.afterRoundEnd("done", true).action == Action::kSucceed);
  // Workers still running never see done (every node's must have succeeded): it re-forms.
  CHECK(policy.afterRoundEnd("done", false).action == Action::kReform);
  for (bool succeeded : {false, true}) {
    INFO(succeeded);
    CHECK(policy.afterRoundEnd("final:x:1", succeeded).action == Action::kFail);
    CHECK(policy.afterRoundEnd("abort:x:1:SIGINT", succeeded).action == Action::kFail);
    CHECK(policy.afterRoundEnd("fail:x:1", succeeded).action == Action::kReform);
    CHECK(policy.afterRoundEnd("join:x:1", succeeded).action == Action::kReform);
    CHECK(policy.afterRoundEnd("evict:x:1", succeeded).action == Action::kReform);
    // Text no ddprun writes never ends the job.
    CHECK(policy.afterRoundEnd("final", succeeded).action == Action::kReform);
    CHECK(policy.afterRoundEnd("", succeeded).action == Action::kReform);
  }
}

TEST_CASE("restart policy: a flapping node sits out from its second quick failure in a row", "[restart_policy]") {
  ManualClock clock;
  RestartPolicy policy(10, NodeCooldown(60s, 600s), clock);
  auto failAfter = [&](ManualClock::Duration running, int restart_count) {
    policy.attemptStarted();
    clock.advance(running);
    const RoundEnd mine = policy.endForFailure(kMe, restart_count);
    return policy.afterFailure(mine, mine.format());
  };
  auto first = failAfter(10s, 0);
  CHECK(first.action == Action::kRestart);
  CHECK(first.sit_out == 0ms);
  auto second = failAfter(10s, 1);
  CHECK(second.action == Action::kRestart);
  CHECK(second.sit_out == 60s);
  CHECK(failAfter(10s, 2).sit_out == 120s);
  CHECK(policy.consecutiveFailures() == 3);
  // An attempt that ran for the longest cooldown was healthy: the streak starts over.
  CHECK(failAfter(600s, 3).sit_out == 0ms);
  CHECK(policy.consecutiveFailures() == 1);
  CHECK(failAfter(1s, 4).sit_out == 60s);
  // The job's success ends the streak.
  CHECK(policy.afterRoundEnd("done", true).action == Action::kSucceed);
  CHECK(policy.consecutiveFailures() == 0);
}

TEST_CASE("restart policy: the last failure counts for the streak but fails the job without sitting out",
          "[restart_policy]") {
  ManualClock clock;
  RestartPolicy policy(1, NodeCooldown(60s, 600s), clock);
  policy.attemptStarted();
  const RoundEnd first = policy.endForFailure(kMe, 0);
  CHECK(policy.afterFailure(first, first.format()).action == Action::kRestart);
  const RoundEnd last = policy.endForFailure(kMe, 1);
  const auto decision = policy.afterFailure(last, last.format());
  CHECK(decision.action == Action::kFail);
  CHECK(decision.sit_out == 0ms);
  CHECK(policy.consecutiveFailures() == 2);
}
