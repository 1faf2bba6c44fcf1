#include "agent/torch_trace/dump_verdict.h"

#include <catch2/catch.hpp>

#include "tests/agent/torch_trace/dumps_support.h"

namespace ddprun::agent {
namespace {

// flight_dumps.py sets every file's time 10 s after the pending operations started.
constexpr int64_t kDumpAt = 1'700'000'020'000'000'000;

DumpVerdict verdictOf(const std::string& scenario, int ranks, const std::string& style = "python") {
  testing::TempDir dir;
  auto written = testing::writeDumps(dir.path(), scenario, style);
  REQUIRE(written.exit_code == 0);
  DumpVerdictOptions options;
  options.now_ns = kDumpAt;
  return dumpVerdict(testing::readDumps(dir.path(), ranks), options);
}

TEST_CASE("dump verdict: a rank that never called the collective is behind, with both call sites", "[dump_verdict]") {
  DumpVerdict v = verdictOf("behind", 2);
  CHECK(v.culprits == std::vector<int>{1});
  REQUIRE(v.findings.size() == 1);
  CHECK(v.text() ==
        "hang: rank 1 has not called all_reduce #2 of group 0 (default_pg); rank 0 has waited in it for 10.0 s — "
        "rank 1 is behind\n"
        "  rank 0: waiting in all_reduce #2 (started), called at /job/train.py:14 in main\n"
        "  rank 1: behind, last called all_reduce #1 (completed) at /job/train.py:12 in main\n");
  CHECK(v.findings[0].ranks[1].standing == RankStanding::kBehind);
}

TEST_CASE("dump verdict: another op at the same sequence number is a mismatch", "[dump_verdict]") {
  DumpVerdict v = verdictOf("mismatch_op", 2, "torch");
  CHECK(v.culprits == std::vector<int>{1});
  REQUIRE(v.findings.size() == 1);
  CHECK(v.findings[0].line ==
        "hang: rank 1 called broadcast where rank 0 called all_reduce (#2 of group 0 (default_pg)) — rank 1 "
        "mismatches");
  CHECK(v.findings[0].ranks[1].standing == RankStanding::kMismatch);
  CHECK(v.findings[0].ranks[1].call_site->line == 20);
}

TEST_CASE("dump verdict: the odd size out is the mismatch", "[dump_verdict]") {
  DumpVerdict v = verdictOf("mismatch_size", 3);
  CHECK(v.culprits == std::vector<int>{1});
  CHECK(v.findings.at(0).line ==
        "hang: rank 1 called all_reduce with input sizes [[4]] where ranks 0,2 have [[8]] (#2 of group 0 "
        "(default_pg)) — rank 1 mismatches");
}

TEST_CASE("dump verdict: another dtype is a mismatch", "[dump_verdict]") {
  DumpVerdict v = verdictOf("mismatch_dtype", 2);
  CHECK(v.culprits == std::vector<int>{1});
  CHECK(v.findings.at(0).line ==
        "hang: rank 1 called all_reduce of dtype Int where rank 0 has Float (#2 of group 0 (default_pg)) — rank 1 "
        "mismatches");
}

TEST_CASE("dump verdict: every rank inside the same collective blames no rank", "[dump_verdict]") {
  DumpVerdict v = verdictOf("all_wait", 2);
  CHECK(v.culprits.empty());
  CHECK(v.findings.at(0).line ==
        "hang: ranks 0-1 wait in all_reduce #2 of group 0 (default_pg) for 10.0 s, called alike by every rank — no "
        "rank is behind");
}

TEST_CASE("dump verdict: a send whose receiver never posted the recv", "[dump_verdict]") {
  DumpVerdict v = verdictOf("p2p", 2, "torch");
  CHECK(v.culprits == std::vector<int>{1});
  REQUIRE(v.findings.size() == 1);
  CHECK(v.findings[0].p2p);
  CHECK(v.text() ==
        "hang: rank 1 has not called the recv from rank 0; rank 0 has waited in send to rank 1 (p2p #2 of group 0 "
        "(default_pg)) for 10.0 s — rank 1 is behind\n"
        "  rank 0: waiting in send to rank 1 (p2p #2, started), called at /job/train.py:31 in main\n"
        "  rank 1: behind, last called p2p recv #1 (completed) at /job/train.py:40 in main\n");
}

TEST_CASE("dump verdict: a recv of another size than the send is a mismatch", "[dump_verdict]") {
  DumpVerdict v = verdictOf("p2p_size", 2);
  CHECK(v.culprits == std::vector<int>{1});
  CHECK(v.findings.at(0).line ==
        "hang: rank 1 called the recv from rank 0 with sizes [[8]] where the send has [[16]]; rank 0 has waited in "
        "send to rank 1 (p2p #1 of group 0 (default_pg)) for 10.0 s — rank 1 mismatches");
}

TEST_CASE("dump verdict: across groups, a rank waiting in another group only passes the hang on", "[dump_verdict]") {
  DumpVerdict v = verdictOf("groups", 3);
  REQUIRE(v.findings.size() == 2);
  CHECK(v.findings[0].group == "group 0 (default_pg)");
  CHECK(v.findings[0].culprits == std::vector<int>{1, 2});
  CHECK(v.findings[1].group == "group 1 (tp)");
  CHECK(v.findings[1].line ==
        "hang: rank 2 has not called all_reduce #1 of group 1 (tp); rank 1 has waited in it for 10.0 s — rank 2 is "
        "behind");
  CHECK(v.culprits == std::vector<int>{2});
  CHECK(v.text().find("  rank 1: behind, last called all_reduce #1 of group 1 (tp) (started) at /job/train.py:50 "
                      "in main\n") != std::string::npos);
  CHECK(v.text().rfind("hang: root cause rank 2\n") == v.text().size() - 24);
}

TEST_CASE("dump verdict: dumps that agree everywhere and have nothing pending are no hang", "[dump_verdict]") {
  DumpVerdict v = verdictOf("done", 2);
  CHECK(v.findings.empty());
  CHECK(v.culprits.empty());
  CHECK(v.text() == "no hang: the dumps of 2 ranks agree on every operation of 1 group, and none is pending\n");
}

TEST_CASE("dump verdict: a ring buffer that lost the job's start is judged from what it kept", "[dump_verdict]") {
  DumpVerdict v = verdictOf("truncated_ring", 2);
  CHECK(v.culprits == std::vector<int>{1});
  CHECK(v.findings.at(0).line.find("rank 1 has not called all_reduce #501") != std::string::npos);
}

// Pure data: the ranks the caller knows finished, and a rank without a dump.
FlightEntry entry(int64_t seq, FlightEntryState state) {
  FlightEntry e;
  e.record_id = seq - 1;
  e.pg_name = "0";
  e.collective_seq_id = seq;
  e.op = "all_reduce";
  e.profiling_name = "nccl:all_reduce";
  e.state = state;
  e.time_created_ns = 1000;
  return e;
}

FlightDump dumpOf(int rank, std::vector<FlightEntry> entries) {
  FlightDump d;
  d.rank = rank;
  d.groups.push_back({"0", "", {0, 1, 2}});
  d.entries = std::move(entries);
  return d;
}

TEST_CASE("dump verdict: a rank that exited normally is done, and a rank without a dump is unknown", "[dump_verdict]") {
  std::vector<FlightDump> dumps = {
      dumpOf(0, {entry(1, FlightEntryState::kCompleted), entry(2, FlightEntryState::kScheduled)}),
      dumpOf(1, {entry(1, FlightEntryState::kCompleted)})};
  DumpVerdictOptions options;
  options.finished_ranks = {1};
  DumpVerdict v = dumpVerdict(dumps, options);
  REQUIRE(v.findings.size() == 1);
  CHECK(v.culprits.empty());
  CHECK(v.findings[0].ranks[1].standing == RankStanding::kDone);
  CHECK(v.findings[0].ranks[2].standing == RankStanding::kUnknown);
  CHECK(v.findings[0].line ==
        "hang: rank 0 waits in all_reduce #2 of group 0; rank 2 cannot tell (no dump reaching it)");
  options.finished_ranks.clear();
  CHECK(dumpVerdict(dumps, options).culprits == std::vector<int>{1});
}

}  // namespace
}  // namespace ddprun::agent
