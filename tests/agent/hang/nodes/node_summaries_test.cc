// The hang summaries' exchange between nodes (agent/hang/nodes/node_summaries.h) on a manual
// clock and a job board of the test's own: how often a node looks for another node's request
// and what each look costs, what a judging node asks once per attempt and how long it waits,
// what it says when nodes did not answer, and what a node's summary carries back.
#include "agent/hang/nodes/node_summaries.h"

#include <chrono>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "tests/agent/hang/nodes/rank_positions.h"
#include "tests/support/agent_log.h"
#include "tests/support/manual_clock.h"

namespace ddprun::agent {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// The other nodes, as the test scripts them; it counts every call that would be a store
// round trip. No status or progress goes through it here.
class ScriptedBoard final : public rendezvous::Board {
 public:
  void publishStatus(const rendezvous::AgentRecord&) override {}
  std::vector<std::string> gatherHangSummaries(milliseconds wait, const std::string& mine) override {
    asked.emplace_back(wait, mine);
    return answers;
  }
  bool hangSummaryRequested() override {
    ++looks;
    return requested;
  }
  void publishHangSummary(const std::string& summary) override { published.push_back(summary); }
  void publishProgress(const std::string&) override {}
  std::vector<std::string> readProgress(size_t, size_t) override { return {}; }
  void publishProgressMedians(const std::string&) override {}
  std::string readProgressMedians(size_t) override { return {}; }

  bool requested = false;
  int looks = 0;
  std::vector<std::string> answers;
  std::vector<std::string> published;
  std::vector<std::pair<milliseconds, std::string>> asked;
};

}  // namespace

TEST_CASE("node summaries: another node's request is looked for at once, then every 2 s, one board call a look",
          "[unit]") {
  testing::ManualClock clock;
  ScriptedBoard board;
  NodeSummaries nodes(board, "node-a");
  const auto start = clock.now();
  CHECK(nodes.nextLook() <= start);

  CHECK_FALSE(nodes.requested(clock.now()));
  CHECK(board.looks == 1);
  CHECK(nodes.nextLook() == start + seconds(2));
  // Ticks in between cost the board nothing, even when a request is there.
  board.requested = true;
  for (int i = 0; i < 19; ++i) {
    clock.advance(milliseconds(100));
    CHECK_FALSE(nodes.requested(clock.now()));
  }
  CHECK(board.looks == 1);
  clock.advance(milliseconds(100));
  CHECK(nodes.requested(clock.now()));
  CHECK(board.looks == 2);
  nodes.answer("this node's summary\n");
  CHECK(board.published == std::vector<std::string>{"this node's summary\n"});
  CHECK(nodes.nextLook() == clock.now() + seconds(2));
}

TEST_CASE("node summaries: a judging node asks once an attempt with its own summary beside, and asks again after",
          "[unit]") {
  ScriptedBoard board;
  board.answers = {"b's summary\n", "c's summary\n"};
  NodeSummaries nodes(board, "node-a");
  int mine_built = 0;
  const auto mine = [&] {
    ++mine_built;
    return std::string("a's summary\n");
  };

  CHECK(nodes.others(3, seconds(0), mine) == board.answers);
  CHECK(nodes.others(3, seconds(0), mine) == board.answers);
  REQUIRE(board.asked.size() == 1);
  CHECK(board.asked[0] == std::make_pair(milliseconds(5000), std::string("a's summary\n")));
  CHECK(mine_built == 1);

  // The next attempt asks anew; the other nodes may first wait for their dumps: 3 s more.
  nodes.forget();
  board.answers = {"b's later summary\n", "c's later summary\n"};
  CHECK(nodes.others(3, seconds(3), mine) == board.answers);
  REQUIRE(board.asked.size() == 2);
  CHECK(board.asked[1].first == milliseconds(8000));
}

TEST_CASE("node summaries: a node alone asks nobody, and nodes that did not answer are counted once", "[unit]") {
  testing::AgentLog log{testing::AgentLog::kOwnLevel};
  ScriptedBoard board;
  board.answers = {"b's summary\n"};
  NodeSummaries nodes(board, "node-a");
  int mine_built = 0;
  const auto mine = [&] {
    ++mine_built;
    return std::string();
  };

  SECTION("alone") {
    CHECK(nodes.others(1, seconds(0), mine).empty());
    CHECK(board.asked.empty());
    CHECK(mine_built == 0);
  }
  SECTION("every other node answered") {
    CHECK(nodes.others(2, seconds(0), mine).size() == 1);
    CHECK(log.text().empty());
  }
  SECTION("two of four nodes did not answer") {
    CHECK(nodes.others(4, seconds(3), mine).size() == 1);
    nodes.others(4, seconds(3), mine);
    CHECK(log.text() == "warning: hang verdict without 2 of 4 nodes (no answer within 8 s)\n");
  }
}

TEST_CASE("node summaries: a node's summary gives back its ranks' positions, frames and dumps", "[unit]") {
  const std::vector<LocalStack> stacks = {{2, 0, "File \"/job/train.py\", line 12, in main\n  load_batch()\n"}};
  FlightDump dump;
  dump.rank = 3;
  dump.version = "2.4";
  const std::string summary =
      encodeNodeSummary("node b", {testing::completedPosition(2, 5), testing::completedPosition(3, 6)}, stacks,
                        {LocalDump{dump, 1, true, ""}});

  const SummaryPositions positions = decodeSummary(summary, 4, {0, 1});
  CHECK(positions.rejected == 0);
  REQUIRE(positions.positions.size() == 2);
  CHECK(positions.positions[0].rank == 2);
  CHECK(positions.positions[0].last_completed_seq == 5);
  CHECK(positions.positions[1].last_completed_seq == 6);
  const RemoteStacks frames = decodeStackSummary(summary, 4, {0, 1});
  REQUIRE(frames.ranks.count(2) == 1);
  CHECK(frames.ranks.at(2).node == "node b");
  CHECK(frames.ranks.at(2).traceback == stacks[0].traceback);
  const RemoteDumps dumps = decodeDumpSummary(summary, 4, {0, 1});
  REQUIRE(dumps.dumps.size() == 1);
  CHECK(dumps.dumps[0].rank == 3);
  CHECK(dumps.ranks.at(3).local_rank == 1);
  CHECK(dumps.finished_ranks == std::vector<int>{3});

  // No dumps: no dump lines.
  CHECK(decodeDumpSummary(encodeNodeSummary("node b", {testing::completedPosition(2, 5)}, stacks, {}), 4, {0, 1})
            .dumps.empty());
}

}  // namespace ddprun::agent
