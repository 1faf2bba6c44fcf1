#include "agent/hang_verdict.h"

#include <catch2/catch.hpp>

namespace ddprun::agent {
namespace {

constexpr int64_t kSecond = 1000000000;

// A rank whose ring holds `completed` all_reduces of 1024 float32, each ended at second 1,
// then optionally one started operation.
FlightRingSnapshot ringOf(int rank, uint64_t completed, std::optional<FlightOpInfo> pending, int64_t started_s,
                          int64_t completed_at_s = 1) {
  FlightRingSnapshot s;
  s.rank = rank;
  s.group_size = 8;
  for (uint64_t seq = 1; seq <= completed; ++seq) {
    s.records.push_back({seq,
                         {FlightOp::kAllReduce, FlightDType::kFloat32, 1024, -1},
                         FlightState::kCompleted,
                         0,
                         completed_at_s * kSecond,
                         completed_at_s * kSecond});
  }
  if (pending) {
    s.records.push_back({completed + 1, *pending, FlightState::kStarted, started_s * kSecond, started_s * kSecond, 0});
  }
  s.last_seq = s.records.empty() ? 0 : s.records.back().seq;
  return s;
}

const FlightOpInfo kAllReduce{FlightOp::kAllReduce, FlightDType::kFloat32, 1024, -1};

std::vector<RankPosition> positions(const std::vector<FlightRingSnapshot>& rings, int64_t now_s) {
  std::vector<RankPosition> out;
  for (const auto& r : rings) out.push_back(positionOf(r, now_s * kSecond));
  return out;
}

}  // namespace

TEST_CASE("hang verdict: a rank still inside an earlier operation is named as behind") {
  std::vector<FlightRingSnapshot> rings;
  for (int r = 0; r < 8; ++r) {
    // Rank 5 is inside #1204 since second 10; the others have finished it and wait in #1205.
    rings.push_back(r == 5 ? ringOf(r, 1203, kAllReduce, 10) : ringOf(r, 1204, kAllReduce, 11));
  }
  auto verdict = hangVerdict(positions(rings, 322));
  REQUIRE(verdict);
  CHECK(verdict->text ==
        "hang: rank 5 is at all_reduce #1204 (started 312 s ago); ranks 0-4,6-7 wait in all_reduce #1205 (started "
        "311 s ago) — rank 5 is behind");
  CHECK(verdict->culprits == std::vector<int>{5});
}

TEST_CASE("hang verdict: a rank that has not called the operation the others wait in is behind") {
  std::vector<FlightRingSnapshot> rings;
  for (int r = 0; r < 4; ++r) rings.push_back(r == 2 ? ringOf(r, 6, std::nullopt, 0) : ringOf(r, 6, kAllReduce, 2));
  auto verdict = hangVerdict(positions(rings, 32));
  REQUIRE(verdict);
  CHECK(verdict->text ==
        "hang: rank 2 has not called #7 (last completed all_reduce #6, 31 s ago); ranks 0-1,3 wait in all_reduce #7 "
        "(started 30 s ago) — rank 2 is behind");
}

TEST_CASE("hang verdict: a different op at the same sequence number is named") {
  std::vector<FlightRingSnapshot> rings;
  for (int r = 0; r < 4; ++r) {
    rings.push_back(
        ringOf(r, 87, r == 3 ? FlightOpInfo{FlightOp::kBroadcast, FlightDType::kFloat32, 1024, 0} : kAllReduce, 5));
  }
  auto verdict = hangVerdict(positions(rings, 60));
  REQUIRE(verdict);
  CHECK(verdict->text == "hang: rank 3 called broadcast where the others called all_reduce (#88)");
  CHECK(verdict->culprits == std::vector<int>{3});
}

TEST_CASE("hang verdict: between two ranks that disagree the higher rank is the odd one") {
  std::vector<FlightRingSnapshot> rings{
      ringOf(0, 2, kAllReduce, 5), ringOf(1, 2, FlightOpInfo{FlightOp::kBroadcast, FlightDType::kFloat32, 1024, 0}, 5)};
  auto verdict = hangVerdict(positions(rings, 60));
  REQUIRE(verdict);
  CHECK(verdict->text == "hang: rank 1 called broadcast where the others called all_reduce (#3)");
}

TEST_CASE("hang verdict: one rank waiting is said in the singular") {
  std::vector<FlightRingSnapshot> rings{ringOf(0, 4, kAllReduce, 5), ringOf(1, 4, std::nullopt, 0)};
  auto verdict = hangVerdict(positions(rings, 9));
  REQUIRE(verdict);
  CHECK(verdict->text ==
        "hang: rank 1 has not called #5 (last completed all_reduce #4, 8 s ago); rank 0 waits in "
        "all_reduce #5 (started 4 s ago) — rank 1 is behind");
}

TEST_CASE("hang verdict: a different size at the same sequence number is named") {
  std::vector<FlightRingSnapshot> rings;
  for (int r = 0; r < 3; ++r) {
    rings.push_back(
        ringOf(r, 4, r == 0 ? FlightOpInfo{FlightOp::kAllReduce, FlightDType::kFloat32, 512, -1} : kAllReduce, 5));
  }
  auto verdict = hangVerdict(positions(rings, 60));
  REQUIRE(verdict);
  CHECK(verdict->text == "hang: rank 0 called all_reduce on 512 float32 where the others used 1024 float32 (#5)");
  CHECK(verdict->culprits == std::vector<int>{0});
}

TEST_CASE("hang verdict: a different root at the same sequence number is named") {
  std::vector<FlightRingSnapshot> rings;
  for (int r = 0; r < 3; ++r) {
    rings.push_back(ringOf(r, 4, FlightOpInfo{FlightOp::kBroadcast, FlightDType::kFloat32, 8, r == 1 ? 1 : 0}, 5));
  }
  auto verdict = hangVerdict(positions(rings, 60));
  REQUIRE(verdict);
  CHECK(verdict->text == "hang: rank 1 called broadcast with root 1 where the others used root 0 (#5)");
}

TEST_CASE("hang verdict: ranks between operations give no verdict") {
  std::vector<FlightRingSnapshot> rings;
  for (int r = 0; r < 4; ++r) rings.push_back(ringOf(r, 10, std::nullopt, 0));
  auto ps = positions(rings, 1000);
  CHECK_FALSE(hangVerdict(ps));
  CHECK_FALSE(noProgressFor(ps, 10));
}

TEST_CASE("hang verdict: a job that keeps completing operations has made progress") {
  std::vector<FlightRingSnapshot> rings;
  // Every rank completed #10 at second 98 and waits in #11 since second 99: slow, not hung.
  for (int r = 0; r < 4; ++r) rings.push_back(ringOf(r, 10, kAllReduce, 99, 98));
  CHECK_FALSE(noProgressFor(positions(rings, 100), 10));
  CHECK(noProgressFor(positions(rings, 108), 10));
  // One rank's recent completion is progress for the whole node.
  rings[0] = ringOf(0, 11, std::nullopt, 0, 107);
  CHECK_FALSE(noProgressFor(positions(rings, 108), 10));
}

TEST_CASE("hang verdict: a rank that never completed anything counts from its pending operation") {
  std::vector<FlightRingSnapshot> rings{ringOf(0, 0, kAllReduce, 5), ringOf(1, 0, kAllReduce, 5)};
  CHECK_FALSE(noProgressFor(positions(rings, 10), 10));
  CHECK(noProgressFor(positions(rings, 16), 10));
  auto verdict = hangVerdict(positions(rings, 16));
  REQUIRE(verdict);
  CHECK(verdict->text.find("ranks 0-1 wait in all_reduce #1 (started 11 s ago)") != std::string::npos);
  CHECK(verdict->culprits.empty());  // nobody here is behind: nobody to blame
}

TEST_CASE("hang verdict: rank ranges") {
  CHECK(rankRanges({0, 1, 2, 3, 4, 6, 7}) == "0-4,6-7");
  CHECK(rankRanges({5}) == "5");
  CHECK(rankRanges({3, 1, 2, 9}) == "1-3,9");
}

TEST_CASE("hang verdict: a position survives the store encoding") {
  auto p = positionOf(ringOf(4, 6, FlightOpInfo{FlightOp::kReduce, FlightDType::kInt64, 77, 2}, 3), 10 * kSecond);
  auto back = decodePosition(encodePosition(p));
  REQUIRE(back);
  CHECK(back->rank == 4);
  CHECK(back->last_completed_seq == 6);
  CHECK(back->last_completed_op == FlightOp::kAllReduce);
  CHECK(back->last_completed_age_s == Approx(9));
  REQUIRE(back->pending);
  CHECK(back->pending->seq == 7);
  CHECK(back->pending->info.op == FlightOp::kReduce);
  CHECK(back->pending->info.dtype == FlightDType::kInt64);
  CHECK(back->pending->info.count == 77);
  CHECK(back->pending->info.root == 2);
  CHECK(back->pending_age_s == Approx(7));
  auto idle = decodePosition(encodePosition(positionOf(ringOf(1, 2, std::nullopt, 0), 5 * kSecond)));
  REQUIRE(idle);
  CHECK_FALSE(idle->pending);
  CHECK_FALSE(decodePosition("v2 1 2 3"));
  CHECK_FALSE(decodePosition("v1 1 0 3 2 1.0 7"));
}

TEST_CASE("hang verdict: the collective timeouts of ddprun gloo and NCCL are recognised, other errors are not") {
  CHECK(reportsCollectiveTimeout("rank 0: all_reduce (shared memory): timed out waiting for rank 1"));
  CHECK(reportsCollectiveTimeout(
      "RuntimeError: [./gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 3000ms for recv operation to "
      "complete"));
  CHECK(reportsCollectiveTimeout("[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5)"));
  CHECK_FALSE(reportsCollectiveTimeout("ValueError: bad learning rate 42"));
  CHECK_FALSE(reportsCollectiveTimeout("RuntimeError: Connection closed by peer"));
}

}  // namespace ddprun::agent
