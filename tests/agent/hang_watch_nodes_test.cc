// The hang watch (agent/hang_watch.h) of one node of a multi-node job, alone: the other nodes
// are a scripted job board of hang summaries (rendezvous/board/board.h) and the round's size
// is the test's, so that no rendezvous runs. What it answers another node that
// judges a hang, and what it makes of the other nodes' answers when it judges one itself:
// the culprit on another node named, with its host and frames, first in this node's report.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "agent/hang/python/stack_summary.h"
#include "agent/hang/rings/hang_verdict.h"
#include "common/env_names.h"
#include "common/flight_ring.h"
#include "tests/agent/agent_parts.h"
#include "tests/agent/test_rings.h"

namespace ddprun::agent::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// The other nodes, as the test scripts them; no progress is exchanged.
class ScriptedExchange final : public rendezvous::Board {
 public:
  void publishStatus(const rendezvous::AgentRecord&) override {}
  void publishProgress(const std::string&) override {}
  std::vector<std::string> readProgress(size_t, size_t) override { return {}; }
  void publishProgressMedians(const std::string&) override {}
  std::string readProgressMedians(size_t) override { return {}; }
  bool hangSummaryRequested() override { return requested; }
  void publishHangSummary(const std::string& summary) override {
    published.push_back(summary);
    requested = false;  // answered: the request is gone until another node asks again
  }
  std::vector<std::string> gatherHangSummaries(milliseconds wait, const std::string& mine) override {
    asked.emplace_back(wait, mine);
    return answers;
  }

  bool requested = false;
  std::vector<std::string> answers;                         // what the other nodes answer
  std::vector<std::string> published;                       // this node's answers
  std::vector<std::pair<milliseconds, std::string>> asked;  // this node's asks: the wait, its own summary
};

// A round of `nodes` nodes and `world_size` ranks; the findings go to the parts' job reporter
// (its events file).
class RoundReports final : public HangReports {
 public:
  RoundReports(JobReporter& reporter, int world_size, int nodes) : reporter_(reporter), round_{world_size, nodes} {}
  void emit(const std::string& event, const JsonObject& fields) override { reporter_.emit(event, fields); }
  void setHangVerdict(JobReporter::Verdict verdict) override { reporter_.setHangVerdict(std::move(verdict)); }
  std::optional<Round> round() const override { return round_; }

 private:
  JobReporter& reporter_;
  Round round_;
};

// The summary line of rank `rank` of a 4-rank job, as its node sends it: `completed`
// all_reduces done and, when `pending`, one more still running (writeTestRing's).
std::string positionLine(const std::filesystem::path& scratch, int rank, int completed, bool pending) {
  writeTestRing(scratch.string(), rank, 4, completed, pending);
  const auto ring = readFlightRingFile((scratch / flightRingFileName(rank, 0)).string());
  REQUIRE(ring);
  const int64_t now_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
  return encodePosition(positionOf(*ring, now_ns)) + "\n";
}

std::vector<int> ranksIn(const std::string& summary, const std::vector<int>& local_ranks) {
  std::vector<int> ranks;
  for (const RankPosition& p : decodeSummary(summary, 4, local_ranks).positions) ranks.push_back(p.rank);
  std::sort(ranks.begin(), ranks.end());  // in the order the rings were read
  return ranks;
}

}  // namespace

TEST_CASE("hang watch across nodes: another node's request is answered with where this node's ranks stand", "[unit]") {
  AgentLog log;
  AgentParts parts(2, [](const SpawnRequest&) { return ManualAgentEnv::Script{}; });
  ScriptedExchange exchange;
  RoundReports reports(parts.reporter, 4, 2);  // ranks 0 and 1 here, 2 and 3 on the other node
  parts.hang_reports = &reports;
  parts.hang_board = &exchange;
  parts.start(true);
  const std::string flight_dir = parts.base_env.at(env::kFlightDir);
  writeTestRing(flight_dir, 0, 4, 5, true);
  writeTestRing(flight_dir, 1, 4, 5, false);

  // Nobody asks: nothing is published, however long the workers run.
  parts.watchUntil([] { return false; }, seconds(30));
  CHECK(exchange.published.empty());

  exchange.requested = true;
  const auto asked_at = parts.env.clock().now();
  parts.watchUntil([&] { return !exchange.published.empty(); }, seconds(30));
  // Looked for at least every 2 s (node_summaries.h's kRequestPoll).
  CHECK(parts.env.clock().now() - asked_at <= seconds(2));
  REQUIRE(exchange.published.size() == 1);
  SummaryPositions sent = decodeSummary(exchange.published[0], 4, {2, 3});
  CHECK(sent.rejected == 0);
  REQUIRE(sent.positions.size() == 2);
  // In the order the rings were read: by rank here.
  std::sort(sent.positions.begin(), sent.positions.end(),
            [](const RankPosition& a, const RankPosition& b) { return a.rank < b.rank; });
  CHECK(sent.positions[0].rank == 0);
  CHECK(sent.positions[0].pending);
  CHECK(sent.positions[0].last_completed_seq == 5);
  CHECK(sent.positions[1].rank == 1);
  CHECK_FALSE(sent.positions[1].pending);
  CHECK(log.count("another node judges a hang; published where this node's ranks stand") == 1);

  // Answered once; the workers are neither judged nor stopped by another node's request.
  parts.watchUntil([] { return false; }, seconds(30));
  CHECK(exchange.published.size() == 1);
  CHECK(parts.env.hungStops().empty());
  CHECK(parts.events("hang_verdict").empty());
}

TEST_CASE(
    "hang watch across nodes: --hang_timeout names the rank behind on another node, with its host and "
    "frames, first in this node's report",
    "[unit]") {
  AgentParts parts(2, [](const SpawnRequest&) { return ManualAgentEnv::Script{}; });
  ScriptedExchange exchange;
  RoundReports reports(parts.reporter, 4, 2);
  parts.hang_reports = &reports;
  parts.hang_board = &exchange;
  parts.config.hang_timeout = seconds(10);
  // Ranks 0, 1 (here) and 2 wait in all_reduce #6; rank 3, on node-b, never called it.
  exchange.answers = {positionLine(parts.dir(), 2, 5, true) + positionLine(parts.dir(), 3, 5, false) +
                      encodeStackSummary("node-b", {{3, 1,
                                                     "File \"/job/train.py\", line 12, in main\n"
                                                     "  load_batch()\n"}})};
  parts.start(true);
  const std::string flight_dir = parts.base_env.at(env::kFlightDir);
  writeTestRing(flight_dir, 0, 4, 5, true);
  writeTestRing(flight_dir, 1, 4, 5, true);

  parts.watchUntil([&] { return !parts.env.hungStops().empty(); }, std::chrono::minutes(1));

  // The other node was asked once, this node's own summary posted beside the ask, and given
  // the judging wait (node_summaries.h's kWait).
  REQUIRE(exchange.asked.size() == 1);
  CHECK(exchange.asked[0].first == seconds(5));
  CHECK(ranksIn(exchange.asked[0].second, {2, 3}) == std::vector<int>{0, 1});
  const auto verdicts = parts.events("hang_verdict");
  REQUIRE(verdicts.size() == 1);
  CHECK(has(verdicts[0], "rank 3 is behind"));
  CHECK(has(verdicts[0], "\"culprits\":\"3\""));
  // Both local workers are stopped as hung with that verdict.
  REQUIRE(parts.env.hungStops().size() == 1);
  CHECK(parts.env.hungStops()[0].workers.size() == 2);
  CHECK(has(parts.env.hungStops()[0].reason, "rank 3 is behind"));

  const std::vector<WorkerFailure> failures = parts.hang->failures("node-a");
  REQUIRE(failures.size() == 3);
  CHECK(failures[0].rank == 3);
  CHECK(failures[0].host == "node-b");
  CHECK(failures[0].local_rank == 1);
  CHECK(failures[0].elsewhere == "blamed by the flight recorder rings");
  CHECK(has(failures[0].hang_reason, "rank 3 is behind"));
  CHECK(failures[0].python_stack == "File \"/job/train.py\", line 12, in main\n  load_batch()\n");
  CHECK(failures[1].host == "node-a");
  CHECK(failures[2].host == "node-a");

  // The next attempt forgets the other node's culprit.
  parts.hang->endAttempt();
  CHECK(parts.hang->failures("node-a").size() == 2);
}

TEST_CASE("hang watch across nodes: a verdict without some nodes' answers says how many are missing", "[unit]") {
  AgentLog log;
  AgentParts parts(2, [](const SpawnRequest&) { return ManualAgentEnv::Script{}; });
  ScriptedExchange exchange;
  RoundReports reports(parts.reporter, 4, 3);  // three nodes; only one other answers
  parts.hang_reports = &reports;
  parts.hang_board = &exchange;
  parts.config.hang_timeout = seconds(10);
  exchange.answers = {positionLine(parts.dir(), 2, 5, true)};
  parts.start(true);
  const std::string flight_dir = parts.base_env.at(env::kFlightDir);
  writeTestRing(flight_dir, 0, 4, 5, true);
  writeTestRing(flight_dir, 1, 4, 5, false);

  parts.watchUntil([&] { return !parts.env.hungStops().empty(); }, std::chrono::minutes(1));

  CHECK(log.count("hang verdict without 1 of 3 nodes (no answer within 5 s)") == 1);
  // What did answer still counts: rank 1 is behind ranks 0 and 2.
  const auto verdicts = parts.events("hang_verdict");
  REQUIRE(verdicts.size() == 1);
  CHECK(has(verdicts[0], "\"culprits\":\"1\""));
}

}  // namespace ddprun::agent::testing
