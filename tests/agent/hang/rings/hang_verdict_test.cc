#include "agent/hang/rings/hang_verdict.h"

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
  s.group_rank = rank;
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

// A message as its point-to-point ring keeps it: `op` to or from group rank `peer`, enqueued
// and started at `started_s`, ended at `ended_s` (0: not ended).
FlightRecord message(uint64_t seq, FlightOp op, int peer, FlightState state, int64_t started_s, int64_t ended_s = 0) {
  return {
      seq, {op, FlightDType::kFloat32, 16, peer}, state, started_s * kSecond, started_s * kSecond, ended_s * kSecond};
}

// The point-to-point ring of `rank` (of the default group unless `group` says otherwise).
FlightRingSnapshot messagesOf(int rank, std::vector<FlightRecord> records, int group = 0, int group_rank = -1) {
  FlightRingSnapshot s;
  s.kind = FlightRingKind::kPointToPoint;
  s.rank = rank;
  s.group = group;
  s.group_rank = group_rank >= 0 ? group_rank : rank;
  s.group_size = 8;
  s.records = std::move(records);
  s.last_seq = s.records.empty() ? 0 : s.records.back().seq;
  return s;
}

FlightRingSnapshot withGroup(FlightRingSnapshot s, int group, int group_rank) {
  s.group = group;
  s.group_rank = group_rank;
  return s;
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
  CHECK(noProgressFor(positions(rings, 109), 10));
  // One rank's recent completion is progress for the whole node.
  rings[0] = ringOf(0, 11, std::nullopt, 0, 107);
  CHECK_FALSE(noProgressFor(positions(rings, 109), 10));
}

TEST_CASE("hang verdict: a wait shorter than the timeout after a long stretch of work is not a hang") {
  // Every rank completed #10 at second 90, then worked with nothing pending (rank 0 wrote a
  // checkpoint); ranks 1-3 wait in #11 since second 95: at 104 nothing completed for 14 s, but
  // nobody has waited 10 s yet.
  std::vector<FlightRingSnapshot> rings{ringOf(0, 10, std::nullopt, 0, 90)};
  for (int r = 1; r < 4; ++r) rings.push_back(ringOf(r, 10, kAllReduce, 95, 90));
  CHECK_FALSE(noProgressFor(positions(rings, 104), 10));
  CHECK(noProgressFor(positions(rings, 105), 10));
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
  CHECK_FALSE(decodePosition("v2 c 1 2 3"));
  CHECK_FALSE(decodePosition("v2 c 1 0 1 3 2 1.0 7"));  // a pending operation cut short
}

TEST_CASE("hang verdict: a point-to-point position survives the store encoding with its kind and group rank") {
  auto ring = messagesOf(9,
                         {message(1, FlightOp::kSend, 0, FlightState::kCompleted, 2, 3),
                          message(2, FlightOp::kRecv, 1, FlightState::kStarted, 4)},
                         2, 3);
  auto p = positionOf(ring, 10 * kSecond);
  auto back = decodePosition(encodePosition(p));
  REQUIRE(back);
  CHECK(back->kind == FlightRingKind::kPointToPoint);
  CHECK(back->rank == 9);
  CHECK(back->group == 2);
  CHECK(back->group_rank == 3);
  CHECK(back->last_completed_seq == 1);
  CHECK(back->last_completed_op == FlightOp::kSend);
  CHECK(back->last_completed_age_s == Approx(7));
  REQUIRE(back->pending);
  CHECK(back->pending->seq == 2);
  CHECK(back->pending->info.op == FlightOp::kRecv);
  CHECK(back->pending->info.root == 1);
  CHECK(back->pending->state == FlightState::kStarted);
  CHECK(back->pending->started_ns != 0);
  CHECK(back->pending_age_s == Approx(6));
  auto collective = decodePosition(encodePosition(positionOf(withGroup(ringOf(4, 2, std::nullopt, 0), 1, 5), 0)));
  REQUIRE(collective);
  CHECK(collective->kind == FlightRingKind::kCollective);
  CHECK(collective->group_rank == 5);
}

TEST_CASE("hang verdict: a summary of another version or with anything malformed or left over is refused") {
  const std::string good = encodePosition(
      positionOf(messagesOf(1, {message(1, FlightOp::kRecv, 0, FlightState::kStarted, 1)}), 5 * kSecond));
  REQUIRE(decodePosition(good));
  CHECK_FALSE(decodePosition("v1" + good.substr(2)));  // the encoding before messages had rings
  CHECK_FALSE(decodePosition("v1 1 0 3 2 1.0"));
  CHECK_FALSE(decodePosition(good + " 7"));
  CHECK_FALSE(decodePosition("v2 x" + good.substr(4)));                       // neither c nor p
  CHECK_FALSE(decodePosition("v2 c 1 0 1 3 99 1.000"));                       // no such op
  CHECK_FALSE(decodePosition("v2 c 1 0 1 3 2 1.000 4 2 0 16 -1 9 1 2.000"));  // no such state
  CHECK_FALSE(decodePosition("v2 c 1 0 1 3 2 1.000 4 2 0 16 -1 1 2 2.000"));  // started is 0 or 1
  CHECK_FALSE(decodePosition("v2 c 1 0 1 3x 2 1.000"));
  CHECK(decodePosition("v2 c 1 0 1 3 2 1.000"));
}

TEST_CASE("hang verdict: a rank waiting in recv from a peer that has nothing pending names the peer as behind") {
  // Both completed all_reduce #4; rank 0 then waits in recv from rank 1, which went idle.
  std::vector<FlightRingSnapshot> rings{ringOf(0, 4, std::nullopt, 0), ringOf(1, 4, std::nullopt, 0),
                                        messagesOf(0, {message(1, FlightOp::kSend, 1, FlightState::kCompleted, 1, 1),
                                                       message(2, FlightOp::kRecv, 1, FlightState::kCompleted, 1, 1),
                                                       message(3, FlightOp::kRecv, 1, FlightState::kStarted, 2)}),
                                        messagesOf(1, {message(1, FlightOp::kRecv, 0, FlightState::kCompleted, 1, 1),
                                                       message(2, FlightOp::kSend, 0, FlightState::kCompleted, 1, 1)})};
  auto verdict = hangVerdict(positions(rings, 32));
  REQUIRE(verdict);
  CHECK(verdict->text ==
        "hang: rank 0 waits in recv from rank 1 (#3, started 30 s ago) while rank 1 has no operation pending — rank 1 "
        "is behind");
  CHECK(verdict->culprits == std::vector<int>{1});
}

TEST_CASE("hang verdict: a rank waiting in send to a peer inside a collective names the peer as behind") {
  // Rank 0 finished all_reduce #2 and waits in send to rank 2; rank 2 is still inside all_reduce #2.
  std::vector<FlightRingSnapshot> rings{ringOf(0, 2, std::nullopt, 0),
                                        ringOf(1, 2, std::nullopt, 0),
                                        ringOf(2, 1, kAllReduce, 3),
                                        messagesOf(0, {message(1, FlightOp::kSend, 2, FlightState::kStarted, 4)}),
                                        messagesOf(1, {}),
                                        messagesOf(2, {})};
  auto verdict = hangVerdict(positions(rings, 10));
  REQUIRE(verdict);
  // The collective line is the one it always was; the message gets a line of its own.
  CHECK(
      verdict->text ==
      "hang: rank 2 is at all_reduce #2 (started 7 s ago); ranks 0-1 have not called #3 (last completed all_reduce #2, "
      "9 s ago) — rank 2 is behind\n"
      "hang: rank 0 waits in send to rank 2 (#1, started 6 s ago) while rank 2 is in all_reduce #2 (started 7 s ago) "
      "— rank 2 is behind");
  CHECK(verdict->culprits == std::vector<int>{2});
}

TEST_CASE(
    "hang verdict: a rank waiting in recv while its peer waits in a collective it has not called wait for each other") {
  // Rank 1 went on to all_reduce #3 without sending; rank 0 waits for the message before it.
  std::vector<FlightRingSnapshot> rings{ringOf(0, 2, std::nullopt, 0), ringOf(1, 2, kAllReduce, 5),
                                        messagesOf(0, {message(1, FlightOp::kRecv, 1, FlightState::kStarted, 4)}),
                                        messagesOf(1, {})};
  auto verdict = hangVerdict(positions(rings, 20));
  REQUIRE(verdict);
  CHECK(verdict->text ==
        "hang: rank 0 has not called #3 (last completed all_reduce #2, 19 s ago); rank 1 waits in all_reduce #3 "
        "(started 15 s ago) — rank 0 is behind\n"
        "hang: rank 0 waits in recv from rank 1 (#1, started 16 s ago) while rank 1 waits in all_reduce #3 (started "
        "15 s ago), which rank 0 has not called — they wait for each other");
  CHECK(verdict->culprits == std::vector<int>{0});
}

TEST_CASE("hang verdict: ranks that wait in messages each get their part and a peer waiting in one is not blamed") {
  // Rank 0 waits in recv from rank 1, which waits in send to rank 2, which has failed in recv from rank 0.
  std::vector<FlightRingSnapshot> rings{messagesOf(0, {message(1, FlightOp::kRecv, 1, FlightState::kStarted, 4)}),
                                        messagesOf(1, {message(1, FlightOp::kSend, 2, FlightState::kEnqueued, 5)}),
                                        messagesOf(2, {message(1, FlightOp::kRecv, 0, FlightState::kFailed, 3, 6)})};
  rings[1].records[0].started_ns = 0;
  auto verdict = hangVerdict(positions(rings, 10));
  REQUIRE(verdict);
  CHECK(verdict->text ==
        "hang: rank 0 waits in recv from rank 1 (#1, started 6 s ago); rank 1 waits in send to rank 2 (#1, enqueued "
        "5 s ago); rank 2 failed in recv from rank 0 (#1)");
  CHECK(verdict->culprits.empty());
}

TEST_CASE("hang verdict: in a new group a message's peer is named by its global rank") {
  // Group 4 holds global ranks 6 (group rank 0) and 3 (group rank 1).
  std::vector<FlightRingSnapshot> rings{
      withGroup(ringOf(6, 1, std::nullopt, 0), 4, 0), withGroup(ringOf(3, 1, std::nullopt, 0), 4, 1),
      messagesOf(6, {message(1, FlightOp::kRecv, 1, FlightState::kStarted, 2)}, 4, 0), messagesOf(3, {}, 4, 1),
      messagesOf(5, {message(1, FlightOp::kSend, 1, FlightState::kStarted, 2)}, 7, 0)};
  auto verdict = hangVerdict(positions(rings, 12));
  REQUIRE(verdict);
  CHECK(verdict->text ==
        "hang: rank 6 waits in recv from rank 3 (#1, started 10 s ago) while rank 3 has no operation pending — rank 3 "
        "is behind (group 4)\n"
        "hang: rank 5 waits in send to group rank 1 (#1, started 10 s ago) while nothing is known of group rank 1 "
        "(group 7)");
  CHECK(verdict->culprits == std::vector<int>{3});
}

TEST_CASE("hang verdict: messages neither change nor hide the collective verdict") {
  std::vector<FlightRingSnapshot> rings;
  for (int r = 0; r < 8; ++r) {
    rings.push_back(r == 5 ? ringOf(r, 1203, kAllReduce, 10) : ringOf(r, 1204, kAllReduce, 11));
    // Every rank exchanged many messages, all completed: they number apart from the collectives.
    rings.push_back(messagesOf(r, {message(7000, FlightOp::kSend, (r + 1) % 8, FlightState::kCompleted, 9, 9)}));
  }
  auto verdict = hangVerdict(positions(rings, 322));
  REQUIRE(verdict);
  CHECK(verdict->text ==
        "hang: rank 5 is at all_reduce #1204 (started 312 s ago); ranks 0-4,6-7 wait in all_reduce #1205 (started "
        "311 s ago) — rank 5 is behind");
  CHECK(verdict->culprits == std::vector<int>{5});
}

TEST_CASE("hang verdict: a completed message is progress and a pending one is something to wait for") {
  // Both ranks idle in collectives since second 2; rank 0 waits in recv since second 5, its
  // first message, which counts from when it started.
  std::vector<FlightRingSnapshot> rings{ringOf(0, 3, std::nullopt, 0, 2), ringOf(1, 3, std::nullopt, 0, 2),
                                        messagesOf(0, {message(1, FlightOp::kRecv, 1, FlightState::kStarted, 5)}),
                                        messagesOf(1, {})};
  CHECK_FALSE(noProgressFor(positions(rings, 14), 10));
  CHECK(noProgressFor(positions(rings, 15), 10));
  // Rank 1 completed a send to rank 2 at second 11: progress, though rank 0 still waits.
  rings[3] = messagesOf(1, {message(1, FlightOp::kSend, 2, FlightState::kCompleted, 10, 11)});
  CHECK_FALSE(noProgressFor(positions(rings, 20), 10));
  CHECK(noProgressFor(positions(rings, 21), 10));
}

TEST_CASE("hang verdict: messages complete in any order and the oldest one still moving is where a rank waits") {
  // #1 (to rank 1) is still moving; #2 (to rank 2) completed at second 7, #3 at second 6.
  auto ring = messagesOf(0, {message(1, FlightOp::kSend, 1, FlightState::kStarted, 2),
                             message(2, FlightOp::kSend, 2, FlightState::kCompleted, 3, 7),
                             message(3, FlightOp::kRecv, 2, FlightState::kCompleted, 4, 6),
                             message(4, FlightOp::kRecv, 1, FlightState::kEnqueued, 5)});
  auto p = positionOf(ring, 10 * kSecond);
  CHECK(p.kind == FlightRingKind::kPointToPoint);
  CHECK(p.last_completed_seq == 2);
  CHECK(p.last_completed_age_s == Approx(3));
  REQUIRE(p.pending);
  CHECK(p.pending->seq == 1);
  CHECK(p.pending_age_s == Approx(8));
  // A failed message is where the rank stands until one completes after it.
  auto failed = messagesOf(0, {message(1, FlightOp::kRecv, 1, FlightState::kFailed, 2, 4),
                               message(2, FlightOp::kSend, 2, FlightState::kCompleted, 3, 3)});
  REQUIRE(positionOf(failed, 10 * kSecond).pending);
  CHECK(positionOf(failed, 10 * kSecond).pending->seq == 1);
  failed.records[1].ended_ns = 5 * kSecond;
  CHECK_FALSE(positionOf(failed, 10 * kSecond).pending);
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

// A worker of a 2-rank job (one rank a node) that writes its own value under the other
// node's hang-summary key: 10,000 lines each for ranks 4242 and 4243. Read line by line with
// decodePosition, as the agent once did, they made the verdict blame both ranks.
TEST_CASE("a forged hang summary naming ranks outside the job is dropped", "[unit][hang][bad-input]") {
  const std::vector<RankPosition> local = positions({ringOf(0, 4, kAllReduce, 10)}, 20);
  std::string forged;
  for (int i = 0; i < 10000; ++i) {
    for (int rank : {4242, 4243}) {
      RankPosition p = positionOf(ringOf(rank, 1, std::nullopt, 0), 20 * kSecond);
      p.group_rank = rank;
      forged += encodePosition(p) + "\n";
    }
  }
  forged += "garbage\n";
  std::vector<RankPosition> trusted = local;
  for (size_t at = 0, next; at < forged.size(); at = next + 1) {
    next = forged.find('\n', at);
    if (auto p = decodePosition(forged.substr(at, next - at))) trusted.push_back(*p);
  }
  const auto fooled = hangVerdict(trusted);
  REQUIRE(fooled);
  CHECK(fooled->culprits == std::vector<int>{4242, 4243});

  const SummaryPositions summary = decodeSummary(forged, 2, {0});
  CHECK(summary.positions.empty());
  CHECK(summary.rejected == 20001);
  std::vector<RankPosition> all = local;
  all.insert(all.end(), summary.positions.begin(), summary.positions.end());
  const auto verdict = hangVerdict(all);
  REQUIRE(verdict);
  CHECK((verdict->culprits.empty() || verdict->culprits == std::vector<int>{0}));
  CHECK(verdict->text.find("4242") == std::string::npos);
  CHECK(verdict->text.size() < 1000);
}

TEST_CASE("a hang summary keeps one position per rank and ring, none of this node's", "[unit][hang][bad-input]") {
  const RankPosition other = positionOf(ringOf(1, 3, kAllReduce, 10), 20 * kSecond);
  RankPosition mine = positionOf(ringOf(0, 3, kAllReduce, 10), 20 * kSecond);
  RankPosition negative = other;
  negative.group_rank = -1;
  const std::string text = encodePosition(other) + "\n" + encodePosition(other) + "\n" + encodePosition(mine) + "\n" +
                           encodePosition(negative) + "\n\n";
  const SummaryPositions summary = decodeSummary(text, 2, {0});
  REQUIRE(summary.positions.size() == 1);
  CHECK(summary.positions[0].rank == 1);
  CHECK(summary.rejected == 3);

  std::string many;
  for (int group = 0; group < 5000; ++group) {
    RankPosition p = other;
    p.group = group;
    many += encodePosition(p) + "\n";
  }
  const SummaryPositions bounded = decodeSummary(many, 2, {0});
  CHECK(bounded.positions.size() == kMaxSummaryPositions);
  CHECK(bounded.rejected == 5000 - kMaxSummaryPositions);
}

}  // namespace ddprun::agent
