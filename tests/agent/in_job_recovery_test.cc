// --recovery=in-job in the round loop (agent/in_job_recovery.h) over fake workers on a manual
// clock (manual_agent_env.h), scripted rounds (scripted_rendezvous.h) and an in-memory workers'
// store: no process is spawned and nothing sleeps. The fake workers write the runtime's
// `capable` key (common/recovery_keys.h) as they start, as ddprun's runtime does in
// init_process_group. Each test checks what a user sees: which workers were started again
// and which kept running untouched, the generation each newcomer got, how the rounds ended,
// the exit code and the events.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "agent/elastic_agent.h"
#include "common/env_names.h"
#include "common/recovery_keys.h"
#include "tests/agent/in_job_job.h"
#include "tests/agent/manual_agent_env.h"
#include "tests/agent/scripted_rendezvous.h"
#include "tests/support/in_memory_store.h"

namespace ddprun::agent::testing {
namespace {

using Script = ManualAgentEnv::Script;
using std::chrono::seconds;

int rankOf(const SpawnRequest& r) { return std::stoi(r.env.at(env::kRank)); }
int restartOf(const SpawnRequest& r) { return std::stoi(r.env.at(env::kRestartCount)); }
int generationOf(const SpawnRequest& r) { return std::stoi(r.env.at(recovery::kGenerationEnv)); }

Script exits(std::chrono::milliseconds after, int code) {
  Script s;
  s.exit_after = after;
  s.exit_code = code;
  return s;
}

bool has(const std::string& line, const std::string& part) { return line.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("in-job recovery: only the failed rank starts again, the others keep running untouched", "[unit]") {
  // Rank 1 fails at 10 s; its replacement finishes at 5 s, the others at 30 s.
  InJobJob job(3, 1, [](const SpawnRequest& r) {
    if (rankOf(r) == 1 && generationOf(r) == 0) return exits(seconds(10), 3);
    if (rankOf(r) == 1) return exits(seconds(5), 0);
    return exits(seconds(30), 0);
  });
  REQUIRE(job.run() == kExitOk);

  const auto& p = job.env.processes();
  REQUIRE(p.size() == 4);  // three workers and one newcomer, nothing else
  CHECK(p[0].signals.empty());
  CHECK(p[2].signals.empty());
  CHECK(p[0].exited);
  CHECK(p[2].exited);
  CHECK(p[3].rank() == 1);
  CHECK(generationOf(p[3].request) == 1);
  CHECK(p[3].restartCount() == 0);  // same round: TORCHELASTIC_RESTART_COUNT unchanged
  CHECK(p[3].request.env.at(env::kWorldSize) == "3");
  CHECK(p[3].request.env.at(recovery::kRecoveryEnv) == "in-job");
  CHECK(generationOf(p[0].request) == 0);
  CHECK(job.generation() == 1);
  // The survivors' runtime gives up unless an agent says soon that it took the failure up.
  CHECK(job.store.check({recovery::noticedKey(recovery::roundScope(0), 0)}));
  CHECK_FALSE(job.store.check({recovery::noticedKey(recovery::roundScope(0), 1)}));
  CHECK(job.rounds.ends.empty());  // the round never ended for a failure
  CHECK(job.rounds.round == 1);
  CHECK(job.rounds.replacements == 1);
  REQUIRE(job.events("worker_replaced").size() == 1);
  const std::string replaced = job.events("worker_replaced")[0];
  CHECK(has(replaced, "\"rank\":1"));
  CHECK(has(replaced, "\"exit_code\":3"));
  CHECK(has(replaced, "\"generation\":1"));
  CHECK(has(replaced, "\"failed_pid\":" + std::to_string(p[1].pid)));
  CHECK(has(replaced, "\"pid\":" + std::to_string(p[3].pid)));
  CHECK(job.events("restart").empty());
}

TEST_CASE("in-job recovery: a rank that never said it can re-form makes it a whole-group restart", "[unit]") {
  // Rank 2 (not on ddprun's runtime, say) never writes `capable`.
  InJobJob job(3, 1,
               [](const SpawnRequest& r) {
                 if (restartOf(r) == 0 && rankOf(r) == 1) return exits(seconds(10), 3);
                 if (restartOf(r) == 0) return Script{};  // runs until stopped
                 return exits(seconds(5), 0);
               },
               {2});
  REQUIRE(job.run() == kExitOk);

  const auto& p = job.env.processes();
  REQUIRE(p.size() == 6);  // attempts 0 and 1, whole
  CHECK(p[0].got(SIGTERM));
  CHECK(p[2].got(SIGTERM));
  CHECK(job.rounds.ends == std::vector<std::string>{"fail:node-a:1"});
  CHECK(job.generation() == 0);
  CHECK(job.rounds.replacements == 0);
  CHECK(job.events("worker_replaced").empty());
  for (size_t i = 3; i < 6; ++i) CHECK(generationOf(p[i].request) == 0);
}

TEST_CASE("in-job recovery: with no restart left the job fails as with --recovery=restart", "[unit]") {
  InJobJob job(2, 0, [](const SpawnRequest& r) {
    if (rankOf(r) == 1) return exits(seconds(10), 3);
    return Script{};
  });
  REQUIRE(job.run() == kExitWorkersFailed);

  const auto& p = job.env.processes();
  REQUIRE(p.size() == 2);
  CHECK(p[0].got(SIGTERM));
  CHECK(job.rounds.ends == std::vector<std::string>{"final:node-a:1"});
  CHECK(job.generation() == 0);
  CHECK(job.events("worker_replaced").empty());
}

TEST_CASE("in-job recovery: a newcomer that fails again is replaced again while restarts are left", "[unit]") {
  // Rank 0 fails in generations 0 and 1; the one of generation 2 finishes.
  InJobJob job(2, 2, [](const SpawnRequest& r) {
    if (rankOf(r) == 0 && generationOf(r) < 2) return exits(seconds(10), 3);
    if (rankOf(r) == 0) return exits(seconds(5), 0);
    return exits(seconds(60), 0);
  });
  REQUIRE(job.run() == kExitOk);

  const auto& p = job.env.processes();
  REQUIRE(p.size() == 4);
  CHECK(p[1].signals.empty());  // rank 1 ran through both replacements
  CHECK(generationOf(p[2].request) == 1);
  CHECK(generationOf(p[3].request) == 2);
  CHECK(p[2].rank() == 0);
  CHECK(p[3].rank() == 0);
  CHECK(job.generation() == 2);
  CHECK(job.rounds.replacements == 2);
  CHECK(job.rounds.ends.empty());
  CHECK(job.events("worker_replaced").size() == 2);
}

TEST_CASE("in-job recovery: replacements count against --max_restarts in later rounds too", "[unit]") {
  // Rank 1 fails and is replaced (one of two restarts). Then rank 0 fails when a worker has
  // given up on in-job recovery: a whole-group restart (the second). In round 2 a failure
  // finds both restarts used: the job fails, where counting rounds alone would restart again.
  InJobJob job(2, 2, [](const SpawnRequest& r) {
    if (restartOf(r) == 0 && rankOf(r) == 1 && generationOf(r) == 0) return exits(seconds(10), 3);
    if (restartOf(r) == 0 && rankOf(r) == 0) return exits(seconds(20), 4);
    if (restartOf(r) == 1 && rankOf(r) == 0) return exits(seconds(10), 5);
    return Script{};
  });
  job.env.at(job.env.started() + seconds(15), [&job] {
    job.store.set(recovery::abandonedKey(recovery::roundScope(0)), "rank 1: no new generation within the timeout");
  });
  REQUIRE(job.run() == kExitWorkersFailed);

  const auto& p = job.env.processes();
  REQUIRE(p.size() == 5);  // round 1: two workers and a newcomer; round 2: two workers
  CHECK(generationOf(p[2].request) == 1);
  CHECK(p[3].restartCount() == 1);
  CHECK(generationOf(p[3].request) == 0);
  CHECK(job.rounds.ends == std::vector<std::string>{"fail:node-a:1", "final:node-a:1"});
  CHECK(job.events("worker_replaced").size() == 1);
}

TEST_CASE("recovery=restart: workers are told so, and a failure restarts the group without the store", "[unit]") {
  // No workers' store at all: the default mode never reads it.
  InJobJob job(2, 1, [](const SpawnRequest& r) {
    if (restartOf(r) == 0 && rankOf(r) == 1) return exits(seconds(10), 3);
    if (restartOf(r) == 0) return Script{};
    return exits(seconds(5), 0);
  });
  job.config.recovery = Recovery::kRestart;
  job.env.workers_store = nullptr;
  REQUIRE(job.run() == kExitOk);

  const auto& p = job.env.processes();
  REQUIRE(p.size() == 4);
  CHECK(p[0].got(SIGTERM));
  CHECK(p[0].request.env.at(recovery::kRecoveryEnv) == "restart");
  CHECK(generationOf(p[3].request) == 0);
  CHECK(job.rounds.ends == std::vector<std::string>{"fail:node-a:1"});
}

TEST_CASE("in-job recovery: a workers' store that does not answer makes it a whole-group restart", "[unit]") {
  InJobJob job(2, 1, [](const SpawnRequest& r) {
    if (restartOf(r) == 0 && rankOf(r) == 1) return exits(seconds(10), 3);
    if (restartOf(r) == 0) return Script{};
    return exits(seconds(5), 0);
  });
  job.env.workers_store = nullptr;  // connectStore throws StoreError
  REQUIRE(job.run() == kExitOk);

  const auto& p = job.env.processes();
  REQUIRE(p.size() == 4);
  CHECK(p[0].got(SIGTERM));
  CHECK(job.rounds.ends == std::vector<std::string>{"fail:node-a:1"});
  CHECK(job.rounds.replacements == 0);
}

}  // namespace ddprun::agent::testing
