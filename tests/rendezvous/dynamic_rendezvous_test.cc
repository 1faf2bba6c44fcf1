// The rendezvous state machine (rendezvous/PROTOCOL.md) with its nodes as threads of this
// test (tests/rendezvous/manual_job.h): every node has its own RendezvousEnv over one
// in-memory network, and time is a manual clock that moves only when the test moves it,
// once every thread it drives is blocked on the clock. So last call, keep-alives, eviction
// and join timeouts are exact and nothing sleeps. Faults (a node cut off, the store's host
// lost) come from FaultInjectingStore.
#include "rendezvous/rounds/dynamic_rendezvous.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <optional>
#include <set>

#include "tests/rendezvous/manual_job.h"

using namespace ddprun::rendezvous;
using namespace ddprun::rendezvous::testing;
using ddprun::RendezvousError;
using namespace std::chrono_literals;

TEST_CASE("state machine: a full job forms at once with ranks in arrival order that every node agrees on", "[rdzv]") {
  Job job(2, 3);
  Node& a = job.add("a:1");
  Node& b = job.add("b:2");
  Node& c = job.add("c:3");
  const auto results = form(job, {&a, &b, &c});
  for (int i = 0; i < 3; ++i) {
    const RendezvousResult& r = results[i];
    CHECK(r.round == 0);
    CHECK(r.group_rank == i);
    CHECK(r.group_world_size == 3);
    CHECK(r.rank_base == i * kNproc);
    CHECK(r.world_size == 3 * kNproc);
    CHECK(r.restart_count == 0);
    CHECK(r.master_addr == results[0].master_addr);
    CHECK(r.master_port == results[0].master_port);
  }
  // Group rank 0 serves the round's workers' store, a store of its own.
  CHECK(results[0].master_port != kPort);
  CHECK_NOTHROW(job.network.store(results[0].master_port));
  CHECK(job.get("r0/closed") == std::to_string((int64_t{3} << 32) + 3 * kNproc));
}

TEST_CASE("state machine: last call closes a round of MIN or more nodes when its timer runs out and not before",
          "[rdzv]") {
  Job job(2, 3);
  Node& a = job.add("a:1");
  Node& b = job.add("b:2");
  auto fa = a.nextRound();
  REQUIRE(job.clock.awaitSleepers(1));
  auto fb = b.nextRound();
  job.advance(2, kLastCall - 1ms);
  REQUIRE(job.clock.awaitSleepers(2));
  CHECK_FALSE(job.has("r0/closed"));  // b's last call (from its arrival) is not over
  job.clock.advance(1ms);
  const auto ra = fa.get();
  const auto rb = fb.get();
  CHECK(ra.group_world_size == 2);
  CHECK(rb.group_rank == 1);
  CHECK(rb.world_size == 2 * kNproc);
}

TEST_CASE("state machine: a node arriving during last call joins the round and one arriving after asks to re-form",
          "[rdzv]") {
  Job job(2, 4);
  Node& a = job.add("a:1");
  Node& b = job.add("b:2");
  Node& c = job.add("c:3");
  auto fa = a.nextRound();
  REQUIRE(job.clock.awaitSleepers(1));
  auto fb = b.nextRound();
  job.advance(2, 10s);
  auto fc = c.nextRound();  // within b's last call
  job.advance(3, kLastCall - 10s);
  CHECK(fc.get().group_world_size == 3);
  fa.get();
  fb.get();
  a.watch();
  b.watch();
  c.watch();

  // Scale up: d finds round 0 closed with room left, ends it with join:d and waits in round 1.
  Node& d = job.add("d:4");
  auto fd = d.nextRound();
  for (Node* n : {&a, &b, &c}) {
    const RoundEvent event = n->awaitEvent();
    CHECK(event.kind == RoundEvent::Kind::kEnded);
    CHECK(event.round == 0);
    CHECK(RoundEnd::parse(event.reason) == RoundEnd::join("d:4"));
  }
  // d's place in round 1 comes first (then d waits there).
  REQUIRE(job.clock.awaitSleepers(1, [&] { return job.has("r1/node/1"); }));
  auto fa1 = a.nextRound();
  auto fb1 = b.nextRound();
  auto fc1 = c.nextRound();  // the fourth node of round 1 fills the job: no last call
  const auto rd = fd.get();
  CHECK(rd.round == 1);
  CHECK(rd.group_rank == 0);  // the newcomer was first in round 1
  CHECK(rd.group_world_size == 4);
  CHECK(rd.restart_count == 0);  // a join uses no restart
  for (auto* f : {&fa1, &fb1, &fc1}) {
    const auto r = f->get();
    CHECK(r.round == 1);
    CHECK(r.group_world_size == 4);
    CHECK(r.restart_count == 0);
  }
}

TEST_CASE(
    "state machine: a group rank 0 that dies before publishing the workers' store is evicted and the others "
    "form the next round",
    "[rdzv]") {
  Job job(2, 3);             // MIN 2: round 1 closes only with both a and b in it, whatever their order
  Node& a = job.add("a:1");  // hosts the store
  Node& b = job.add("b:2");
  Node& x = job.add("x:3");
  // x arrives first (group rank 0) and fails right after the round closes, before it
  // publishes the workers' store, as when its agent is killed then.
  x.faults().add(Fault::fail().only(StoreOp::kSet).matching("rdzv/job/r0/restarts").always());
  auto fx = x.nextRound();
  REQUIRE(job.clock.awaitSleepers(1));
  auto fa = a.nextRound();
  REQUIRE(job.clock.awaitSleepers(2));
  auto fb = b.nextRound();  // the third closes the round
  CHECK_THROWS_AS(fx.get(), RendezvousError);
  // a and b wait keep_alive_interval x keep_alive_max_attempt (15 s) for x's address, evict
  // x, and form round 1 by last call (30 s). The clock moves a second at a time once every
  // call still running waits on it (never near join_timeout, 600 s).
  const auto guard = std::chrono::steady_clock::now() + kGuard;
  for (int seconds = 0;;) {
    const size_t running = (fa.ready() ? 0 : 1) + (fb.ready() ? 0 : 1);
    if (running == 0) break;
    REQUIRE(std::chrono::steady_clock::now() < guard);
    REQUIRE(seconds < 120);
    // (Not while round 1 is closed and its address not yet out: its group rank 0, woken by the
    // close, still counts as a sleeper until it runs, and time must not pass it by.)
    const auto quiet = [&] { return !job.has("r1/closed") || job.has("r1/master"); };
    if (job.clock.awaitSleepers(running, quiet, 100ms)) {
      job.clock.advance(1s);
      ++seconds;
    }
  }
  CHECK(RoundEnd::parse(job.get("r0/end")) == RoundEnd::evict("x:3"));
  for (auto* f : {&fa, &fb}) {
    const auto r = f->get();
    CHECK(r.round == 1);
    CHECK(r.group_world_size == 2);
    CHECK(r.restart_count == 0);  // an eviction uses no restart
    CHECK(r.master_port > 0);
  }
}

TEST_CASE(
    "state machine: a node that took the first seat and died before writing its entry is evicted and the others "
    "form the next round",
    "[rdzv]") {
  // As in the chaos soak (c10d, 30 minutes, seed 30): x's ADD of the round's count was applied
  // but x never wrote node/1 (its link was cut and it gave up; an agent killed between the two
  // is the same). The others waited 15 s for the address, then read node/1 for the name to
  // evict: a read that waits for the key, so read_timeout later every agent failed, the
  // store's host with them, and the job ended (exit 3).
  Job job(2, 3);
  Node& a = job.add("a:1");  // hosts the store
  Node& b = job.add("b:2");
  Node& x = job.add("x:3");
  x.faults().add(Fault::fail().only(StoreOp::kSet).matching("rdzv/job/r0/node/1").always());
  CHECK_THROWS_AS(x.nextRound().get(), RendezvousError);
  auto fa = a.nextRound();
  REQUIRE(job.clock.awaitSleepers(1));
  auto fb = b.nextRound();  // the third seat closes the round
  const auto guard = std::chrono::steady_clock::now() + kGuard;
  for (int seconds = 0;;) {
    const size_t running = (fa.ready() ? 0 : 1) + (fb.ready() ? 0 : 1);
    if (running == 0) break;
    REQUIRE(std::chrono::steady_clock::now() < guard);
    REQUIRE(seconds < 120);
    const auto quiet = [&] { return !job.has("r1/closed") || job.has("r1/master"); };
    if (job.clock.awaitSleepers(running, quiet, 100ms)) {
      job.clock.advance(1s);
      ++seconds;
    }
  }
  CHECK_FALSE(job.has("r0/node/1"));
  CHECK(RoundEnd::parse(job.get("r0/end")) == RoundEnd::evict("seat 1 of round 0"));
  for (auto* f : {&fa, &fb}) {
    const auto r = f->get();
    CHECK(r.round == 1);
    CHECK(r.group_world_size == 2);
    CHECK(r.restart_count == 0);
  }
}

TEST_CASE("state machine: a node arriving at a full job waits for a place and takes it when the round ends", "[rdzv]") {
  Job job(1, 2);
  Node& a = job.add("a:1");
  Node& b = job.add("b:2");
  form(job, {&a, &b});
  Node& c = job.add("c:3");
  auto fc = c.nextRound();
  REQUIRE(job.clock.awaitSleepers(1));  // c waits for round 0's end
  CHECK_FALSE(job.has("r0/end"));       // and does not end it
  CHECK(b.rdzv().endRound(RoundEnd::evict("a:1")) == "evict:a:1");
  // c takes the first place in round 1, b the second, which fills the job.
  REQUIRE(job.clock.awaitSleepers(1, [&] { return job.has("r1/node/1"); }));
  auto fb = b.nextRound();
  CHECK(fc.get().group_rank == 0);
  CHECK(fb.get().group_world_size == 2);
}

TEST_CASE("state machine: a silent node is evicted after keep_alive_max_attempt misses and the job scales down",
          "[rdzv]") {
  Job job(1, 2);
  Node& a = job.add("a:1");
  Node& b = job.add("b:2");
  form(job, {&a, &b});
  a.watch();  // b never keeps alive: it hangs
  // a reads b's counter once per interval; the first reading is its baseline, then each
  // interval without a change is a miss.
  for (int interval = 1; interval <= kMaxMisses; ++interval) job.advance(1, kKeepAlive);
  REQUIRE(job.clock.awaitSleepers(1));
  CHECK_FALSE(job.has("r0/end"));
  CHECK_FALSE(a.hasEvent());
  job.clock.advance(kKeepAlive);
  const RoundEvent event = a.awaitEvent();
  CHECK(event.kind == RoundEvent::Kind::kEnded);
  CHECK(RoundEnd::parse(event.reason) == RoundEnd::evict("b:2"));
  // Round 1 without b: MIN is 1, so a's last call closes it alone.
  auto fa = a.nextRound();
  job.advance(1, kLastCall);
  const auto r = fa.get();
  CHECK(r.round == 1);
  CHECK(r.group_world_size == 1);
  CHECK(r.world_size == kNproc);
  CHECK(r.restart_count == 0);  // an eviction uses no restart
}

TEST_CASE("state machine: a node cut off from the store is evicted by the others and learns it lost the store",
          "[rdzv]") {
  Job job(1, 2);
  Node& a = job.add("a:1");
  Node& b = job.add("b:2");
  form(job, {&a, &b});
  a.watch();
  REQUIRE(job.clock.awaitSleepers(1));
  job.clock.advance(1s);  // b's keep-alives fall between a's readings
  b.faults().add(Fault::drop().always());
  b.watch();  // its first keep-alive is lost, and it waits for the reply (read_timeout: 60 s)
  for (int interval = 1; interval <= kMaxMisses + 1; ++interval) {
    REQUIRE(job.clock.awaitSleepers(2));
    job.clock.advanceToNextDeadline();  // a's next reading (b's wait runs longer)
  }
  CHECK(RoundEnd::parse(a.awaitEvent().reason) == RoundEnd::evict("b:2"));
  CHECK_FALSE(b.hasEvent());
  job.advance(1, 60s);
  const RoundEvent lost = b.awaitEvent();
  CHECK(lost.kind == RoundEvent::Kind::kStoreLost);
  CHECK_THAT(lost.reason, Catch::Contains("timed out"));
}

TEST_CASE("state machine: keep-alives that resume before the limit keep a node in the job", "[rdzv]") {
  Job job(1, 2);
  Node& a = job.add("a:1");
  Node& b = job.add("b:2");
  form(job, {&a, &b});
  a.watch();
  // b stays silent for kMaxMisses - 1 of a's intervals, then keeps alive, 1 s out of step.
  for (int interval = 1; interval < kMaxMisses; ++interval) job.advance(1, kKeepAlive);
  job.advance(1, 1s);
  b.watch();
  for (int step = 0; step < 40; ++step) {
    REQUIRE(job.clock.awaitSleepers(2));
    job.clock.advanceToNextDeadline();
  }
  REQUIRE(job.clock.awaitSleepers(2));
  CHECK_FALSE(job.has("r0/end"));
  CHECK_FALSE(a.hasEvent());
  CHECK_FALSE(b.hasEvent());
}

TEST_CASE("state machine: keep-alives late by less than an interval are no misses", "[rdzv]") {
  Job job(1, 2);
  Node& a = job.add("a:1");
  Node& b = job.add("b:2");
  form(job, {&a, &b});
  // b's keep-alives land 3 s late, every 8 s, at half seconds: never at the instant a
  // reads them (whole seconds), so which comes first is never up to the scheduler.
  b.faults().add(Fault::delayBy(3s).only(StoreOp::kAdd).matching("rdzv/job/r0/hb/1").always());
  a.watch();
  REQUIRE(job.clock.awaitSleepers(1));
  job.clock.advance(1500ms);
  b.watch();
  for (int step = 0; step < 40; ++step) {
    REQUIRE(job.clock.awaitSleepers(2));
    job.clock.advanceToNextDeadline();
  }
  REQUIRE(job.clock.awaitSleepers(2));
  CHECK_FALSE(job.has("r0/end"));
  CHECK(std::stoi(job.get("r0/hb/1")) > 5);  // b kept alive all along, late each time
}

TEST_CASE("state machine: a node alone in its round keeps alive and evicts nobody", "[rdzv]") {
  Job job(1, 1);
  Node& a = job.add("a:1");
  form(job, {&a});
  a.watch();
  for (int interval = 0; interval < 10; ++interval) job.advance(1, kKeepAlive);
  REQUIRE(job.clock.awaitSleepers(1));
  CHECK_FALSE(job.has("r0/end"));
  CHECK(job.get("r0/hb/0") == "11");  // one on start, one per interval
}

TEST_CASE("state machine: one failed keep-alive is tried again at the next interval and the node stays in the job",
          "[rdzv]") {
  Job job(1, 2);
  Node& a = job.add("a:1");
  Node& b = job.add("b:2");
  form(job, {&a, &b});
  b.faults().add(Fault::fail().only(StoreOp::kAdd).matching("rdzv/job/r0/hb/1").from(2));
  a.watch();
  REQUIRE(job.clock.awaitSleepers(1));
  job.clock.advance(1s);
  b.watch();
  job.advance(2, 4s);  // a's first interval
  job.advance(2, 1s);  // b's: its second keep-alive fails, once
  for (int interval = 0; interval < 2 * kMaxMisses; ++interval) {
    job.advance(2, 4s);
    job.advance(2, 1s);
  }
  REQUIRE(job.clock.awaitSleepers(2));  // both watchers still run
  CHECK_FALSE(job.has("r0/end"));
  CHECK_FALSE(a.hasEvent());
  CHECK_FALSE(b.hasEvent());
  CHECK(std::stoi(job.get("r0/hb/1")) == 2 * kMaxMisses + 1);  // the start's, then one per interval but the failed
}

TEST_CASE("state machine: keep_alive_max_attempt failed keep-alives in a row report the store lost on that node only",
          "[rdzv]") {
  Job job(1, 2);
  Node& a = job.add("a:1");
  Node& b = job.add("b:2");
  form(job, {&a, &b});
  b.faults().add(Fault::fail().only(StoreOp::kAdd).matching("rdzv/job/r0/hb/1").from(2).always());
  a.watch();
  REQUIRE(job.clock.awaitSleepers(1));
  job.clock.advance(1s);
  b.watch();
  // b fails at 6 s, 11 s and 16 s (a reads at 5, 10 and 15 s); the third in a row is the loss.
  for (int failure = 1; failure <= kMaxMisses; ++failure) {
    job.advance(2, 4s);
    job.advance(2, 1s);
  }
  const RoundEvent lost = b.awaitEvent();
  CHECK(lost.kind == RoundEvent::Kind::kStoreLost);
  CHECK_THAT(lost.reason, Catch::Contains("injected"));
  CHECK_FALSE(a.hasEvent());
  // b's watcher is gone; a evicts it like any silent node: its readings at 10, 15 and 20 s
  // found b's count unchanged since 5 s.
  REQUIRE(job.clock.awaitSleepers(1));
  job.clock.advanceToNextDeadline();
  CHECK(RoundEnd::parse(a.awaitEvent().reason) == RoundEnd::evict("b:2"));
}

TEST_CASE("state machine: the store's host never takes its own store for lost when its keep-alives time out",
          "[rdzv]") {
  // A loaded machine can hold the in-process store's replies past the timeout; the host's
  // agent ending the job for that is the worst outcome. Each dropped keep-alive waits out
  // read_timeout (60 s) and fails as a timeout.
  Job job(1, 1);
  Node& a = job.add("a:1");  // the host
  form(job, {&a});
  const size_t rule = a.faults().add(Fault::drop().only(StoreOp::kAdd).matching("rdzv/job/r0/hb/0").from(2).always());
  a.watch();
  for (int timeout = 0; timeout < 2 * kMaxMisses; ++timeout) {
    job.advance(1, kKeepAlive);  // the wait for the round's end
    job.advance(1, 60s);         // the keep-alive, dropped: a timeout
  }
  REQUIRE(job.clock.awaitSleepers(1));  // the watcher still runs
  CHECK_FALSE(a.hasEvent());
  CHECK(a.faults().hits(rule) == 2 * kMaxMisses);
  a.faults().clear();
  job.advance(1, kKeepAlive);
  job.advance(1, kKeepAlive);
  REQUIRE(job.clock.awaitSleepers(1));
  CHECK(std::stoi(job.get("r0/hb/0")) >= 2);  // it keeps alive again
  CHECK_FALSE(a.hasEvent());
}

TEST_CASE("state machine: losing the store's host ends every watcher and every wait at once", "[rdzv]") {
  Job job(2, 3);
  Node& a = job.add("a:1");
  Node& b = job.add("b:2");
  form(job, {&a, &b}, true);
  a.watch();
  b.watch();
  Node& c = job.add("c:3");
  job.network.storeFaults(kPort).failAll();
  for (Node* n : {&a, &b}) {
    const RoundEvent event = n->awaitEvent();
    CHECK(event.kind == RoundEvent::Kind::kStoreLost);
    CHECK(event.round == 0);
  }
  CHECK_THROWS_AS(b.rdzv().nextRound(), RendezvousError);
  auto fc = c.nextRound();
  CHECK_THROWS_AS(fc.get(), RendezvousError);
}

TEST_CASE("state machine: losing the store's host fails a node waiting to join without waiting out join_timeout",
          "[rdzv]") {
  Job job(2, 2);
  job.add("a:1");  // the host
  Node& b = job.add("b:2");
  auto fb = b.nextRound();
  REQUIRE(job.clock.awaitSleepers(1));
  job.network.storeFaults(kPort).failAll();
  try {
    fb.get();
    FAIL("joined");
  } catch (const RendezvousError& e) {
    CHECK_THAT(e.what(), Catch::Contains("round 0 of job 'job'"));
  }
}

TEST_CASE("state machine: a round short of MIN nodes fails after join_timeout and not before", "[rdzv]") {
  Job job(2, 2);
  Node& a = job.add("a:1");
  auto fa = a.nextRound();
  job.advance(1, kJoinTimeout - 1s);
  REQUIRE(job.clock.awaitSleepers(1));
  CHECK_FALSE(fa.ready());
  job.clock.advance(1s);
  try {
    fa.get();
    FAIL("formed");
  } catch (const RendezvousError& e) {
    CHECK_THAT(e.what(), Catch::Contains("only 1 of at least 2 nodes joined within join_timeout (600 s)"));
  }
}

TEST_CASE("state machine: interrupt makes a waiting nextRound fail at once", "[rdzv]") {
  Job job(2, 2);
  Node& a = job.add("a:1");
  auto fa = a.nextRound();
  REQUIRE(job.clock.awaitSleepers(1));
  a.rdzv().interrupt();
  CHECK_THROWS_AS(fa.get(), RendezvousError);
}

TEST_CASE("state machine: a failure costs one restart on every node but join and evict and a lost race cost none",
          "[rdzv]") {
  Job job(2, 2);
  Node& a = job.add("a:1");
  Node& b = job.add("b:2");
  form(job, {&a, &b});
  b.watch();
  CHECK(a.rdzv().endRound(RoundEnd::failure("a:1")) == "fail:a:1");
  CHECK(b.awaitEvent().reason == "fail:a:1");
  // b's own end comes second: the first one stands.
  CHECK(b.rdzv().endRound(RoundEnd::finalFailure("b:2")) == "fail:a:1");
  auto results = form(job, {&a, &b});
  CHECK(results[0].round == 1);
  CHECK(results[0].restart_count == 1);
  CHECK(results[1].restart_count == 1);

  CHECK(a.rdzv().endRound(RoundEnd::evict("x:9")) == "evict:x:9");
  results = form(job, {&b, &a});
  CHECK(results[0].round == 2);
  CHECK(results[0].restart_count == 1);
  CHECK(results[1].restart_count == 1);
  CHECK(results[1].group_rank == 1);
}

TEST_CASE("state machine: the last node done ends the round and the host leaves after everyone checked out", "[rdzv]") {
  Job job(2, 2);
  Node& a = job.add("a:1");
  Node& b = job.add("b:2");
  form(job, {&a, &b});
  a.watch();
  b.rdzv().markDone();
  CHECK_FALSE(job.has("r0/end"));
  a.rdzv().markDone();
  CHECK(a.awaitEvent().reason == "done");
  CHECK(job.get("r0/end") == "done");
  auto host_leaves = a.finish();
  REQUIRE(job.clock.awaitSleepers(1));  // the host waits for b to check out
  CHECK_FALSE(host_leaves.ready());
  b.rdzv().finish();
  host_leaves.get();
  CHECK(job.get("r0/all_exited") == "1");
}

TEST_CASE("state machine: a node sitting out learns that the job ended and does not join again", "[rdzv]") {
  Job job(1, 2);
  Node& a = job.add("a:1");
  Node& b = job.add("b:2");
  form(job, {&a, &b});
  a.watch();
  CHECK(b.rdzv().endRound(RoundEnd::failure("b:2")) == "fail:b:2");
  b.rdzv().sitOut();
  CHECK(job.get("away") == "1");
  b.rdzv().sitOut();  // still away (a sick GPU): counted once
  CHECK(job.get("away") == "1");
  CHECK(a.awaitEvent().reason == "fail:b:2");
  auto fa = a.nextRound();
  job.advance(1, kLastCall);
  const auto r = fa.get();
  CHECK(r.group_world_size == 1);
  CHECK(r.restart_count == 1);
  CHECK_FALSE(b.rdzv().jobEndedWhileAway());
  a.rdzv().markDone();
  CHECK(b.rdzv().jobEndedWhileAway() == std::optional<std::string>("done"));
  CHECK_THROWS_AS(b.rdzv().nextRound(), JobEndedError);
  // The host waits (on the clock) for the node away to check out before it leaves.
  auto host_leaves = a.finish();
  REQUIRE(job.clock.awaitSleepers(1));
  CHECK_FALSE(host_leaves.ready());
  b.rdzv().finish();
  CHECK(job.get("away") == "0");
  job.clock.advance(20ms);
  host_leaves.get();
}
