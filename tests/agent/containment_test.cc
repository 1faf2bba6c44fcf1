// Containment (agent/containment.h) alone, over fake workers on a manual clock
// (agent_parts.h): nothing of an attempt outlives it. Without cgroups, a worker's process
// group is what is left of it once the worker is gone; the fake world keeps each worker
// alone in its group, so a worker still running stands for its group's leftovers.
#include <signal.h>

#include <chrono>
#include <string>

#include <catch2/catch.hpp>

#include "common/env_names.h"
#include "tests/agent/agent_parts.h"

namespace ddprun::agent::testing {
using Script = ManualAgentEnv::Script;
using std::chrono::seconds;

TEST_CASE("containment: without cgroups a worker starts in none", "[unit]") {
  AgentParts parts(1, [](const SpawnRequest&) { return Script{}; });
  Containment containment(parts.config, parts.env, parts.group, nullptr);
  containment.setUp();
  CHECK(containment.cgroupFor(0, 0).empty());
}

TEST_CASE("containment: what is left of an attempt's process groups gets SIGTERM, then SIGKILL after --term_timeout",
          "[unit]") {
  AgentParts parts(3, [](const SpawnRequest& r) {
    Script s;
    if (r.env.at(env::kRank) == "0") s = exits(seconds(1), 0);  // gone before the attempt ends
    s.ignores_term = r.env.at(env::kRank) == "2";
    return s;
  });
  Containment containment(parts.config, parts.env, parts.group, nullptr);
  containment.setUp();
  parts.start();
  parts.runUntil([&] { return !parts.group.workers()[0].running; });
  const auto before = parts.env.clock().now();

  containment.clear();

  const auto& p = parts.env.processes();
  CHECK(p[0].signals.empty());  // its group is gone: nothing to stop
  CHECK(p[1].got(SIGTERM));
  CHECK_FALSE(p[1].got(SIGKILL));  // it ended at SIGTERM
  CHECK(p[2].got(SIGTERM));
  CHECK(p[2].got(SIGKILL));
  CHECK(parts.env.clock().now() - before >= parts.config.term_timeout);
  for (const auto& process : p) CHECK(process.exited);
}

TEST_CASE("containment: a group that even SIGKILL does not end is given up on, and the attempt still clears",
          "[unit]") {
  AgentLog log;
  AgentParts parts(1, [](const SpawnRequest&) {
    Script s;
    s.unkillable = true;
    return s;
  });
  Containment containment(parts.config, parts.env, parts.group, nullptr);
  containment.setUp();
  parts.start();

  containment.clear();  // returns: the test would never end otherwise

  CHECK(parts.env.processes()[0].got(SIGKILL));
  CHECK_FALSE(parts.env.processes()[0].exited);
  CHECK(log.count("still has processes") == 1);
}

}  // namespace ddprun::agent::testing
