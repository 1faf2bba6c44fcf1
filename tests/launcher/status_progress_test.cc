// `ddprun status`'s lags and --trace from the progress the agents publish on the store
// (agent/hang/rings/progress_summary.h), read through an in-memory store: the straggler named,
// every rank's current collective, forged values kept out; and --straggler_threshold's parse.
#include <catch2/catch.hpp>

#include "agent/hang/rings/progress_summary.h"
#include "launcher/status_command.h"
#include "tests/launcher/parse_args.h"
#include "tests/support/in_memory_store.h"
#include "tests/support/scoped_env.h"

using namespace ddprun;
using namespace ddprun::agent;
using ddprun::testing::parseArgs;

namespace {

const std::string kPrefix = "rdzv/job/r2/progress/";

rendezvous::JobStatus runningStatus(int nodes, int world_size) {
  rendezvous::JobStatus s;
  s.run_id = "job";
  s.store = "127.0.0.1:29400";
  s.round = 2;
  s.round_state = "running";
  s.nodes_in_round = nodes;
  s.world_size = world_size;
  s.now_ms = 1700000001000;
  return s;
}

// A node's value: ranks `first`.. with mean waits `waits` (seconds), each at all_reduce #100
// (started 0.2 s before the reading, 1 s ago).
std::string nodeValue(int first, const std::vector<double>& waits, double threshold_s = 0.02) {
  NodeProgress n;
  n.unix_ms = 1700000000000;
  n.threshold_s = threshold_s;
  for (size_t i = 0; i < waits.size(); ++i) {
    const int rank = first + static_cast<int>(i);
    n.ranks.push_back(RankProgress{rank, 0, 99, 64, waits[i]});
    RankPosition p;
    p.rank = rank;
    p.group_rank = rank;
    p.last_completed_seq = 99;
    p.last_completed_op = FlightOp::kAllReduce;
    p.last_completed_age_s = 0.3;
    FlightRecord pending;
    pending.seq = 100;
    pending.info.op = FlightOp::kAllReduce;
    pending.state = FlightState::kStarted;
    pending.started_ns = 1;
    p.pending = pending;
    p.pending_age_s = 0.2;
    n.positions.push_back(p);
  }
  return encodeNodeProgress(n);
}

}  // namespace

TEST_CASE("status reads each node's progress and names the rank behind the median", "[unit][status][straggler]") {
  rendezvous::InMemoryStore store;
  // Node 0 holds ranks 0-1, node 1 rank 2, which enters 50 ms after the others.
  store.set(kPrefix + "0", nodeValue(0, {0.052, 0.053}));
  store.set(kPrefix + "1", nodeValue(2, {0.003}));
  store.append(kPrefix + "nodes", "1\n0\n1\n");
  const auto status = runningStatus(2, 3);
  const launcher::JobProgress progress = launcher::readJobProgress(store, status);
  REQUIRE(progress.nodes.size() == 2);
  CHECK(progress.nodes[0].group_rank == 0);

  const std::string table = launcher::formatProgressTable(status, progress, false);
  INFO(table);
  CHECK_THAT(table, Catch::Contains("RANK  GROUP  LAG"));
  CHECK_THAT(table, Catch::Contains("2     0      0.049s straggler  0.003s     64           #99"));
  CHECK_THAT(table, Catch::Contains("stragglers: rank 2 (threshold 0.020s)"));
  CHECK_THAT(table, Catch::Contains("(as of 1.0s ago)"));

  const std::string trace = launcher::formatProgressTable(status, progress, true);
  INFO(trace);
  // Age: 0.2 s pending when read, read 1 s ago.
  for (const char* row :
       {"0     0      #100  all_reduce  started  1.2s", "2     0      #100  all_reduce  started  1.2s"})
    CHECK_THAT(trace, Catch::Contains(row));

  const std::string json = launcher::formatStatusJson(status, progress, true);
  CHECK_THAT(json, Catch::Contains("\"straggler_threshold_s\":0.02"));
  CHECK_THAT(json, Catch::Contains("\"stragglers\":[2]"));
  CHECK_THAT(json, Catch::Contains("\"trace\":[{\"rank\":0,\"group\":0,\"seq\":100,\"op\":\"all_reduce\""));
}

TEST_CASE("status shows a balanced job without stragglers, and says when nothing was published",
          "[unit][status][straggler]") {
  rendezvous::InMemoryStore store;
  const auto status = runningStatus(1, 3);
  CHECK_THAT(launcher::formatProgressTable(status, launcher::readJobProgress(store, status), false),
             Catch::Contains("no collective progress published in this round"));
  store.set(kPrefix + "0", nodeValue(0, {0.050, 0.051, 0.049}));
  store.append(kPrefix + "nodes", "0\n");
  const std::string table = launcher::formatProgressTable(status, launcher::readJobProgress(store, status), false);
  CHECK_THAT(table, Catch::Contains("stragglers: none (threshold 0.020s)"));
  CHECK_THAT(table, !Catch::Contains(" straggler "));
}

TEST_CASE("status keeps forged progress values out", "[unit][status][straggler]") {
  rendezvous::InMemoryStore store;
  store.set(kPrefix + "0", nodeValue(0, {0.05, 0.05}));
  // A node number outside the round, a value over the bound, and lines naming ranks outside the world.
  store.set(kPrefix + "7", nodeValue(0, {9.0}));
  store.set(kPrefix + "1", nodeValue(2, {0.05}) + std::string(kMaxProgressBytes, '\n'));
  store.set(kPrefix + "2", "dp1 1 20\ns 4242 0 1 64 10\n\x1b[2J\nv2 c 99 0 0 5 2 0.1\n");
  store.append(kPrefix + "nodes", "0\n7\n1\n2\n-1\nabc\n");
  const auto status = runningStatus(3, 3);
  const launcher::JobProgress progress = launcher::readJobProgress(store, status);
  REQUIRE(progress.nodes.size() == 2);  // nodes 0 and 2; 1's value is over the bound, 7 is no node
  CHECK(progress.nodes[1].progress.ranks.empty());
  CHECK(progress.rejected == 3);
  const std::string table = launcher::formatProgressTable(status, progress, true);
  CHECK_THAT(table, !Catch::Contains("\x1b"));
  CHECK_THAT(table, !Catch::Contains("4242"));
  CHECK_THAT(table, !Catch::Contains("99 "));
}

TEST_CASE("status --trace shows torch's live trace for the ranks that have one, the rings elsewhere, and says which",
          "[unit][status]") {
  rendezvous::InMemoryStore store;
  // Node 0: ranks 0-1 with rings at all_reduce #100; rank 1's worker serves a live trace, which
  // has DDP's all-reduce #130 (issued from C++, unseen by the ring) and a second group.
  NodeProgress n = decodeNodeProgress(nodeValue(0, {0.05, 0.05}), 3)->progress;
  TracePosition t;
  t.rank = 1;
  t.group = 0;
  t.seq = 130;
  t.op = "all_reduce";
  t.state = TraceState::kStarted;
  t.age_s = 2.5;
  n.traces.push_back(t);
  t.group = 1;
  t.seq = 4;
  t.op = "_allgather_base";
  t.state = TraceState::kCompleted;
  t.age_s = 0.5;
  n.traces.push_back(t);
  store.set(kPrefix + "0", encodeNodeProgress(n));
  store.append(kPrefix + "nodes", "0\n");
  const auto status = runningStatus(1, 3);
  const launcher::JobProgress progress = launcher::readJobProgress(store, status);
  REQUIRE(progress.nodes.size() == 1);

  const std::string table = launcher::formatProgressTable(status, progress, true);
  INFO(table);
  CHECK_THAT(table, Catch::Contains("RANK  GROUP  SEQ   OP               STATE      AGE   SOURCE"));
  // Ages plus the summary's 1 s.
  CHECK_THAT(table, Catch::Contains("0     0      #100  all_reduce       started    1.2s  ring\n"));
  CHECK_THAT(table, Catch::Contains("1     0      #130  all_reduce       started    3.5s  torch\n"));
  CHECK_THAT(table, Catch::Contains("1     1      #4    _allgather_base  completed  1.5s  torch\n"));
  // Rank 1's ring row gives way to its trace.
  CHECK_THAT(table, !Catch::Contains("1     0      #100"));

  const std::string json = launcher::formatStatusJson(status, progress, true);
  CHECK_THAT(json, Catch::Contains(R"({"rank":0,"group":0,"seq":100,"op":"all_reduce","age_s":1.200,"state":"started",)"
                                   R"("source":"ring"})"));
  CHECK_THAT(json, Catch::Contains(R"({"rank":1,"group":0,"seq":130,"op":"all_reduce","age_s":3.500,"state":"started",)"
                                   R"("source":"torch"})"));
  CHECK_THAT(json, Catch::Contains(R"("group":1,"seq":4,"op":"_allgather_base")"));
}

TEST_CASE("straggler_threshold: 0.5 s unless given, 0 turns it off, bad values are one-line usage errors", "[cli]") {
  ddprun::testing::ScopedEnv unset("PET_STRAGGLER_THRESHOLD", std::nullopt);
  CHECK(parseArgs({"--no_python", "true"}).config.straggler_threshold.count() == 500);
  CHECK(parseArgs({"--straggler_threshold", "0.02", "--no_python", "true"}).config.straggler_threshold.count() == 20);
  CHECK(parseArgs({"--straggler-threshold=0", "--no_python", "true"}).config.straggler_threshold.count() == 0);
  CHECK_THROWS_WITH(parseArgs({"--straggler_threshold", "-1", "--no_python", "true"}),
                    Catch::Contains("--straggler_threshold"));
  CHECK_THROWS_WITH(parseArgs({"--straggler_threshold", "soon", "--no_python", "true"}),
                    Catch::Contains("--straggler_threshold"));
  CHECK_THROWS_WITH(parseArgs({"--straggler_threshold", "0.0001", "--no_python", "true"}),
                    Catch::Contains("--straggler_threshold 0.0001 is less than a millisecond"));
  ddprun::testing::ScopedEnv pet("PET_STRAGGLER_THRESHOLD", "2");
  CHECK(parseArgs({"--no_python", "true"}).config.straggler_threshold.count() == 2000);
}
