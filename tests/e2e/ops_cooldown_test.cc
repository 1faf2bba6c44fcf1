// A flapping node: one agent's workers fail on every attempt while the other two nodes'
// workers are healthy. With --node_cooldown the flapping node sits out for growing
// periods (1.5 s, then 3 s) and the others go on with two nodes, where they finish: the
// job succeeds. Without it the same node restarts the whole job until the restarts run out.
#include <csignal>
#include <regex>

#include <catch2/catch.hpp>

#include "tests/e2e/ops_support.h"

using namespace ddprun::testing;
using namespace ddprun::testing::ops;

namespace {

// The flapping node's worker (FLAP=1 in its agent's environment) fails after 0.2 s. The
// healthy ones wait while the flapping node is in the job, and finish once they run
// without it after the third restart; before that they wait for it to come back.
const char* kScript =
    "echo W rank=$RANK groups=$GROUP_WORLD_SIZE restart=$TORCHELASTIC_RESTART_COUNT flap=${FLAP:-0}; "
    "if [ \"${FLAP:-0}\" = 1 ]; then sleep 0.2; exit 3; fi; "
    "if [ $GROUP_WORLD_SIZE = 2 ] && [ $TORCHELASTIC_RESTART_COUNT -ge 3 ]; then exit 0; fi; "
    "exec sleep 60";

std::vector<std::unique_ptr<TestProcess>> startJob(int& port, const std::string& id,
                                                   const std::vector<std::string>& extra,
                                                   const std::string& events_file, const std::string& last_call) {
  const std::string conf = "keep_alive_interval=0.5,keep_alive_max_attempt=3,last_call_timeout=" + last_call;
  std::vector<std::unique_ptr<TestProcess>> agents;
  for (int i = 0; i < 3; ++i) {
    auto args = agentArgs("2:3", 1, port, id, conf + (i == 0 ? ",is_host=true" : ",is_host=false"));
    args.push_back("--max_restarts=3");
    args.insert(args.end(), extra.begin(), extra.end());
    std::map<std::string, std::string> env{{"DDPRUN_EVENTS_FILE", events_file}};
    if (i == 2) env["FLAP"] = "1";
    agents.push_back(std::make_unique<TestProcess>(withShell(args, kScript), env));
    if (i == 0) port = announcedPort(*agents.back());
  }
  return agents;
}

}  // namespace

TEST_CASE("a flapping node sits out for a growing cooldown and the job finishes without it", "[e2e][ops]") {
  int port = 0;  // agent 0, the store's host, takes one from the kernel and announces it
  TempDir dir;
  const std::string events = dir.file("events.jsonl");
  auto agents = startJob(port, "flapjob", {"--node_cooldown=1.5", "--node_cooldown_max=60"}, events, "0.5");
  TestProcess& flapper = *agents[2];

  // While it sits out, `ddprun status` shows it cooling down.
  bool saw_cooldown = false;
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (!flapper.wait(100ms) && std::chrono::steady_clock::now() < deadline) {
    if (saw_cooldown) continue;
    auto s = run({ddprunPath(), "status", "--rdzv_endpoint=127.0.0.1:" + std::to_string(port), "--rdzv_id=flapjob"}, {},
                 10s);
    saw_cooldown = s.exit_code == 0 && std::regex_search(s.out, std::regex(R"(\scooldown\s.*\(back in)"));
  }
  for (auto& agent : agents) {
    REQUIRE(agent->wait(60s));
    INFO(agent->err());
    CHECK(agent->exitCode() == 0);
  }
  CHECK(saw_cooldown);
  INFO(flapper.err());
  // The first failure restarts the job as usual; the second and third make it sit out.
  CHECK_THAT(flapper.err(), Catch::Contains("failed 2 times in a row; it sits out of the job for 1.5 s"));
  CHECK_THAT(flapper.err(), Catch::Contains("failed 3 times in a row; it sits out of the job for 3.0 s"));
  CHECK_THAT(flapper.err(), Catch::Contains("the job finished successfully while this node sat out"));
  CHECK(countOf(flapper.out(), "flap=1") == 3);  // it ran only three times
  for (int i = 0; i < 2; ++i) CHECK_THAT(agents[i]->out(), Catch::Contains("groups=2 restart=3"));

  auto checked = checkWithPython(events, R"(
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
cool = [e for e in lines if e["event"] == "node_cooldown"]
assert [(e["consecutive_failures"], e["seconds"]) for e in cool] == [(2, 1.5), (3, 3.0)], cool
assert len({e["node"] for e in cool}) == 1, cool
assert any(e["event"] == "cooldown_end" for e in lines), "cooldown_end"
assert [e["reason"] for e in lines if e["event"] == "job_ended_while_away"] == ["done"], "ended away"
downs = [e for e in lines if e["event"] == "scale_down"]
assert downs and all(e["reason"].startswith("fail:") for e in downs), downs
)");
  INFO(readFile(events) << checked.err);
  CHECK(checked.exit_code == 0);
}

TEST_CASE("without --node_cooldown a flapping node uses up the job's restarts", "[e2e][ops]") {
  int port = 0;  // agent 0, the store's host, takes one from the kernel and announces it
  TempDir dir;
  // A long last call: every round waits for the flapping node, as it would without a cooldown anyway.
  auto agents = startJob(port, "flapjob2", {}, dir.file("events.jsonl"), "3");
  for (auto& agent : agents) {
    REQUIRE(agent->wait(60s));
    CHECK(agent->exitCode() == 1);
  }
  CHECK(countOf(agents[2]->out(), "flap=1") == 4);  // every attempt of the job had it
  CHECK_THAT(agents[2]->err(), !Catch::Contains("sits out"));
}
