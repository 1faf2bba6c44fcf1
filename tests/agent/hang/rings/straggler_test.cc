// Stragglers from synthetic rings (agent/hang/rings/straggler.h): ranks that leave every
// collective together, one entering late, on hosts whose clocks differ; and the store
// values that carry the summaries between nodes (agent/hang/rings/progress_summary.h).
#include "agent/hang/rings/straggler.h"

#include <catch2/catch.hpp>

#include "agent/hang/rings/progress_summary.h"

using namespace ddprun;
using namespace ddprun::agent;

namespace {

constexpr int64_t kMs = 1000000;

// A rank's collective ring of `n` all_reduces, one every 100 ms from `clock_ns` (the host's
// own CLOCK_MONOTONIC): every rank leaves collective k at the same moment, and this one
// entered it `late_ms` after the earliest rank (which entered 10 ms before the end).
FlightRingSnapshot ring(int rank, int n, double late_ms, int64_t clock_ns = 0, int group = 0) {
  FlightRingSnapshot s;
  s.rank = rank;
  s.group = group;
  s.group_rank = rank;
  s.group_size = 3;
  for (int k = 1; k <= n; ++k) {
    FlightRecord r;
    r.seq = static_cast<uint64_t>(k);
    r.info.op = FlightOp::kAllReduce;
    r.state = FlightState::kCompleted;
    r.ended_ns = clock_ns + k * 100 * kMs;
    const int64_t earliest = r.ended_ns - 60 * kMs;
    r.enqueued_ns = earliest + static_cast<int64_t>(late_ms * kMs);
    r.started_ns = r.enqueued_ns;
    s.records.push_back(r);
  }
  s.last_seq = static_cast<uint64_t>(n);
  return s;
}

std::vector<RankProgress> progressOfAll(const std::vector<FlightRingSnapshot>& rings) {
  std::vector<RankProgress> out;
  for (const auto& r : rings) {
    if (auto p = progressOf(r)) out.push_back(*p);
  }
  return out;
}

std::vector<RankLag> judge(const std::vector<FlightRingSnapshot>& rings) {
  const auto progress = progressOfAll(rings);
  return lagsOf(progress, groupMedians(progress));
}

}  // namespace

TEST_CASE("straggler: a balanced group names nobody", "[unit][straggler]") {
  const auto lags = judge({ring(0, 100, 0), ring(1, 100, 0.5), ring(2, 100, 0.2)});
  REQUIRE(lags.size() == 3);
  StragglerTracker tracker(0.02);
  CHECK(tracker.update(lags).empty());
  for (const auto& l : lags) CHECK(std::abs(l.lag_s) < 0.001);
}

TEST_CASE(
    "straggler: one rank entering each collective 50 ms late is named with a lag of about 50 ms, across "
    "hosts whose clocks differ",
    "[unit][straggler]") {
  // Rank 2's host boots days later: its timestamps share nothing with the others'.
  const auto lags = judge({ring(0, 100, 0, 5 * 1000 * kMs), ring(1, 100, 1), ring(2, 100, 50, -777777 * kMs)});
  REQUIRE(lags.size() == 3);
  CHECK(lags[2].rank == 2);
  CHECK(lags[2].lag_s == Approx(0.049).margin(0.002));
  CHECK(lags[2].collectives == kStragglerWindow);
  CHECK(lags[2].last_completed_seq == 100);
  CHECK(std::abs(lags[0].lag_s) < 0.002);
  CHECK(std::abs(lags[1].lag_s) < 0.002);

  StragglerTracker tracker(0.02);
  auto changes = tracker.update(lags);
  REQUIRE(changes.size() == 1);
  CHECK(changes[0].lag.rank == 2);
  CHECK(changes[0].straggling);
  CHECK(tracker.stragglers().count(2) == 1);
  // Still late: said once, not at every look.
  CHECK(tracker.update(lags).empty());
  // Between half the threshold and the threshold: still a straggler (no flapping).
  CHECK(tracker.update(judge({ring(0, 100, 0), ring(1, 100, 0), ring(2, 100, 15)})).empty());
  // Caught up: recovered, once.
  changes = tracker.update(judge({ring(0, 100, 0), ring(1, 100, 0), ring(2, 100, 1)}));
  REQUIRE(changes.size() == 1);
  CHECK(changes[0].lag.rank == 2);
  CHECK_FALSE(changes[0].straggling);
  CHECK(tracker.stragglers().empty());
}

TEST_CASE("straggler: too few completed collectives give no judgement", "[unit][straggler]") {
  const auto few = judge({ring(0, 10, 0), ring(1, 10, 0), ring(2, 10, 50)});
  CHECK(few.empty());
  // One rank alone in its group has nobody to lag behind.
  CHECK(judge({ring(0, 100, 0)}).empty());
  // A rank with too few is left out; the others are judged among themselves.
  const auto lags = judge({ring(0, 100, 0), ring(1, 100, 0), ring(2, 5, 50)});
  REQUIRE(lags.size() == 2);
  CHECK(lags[0].rank == 0);
  CHECK(lags[1].rank == 1);
}

TEST_CASE("straggler: the window is the newest completed collectives, and pending and failed ones do not count",
          "[unit][straggler]") {
  // Rank 2 was late in its first 100 collectives and on time in the 64 after them.
  auto late_then_on_time = ring(2, 164, 0);
  for (int k = 0; k < 100; ++k) {
    late_then_on_time.records[static_cast<size_t>(k)].started_ns += 50 * kMs;
    late_then_on_time.records[static_cast<size_t>(k)].enqueued_ns += 50 * kMs;
  }
  FlightRecord pending;
  pending.seq = 165;
  pending.state = FlightState::kStarted;
  pending.started_ns = 1;
  late_then_on_time.records.push_back(pending);
  const auto p = progressOf(late_then_on_time);
  REQUIRE(p);
  CHECK(p->collectives == kStragglerWindow);
  CHECK(p->last_completed_seq == 164);
  CHECK(p->mean_wait_s == Approx(0.060));

  FlightRingSnapshot p2p = ring(0, 100, 0);
  p2p.kind = FlightRingKind::kPointToPoint;
  CHECK_FALSE(progressOf(p2p));
  CHECK_FALSE(progressOf(FlightRingSnapshot{}));
}

TEST_CASE("straggler: each group has its median, and a rank's lag is its worst over its groups", "[unit][straggler]") {
  // Group 1 (ranks 0-2): rank 1 is 30 ms late there; group 0: everyone on time.
  const auto progress = progressOfAll({ring(0, 100, 0), ring(1, 100, 0), ring(2, 100, 0), ring(0, 100, 0, 0, 1),
                                       ring(1, 100, 30, 0, 1), ring(2, 100, 0, 0, 1)});
  const auto medians = groupMedians(progress);
  REQUIRE(medians.size() == 2);
  CHECK(medians[1].group == 1);
  CHECK(medians[1].ranks == 3);
  const auto lags = lagsOf(progress, medians);
  REQUIRE(lags.size() == 3);
  CHECK(lags[1].group == 1);
  CHECK(lags[1].lag_s == Approx(0.030).margin(0.001));
}

TEST_CASE("progress summary: a node's value round-trips and stays within its bound", "[unit][straggler]") {
  NodeProgress node;
  node.unix_ms = 1700000000123;
  node.threshold_s = 0.5;
  node.ranks.push_back(RankProgress{3, 0, 1204, 64, 0.0125});
  RankPosition pos;
  pos.rank = 3;
  pos.last_completed_seq = 1204;
  pos.last_completed_op = FlightOp::kAllReduce;
  pos.last_completed_age_s = 0.25;
  node.positions.push_back(pos);
  const std::string text = encodeNodeProgress(node);
  const auto back = decodeNodeProgress(text, 4);
  REQUIRE(back);
  CHECK(back->rejected == 0);
  CHECK(back->progress.unix_ms == node.unix_ms);
  CHECK(back->progress.threshold_s == 0.5);
  REQUIRE(back->progress.ranks.size() == 1);
  CHECK(back->progress.ranks[0].rank == 3);
  CHECK(back->progress.ranks[0].last_completed_seq == 1204);
  CHECK(back->progress.ranks[0].mean_wait_s == Approx(0.0125));
  REQUIRE(back->progress.positions.size() == 1);
  CHECK(back->progress.positions[0].last_completed_seq == 1204);

  // A node of thousands of ranks: cut to the caps, never past the byte bound.
  NodeProgress big;
  for (int r = 0; r < 5000; ++r) {
    big.ranks.push_back(RankProgress{r, 0, 1u << 30, 64, 1234.5});
    pos.rank = r;
    big.positions.push_back(pos);
  }
  const std::string cut = encodeNodeProgress(big);
  CHECK(cut.size() <= kMaxProgressBytes);
  const auto decoded = decodeNodeProgress(cut, 5000);
  REQUIRE(decoded);
  CHECK(decoded->progress.ranks.size() == kMaxProgressEntries);
  CHECK(decoded->progress.positions.size() <= kMaxProgressEntries);
}

TEST_CASE("progress summary: forged values are refused or trimmed, never trusted", "[unit][straggler]") {
  CHECK_FALSE(decodeNodeProgress("", 4));
  CHECK_FALSE(decodeNodeProgress("dp2 1 500\n", 4));
  CHECK_FALSE(decodeNodeProgress("dp1 1 -5\n", 4));
  CHECK_FALSE(decodeNodeProgress("dp1 1 500\n" + std::string(kMaxProgressBytes, 'x'), 4));
  const auto d = decodeNodeProgress(
      "dp1 1 500\n"
      "s 4242 0 1 64 10\n"       // a rank outside the world
      "s -1 0 1 64 10\n"         // negative
      "s 1 0 1 65 10\n"          // more collectives than a window holds
      "s 1 0 1 64 nan\n"         // not a number
      "s 1 0 1 64 10 extra\n"    // left over
      "\x1b]0;pwned\x07\n"       // a terminal escape
      "v2 p 1 0 0 5 2 0.1\n"     // a point-to-point position: not shown
      "v2 c 9 0 0 5 2 0.1\n"     // a position outside the world
      "s 1 0 7 64 20000\n"       // good
      "s 1 0 8 64 99999\n"       // the same rank and group again
      "v2 c 1 0 1 5 2 0.100\n",  // good
      4);
  REQUIRE(d);
  CHECK(d->rejected == 9);
  REQUIRE(d->progress.ranks.size() == 1);
  CHECK(d->progress.ranks[0].last_completed_seq == 7);
  CHECK(d->progress.ranks[0].mean_wait_s == Approx(0.02));
  REQUIRE(d->progress.positions.size() == 1);
  CHECK(d->progress.positions[0].rank == 1);

  const auto m = decodeJobMedians("dm1 5\nm 0 12000 3\nm 0 1 3\nm 1 5 1\nm x 1 2\n");
  REQUIRE(m);
  REQUIRE(m->groups.size() == 1);
  CHECK(m->groups[0].median_wait_s == Approx(0.012));
  CHECK_FALSE(decodeJobMedians("dm1 5\n" + std::string(kMaxMediansBytes, 'm')));
  JobMedians many;
  for (int g = 0; g < 1000; ++g) many.groups.push_back(GroupMedian{g, 1.0, 2});
  const std::string text = encodeJobMedians(many);
  CHECK(text.size() <= kMaxMediansBytes);
  CHECK(decodeJobMedians(text)->groups.size() == kMaxMedianGroups);
}
