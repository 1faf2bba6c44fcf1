// The rings' verdict across nodes (agent/hang/verdicts/ring_judgement.h) alone, on positions
// read from rings built here and other nodes' summaries encoded as their agents encode them:
// whom it blames, how a culprit of another node becomes a failure of the report, what it
// drops of a summary, and what it says when no operation is pending.
#include "agent/hang/verdicts/ring_judgement.h"

#include <string>
#include <vector>

#include <catch2/catch.hpp>

namespace ddprun::agent {
namespace {

constexpr int64_t kSecond = 1000000000;
const std::string kTrigger = "--hang_timeout: no rank on this node completed an operation for 10 s";
const std::string kFrames = "File \"/job/train.py\", line 12, in main\n  load_batch()\n";

// A rank of a job of two that completed all_reduce #1..#5 at second 1 and, when `waiting`,
// has waited in #6 since second 2; read at second 20.
RankPosition positionAt(int rank, bool waiting) {
  FlightRingSnapshot s;
  s.rank = rank;
  s.group_rank = rank;
  s.group_size = 2;
  const FlightOpInfo all_reduce{FlightOp::kAllReduce, FlightDType::kFloat32, 1024, -1};
  for (uint64_t seq = 1; seq <= 5; ++seq) {
    s.records.push_back({seq, all_reduce, FlightState::kCompleted, 0, kSecond, kSecond});
  }
  if (waiting) s.records.push_back({6, all_reduce, FlightState::kStarted, 2 * kSecond, 2 * kSecond, 0});
  s.last_seq = s.records.back().seq;
  return positionOf(s, 20 * kSecond);
}

// Another node's summary as its agent writes it (node_summaries.h's encodeNodeSummary, without
// dumps; its library is not linked here): a position a line, then its Python ranks' frames.
std::string summaryOf(const std::string& node, const std::vector<RankPosition>& positions,
                      const std::vector<LocalStack>& stacks) {
  std::string summary;
  for (const RankPosition& p : positions) summary += encodePosition(p) + "\n";
  return summary + encodeStackSummary(node, stacks);
}

// Rank 0 here, waiting in #6; rank 1 on another node, whose summary `answers` holds.
struct TwoNodes {
  explicit TwoNodes(std::vector<std::string> others_answers) : answers(std::move(others_answers)) {
    c.local = {positionAt(0, true)};
    c.local_ranks = {0};
    c.world_size = 2;
    c.several_nodes = true;
    c.others = [this]() -> const std::vector<std::string>& {
      ++asked;
      return answers;
    };
  }
  RingCase c;
  std::vector<std::string> answers;
  int asked = 0;
};

std::vector<std::string> lines(const RingJudgement& j) {
  std::vector<std::string> out;
  for (const auto& [level, line] : j.log)
    out.push_back(std::string(spdlog::level::to_string_view(level).data()) + ": " + line);
  return out;
}

}  // namespace

TEST_CASE("ring judgement: the rank behind on another node is named from its node's summary, with its frames",
          "[unit]") {
  TwoNodes nodes({summaryOf("node b", {positionAt(1, false)}, {LocalStack{1, 2, kFrames}})});

  RingJudgement j = judgeRings(kTrigger, nodes.c);

  CHECK(nodes.asked == 1);
  REQUIRE(j.verdict);
  CHECK(j.verdict->culprits == std::vector<int>{1});
  CHECK_THAT(j.verdict->text, Catch::Contains("rank 1 is behind"));
  CHECK(lines(j) == std::vector<std::string>{"error: " + kTrigger + "; " + j.verdict->text});
  REQUIRE(j.remote_stacks.count(1) == 1);
  CHECK(j.remote_stacks.at(1).traceback == kFrames);
  REQUIRE(j.remote_culprits.size() == 1);
  const WorkerFailure& f = j.remote_culprits[0];
  CHECK(f.rank == 1);
  CHECK(f.host == "node b");
  CHECK(f.local_rank == 2);
  CHECK(f.hang_reason == j.verdict->text);
  CHECK(f.elsewhere == "blamed by the flight recorder rings");
  CHECK(f.python_stack == kFrames);

  SECTION("frames known already hold over the summary's") {
    nodes.c.known_stacks[1] = RemoteStack{"node c", 0, "File \"/job/other.py\", line 3, in f\n"};
    j = judgeRings(kTrigger, nodes.c);
    REQUIRE(j.remote_culprits.size() == 1);
    CHECK(j.remote_culprits[0].host == "node c");
  }
  SECTION("a rank blamed already is not blamed twice") {
    nodes.c.known_remote_culprits = {1};
    CHECK(judgeRings(kTrigger, nodes.c).remote_culprits.empty());
  }
  SECTION("a rank whose node sent no frames is no failure of this node's report") {
    nodes.answers = {summaryOf("node b", {positionAt(1, false)}, {})};
    j = judgeRings(kTrigger, nodes.c);
    REQUIRE(j.verdict);
    CHECK(j.verdict->culprits == std::vector<int>{1});
    CHECK(j.remote_culprits.empty());
  }
}

TEST_CASE("ring judgement: a culprit of this node is no remote failure, and a lone node asks nobody", "[unit]") {
  TwoNodes nodes({});
  nodes.c.local = {positionAt(0, true), positionAt(1, false)};
  nodes.c.local_ranks = {0, 1};
  nodes.c.several_nodes = false;

  const RingJudgement j = judgeRings(kTrigger, nodes.c);

  CHECK(nodes.asked == 0);
  REQUIRE(j.verdict);
  CHECK(j.verdict->culprits == std::vector<int>{1});
  CHECK(j.remote_culprits.empty());
}

TEST_CASE("ring judgement: what no rank of the job can hold is dropped from a summary and said", "[unit]") {
  const std::string summary = summaryOf("node b", {positionAt(1, false), positionAt(7, false)},
                                        {LocalStack{1, 0, kFrames}, LocalStack{9, 0, kFrames}});
  TwoNodes nodes({summary});

  const RingJudgement j = judgeRings(kTrigger, nodes.c);

  REQUIRE(j.verdict);
  CHECK(j.verdict->culprits == std::vector<int>{1});
  CHECK(j.remote_stacks.count(9) == 0);
  const std::vector<std::string> said = lines(j);
  REQUIRE(said.size() == 3);
  CHECK(said[0] ==
        "warning: hang verdict: ignored 1 position(s) of another node's summary that no rank of this job of 2 can "
        "hold");
  CHECK(said[1].rfind("warning: hang verdict: ignored ", 0) == 0);
  CHECK_THAT(said[1], Catch::Contains("Python traceback line(s) of another node's summary"));
}

TEST_CASE("ring judgement: nothing pending is said, at debug level for Python workers without rings yet", "[unit]") {
  RingCase c;
  c.world_size = 2;
  c.local_ranks = {0, 1};
  c.python_workers = true;
  RingJudgement j = judgeRings(kTrigger, c);
  CHECK_FALSE(j.verdict);
  CHECK(lines(j) == std::vector<std::string>{"debug: " + kTrigger +
                                             "; the flight recorder shows no operation pending on this node"});

  // Rings that show nothing pending are news, Python or not.
  c.local = {positionAt(0, false), positionAt(1, false)};
  j = judgeRings(kTrigger, c);
  CHECK_FALSE(j.verdict);
  CHECK(lines(j) == std::vector<std::string>{"warning: " + kTrigger +
                                             "; the flight recorder shows no operation pending on this node"});
  c.local.clear();
  c.python_workers = false;
  CHECK(lines(judgeRings(kTrigger, c)).at(0).rfind("warning: ", 0) == 0);
}

}  // namespace ddprun::agent
