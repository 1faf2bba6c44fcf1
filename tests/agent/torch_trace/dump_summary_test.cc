// torch's dumps across nodes (agent/torch_trace/dump_summary.h): what a node sends of its
// ranks' dumps through the hang-summary exchange, and the verdict of the node that merges them
// with its own: the same as over every dump read locally, within a bounded number of bytes, and
// nothing a forged summary can make it blame.
#include "agent/torch_trace/dump_summary.h"

#include <algorithm>

#include <catch2/catch.hpp>

#include "agent/hang/rings/hang_verdict.h"
#include "agent/torch_trace/dump_verdict.h"
#include "tests/agent/torch_trace/dumps_support.h"

namespace ddprun::agent {
namespace {

constexpr int64_t kDumpAt = 1'700'000'020'000'000'000;  // flight_dumps.py's files' time

std::vector<FlightDump> scenarioDumps(const std::string& scenario, int ranks) {
  testing::TempDir dir;
  REQUIRE(testing::writeDumps(dir.path(), scenario).exit_code == 0);
  return testing::readDumps(dir.path(), ranks);
}

// Rank 0's dump read here, every other rank's through another node's summary.
std::vector<FlightDump> merged(const std::vector<FlightDump>& all, RemoteDumps* out = nullptr) {
  std::vector<LocalDump> theirs;
  for (size_t i = 1; i < all.size(); ++i) theirs.push_back(LocalDump{all[i], static_cast<int>(i - 1), false, ""});
  const std::string summary = encodeDumpSummary("node-b:7", theirs);
  RemoteDumps remote = decodeDumpSummary(summary, static_cast<int>(all.size()), {0});
  std::vector<FlightDump> dumps{all[0]};
  dumps.insert(dumps.end(), remote.dumps.begin(), remote.dumps.end());
  if (out) *out = std::move(remote);
  return dumps;
}

FlightEntry collective(int64_t seq, FlightEntryState state, int line) {
  FlightEntry e;
  e.pg_name = "0";
  e.pg_desc = "default_pg";
  e.collective_seq_id = seq;
  e.op = "all_reduce";
  e.profiling_name = "nccl:all_reduce";
  e.input_sizes = e.output_sizes = {{1024, 1024}};
  e.input_dtypes = e.output_dtypes = {"Float"};
  e.state = state;
  e.time_created_ns = kDumpAt - 20'000'000'000 + seq;
  e.time_started_ns = e.time_created_ns;
  if (state == FlightEntryState::kCompleted) e.time_completed_ns = e.time_created_ns + 1000;
  e.frames = {{"all_reduce", "/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py", 2050},
              {"train_step", "/job/train.py", line},
              {"<module>", "/job/train.py", 99}};
  return e;
}

// A long job: `completed` all_reduces done, and (when `waiting`) the next one started.
FlightDump longDump(int rank, int world, int completed, bool waiting) {
  FlightDump d;
  d.rank = rank;
  FlightGroupConfig g{"0", "default_pg", {}};
  for (int r = 0; r < world; ++r) g.ranks.push_back(r);
  d.groups.push_back(g);
  for (int s = 1; s <= completed; ++s) d.entries.push_back(collective(s, FlightEntryState::kCompleted, 12));
  if (waiting) d.entries.push_back(collective(completed + 1, FlightEntryState::kStarted, 14));
  for (size_t i = 0; i < d.entries.size(); ++i) d.entries[i].record_id = static_cast<int64_t>(i);
  return d;
}

}  // namespace

TEST_CASE("dump summary: a rank behind on another node is blamed with its call site, as if read here",
          "[dump_summary]") {
  const auto all = scenarioDumps("behind", 2);
  RemoteDumps remote;
  const auto dumps = merged(all, &remote);
  CHECK(remote.rejected == 0);
  REQUIRE(remote.dumps.size() == 1);
  CHECK(remote.ranks.at(1).node == "node-b:7");
  CHECK(remote.ranks.at(1).local_rank == 0);
  DumpVerdictOptions options;
  options.now_ns = kDumpAt;
  const DumpVerdict verdict = dumpVerdict(dumps, options);
  CHECK(verdict.culprits == std::vector<int>{1});
  CHECK(verdict.text() == dumpVerdict(all, options).text());
  CHECK_THAT(verdict.text(),
             Catch::Contains("rank 1: behind, last called all_reduce #1 (completed) at /job/train.py:12 in main"));
}

TEST_CASE("dump summary: every scenario merged across nodes gives the verdict of the dumps read in one place",
          "[dump_summary]") {
  const std::pair<const char*, int> scenarios[] = {
      {"behind", 2}, {"mismatch_op", 2}, {"mismatch_size", 3}, {"mismatch_dtype", 2}, {"all_wait", 2},
      {"p2p", 2},    {"p2p_size", 2},    {"groups", 3},        {"truncated_ring", 2}, {"done", 2}};
  for (const auto& [scenario, ranks] : scenarios) {
    INFO(scenario);
    const auto all = scenarioDumps(scenario, ranks);
    DumpVerdictOptions options;
    options.now_ns = kDumpAt;
    const DumpVerdict here = dumpVerdict(all, options);
    const DumpVerdict across = dumpVerdict(merged(all), options);
    CHECK(across.text() == here.text());
    CHECK(across.culprits == here.culprits);
  }
}

TEST_CASE(
    "dump summary: a long job sends the entries around where the ranks part ways, and still blames the rank "
    "behind",
    "[dump_summary]") {
  const FlightDump waiting = longDump(0, 2, 3000, true);
  const FlightDump behind = longDump(1, 2, 3000, false);
  const FlightDump compact = compactDump(behind, 8, 8);
  CHECK(compact.truncated);
  CHECK(compact.entries.size() == 9);  // #2992..#3000: 8 before the last completed, and it
  CHECK(compact.entries.front().collective_seq_id == 2992);
  CHECK(compact.entries.back().collective_seq_id == 3000);
  REQUIRE(compact.entries.back().frames.size() == 1);
  CHECK(compact.entries.back().frames[0].filename == "/job/train.py");  // the call site, torch's frames cut

  const std::string summary = encodeDumpSummary("b", {LocalDump{behind, 0, false, ""}});
  CHECK(summary.size() < 4096);
  RemoteDumps remote = decodeDumpSummary(summary, 2, {0});
  CHECK(remote.rejected == 0);
  std::vector<FlightDump> dumps{waiting};
  dumps.insert(dumps.end(), remote.dumps.begin(), remote.dumps.end());
  const DumpVerdict verdict = dumpVerdict(dumps);
  CHECK(verdict.culprits == std::vector<int>{1});
  CHECK_THAT(verdict.text(), Catch::Contains("rank 1 has not called all_reduce #3001 of group 0 (default_pg)"));
  CHECK_THAT(verdict.text(), Catch::Contains("rank 1: behind, last called all_reduce #3000 (completed) at "
                                             "/job/train.py:12 in train_step"));
}

TEST_CASE("dump summary: a node of many ranks stays within its byte budget, fewer entries first, then fewer ranks",
          "[dump_summary]") {
  std::vector<LocalDump> many;
  // 1024 ranks of 2048: at 8 entries before and after their last completed collective, about
  // 1.7 MB; at the fewest (it, and the one pending after it), within the budget.
  for (int r = 0; r < 1024; ++r) many.push_back(LocalDump{longDump(r, 2048, 20, r % 2 == 0), r, false, ""});
  const std::string summary = encodeDumpSummary("big", many);
  CHECK(summary.size() <= kMaxDumpSummaryBytes);
  RemoteDumps remote = decodeDumpSummary(summary, 2048, {});
  CHECK(remote.rejected == 0);
  CHECK(remote.dumps.size() == 1024);  // every rank, with fewer entries each
  size_t most = 0;
  for (const FlightDump& d : remote.dumps) most = std::max(most, d.entries.size());
  CHECK(most == 2);
  CHECK(remote.dumps[0].entries.back().state == FlightEntryState::kStarted);  // where rank 0 waits

  const std::string cut = encodeDumpSummary("big", many, 20'000);
  CHECK(cut.size() <= 20'000);
  RemoteDumps some = decodeDumpSummary(cut, 2048, {});
  CHECK(some.rejected == 0);
  CHECK(!some.dumps.empty());
  CHECK(some.dumps.size() < 1024);  // the ranks that did not fit are left out, for the judge to name
}

TEST_CASE("dump summary: names with spaces, commas, '%', newlines and nothing at all cross unchanged",
          "[dump_summary]") {
  FlightDump d = longDump(3, 4, 1, true);
  d.groups[0].desc = "";
  for (FlightEntry& e : d.entries) {
    e.pg_desc = "";
    e.frames = {{"odd name, 100% -", "/my job/train\nstep.py", 7}};
    e.input_dtypes = {"Float", "-"};
    e.input_sizes = {{}, {3, 0}};
  }
  RemoteDumps remote = decodeDumpSummary(encodeDumpSummary("node with space", {LocalDump{d, 2, true, ""}}), 4, {0});
  CHECK(remote.rejected == 0);
  REQUIRE(remote.dumps.size() == 1);
  CHECK(remote.ranks.at(3).node == "node with space");
  CHECK(remote.ranks.at(3).local_rank == 2);
  CHECK(remote.finished_ranks == std::vector<int>{3});
  const FlightDump& got = remote.dumps[0];
  REQUIRE(got.entries.size() == 2);
  CHECK(got.groups.at(0).desc.empty());
  CHECK(got.groups.at(0).ranks == std::vector<int>{0, 1, 2, 3});
  for (size_t i = 0; i < 2; ++i) {
    const FlightEntry& e = got.entries[i];
    CHECK(e.pg_desc.empty());
    REQUIRE(e.frames.size() == 1);
    CHECK(e.frames[0].name == "odd name, 100% -");
    CHECK(e.frames[0].filename == "/my job/train\nstep.py");
    CHECK(e.frames[0].line == 7);
    CHECK(e.input_dtypes == std::vector<std::string>{"Float", "-"});
    CHECK(e.input_sizes == std::vector<std::vector<int64_t>>{{}, {3, 0}});
    CHECK(e.output_sizes == d.entries[i].output_sizes);
    CHECK(e.state == d.entries[i].state);
    CHECK(e.time_started_ns == d.entries[i].time_started_ns);
    CHECK(e.time_completed_ns == d.entries[i].time_completed_ns);
  }
}

TEST_CASE("dump summary: a rank's Python traceback goes with its dump, its innermost lines, within their budget",
          "[dump_summary]") {
  std::string stack;
  for (int i = 0; i < 20; ++i) stack += "File \"/job/train.py\", line " + std::to_string(i) + ", in f\n";
  stack += "File \"/job/train.py\", line 19, in <module>\n  time.sleep(60)\n";
  RemoteDumps remote =
      decodeDumpSummary(encodeDumpSummary("b", {LocalDump{longDump(1, 2, 1, false), 0, false, stack}}), 2, {0});
  CHECK(remote.rejected == 0);
  REQUIRE(remote.python_stacks.count(1) == 1);
  const std::string& got = remote.python_stacks.at(1);
  CHECK(std::count(got.begin(), got.end(), '\n') == static_cast<long>(kMaxStackLines));
  CHECK_THAT(got, Catch::EndsWith("File \"/job/train.py\", line 19, in <module>\n  time.sleep(60)\n"));
  CHECK_THAT(got, !Catch::Contains("line 3, in f"));  // the outermost lines go first

  // Many ranks' stacks: those that fit their budget, whole; the dumps all go.
  std::vector<LocalDump> many;
  for (int r = 0; r < 64; ++r) many.push_back(LocalDump{longDump(r, 64, 1, false), r, false, stack});
  RemoteDumps some = decodeDumpSummary(encodeDumpSummary("b", many, kMaxDumpSummaryBytes, 4096), 64, {});
  CHECK(some.rejected == 0);
  CHECK(some.dumps.size() == 64);
  CHECK(!some.python_stacks.empty());
  CHECK(some.python_stacks.size() < 64);
  for (const auto& [rank, text] : some.python_stacks) CHECK(text == got);
}

TEST_CASE("dump summary: forged or broken lines are dropped and counted, never blamed", "[dump_summary]") {
  const std::string good = encodeDumpSummary("b", {LocalDump{longDump(1, 2, 1, false), 0, false, ""}});
  const std::string forged = good +
                             "fr1 d 4242 0 0 0\n"  // no such rank in a job of 2
                             "fr1 e 4242 0 - 1 0 0 all_reduce -1 -1 started 1 - - 0 [] - [] - - 0 -\n"
                             "fr1 d 0 0 0 0\n"  // this node's own rank
                             "fr1 e 1 0 - x 0 0 all_reduce -1 -1 started 1 - - 0 [] - [] - - 0 -\n"    // bad number
                             "fr1 e 1 0 - 1 0 0 all_reduce -1 -1 sleeping 1 - - 0 [] - [] - - 0 -\n"   // bad state
                             "fr1 e 1 0 - 1 0 0 all_reduce -1 -1 started 1 - - 0 [[1] - [] - - 0 -\n"  // bad sizes
                             "fr1 g 1 0 - 0-9\n"  // ranks out of the job
                             "fr1 q 1\n"
                             "fr1 e 1 %zz\n"
                             "fr1 s 1 two tokens\n"
                             "fr1 s 0 a-local-rank's\n";
  RemoteDumps remote = decodeDumpSummary(forged, 2, {0});
  CHECK(remote.rejected == 11);
  CHECK(remote.python_stacks.empty());
  REQUIRE(remote.dumps.size() == 1);
  CHECK(remote.dumps[0].rank == 1);
  CHECK(remote.dumps[0].entries.size() == 1);

  // A rank sent twice: neither is believed.
  RemoteDumps twice = decodeDumpSummary(good + good, 2, {0});
  CHECK(twice.dumps.empty());
  CHECK(twice.ranks.empty());

  // The ring positions' reader leaves these lines to this one, and this one the positions.
  RankPosition p;
  p.rank = 1;
  const std::string both = encodePosition(p) + "\n" + good;
  const SummaryPositions positions = decodeSummary(both, 2, {0});
  CHECK(positions.rejected == 0);
  CHECK(positions.positions.size() == 1);
  CHECK(decodeDumpSummary(both, 2, {0}).rejected == 0);
}

}  // namespace ddprun::agent
