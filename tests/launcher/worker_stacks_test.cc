#include <sstream>

#include <catch2/catch.hpp>

#include "launcher/worker_stacks.h"

using ddprun::launcher::readEventsAgent;

TEST_CASE("status --stacks finds the running workers of an agent in its events file", "[worker_stacks]") {
  std::istringstream events(
      R"({"time":"t","unix_ms":1,"event":"agent_start","node":"host-a:4000","run_id":"r","store":"h:1"}
{"time":"t","unix_ms":2,"event":"worker_start","node":"host-a:4000","run_id":"r","rank":2,"local_rank":0,"pid":4101,"attempt":0,"round":0,"restart_count":0}
{"time":"t","unix_ms":2,"event":"worker_start","node":"host-a:4000","run_id":"r","rank":3,"local_rank":1,"pid":4102,"attempt":0,"round":0,"restart_count":0}
{"time":"t","unix_ms":3,"event":"worker_exit","node":"host-a:4000","run_id":"r","rank":3,"local_rank":1,"pid":4102,"attempt":0,"exit_code":1,"signal":null,"failed":true,"stopped_by_agent":false}
{"time":"t","unix_ms":3,"event":"worker_exit","node":"host-a:4000","run_id":"r","rank":2,"local_rank":0,"pid":4101,"attempt":0,"exit_code":null,"signal":"SIGTERM","failed":false,"stopped_by_agent":true}
not json at all
{"time":"t","unix_ms":4,"event":"worker_start","node":"host-a:4000","run_id":"r","rank":2,"local_rank":0,"pid":4201,"attempt":1,"round":1,"restart_count":1}
{"time":"t","unix_ms":4,"event":"worker_start","node":"host-a:4000","run_id":"r","rank":3,"local_rank":1,"pid":4202,"attempt":1,"round":1,"restart_count":1}
)");
  auto agent = readEventsAgent(events);
  CHECK(agent.host == "host-a");
  CHECK(agent.pid == 4000);
  CHECK_FALSE(agent.exited);
  REQUIRE(agent.running.size() == 2);
  CHECK(agent.running[0].pid == 4201);
  CHECK(agent.running[0].rank == 2);
  CHECK(agent.running[0].local_rank == 0);
  CHECK(agent.running[0].attempt == 1);
  CHECK(agent.running[1].pid == 4202);
  CHECK(agent.running[1].rank == 3);
}

TEST_CASE("status --stacks sees an agent that has exited", "[worker_stacks]") {
  std::istringstream events(
      R"({"time":"t","unix_ms":1,"event":"agent_start","node":"h:9","run_id":"r"}
{"time":"t","unix_ms":2,"event":"worker_start","node":"h:9","run_id":"r","rank":0,"local_rank":0,"pid":10,"attempt":0}
{"time":"t","unix_ms":3,"event":"agent_exit","node":"h:9","run_id":"r","exit_code":1}
)");
  auto agent = readEventsAgent(events);
  CHECK(agent.exited);
  CHECK(agent.pid == 9);
}
