#include <catch2/catch.hpp>

#include "agent/timer_table.h"

using namespace ddprun::agent;

namespace {

TimerRequest timer(int64_t pid, const std::string& scope, double expires, int signal = 9) {
  TimerRequest r;
  r.pid = pid;
  r.scope_id = scope;
  r.expiration_time = expires;
  r.signal = signal;
  return r;
}

TimerRequest release(int64_t pid, const std::string& scope) { return timer(pid, scope, -1, 0); }

}  // namespace

TEST_CASE("a timer expires at its time and not before and only once", "[timer_table]") {
  TimerTable table;
  table.apply(timer(10, "step", 100.0));
  CHECK(table.nextExpiration() == 100.0);
  CHECK(table.takeExpired(99.9).empty());
  auto expired = table.takeExpired(100.0);
  REQUIRE(expired.size() == 1);
  CHECK(expired[0].pid == 10);
  CHECK(expired[0].timer.scope_id == "step");
  CHECK(expired[0].signal == 9);
  CHECK(expired[0].expired_scopes == std::vector<std::string>{"step"});
  CHECK(table.size() == 0);
  CHECK_FALSE(table.nextExpiration());
  CHECK(table.takeExpired(1000.0).empty());
}

TEST_CASE("a released timer never expires and a set one can be moved", "[timer_table]") {
  TimerTable table;
  table.apply(timer(10, "step", 100.0));
  table.apply(release(10, "step"));
  CHECK(table.takeExpired(200.0).empty());
  table.apply(release(10, "never-set"));  // as torch: nothing to release, nothing happens
  CHECK(table.size() == 0);

  table.apply(timer(10, "step", 100.0));
  table.apply(timer(10, "step", 300.0));  // set again: the later time counts
  CHECK(table.size() == 1);
  CHECK(table.takeExpired(200.0).empty());
  CHECK(table.takeExpired(300.0).size() == 1);
}

TEST_CASE("timers are per pid and scope and an expiry takes all timers of its process", "[timer_table]") {
  TimerTable table;
  table.apply(timer(10, "outer", 500.0));
  table.apply(timer(10, "inner", 100.0));
  table.apply(timer(11, "inner", 150.0));
  CHECK(table.nextExpiration() == 100.0);
  auto expired = table.takeExpired(120.0);
  REQUIRE(expired.size() == 1);
  CHECK(expired[0].pid == 10);
  CHECK(expired[0].timer.scope_id == "inner");
  // pid 10's unexpired "outer" went with it: the process is killed.
  CHECK(table.size() == 1);
  CHECK(table.nextExpiration() == 150.0);
  expired = table.takeExpired(150.0);
  REQUIRE(expired.size() == 1);
  CHECK(expired[0].pid == 11);
}

TEST_CASE("the earliest expired timer with a signal decides as in torch", "[timer_table]") {
  TimerTable table;
  table.apply(timer(10, "no-kill", 100.0, 0));
  table.apply(timer(10, "term", 110.0, 15));
  table.apply(timer(10, "kill", 120.0, 9));
  auto expired = table.takeExpired(130.0);
  REQUIRE(expired.size() == 1);
  CHECK(expired[0].signal == 15);
  CHECK(expired[0].timer.scope_id == "term");
  CHECK(expired[0].expired_scopes == std::vector<std::string>{"no-kill", "term", "kill"});

  table.apply(timer(12, "watch-only", 100.0, 0));
  expired = table.takeExpired(130.0);
  REQUIRE(expired.size() == 1);
  CHECK(expired[0].signal == 0);
  CHECK(expired[0].timer.scope_id == "watch-only");
  CHECK(table.size() == 0);
}

TEST_CASE("clearing the table drops every timer", "[timer_table]") {
  TimerTable table;
  table.apply(timer(10, "a", 100.0));
  table.apply(timer(11, "b", 100.0));
  table.clear();
  CHECK(table.takeExpired(1e12).empty());
}
