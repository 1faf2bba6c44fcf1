// The agent's round loop (agent/elastic_agent.cc) over fake workers on a manual clock
// (manual_agent_env.h) and scripted rounds (scripted_rendezvous.h): no process is spawned
// and nothing sleeps. Each test checks what a user of ddprun would see: its exit code, which
// workers were started in which round and how they were stopped, how the rounds ended, the
// events file.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "agent/elastic_agent.h"
#include "common/env_names.h"
#include "tests/agent/manual_agent_env.h"
#include "tests/agent/scripted_rendezvous.h"
#include "tests/agent/test_rings.h"

namespace ddprun::agent::testing {
namespace {

using Script = ManualAgentEnv::Script;
using std::chrono::seconds;

int rankOf(const SpawnRequest& r) { return std::stoi(r.env.at(env::kRank)); }
int restartOf(const SpawnRequest& r) { return std::stoi(r.env.at(env::kRestartCount)); }
std::string worldSizeOf(const ManualAgentEnv::Process& p) { return p.request.env.at(env::kWorldSize); }

// One node's job: the config, the fake world and the scripted rounds, with a log directory
// of its own that goes with it.
class Job {
 public:
  Job(int nproc, int max_restarts, ManualAgentEnv::Scripter scripter) : env(std::move(scripter)) {
    static std::atomic<int> count{0};
    const std::string id = "round-loop-" + std::to_string(::getpid()) + "-" + std::to_string(count++);
    dir_ = std::filesystem::temp_directory_path() / ("ddprun_" + id);
    std::filesystem::create_directories(dir_);
    config.entrypoint = {"/fake/worker"};
    config.entry_name = "worker";
    config.nproc_per_node = nproc;
    config.max_restarts = max_restarts;
    config.term_timeout = std::chrono::milliseconds(2000);
    config.cgroups = false;
    config.log_dir = dir_.string();
    config.events_file = (dir_ / "events.jsonl").string();
    config.rendezvous.run_id = id;
  }
  ~Job() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  int run() {
    ElasticAgent agent(config, nullptr, env,
                       [this] { return std::make_unique<ScriptedRendezvous>(rounds, env, config.nproc_per_node); });
    return agent.run();
  }

  // The lines of the events file for `event`.
  std::vector<std::string> events(const std::string& event) const {
    std::vector<std::string> found;
    std::ifstream in(*config.events_file);
    for (std::string line; std::getline(in, line);) {
      if (line.find("\"event\":\"" + event + "\"") != std::string::npos) found.push_back(line);
    }
    return found;
  }

  AgentConfig config;
  ManualAgentEnv env;
  RoundScript rounds;

 private:
  std::filesystem::path dir_;
};

// A worker that ends by itself after `after` with `code`.
Script exits(std::chrono::milliseconds after, int code) {
  Script s;
  s.exit_after = after;
  s.exit_code = code;
  return s;
}

bool has(const std::string& line, const std::string& part) { return line.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("round loop: a worker that fails is stopped with its group, which restarts and succeeds", "[unit]") {
  Job job(2, 1, [](const SpawnRequest& r) {
    if (restartOf(r) == 0 && rankOf(r) == 1) return exits(seconds(10), 3);
    if (restartOf(r) == 0) return Script{};  // runs until stopped
    return exits(seconds(5), 0);
  });
  REQUIRE(job.run() == kExitOk);

  const auto& p = job.env.processes();
  REQUIRE(p.size() == 4);
  CHECK(p[0].got(SIGTERM));         // rank 0 of attempt 0: stopped, not waited for
  CHECK(p[1].signals.empty());      // rank 1 failed by itself
  CHECK(p[2].restartCount() == 1);  // attempt 1: one restart used
  CHECK(p[3].restartCount() == 1);
  CHECK(job.rounds.ends == std::vector<std::string>{"fail:node-a:1"});
  REQUIRE(job.events("restart").size() == 1);
  CHECK(has(job.events("restart")[0], "\"restart_count\":1"));
  const auto exits = job.events("worker_exit");
  CHECK(std::any_of(exits.begin(), exits.end(), [](const std::string& e) {
    return has(e, "\"rank\":1") && has(e, "\"exit_code\":3") && has(e, "\"failed\":true");
  }));
  CHECK(job.rounds.finished);
  CHECK(job.rounds.states.back() == "exited");
}

TEST_CASE("round loop: with the restarts spent, the job ends with exit 1 and no further attempt", "[unit]") {
  Job job(2, 1, [](const SpawnRequest& r) {
    if (rankOf(r) == 0) return exits(seconds(1), 2);
    return Script{};
  });
  REQUIRE(job.run() == kExitWorkersFailed);

  const auto& p = job.env.processes();
  REQUIRE(p.size() == 4);  // attempts 0 and 1, nothing after
  CHECK(p[3].restartCount() == 1);
  CHECK(p[1].got(SIGTERM));
  CHECK(p[3].got(SIGTERM));
  CHECK(job.rounds.ends == std::vector<std::string>{"fail:node-a:1", "final:node-a:1"});
  CHECK(job.events("restart").size() == 1);
  REQUIRE(job.events("agent_exit").size() == 1);
  CHECK(has(job.events("agent_exit")[0], "\"exit_code\":1"));
  CHECK(job.rounds.finished);
}

TEST_CASE("round loop: a node that joins mid-attempt re-forms the job, larger, without using a restart", "[unit]") {
  Job job(2, 0, [](const SpawnRequest& r) {
    if (r.env.at(env::kWorldSize) == "2") return Script{};  // one node: runs until the job re-forms
    return exits(seconds(10), 0);
  });
  const auto start = job.env.clock().now();
  job.env.at(start + seconds(30), [&job] {
    job.rounds.nodes = 2;
    job.rounds.endElsewhere(rendezvous::RoundEnd::join("node-b:2").format());
  });
  REQUIRE(job.run() == kExitOk);

  const auto& p = job.env.processes();
  REQUIRE(p.size() == 4);
  CHECK(worldSizeOf(p[0]) == "2");
  CHECK(p[0].got(SIGTERM));
  CHECK(p[1].got(SIGTERM));
  CHECK(worldSizeOf(p[2]) == "4");
  CHECK(p[2].restartCount() == 0);
  CHECK(p[2].signals.empty());
  REQUIRE(job.events("scale_up").size() == 1);
  CHECK(has(job.events("scale_up")[0], "\"from_nodes\":1,\"to_nodes\":2"));
  CHECK(job.events("restart").empty());
  CHECK(job.rounds.ends.empty());  // the round was ended by the joining node, not this one
}

TEST_CASE("round loop: a node evicted mid-attempt re-forms the job, smaller, without using a restart", "[unit]") {
  Job job(2, 0, [](const SpawnRequest& r) {
    if (r.env.at(env::kWorldSize) == "4") return Script{};
    return exits(seconds(10), 0);
  });
  job.rounds.nodes = 2;
  job.env.at(job.env.clock().now() + seconds(30), [&job] {
    job.rounds.nodes = 1;
    job.rounds.endElsewhere(rendezvous::RoundEnd::evict("node-b:2").format());
  });
  REQUIRE(job.run() == kExitOk);

  const auto& p = job.env.processes();
  REQUIRE(p.size() == 4);
  CHECK(worldSizeOf(p[0]) == "4");
  CHECK(p[0].got(SIGTERM));
  CHECK(worldSizeOf(p[2]) == "2");
  CHECK(p[2].restartCount() == 0);
  REQUIRE(job.events("scale_down").size() == 1);
  CHECK(has(job.events("scale_down")[0], "\"from_nodes\":2,\"to_nodes\":1"));
  CHECK(job.events("restart").empty());
}

TEST_CASE("round loop: a stop signal while the workers start stops those started and ends the job 128+N", "[unit]") {
  ManualAgentEnv* env = nullptr;
  Job job(2, 3, [&env](const SpawnRequest& r) {
    if (rankOf(r) == 1) env->sendToAgent(SIGTERM);  // arrives between the two starts
    return Script{};
  });
  env = &job.env;
  REQUIRE(job.run() == 128 + SIGTERM);

  const auto& p = job.env.processes();
  REQUIRE(p.size() == 2);  // no restart after a stop signal
  CHECK(p[0].got(SIGTERM));
  CHECK(p[1].got(SIGTERM));
  CHECK(job.rounds.ends == std::vector<std::string>{"abort:node-a:1:SIGTERM"});
  REQUIRE(job.events("round_end").size() == 1);
  CHECK(has(job.events("round_end")[0], "\"cause\":\"stopped\""));
  CHECK(job.rounds.finished);
}

TEST_CASE(
    "round loop: a collective that timed out brings the hang verdict, and the rank still running is stopped "
    "as hung",
    "[unit]") {
  const auto errorFile = [](const std::string& message, const std::string& op) {
    return "{\"message\": {\"message\": \"" + message +
           "\", \"extraInfo\": {\"py_callstack\": \"Traceback (most recent call last):\\n"
           "  File \\\"/job/train.py\\\", line 40, in <module>\\n"
           "  File \\\"/job/train.py\\\", line 12, in step\\n"
           "  File \\\"/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py\\\", line 1541, in " +
           op + "\\nRuntimeError: " + message + "\\n\", \"timestamp\": 1}}}";
  };
  Job job(3, 0, [&errorFile](const SpawnRequest& r) {
    Script s;
    if (rankOf(r) == 0) {
      s = exits(seconds(10), 1);
      s.error_file = errorFile("Watchdog caught collective operation timeout", "all_reduce");
    } else if (rankOf(r) == 1) {
      s = exits(seconds(10), 1);
      s.error_file = errorFile("broadcast failed", "broadcast");
    }
    return s;  // rank 2 runs on
  });
  REQUIRE(job.run() == kExitWorkersFailed);

  REQUIRE(job.events("hang_verdict").size() == 1);
  const std::string verdict = job.events("hang_verdict")[0];
  CHECK(has(verdict, "\"source\":\"python_stacks\""));
  CHECK(has(verdict, "\"culprits\":\"1\""));
  REQUIRE(job.env.hungStops().size() == 1);
  const auto& stop = job.env.hungStops()[0];
  CHECK(stop.signal == SIGKILL);
  REQUIRE(stop.workers.size() == 1);
  CHECK(stop.workers[0].rank == 2);
  CHECK(has(stop.reason, "rank 1"));
  CHECK(job.env.processes()[2].got(SIGKILL));
  CHECK_FALSE(job.env.processes()[2].got(SIGTERM));  // stopped as hung, not by the ordinary stop
}

TEST_CASE("round loop: a worker that even SIGKILL does not end is reported and the job still ends", "[unit]") {
  Job job(2, 0, [](const SpawnRequest& r) {
    if (rankOf(r) == 0) return exits(seconds(5), 1);
    Script s;
    s.unkillable = true;
    return s;
  });
  REQUIRE(job.run() == kExitWorkersFailed);

  const auto& p = job.env.processes();
  REQUIRE(p.size() == 2);
  CHECK(p[1].got(SIGTERM));
  CHECK(p[1].got(SIGKILL));
  REQUIRE(job.events("worker_unkillable").size() == 1);
  const std::string unkillable = job.events("worker_unkillable")[0];
  CHECK(has(unkillable, "\"rank\":1"));
  CHECK(has(unkillable, "\"sigkill_sent\":true"));
  CHECK(has(unkillable, "\"state\":\"D (disk sleep)\""));
  CHECK(job.rounds.ends == std::vector<std::string>{"final:node-a:1"});
  CHECK(job.rounds.finished);
}

TEST_CASE("round loop: workers stopped as hung by --hang_timeout fail the attempt, which restarts using one restart",
          "[unit]") {
  Job job(2, 1, [](const SpawnRequest& r) {
    if (restartOf(r) > 0) return exits(seconds(5), 0);
    // Attempt 0 hangs in all_reduce #3, which rank 1 never called: each worker's ring says so
    // where the agent named it.
    writeTestRing(r.env.at(env::kFlightDir), rankOf(r), 2, 2, rankOf(r) == 0);
    return Script{};  // runs until stopped
  });
  job.config.hang_timeout = seconds(10);
  REQUIRE(job.run() == kExitOk);

  const auto& p = job.env.processes();
  REQUIRE(p.size() == 4);
  REQUIRE(job.env.hungStops().size() == 1);
  CHECK(job.env.hungStops()[0].workers.size() == 2);
  CHECK(p[0].got(SIGKILL));
  CHECK(p[1].got(SIGKILL));
  CHECK_FALSE(p[0].got(SIGTERM));  // stopped as hung, not by the ordinary stop
  CHECK(p[2].restartCount() == 1);
  CHECK(job.rounds.ends == std::vector<std::string>{"fail:node-a:1"});
  REQUIRE(job.events("restart").size() == 1);
  CHECK(has(job.events("restart")[0], "\"restart_count\":1"));
  // One verdict: the restarted attempt's rings start empty.
  REQUIRE(job.events("hang_verdict").size() == 1);
  CHECK(has(job.events("hang_verdict")[0], "\"culprits\":\"1\""));
}

}  // namespace ddprun::agent::testing
