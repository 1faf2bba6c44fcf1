// Structured events of a job with one restart and one scale-down: three agents share one
// DDPRUN_EVENTS_FILE (and one also writes events.jsonl into its --log_dir run directory).
// A worker of group rank 1 fails once (restart), then an agent is killed (scale down to
// two nodes), and the job finishes there.
#include <csignal>
#include <filesystem>

#include <catch2/catch.hpp>

#include "tests/e2e/ops_support.h"

using namespace ddprun::testing;
using namespace ddprun::testing::ops;

TEST_CASE("events of a run with one restart and one scale-down", "[e2e][ops]") {
  int port = 0;  // agent 0, the store's host, takes one from the kernel and announces it
  TempDir dir;
  const std::string events = dir.file("events.jsonl");
  const std::string logs = dir.path() + "/logs";
  const std::string conf = "keep_alive_interval=0.5,keep_alive_max_attempt=3,last_call_timeout=3";
  // Attempt 0: group rank 1's worker exits 7. Then workers wait while the job has three
  // nodes and finish once it has two.
  const std::string script =
      "echo W rank=$RANK restart=$TORCHELASTIC_RESTART_COUNT; "
      "if [ $TORCHELASTIC_RESTART_COUNT = 0 ] && [ $GROUP_RANK = 1 ]; then sleep 0.3; exit 7; fi; "
      "if [ $GROUP_WORLD_SIZE = 3 ]; then exec sleep 60; fi";
  std::vector<std::unique_ptr<TestProcess>> agents;
  for (int i = 0; i < 3; ++i) {
    auto args = agentArgs("2:3", 1, port, "eventsjob", conf + (i == 0 ? ",is_host=true" : ",is_host=false"));
    args.push_back("--max_restarts=1");
    if (i == 0) args.push_back("--log_dir=" + logs);
    agents.push_back(std::make_unique<TestProcess>(withShell(args, script),
                                                   std::map<std::string, std::string>{{"DDPRUN_EVENTS_FILE", events}}));
    if (i == 0) port = announcedPort(*agents.back());
  }
  for (auto& agent : agents) REQUIRE(agent->waitForOutput("restart=1", 60s));
  // A worker can print before its agent records worker_start: kill only once all three are
  // recorded, or the killed agent's record is lost with it.
  // Only worker_start has "round" right after "attempt".
  REQUIRE(eventually([&] { return countOf(readFile(events), "\"attempt\":1,\"round\":1,") == 3; }, 10s));
  ::kill(agents[2]->pid(), SIGKILL);
  REQUIRE(agents[2]->wait(10s));
  for (int i = 0; i < 2; ++i) {
    REQUIRE(agents[i]->wait(60s));
    INFO(agents[i]->err());
    CHECK(agents[i]->exitCode() == 0);
  }

  // Every line is a JSON object with a timestamp; the sequence tells the story.
  auto checked = checkWithPython(events, R"(
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
for e in lines:
    assert e["time"].endswith("Z") and e["unix_ms"] > 0 and e["run_id"] == "eventsjob" and e["node"], e
def of(kind, **fields):
    return [e for e in lines if e["event"] == kind and all(e.get(k) == v for k, v in fields.items())]
assert len(of("agent_start")) == 3, "agent_start"
assert len(of("rendezvous_round", round=0, nodes=3)) == 3, "round 0"
assert len(of("worker_start", round=0, restart_count=0)) == 3, "starts in round 0"
assert len(of("worker_start", round=1, restart_count=1)) == 3, "starts in round 1"
assert len(of("worker_start", round=2, restart_count=1)) == 2, "starts in round 2"
failed = of("worker_exit", failed=True)
assert len(failed) == 1 and failed[0]["exit_code"] == 7 and failed[0]["signal"] is None, failed
stopped = of("worker_exit", stopped_by_agent=True, signal="SIGTERM")
assert len(stopped) >= 2 and all(e["exit_code"] is None for e in stopped), stopped
assert len(of("round_end", round=0, cause="worker_failure", by_this_node=True)) == 1, "failure"
restarts = of("restart", restart_count=1, max_restarts=1)
assert len(restarts) == 3 and all(e["reason"].startswith("fail:") for e in restarts), restarts
assert len(of("round_end", cause="node_evicted")) == 2, "evicted"
down = of("scale_down", from_nodes=3, to_nodes=2, from_world_size=3, to_world_size=2)
assert len(down) == 2 and all(e["reason"].startswith("evict:") for e in down), down
assert len(of("round_end", cause="done")) == 2, "done"
assert len(of("agent_exit", exit_code=0)) == 2, "exits"
times = [e["unix_ms"] for e in lines]
print(len(lines), "events")
)");
  INFO(readFile(events) << checked.out << checked.err);
  CHECK(checked.exit_code == 0);

  // The agent with --log_dir has its own copy, with only its own events.
  std::string run_dir_events;
  for (const auto& entry : std::filesystem::directory_iterator(logs)) {
    if (std::filesystem::exists(entry.path() / "events.jsonl"))
      run_dir_events = (entry.path() / "events.jsonl").string();
  }
  REQUIRE_FALSE(run_dir_events.empty());
  auto own = checkWithPython(run_dir_events, R"(
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
assert len({e["node"] for e in lines}) == 1, "one node"
kinds = [e["event"] for e in lines]
assert kinds[0] == "agent_start" and kinds[-1] == "agent_exit", kinds
for k in ("rendezvous_round", "worker_start", "worker_exit", "round_end", "restart", "scale_down"):
    assert k in kinds, k
)");
  INFO(readFile(run_dir_events) << own.err);
  CHECK(own.exit_code == 0);
}

TEST_CASE("an events file that cannot be written is a usage error before anything starts", "[e2e][ops]") {
  auto r = run({ddprunPath(), "--standalone", "--no_python", "true"},
               {{"DDPRUN_EVENTS_FILE", "/nonexistent-dir/events.jsonl"}}, 30s);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.err, Catch::Contains("DDPRUN_EVENTS_FILE=/nonexistent-dir/events.jsonl"));
}
