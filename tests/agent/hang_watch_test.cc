// The hang watch (agent/hang_watch.h) alone, ticked as the round loop ticks it, over fake
// workers on a manual clock (agent_parts.h) and flight recorder rings written here: what it
// judges, whom it stops as hung and how, what it tells the log and the events file.
#include <signal.h>

#include <chrono>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "common/env_names.h"
#include "tests/agent/agent_parts.h"
#include "tests/agent/test_rings.h"

namespace ddprun::agent::testing {
using std::chrono::seconds;

TEST_CASE("hang watch: --hang_timeout names the rank behind, then stops every worker as hung, stacks first", "[unit]") {
  AgentParts parts(2, [](const SpawnRequest&) { return ManualAgentEnv::Script{}; });  // both run on
  parts.config.hang_timeout = seconds(10);
  parts.start(true);
  const std::string flight_dir = parts.base_env.at(env::kFlightDir);
  // Rank 0 waits in all_reduce #6; rank 1 never called it.
  writeTestRing(flight_dir, 0, 2, 5, true);
  writeTestRing(flight_dir, 1, 2, 5, false);

  parts.watchUntil([&] { return !parts.env.hungStops().empty(); }, std::chrono::minutes(1));

  // One stop of both workers, with the verdict as its reason: the fake env takes each one's
  // stacks, then sends the signal (agent/hang/stop/hung_worker_stop.h in the real one).
  REQUIRE(parts.env.hungStops().size() == 1);
  const auto& stop = parts.env.hungStops()[0];
  CHECK(stop.signal == SIGKILL);
  REQUIRE(stop.workers.size() == 2);
  CHECK(stop.workers[0].rank == 0);
  CHECK(stop.workers[1].rank == 1);
  CHECK(has(stop.reason, "rank 1 is behind"));
  CHECK(parts.env.processes()[0].got(SIGKILL));
  CHECK(parts.env.processes()[1].got(SIGKILL));
  const auto verdicts = parts.events("hang_verdict");
  REQUIRE(verdicts.size() == 1);
  CHECK(has(verdicts[0], "rank 1 is behind"));
  CHECK(has(verdicts[0], "\"trigger\":\"--hang_timeout: no rank on this node completed an operation for 10 s"));
  CHECK(has(verdicts[0], "\"culprits\":\"1\""));

  // The report: the rank behind first, each with the stacks taken before it was stopped.
  const std::vector<WorkerFailure> failures = parts.hang->failures("host-a");
  REQUIRE(failures.size() == 2);
  CHECK(failures[0].rank == 1);
  CHECK(failures[0].signal == SIGKILL);
  CHECK(failures[0].stacks == "(the fake stacks of rank 1)");
  CHECK(has(failures[0].hang_reason, "rank 1 is behind"));
  CHECK(failures[1].stacks == "(the fake stacks of rank 0)");
}

TEST_CASE("hang watch: ranks that keep completing operations are not hung, however long they run", "[unit]") {
  AgentParts parts(2, [](const SpawnRequest&) { return ManualAgentEnv::Script{}; });
  parts.config.hang_timeout = seconds(100);  // longer than the minute since the last completed one
  parts.start(true);
  const std::string flight_dir = parts.base_env.at(env::kFlightDir);
  writeTestRing(flight_dir, 0, 2, 5, true);
  writeTestRing(flight_dir, 1, 2, 5, false);

  parts.watchUntil([] { return false; }, std::chrono::minutes(5));

  CHECK(parts.env.hungStops().empty());
  CHECK(parts.events("hang_verdict").empty());
  CHECK_FALSE(parts.env.processes()[0].got(SIGKILL));
}

TEST_CASE("hang watch: --hang_timeout on workers that keep no flight recorder says so once and stops nobody",
          "[unit]") {
  AgentLog log;
  AgentParts parts(2, [](const SpawnRequest&) { return ManualAgentEnv::Script{}; });
  parts.config.hang_timeout = seconds(10);
  parts.start(true);

  // Many looks at the empty rings directory (a few per timeout) over ten timeouts.
  parts.watchUntil([] { return false; }, seconds(100));

  CHECK(log.count("no worker on this node keeps a flight recorder") == 1);
  CHECK(parts.env.hungStops().empty());
  for (const auto& p : parts.env.processes()) CHECK(p.signals.empty());
}

TEST_CASE("hang watch: a stderr line saying a collective failed stops the attempt when no worker ends within the grace",
          "[unit]") {
  AgentParts parts(2, [](const SpawnRequest&) { return ManualAgentEnv::Script{}; });
  parts.start(true);

  parts.hang->onStderrLine(1, "hello from rank 1");  // says nothing of a collective
  CHECK(parts.hang->collectiveLine().empty());
  parts.hang->onStderrLine(1, "RuntimeError: [x.cc:81] Timed out waiting 5000ms for recv operation to complete");
  CHECK(parts.hang->collectiveLine() ==
        "rank 1: RuntimeError: [x.cc:81] Timed out waiting 5000ms for recv operation to complete");
  CHECK_FALSE(parts.hang->collectiveGraceOver());  // the workers get a few seconds to end by themselves

  const auto said = parts.env.clock().now();
  parts.watchUntil([&] { return parts.hang->collectiveGraceOver(); }, std::chrono::minutes(1));
  CHECK(parts.hang->collectiveGraceOver());
  CHECK(parts.env.clock().now() - said >= seconds(5));
  // Stopping them is the round loop's: the watch signalled nobody.
  for (const auto& p : parts.env.processes()) CHECK(p.signals.empty());

  // The next attempt starts afresh.
  parts.hang->endAttempt();
  CHECK(parts.hang->collectiveLine().empty());
  CHECK_FALSE(parts.hang->collectiveGraceOver());
}

}  // namespace ddprun::agent::testing
