// What this node's hang summary says of its workers (agent/hang/nodes/local_summary.h), read
// back as another node reads it (node_summaries.h, stack_summary.h, dump_summary.h): its
// ranks' positions and Python frames always, their dumps only when there are any, a live
// trace standing in for a rank without a dump file, with whether its worker finished.
#include "agent/hang/nodes/local_summary.h"

#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "agent/hang/python/python_stacks.h"
#include "agent/hang/python/stack_summary.h"
#include "agent/torch_trace/dump_summary.h"
#include "tests/agent/hang/nodes/rank_positions.h"

namespace ddprun::agent {
namespace {

const std::string kDump =
    "Current thread 0x1 (most recent call first):\n  File \"/job/train.py\", line 12 in <module>\n";

FlightDump liveTrace(int rank) {
  FlightDump d;
  d.rank = rank;
  d.version = "2.10";
  return d;
}

}  // namespace

TEST_CASE("local summary: a node's ranks' positions and frames, and their dumps only when there are any", "[unit]") {
  const std::vector<SummaryRank> ranks = {{2, 0, kDump, false}, {3, 1, "", true}};

  std::string summary = localSummary("node b", {testing::completedPosition(2, 5)}, ranks, nullptr, {});
  const SummaryPositions positions = decodeSummary(summary, 4, {0, 1});
  REQUIRE(positions.positions.size() == 1);
  CHECK(positions.positions[0].rank == 2);
  const RemoteStacks stacks = decodeStackSummary(summary, 4, {0, 1});
  REQUIRE(stacks.ranks.size() == 1);  // rank 3's stacks were not taken
  CHECK(stacks.ranks.at(2).node == "node b");
  CHECK(stacks.ranks.at(2).traceback == formatTraceback(mainThreadFrames(kDump)));
  CHECK(decodeDumpSummary(summary, 4, {0, 1}).dumps.empty());

  // Live traces travel as dumps do: each with its worker's place, whether it finished and its frames.
  summary = localSummary("node b", {}, ranks, nullptr, {liveTrace(3), liveTrace(2)});
  const RemoteDumps dumps = decodeDumpSummary(summary, 4, {0, 1});
  REQUIRE(dumps.dumps.size() == 2);
  CHECK(dumps.ranks.at(2).local_rank == 0);
  CHECK(dumps.ranks.at(3).local_rank == 1);
  CHECK(dumps.finished_ranks == std::vector<int>{3});
  CHECK(dumps.python_stacks.count(2) == 1);
  CHECK(dumps.python_stacks.count(3) == 0);
}

TEST_CASE("local summary: a worker's standing as its summary tells it", "[unit]") {
  struct FakeWorker {
    struct {
      int rank, local_rank;
    } place;
    std::string python_stack;
    bool running;
    int exit_code;
    int signal;
  };
  const std::vector<FakeWorker> workers = {
      {{0, 0}, kDump, true, 0, 0}, {{1, 1}, "", false, 0, 0}, {{2, 2}, "", false, 1, 0}, {{3, 3}, "", false, 0, 9}};
  const std::vector<SummaryRank> ranks = summaryRanks(workers);
  REQUIRE(ranks.size() == 4);
  CHECK((ranks[0].rank == 0 && ranks[0].python_stack == kDump && !ranks[0].finished));
  CHECK((ranks[1].rank == 1 && ranks[1].local_rank == 1 && ranks[1].finished));
  CHECK_FALSE(ranks[2].finished);  // exited with 1
  CHECK_FALSE(ranks[3].finished);  // killed
}

}  // namespace ddprun::agent
