// The job reporter (agent/job_reporter.h) alone, over fake workers on a manual clock and a
// scripted round (agent_parts.h): what `ddprun status` reads of this node (its status record
// in the store) and what the events file says of the rounds and the workers.
#include <signal.h>

#include <chrono>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "common/env_names.h"
#include "tests/agent/agent_parts.h"

namespace ddprun::agent::testing {
using Script = ManualAgentEnv::Script;
using std::chrono::seconds;

namespace {

rendezvous::RendezvousResult roundOf(int round, int nodes, int restarts) {
  rendezvous::RendezvousResult r;
  r.round = round;
  r.group_world_size = nodes;
  r.world_size = nodes * 2;
  r.restart_count = restarts;
  r.master_addr = "10.0.0.1";
  r.master_port = 29500;
  return r;
}

}  // namespace

TEST_CASE("job reporter: each round, how it ended, and the restart and scale change it brought are events", "[unit]") {
  AgentParts parts(2, [](const SpawnRequest&) { return Script{}; });
  parts.reporter.open(parts.rdzv, {*parts.config.events_file});

  parts.reporter.roundFormed(roundOf(1, 2, 0));
  parts.reporter.setRound(roundOf(1, 2, 0));
  parts.reporter.roundEnded("fail:node-b:1", false);  // another node's worker failed
  parts.reporter.roundFormed(roundOf(2, 1, 1));       // node-b left, a restart was used

  const auto rounds = parts.events("rendezvous_round");
  REQUIRE(rounds.size() == 2);
  CHECK(has(rounds[0], "\"round\":1"));
  CHECK(has(rounds[0], "\"nodes\":2"));
  CHECK(has(rounds[0], "\"master\":\"10.0.0.1:29500\""));
  CHECK(has(rounds[0], "\"node\":\"node-a:1\""));  // every line names this node
  const auto ends = parts.events("round_end");
  REQUIRE(ends.size() == 1);
  CHECK(has(ends[0], "\"round\":1"));
  CHECK(has(ends[0], "\"cause\":\"worker_failure\""));
  CHECK(has(ends[0], "\"by_this_node\":false"));
  const auto restarts = parts.events("restart");
  REQUIRE(restarts.size() == 1);
  CHECK(has(restarts[0], "\"restart_count\":1"));
  CHECK(has(restarts[0], "\"reason\":\"fail:node-b:1\""));
  const auto down = parts.events("scale_down");
  REQUIRE(down.size() == 1);
  CHECK(has(down[0], "\"from_nodes\":2"));
  CHECK(has(down[0], "\"to_nodes\":1"));
  CHECK(parts.events("scale_up").empty());
}

TEST_CASE("job reporter: the node's state goes to its status record, until the store is lost", "[unit]") {
  AgentParts parts(2, [](const SpawnRequest&) { return Script{}; });
  parts.reporter.open(parts.rdzv, {*parts.config.events_file});

  parts.reporter.setState("running");
  CHECK(parts.rounds.states == std::vector<std::string>{"running"});
  parts.reporter.storeLost();
  parts.reporter.setState("stopping");  // a publish could wait on a dead store
  CHECK(parts.rounds.states == std::vector<std::string>{"running"});
}

TEST_CASE("job reporter: workers' starts and exits are events, a stop by ddprun told apart from a failure", "[unit]") {
  AgentParts parts(2,
                   [](const SpawnRequest& r) { return r.env.at(env::kRank) == "0" ? exits(seconds(2), 7) : Script{}; });
  parts.start();
  parts.runUntil([&] { return !parts.group.workers()[0].running; });
  parts.reporter.workersUnkillable(parts.group.stop(SIGTERM));
  parts.runUntil([&] { return parts.events("worker_exit").size() == 2; });

  REQUIRE(parts.events("worker_start").size() == 2);
  CHECK(has(parts.events("worker_start")[1], "\"pid\":" + std::to_string(parts.env.processes()[1].pid)));
  const auto exits = parts.events("worker_exit");
  REQUIRE(exits.size() == 2);
  CHECK(has(exits[0], "\"rank\":0"));
  CHECK(has(exits[0], "\"exit_code\":7"));
  CHECK(has(exits[0], "\"failed\":true"));
  CHECK(has(exits[0], "\"stopped_by_agent\":false"));
  CHECK(has(exits[1], "\"rank\":1"));
  CHECK(has(exits[1], "\"signal\":\"SIGTERM\""));
  CHECK(has(exits[1], "\"failed\":false"));
  CHECK(has(exits[1], "\"stopped_by_agent\":true"));
  CHECK(parts.events("worker_unkillable").empty());
}

}  // namespace ddprun::agent::testing
