#include <catch2/catch.hpp>

#include "agent/hang/timers/timer_table.h"

#include <map>
#include <random>
#include <set>

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

// Issue 39, defect 4: the table had no bound.
TEST_CASE("a worker's new timers past its bound are refused, but moving and releasing are not", "[timer_table]") {
  TimerTable table(3);
  CHECK(table.apply(timer(10, "a", 100.0), 10) == TimerApplied::kSet);
  CHECK(table.apply(timer(11, "b", 100.0), 10) == TimerApplied::kSet);  // a process of worker 10
  CHECK(table.apply(timer(10, "c", 100.0), 10) == TimerApplied::kSet);
  CHECK(table.apply(timer(10, "d", 50.0), 10) == TimerApplied::kRefused);
  CHECK(table.apply(timer(12, "a", 100.0), 12) == TimerApplied::kSet);  // another worker: its own bound
  CHECK(table.apply(timer(10, "a", 200.0), 10) == TimerApplied::kReplaced);
  CHECK(table.countOf(10) == 3);
  CHECK(table.nextExpiration() == 100.0);
  CHECK(table.apply(release(11, "b"), 11) == TimerApplied::kReleased);
  CHECK(table.countOf(10) == 2);
  CHECK(table.apply(timer(10, "d", 50.0), 10) == TimerApplied::kSet);
  CHECK(table.nextExpiration() == 50.0);
  // pid 10 expires with all its timers: worker 10's count drops with them.
  auto expired = table.takeExpired(60.0);
  REQUIRE(expired.size() == 1);
  CHECK(expired[0].expired_scopes == std::vector<std::string>{"d"});
  CHECK(table.countOf(10) == 0);
  CHECK(table.size() == 1);
}

TEST_CASE("moving a timer moves its place among the expirations", "[timer_table]") {
  TimerTable table;
  table.apply(timer(10, "a", 100.0));
  table.apply(timer(11, "b", 200.0));
  table.apply(timer(10, "a", 300.0));
  CHECK(table.nextExpiration() == 200.0);
  table.apply(timer(11, "b", 400.0));
  CHECK(table.nextExpiration() == 300.0);
  CHECK(table.takeExpired(250.0).empty());
  table.apply(timer(11, "b", 1.0));
  auto expired = table.takeExpired(1.0);
  REQUIRE(expired.size() == 1);
  CHECK(expired[0].pid == 11);
  CHECK(table.nextExpiration() == 300.0);
}

TEST_CASE("the indexed table expires what a plain scan of every timer would", "[timer_table]") {
  std::mt19937 rng(39);
  TimerTable table(1u << 20);
  std::map<std::pair<int64_t, std::string>, double> model;
  for (int step = 0; step < 20000; ++step) {
    const int64_t pid = 1 + static_cast<int64_t>(rng() % 40);
    const std::string scope = "s" + std::to_string(rng() % 30);
    if (rng() % 5 == 0) {
      table.apply(release(pid, scope));
      model.erase({pid, scope});
    } else {
      const double when = static_cast<double>(step + static_cast<int>(rng() % 500));
      table.apply(timer(pid, scope, when));
      model[{pid, scope}] = when;
    }
    if (step % 50 == 0) {
      const double now = static_cast<double>(step);
      std::set<int64_t> due;
      for (const auto& [key, when] : model) {
        if (when <= now) due.insert(key.first);
      }
      std::vector<int64_t> got;
      for (const TimerExpiry& e : table.takeExpired(now)) got.push_back(e.pid);
      REQUIRE(got == std::vector<int64_t>(due.begin(), due.end()));
      for (auto it = model.begin(); it != model.end();)
        it = due.count(it->first.first) ? model.erase(it) : std::next(it);
      REQUIRE(table.size() == model.size());
      std::optional<double> next;
      for (const auto& [key, when] : model) {
        if (!next || when < *next) next = when;
      }
      REQUIRE(table.nextExpiration() == next);
    }
  }
}
