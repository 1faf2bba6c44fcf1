// The torch-dump verdict across nodes (agent/hang/verdicts/dump_judgement.h) alone, on dumps
// that tests/agent/torch_trace/flight_dumps.py writes with Python 3 and on other nodes'
// summaries encoded as their agents encode them: whom it blames and how the report shows a
// culprit of another node, and what it says instead of a verdict when some rank's dump is
// missing, the other nodes being asked only when this node's own dumps all read.
#include "agent/hang/verdicts/dump_judgement.h"

#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "agent/torch_trace/dump_summary.h"
#include "tests/agent/torch_trace/dumps_support.h"

namespace ddprun::agent {
namespace {

// flight_dumps.py sets every file's time 10 s after the pending operations started.
constexpr int64_t kDumpAt = 1'700'000'020'000'000'000;
const std::string kTrigger = "--hang_timeout: no rank on this node completed an operation for 10 s";
const std::string kFrames = "File \"/job/train.py\", line 12, in main\n  load_batch()\x1b[2J\n";

// The dumps of `scenario`'s `ranks` ranks.
std::vector<FlightDump> dumpsOf(const std::string& scenario, int ranks) {
  testing::TempDir dir;
  REQUIRE(testing::writeDumps(dir.path(), scenario).exit_code == 0);
  return testing::readDumps(dir.path(), ranks);
}

// Rank 0 on this node with its dump; ranks 1.. on other nodes, whose summaries `others` are.
struct TwoNodes {
  explicit TwoNodes(const std::vector<FlightDump>& all, std::vector<std::string> answers) : others(std::move(answers)) {
    c.local.dumps = {all[0]};
    c.local_ranks = {0};
    c.world_size = static_cast<int>(all.size());
    c.now_ns = kDumpAt;
    c.others = [this]() -> const std::vector<std::string>& {
      ++asked;
      return others;
    };
  }
  DumpCase c;
  std::vector<std::string> others;
  int asked = 0;
};

std::vector<std::string> lines(const DumpJudgement& j) {
  std::vector<std::string> out;
  for (const auto& [level, line] : j.log)
    out.push_back(std::string(spdlog::level::to_string_view(level).data()) + ": " + line);
  return out;
}

}  // namespace

TEST_CASE("dump judgement: the rank behind on another node is named with its host, local rank, call site and frames",
          "[unit]") {
  const std::vector<FlightDump> all = dumpsOf("behind", 2);
  TwoNodes nodes(all, {encodeDumpSummary("node b", {LocalDump{all[1], 1, false, kFrames}})});

  const DumpJudgement j = judgeDumps(kTrigger, nodes.c);

  CHECK(nodes.asked == 1);
  CHECK(j.culprits == std::vector<int>{1});
  const std::string finding =
      "hang: rank 1 has not called all_reduce #2 of group 0 (default_pg); rank 0 has waited in it for 10.0 s — "
      "rank 1 is behind";
  CHECK(j.sentences == finding);
  CHECK(j.text == finding +
                      "\n  rank 0: waiting in all_reduce #2 (started), called at /job/train.py:14 in main\n"
                      "  rank 1: behind, last called all_reduce #1 (completed) at /job/train.py:12 in main");
  CHECK(lines(j) == std::vector<std::string>{"error: " + kTrigger + "; " + j.text});
  REQUIRE(j.remote_culprits.size() == 1);
  const WorkerFailure& f = j.remote_culprits[0];
  CHECK(f.rank == 1);
  CHECK(f.host == "node b");
  CHECK(f.local_rank == 1);
  CHECK(f.hang_reason == finding);
  CHECK(f.elsewhere == "behind, last called all_reduce #1 (completed) at /job/train.py:12 in main");
  // The other node's text, escaped: no terminal control reaches the report.
  CHECK(f.python_stack.find('\x1b') == std::string::npos);
  CHECK(f.python_stack.rfind("File \"/job/train.py\", line 12, in main\n  load_batch()", 0) == 0);
}

TEST_CASE(
    "dump judgement: a rank whose dump came from no node leaves the verdict to the Python stacks, its frames kept",
    "[unit]") {
  const std::vector<FlightDump> all = dumpsOf("behind", 2);
  TwoNodes nodes(all, {encodeStackSummary("node b", {{1, 1, kFrames}})});

  const DumpJudgement j = judgeDumps(kTrigger, nodes.c);

  CHECK(j.culprits.empty());
  CHECK(j.remote_culprits.empty());
  CHECK(lines(j) == std::vector<std::string>{
                        "warning: torch flight-recorder dumps: no dump of rank 1 came from the other nodes (this node "
                        "read rank 0); the verdict comes from the Python stacks"});
  REQUIRE(j.remote_stacks.count(1) == 1);
  CHECK(j.remote_stacks.at(1).node == "node b");
  CHECK(j.remote_stacks.at(1).local_rank == 1);
}

TEST_CASE(
    "dump judgement: this node's missing or unreadable dumps leave the verdict to the Python stacks, nobody asked",
    "[unit]") {
  const std::vector<FlightDump> all = dumpsOf("behind", 2);
  TwoNodes nodes(all, {});
  nodes.c.local_ranks = {0, 1};
  nodes.c.world_size = 4;
  nodes.c.waited = std::chrono::milliseconds(3000);

  SECTION("one rank's dump missing, another's unreadable") {
    nodes.c.local.missing = {1};
    nodes.c.local.unreadable = {"rank 2: /tmp/d\x1b: not a pickle"};
    CHECK(lines(judgeDumps(kTrigger, nodes.c)) ==
          std::vector<std::string>{"warning: torch flight-recorder dumps: no dump from rank 1 within 3000 ms; rank 2: "
                                   "/tmp/d\\x1b: not a pickle; the verdict comes from the Python stacks"});
  }
  SECTION("no dump at all") {
    nodes.c.local.dumps.clear();
    nodes.c.local.missing = {0, 1};
    CHECK(lines(judgeDumps(kTrigger, nodes.c)) ==
          std::vector<std::string>{"info: no torch flight-recorder dump from rank 0-1 within 3000 ms; the verdict "
                                   "comes from the Python stacks"});
  }
  CHECK(nodes.asked == 0);
}

TEST_CASE("dump judgement: dumps that name no rank behind give no verdict, and a node alone asks nobody", "[unit]") {
  const std::vector<FlightDump> all = dumpsOf("all_wait", 2);
  TwoNodes nodes(all, {});
  nodes.c.local.dumps = all;
  nodes.c.local_ranks = {0, 1};

  const DumpJudgement j = judgeDumps(kTrigger, nodes.c);

  CHECK(nodes.asked == 0);
  CHECK(j.culprits.empty());
  REQUIRE(j.log.size() == 1);
  CHECK(j.log[0].first == spdlog::level::warn);
  CHECK(j.log[0].second.rfind(kTrigger + "; the flight-recorder dumps name no rank behind: hang: ranks 0-1 wait in "
                                         "all_reduce #2",
                              0) == 0);
}

}  // namespace ddprun::agent
