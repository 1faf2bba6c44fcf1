// This node's workers (agent/worker_group.h) alone, over fake workers on a manual clock
// (agent_parts.h): how they are started, reaped and stopped, and the failures they leave
// for the report.
#include <signal.h>

#include <chrono>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "common/env_names.h"
#include "common/error.h"
#include "tests/agent/agent_parts.h"

namespace ddprun::agent::testing {
using Script = ManualAgentEnv::Script;
using std::chrono::seconds;

TEST_CASE("worker group: each worker starts with its rank's environment, and its exit is reaped with its code",
          "[unit]") {
  AgentParts parts(2,
                   [](const SpawnRequest& r) { return r.env.at(env::kRank) == "1" ? exits(seconds(5), 3) : Script{}; });
  parts.start();

  const auto& p = parts.env.processes();
  REQUIRE(p.size() == 2);
  for (int i = 0; i < 2; ++i) {
    CHECK(p[i].rank() == i);
    CHECK(p[i].request.env.at(env::kLocalRank) == std::to_string(i));
    CHECK(p[i].request.env.at(env::kWorldSize) == "2");
    CHECK(p[i].request.argv == std::vector<std::string>{"/fake/worker"});
    CHECK(parts.group.workers()[i].pid == p[i].pid);
    CHECK(parts.group.workers()[i].running);
  }

  parts.runUntil([&] { return !parts.group.workers()[1].running; });
  const Worker& failed = parts.group.workers()[1];
  CHECK(failed.exit_code == 3);
  CHECK(failed.failed());
  CHECK(parts.group.workers()[0].running);
  CHECK(parts.group.anyRunning());
  const auto exits = parts.events("worker_exit");
  REQUIRE(exits.size() == 1);
  CHECK(has(exits[0], "\"rank\":1"));
  CHECK(has(exits[0], "\"exit_code\":3"));
}

TEST_CASE("worker group: stop() sends the signal, then SIGKILL after --term_timeout to a worker that ignores it",
          "[unit]") {
  AgentParts parts(2, [](const SpawnRequest& r) {
    Script s;
    s.ignores_term = r.env.at(env::kRank) == "1";
    return s;
  });
  parts.start();
  const auto before = parts.env.clock().now();

  const std::vector<UnkillableWorker> unkillable = parts.group.stop(SIGTERM);

  CHECK(unkillable.empty());
  const auto& p = parts.env.processes();
  CHECK(p[0].got(SIGTERM));
  CHECK_FALSE(p[0].got(SIGKILL));  // it ended at SIGTERM
  CHECK(p[1].got(SIGTERM));
  CHECK(p[1].got(SIGKILL));
  CHECK(parts.env.clock().now() - before >= parts.config.term_timeout);
  CHECK_FALSE(parts.group.anyRunning());
  // Stopped by ddprun, not failed: nothing for the report.
  for (const Worker& w : parts.group.workers()) CHECK(w.stopped_by_agent);
  CHECK(parts.group.collectFailures("host-a", {}).empty());
}

TEST_CASE("worker group: a worker that even SIGKILL does not end is returned with its state and left behind",
          "[unit]") {
  AgentParts parts(1, [](const SpawnRequest&) {
    Script s;
    s.unkillable = true;
    return s;
  });
  parts.start();

  const std::vector<UnkillableWorker> unkillable = parts.group.stop(SIGTERM);

  REQUIRE(unkillable.size() == 1);
  CHECK(unkillable[0].rank == 0);
  CHECK(unkillable[0].pid == parts.env.processes()[0].pid);
  CHECK(unkillable[0].sigkill_sent);
  CHECK(unkillable[0].state == "D (disk sleep)");
  CHECK(parts.group.workers()[0].abandoned);
  CHECK_FALSE(parts.group.anyRunning());  // no longer waited for
}

TEST_CASE("worker group: the failures name each failed worker, the ranks asked for first", "[unit]") {
  AgentParts parts(3, [](const SpawnRequest& r) {
    if (r.env.at(env::kRank) == "0") return exits(seconds(1), 2);
    if (r.env.at(env::kRank) == "2") return exits(seconds(1), 5);
    return exits(seconds(1), 0);
  });
  parts.start();
  parts.runUntil([&] { return !parts.group.anyRunning(); });

  const std::vector<WorkerFailure> failures = parts.group.collectFailures("host-a", {2});
  REQUIRE(failures.size() == 2);  // rank 1 succeeded
  CHECK(failures[0].rank == 2);
  CHECK(failures[0].exit_code == 5);
  CHECK(failures[1].rank == 0);
  CHECK(failures[1].exit_code == 2);
  CHECK(failures[1].host == "host-a");
  CHECK(failures[1].pid == parts.env.processes()[0].pid);
}

TEST_CASE("worker group: a worker that cannot be started is not running, and the start says why", "[unit]") {
  AgentParts parts(2, [](const SpawnRequest& r) {
    Script s;
    s.spawn_fails = r.env.at(env::kRank) == "1";
    return s;
  });
  CHECK_THROWS_AS(parts.start(), SystemError);
  CHECK(parts.group.workers()[0].running);
  CHECK_FALSE(parts.group.workers()[1].running);
  CHECK(parts.group.workers()[1].pid == -1);
}

TEST_CASE("worker group: a signal goes to every running worker and to no worker that has ended", "[unit]") {
  AgentParts parts(2,
                   [](const SpawnRequest& r) { return r.env.at(env::kRank) == "0" ? exits(seconds(1), 0) : Script{}; });
  parts.start();
  parts.runUntil([&] { return !parts.group.workers()[0].running; });

  parts.group.signalRunning(SIGUSR1);

  CHECK(parts.env.processes()[0].signals.empty());
  CHECK(parts.env.processes()[1].signals == std::vector<int>{SIGUSR1, SIGUSR1});  // its group, then itself
  CHECK(parts.group.workers()[1].running);                                        // SIGUSR1 is the worker's to handle
}

}  // namespace ddprun::agent::testing
