// Stragglers and `ddprun status --trace` through the real ddprun, with C++ workers whose
// all_reduces run on the host backend and keep flight recorder rings (test_worker's
// `collectives` mode): one rank of 3 that sleeps 50 ms before every all_reduce is named (a
// `straggler` event, a warn line, the health check, `ddprun status`), on one node and when the
// judging node is another one; a balanced run names nobody; `status --trace` shows every
// rank's current collective while the job runs.
#include <unistd.h>

#include <fstream>
#include <memory>
#include <regex>

#include <catch2/catch.hpp>

#include "tests/e2e/ops_support.h"
#include "tests/e2e/stacks_support.h"

using namespace ddprun::testing;
using namespace ddprun::testing::ops;

namespace {

// `steps` all_reduces, each after `step_ms` of compute; rank `slow_rank` (-1: none) sleeps
// `slow_ms` more before every one.
std::vector<std::string> workerArgs(int steps, int step_ms, int slow_rank, int slow_ms) {
  return {testWorkerPath(),          "collectives", std::to_string(steps),   std::to_string(step_ms),
          std::to_string(slow_rank), "0",           std::to_string(slow_ms), "1"};
}

std::vector<std::string> oneNode(const std::string& id, const std::string& log_dir, int steps, int step_ms,
                                 int slow_rank, int slow_ms) {
  std::vector<std::string> args = {ddprunPath(),
                                   "--nnodes=1",
                                   "--nproc_per_node=3",
                                   "--rdzv_backend=c10d",
                                   "--rdzv_endpoint=127.0.0.1:0",
                                   "--rdzv_id=" + id,
                                   "--straggler_threshold=0.02",
                                   "--health_check_port=0",
                                   "--log_dir=" + log_dir,
                                   "--no_python"};
  for (auto& a : workerArgs(steps, step_ms, slow_rank, slow_ms)) args.push_back(a);
  return args;
}

RunResult status(const std::vector<std::string>& extra) {
  std::vector<std::string> args = {ddprunPath(), "status"};
  args.insert(args.end(), extra.begin(), extra.end());
  return run(args, {}, 30s);
}

// The events of `event` in the events file under `log_dir`, one line each.
std::vector<std::string> eventsOf(const std::string& log_dir, const std::string& event) {
  const std::string file = findFile(log_dir, "/events.jsonl");
  std::vector<std::string> lines;
  if (file.empty()) return lines;
  const std::string text = readFile(file);
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(start, end - start);
    if (line.find("\"event\":\"" + event + "\"") != std::string::npos) lines.push_back(line);
    start = end + 1;
  }
  return lines;
}

// Rows of `status --trace` for rank `rank`: "RANK GROUP #SEQ OP STATE AGE".
bool traceShows(const std::string& table, int rank) {
  const std::regex row("(^|\\n)" + std::to_string(rank) +
                       R"(\s+0\s+#\d+\s+all_reduce\s+(started|pending|completed)\s+\d+\.\d+s)");
  return std::regex_search(table, row);
}

}  // namespace

TEST_CASE("a rank that enters every all_reduce 50 ms late is named a straggler: event, log, health check, status",
          "[e2e][straggler]") {
  TempDir logs;
  const std::string id = "straggler-" + std::to_string(::getpid());
  // About 18 s: 300 all_reduces, rank 2 spends 60 ms before each, the others 10 ms.
  TestProcess ddprun(oneNode(id, logs.path(), 300, 10, 2, 50));
  const int health = healthPort(ddprun);
  REQUIRE(health > 0);
  REQUIRE(ddprun.waitForOutput("rank 2 is a straggler: it enters collectives ", 60s));

  // The health check lists it while it straggles.
  const std::string answer = httpGet(health);
  CHECK_THAT(answer, Catch::Contains("\"stragglers\":[{\"rank\":2,\"group\":0,\"lag_s\":0.0"));

  RunResult table = status({"--log_dir=" + logs.path()});
  INFO(table.out << table.err);
  REQUIRE(table.exit_code == 0);
  CHECK_THAT(table.out, Catch::Contains("stragglers: rank 2 (threshold 0.020s)"));
  CHECK(std::regex_search(table.out, std::regex(R"((^|\n)2\s+0\s+0\.0[3-6]\ds straggler\s)")));
  CHECK(std::regex_search(table.out, std::regex(R"((^|\n)0\s+0\s+-?0\.00\ds\s)")));

  RunResult trace = status({"--log_dir=" + logs.path(), "--trace"});
  INFO(trace.out << trace.err);
  REQUIRE(trace.exit_code == 0);
  CHECK_THAT(trace.out, Catch::Contains("RANK  GROUP  SEQ"));
  for (int rank = 0; rank < 3; ++rank) CHECK(traceShows(trace.out, rank));

  {  // --json: the lags and the trace for scripts
    RunResult json = status({"--log_dir=" + logs.path(), "--json", "--trace"});
    REQUIRE(json.exit_code == 0);
    TempDir dir;
    const std::string file = dir.file("status.json");
    std::ofstream(file) << json.out;
    auto checked = checkWithPython(file, R"(
import json, sys
d = json.load(open(sys.argv[1]))
assert d["straggler_threshold_s"] == 0.02, d
assert d["stragglers"] == [2], d
lags = {r["rank"]: r for r in d["ranks"]}
assert sorted(lags) == [0, 1, 2], d
assert 0.03 < lags[2]["lag_s"] < 0.07 and lags[2]["straggler"], lags
assert abs(lags[0]["lag_s"]) < 0.01 and not lags[0]["straggler"], lags
assert sorted(t["rank"] for t in d["trace"]) == [0, 1, 2], d
for t in d["trace"]:
    assert t["group"] == 0 and t["op"] == "all_reduce" and t["seq"] >= 1 and t["age_s"] >= 0, t
    assert t["state"] in ("pending", "started", "completed"), t
)");
    INFO(json.out << checked.err);
    CHECK(checked.exit_code == 0);
  }

  REQUIRE(ddprun.wait(120s));
  INFO(ddprun.out() << ddprun.err());
  CHECK(ddprun.exitCode() == 0);
  const auto events = eventsOf(logs.path(), "straggler");
  REQUIRE(events.size() == 1);
  CHECK_THAT(events[0], Catch::Contains("\"rank\":2,\"group\":0,\"lag_s\":0.0"));
  CHECK_THAT(events[0], Catch::Contains("\"threshold_s\":0.02"));
  CHECK(countOf(ddprun.err(), "is a straggler") == 1);
}

TEST_CASE("a balanced run names no straggler", "[e2e][straggler]") {
  TempDir logs;
  const std::string id = "balanced-" + std::to_string(::getpid());
  // About 15 s: 300 all_reduces, every rank 50 ms before each.
  TestProcess ddprun(oneNode(id, logs.path(), 300, 50, -1, 0));
  REQUIRE(ddprun.waitForOutput("step 150 rank=", 60s, 3));
  // The ranks were judged (lags shown), and nobody is named.
  RunResult table;
  REQUIRE(eventually(
      [&] {
        table = status({"--log_dir=" + logs.path()});
        return table.out.find("stragglers: ") != std::string::npos;
      },
      20s));
  INFO(table.out << table.err);
  CHECK_THAT(table.out, Catch::Contains("stragglers: none (threshold 0.020s)"));
  REQUIRE(ddprun.wait(120s));
  INFO(ddprun.out() << ddprun.err());
  CHECK(ddprun.exitCode() == 0);
  CHECK(eventsOf(logs.path(), "straggler").empty());
  CHECK_THAT(ddprun.err(), !Catch::Contains("is a straggler"));
}

TEST_CASE("a straggler on one node is named by its own agent from the medians the first node publishes",
          "[e2e][straggler]") {
  // Two agents on loopback: node A (the store's host, group rank 0) runs ranks 0-1, node B rank 2,
  // which sleeps 50 ms before every all_reduce. Only B can name it, with A's medians.
  TempDir logs_a, logs_b;
  const std::string id = "straggler2-" + std::to_string(::getpid());
  const std::string conf = "keep_alive_interval=0.5,keep_alive_max_attempt=6";
  auto nodeArgs = [&](int nproc, int port, bool host, const std::string& log_dir) {
    auto args = agentArgs("2", nproc, port, id, conf + (host ? ",is_host=true" : ",is_host=false"));
    args.insert(args.end(), {"--straggler_threshold=0.02", "--log_dir=" + log_dir, "--no_python"});
    for (auto& a : workerArgs(300, 10, 2, 50)) args.push_back(a);
    return args;
  };
  TestProcess a(nodeArgs(2, 0, true, logs_a.path()));
  const int port = announcedPort(a);
  // B joins once A waits in the round (its record says "joining"): group rank 1, rank 2.
  const std::string endpoint = "--rdzv_endpoint=127.0.0.1:" + std::to_string(port);
  REQUIRE(eventually(
      [&] {
        return status({endpoint, "--rdzv_id=" + id}).out.find("joining") != std::string::npos;
      },
      30s));
  TestProcess b(nodeArgs(1, port, false, logs_b.path()));
  REQUIRE(b.waitForOutput("step 1 rank=2", 60s));
  REQUIRE(b.waitForOutput("rank 2 is a straggler: it enters collectives ", 90s));
  REQUIRE(b.wait(120s));
  REQUIRE(a.wait(60s));
  INFO(a.err() << b.err());
  CHECK(a.exitCode() == 0);
  CHECK(b.exitCode() == 0);
  const auto events = eventsOf(logs_b.path(), "straggler");
  REQUIRE(events.size() == 1);
  CHECK_THAT(events[0], Catch::Contains("\"rank\":2,"));
  CHECK(eventsOf(logs_a.path(), "straggler").empty());
}
