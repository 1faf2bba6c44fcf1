#include "agent/node_cooldown.h"

#include <catch2/catch.hpp>

using ddprun::agent::NodeCooldown;
using namespace std::chrono_literals;
using ms = std::chrono::milliseconds;

TEST_CASE("a node sits out from its second failure in a row, twice as long each time, up to the maximum",
          "[cooldown]") {
  NodeCooldown cooldown(1000ms, 5000ms);
  CHECK(cooldown.onFailure(100ms) == 0ms);  // one failure is not flapping
  CHECK(cooldown.onFailure(100ms) == 1000ms);
  CHECK(cooldown.onFailure(100ms) == 2000ms);
  CHECK(cooldown.onFailure(100ms) == 4000ms);
  CHECK(cooldown.onFailure(100ms) == 5000ms);
  CHECK(cooldown.onFailure(100ms) == 5000ms);
  CHECK(cooldown.consecutiveFailures() == 6);
}

TEST_CASE("a long healthy attempt or a success ends the streak", "[cooldown]") {
  NodeCooldown cooldown(1000ms, 5000ms);
  cooldown.onFailure(10ms);
  CHECK(cooldown.onFailure(10ms) == 1000ms);
  // This attempt ran for the longest cooldown before failing: a new streak starts.
  CHECK(cooldown.onFailure(5000ms) == 0ms);
  CHECK(cooldown.consecutiveFailures() == 1);
  CHECK(cooldown.onFailure(10ms) == 1000ms);
  cooldown.onSuccess();
  CHECK(cooldown.consecutiveFailures() == 0);
  CHECK(cooldown.onFailure(10ms) == 0ms);
}

TEST_CASE("a zero base turns the cooldown off but failures are still counted", "[cooldown]") {
  NodeCooldown cooldown(0ms, 300000ms);
  CHECK_FALSE(cooldown.enabled());
  for (int i = 0; i < 5; ++i) CHECK(cooldown.onFailure(10ms) == 0ms);
  CHECK(cooldown.consecutiveFailures() == 5);
}

TEST_CASE("doubling never overflows however long the streak", "[cooldown]") {
  NodeCooldown cooldown(1ms, ms(std::chrono::hours(24 * 365)));
  ms last{0};
  for (int i = 0; i < 200; ++i) {
    ms d = cooldown.onFailure(0ms);
    CHECK(d >= last);
    last = d;
  }
  CHECK(last == ms(std::chrono::hours(24 * 365)));
}
