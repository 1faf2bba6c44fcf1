// --recovery=in-job's warm spare in the round loop (agent/in_job_recovery.h, worker_group.h's
// spare, spare_worker.h) over fake workers on a manual clock: no process is spawned and
// nothing sleeps. The fake workers write the runtime's `capable` key as they start, "spare"
// as ddprun's runtime does (common/recovery_keys.h). Each test checks what a user sees: which
// processes were started and with what environment, whose pid a failed rank's place went to,
// what the spare was told on its pipe, and that nothing of a spare outlives its attempt.
#include <signal.h>

#include <string>

#include <catch2/catch.hpp>

#include "agent/in_job_recovery.h"
#include "common/env_names.h"
#include "common/recovery_keys.h"
#include "common/spare_assignment.h"
#include "tests/agent/in_job_job.h"

namespace ddprun::agent::testing {
namespace {

using Script = ManualAgentEnv::Script;
using Process = ManualAgentEnv::Process;
using std::chrono::seconds;

bool isSpare(const SpawnRequest& r) { return r.env.count(recovery::kSpareEnv) > 0; }
int rankOf(const SpawnRequest& r) { return std::stoi(r.env.at(env::kRank)); }
int generationOf(const SpawnRequest& r) { return std::stoi(r.env.at(recovery::kGenerationEnv)); }
bool has(const std::string& line, const std::string& part) { return line.find(part) != std::string::npos; }

Script exits(seconds after, int code) {
  Script s;
  s.exit_after = after;
  s.exit_code = code;
  return s;
}

// A job whose workers may have a spare: spares on, the runtime's "spare" capability.
void withSpare(InJobJob& job) {
  job.config.recovery_spare = true;
  job.capable = recovery::kCapableSpare;
}

std::vector<const Process*> spares(const InJobJob& job) {
  std::vector<const Process*> found;
  for (const Process& p : job.env.processes()) {
    if (isSpare(p.request)) found.push_back(&p);
  }
  return found;
}

// What the spare was told on its pipe, and whether the agent closed it.
struct Told {
  std::optional<recovery::SpareAssignment> assignment;
  bool eof = false;
};
Told toldTo(const Process& spare) {
  Told told;
  const std::string bytes = spare.readInherited(&told.eof);
  recovery::SpareAssignmentReader reader;
  told.assignment = reader.add(bytes);
  return told;
}

std::string valueSet(const recovery::SpareAssignment& a, const std::string& name) {
  for (const auto& [key, value] : a.set) {
    if (key == name) return value;
  }
  return "(not set)";
}
bool unsets(const recovery::SpareAssignment& a, const std::string& name) {
  return std::find(a.unset.begin(), a.unset.end(), name) != a.unset.end();
}

}  // namespace

TEST_CASE("spare worker: a failed rank's place goes to the spare, whose pid becomes the worker's", "[unit]") {
  // Rank 1 fails at 10 s. The first spare (started once both workers said they can re-form)
  // ends at 40 s after its start: by then it is rank 1. The next spare waits until the end.
  int spares_started = 0;
  InJobJob job(2, 1, [&](const SpawnRequest& r) {
    if (isSpare(r)) return ++spares_started == 1 ? exits(seconds(40), 0) : Script{};
    if (rankOf(r) == 1 && generationOf(r) == 0) return exits(seconds(10), 3);
    return exits(seconds(30), 0);
  });
  withSpare(job);
  REQUIRE(job.run() == kExitOk);

  const auto& p = job.env.processes();
  // Two workers and two spares: no process was started for rank 1.
  REQUIRE(p.size() == 4);
  const auto s = spares(job);
  REQUIRE(s.size() == 2);
  const Process& spare = *s[0];
  // The spare started with the workers' environment less the rank.
  CHECK(spare.request.argv == p[0].request.argv);
  CHECK(spare.request.env.at(recovery::kSpareEnv) == "1");
  CHECK(spare.request.env.count(env::kRank) == 0);
  CHECK(spare.request.env.count(env::kLocalRank) == 0);
  CHECK(spare.request.env.count(recovery::kGenerationEnv) == 0);
  CHECK(spare.request.env.at(env::kWorldSize) == "2");
  CHECK(spare.request.env.at(recovery::kRecoveryEnv) == "in-job");
  CHECK(spare.request.inherit_fd >= 3);
  CHECK(spare.request.env.at(recovery::kSpareFdEnv) == std::to_string(spare.request.inherit_fd));
  // It was told to be rank 1 in generation 1, the rest of its environment as a newcomer's.
  const Told told = toldTo(spare);
  REQUIRE(told.assignment);
  CHECK(told.eof);
  CHECK(valueSet(*told.assignment, env::kRank) == "1");
  CHECK(valueSet(*told.assignment, env::kLocalRank) == "1");
  CHECK(valueSet(*told.assignment, env::kRoleRank) == "1");
  CHECK(valueSet(*told.assignment, recovery::kGenerationEnv) == "1");
  CHECK(has(valueSet(*told.assignment, env::kErrorFile), "error.json"));
  CHECK(unsets(*told.assignment, recovery::kSpareEnv));
  CHECK(unsets(*told.assignment, recovery::kSpareFdEnv));
  CHECK(valueSet(*told.assignment, env::kWorldSize) == "(not set)");  // the same already
  // The spare's pid is rank 1's: its exit at 40 s is the end of rank 1, the job's success.
  REQUIRE(job.events("worker_replaced").size() == 1);
  const std::string replaced = job.events("worker_replaced")[0];
  CHECK(has(replaced, "\"pid\":" + std::to_string(spare.pid)));
  CHECK(has(replaced, "\"failed_pid\":" + std::to_string(p[1].pid)));
  CHECK(has(replaced, "\"generation\":1"));
  CHECK(spare.signals.empty());
  CHECK(spare.exited);
  CHECK(p[0].signals.empty());  // rank 0 ran on untouched
  CHECK(job.generation() == 1);
  CHECK(job.rounds.ends.empty());
  // A new spare followed the hand-over, and went with the attempt: killed, reaped, told nothing.
  const Process& next = *s[1];
  CHECK(next.got(SIGKILL));
  CHECK(next.reaped);
  const Told nothing = toldTo(next);
  CHECK_FALSE(nothing.assignment);
  CHECK(nothing.eof);
}

TEST_CASE("spare worker: a spare started in one round takes a failed rank of the next, with that round's world",
          "[unit]") {
  // Round 1 (one node, world 2) runs until a second node joins at 20 s; the job re-forms with
  // world 4. In round 2 rank 1 fails 10 s after its start. The spare started in round 1 stays
  // through the re-form and takes rank 1: had it gone with round 1, round 2's spare would
  // still be loading when a failure came so soon (the chaos soak's kills). It ends as rank 1,
  // 60 s after its start.
  int spares_started = 0;
  InJobJob job(2, 1, [&](const SpawnRequest& r) {
    if (isSpare(r)) return ++spares_started == 1 ? exits(seconds(60), 0) : Script{};
    if (r.env.at(env::kWorldSize) == "2") return Script{};  // round 1: runs until the re-form
    if (rankOf(r) == 1 && generationOf(r) == 0) return exits(seconds(10), 3);
    return exits(seconds(30), 0);
  });
  withSpare(job);
  job.env.at(job.env.clock().now() + seconds(20), [&job] {
    // The joining node's ranks 2 and 3 are on the runtime too.
    for (int rank : {2, 3}) job.store.set(recovery::capableKey(recovery::roundScope(0), rank), job.capable);
    job.rounds.nodes = 2;
    job.rounds.endElsewhere(rendezvous::RoundEnd::join("node-b:2").format());
  });
  REQUIRE(job.run() == kExitOk);

  const auto& p = job.env.processes();
  const auto s = spares(job);
  REQUIRE(s.size() == 2);  // the first, and the one that followed its hand-over
  const Process& spare = *s[0];
  CHECK(spare.request.env.at(env::kWorldSize) == "2");  // started in round 1
  CHECK(spare.signals.empty());                         // not stopped with round 1's workers
  // Round 1's two workers were stopped; round 2 started two; none for rank 1 since.
  size_t workers = 0;
  for (const Process& w : p) {
    if (isSpare(w.request)) continue;
    ++workers;
    if (w.request.env.at(env::kWorldSize) == "2") CHECK(w.got(SIGTERM));
  }
  CHECK(workers == 4);
  // Its assignment carries round 2's world.
  const Told told = toldTo(spare);
  REQUIRE(told.assignment);
  CHECK(valueSet(*told.assignment, env::kRank) == "1");
  CHECK(valueSet(*told.assignment, env::kWorldSize) == "4");
  CHECK(valueSet(*told.assignment, env::kGroupWorldSize) == "2");
  REQUIRE(job.events("worker_replaced").size() == 1);
  CHECK(has(job.events("worker_replaced")[0], "\"pid\":" + std::to_string(spare.pid)));
  // The spare that followed went with the job: killed and reaped.
  CHECK(s[1]->got(SIGKILL));
  CHECK(s[1]->reaped);
}

TEST_CASE("spare worker: a spare that dies while it waits is started again and the job never notices", "[unit]") {
  int spares_started = 0;
  InJobJob job(2, 1, [&](const SpawnRequest& r) {
    if (isSpare(r)) return ++spares_started == 1 ? exits(seconds(3), 1) : Script{};
    return exits(seconds(30), 0);
  });
  withSpare(job);
  REQUIRE(job.run() == kExitOk);

  const auto s = spares(job);
  REQUIRE(s.size() == 2);
  CHECK(s[0]->exited);
  CHECK(s[0]->reaped);
  CHECK(s[1]->got(SIGKILL));  // the second one waited until the job ended
  const auto& p = job.env.processes();
  CHECK(p[0].signals.empty());
  CHECK(p[1].signals.empty());
  CHECK(job.events("worker_replaced").empty());
  CHECK(job.rounds.ends.empty());
  CHECK(job.rounds.replacements == 0);  // no restart spent on it
  CHECK(job.generation() == 0);
}

TEST_CASE("spare worker: spares that keep dying while they wait stop after three", "[unit]") {
  // Each spare dies 1 s after its start; rank 1 fails at 60 s and gets a new process.
  InJobJob job(2, 1, [&](const SpawnRequest& r) {
    if (isSpare(r)) return exits(seconds(1), 1);
    if (rankOf(r) == 1 && generationOf(r) == 0) return exits(seconds(60), 3);
    return exits(seconds(90), 0);
  });
  withSpare(job);
  REQUIRE(job.run() == kExitOk);

  CHECK(spares(job).size() == static_cast<size_t>(InJobRecovery::kMaxSpareDeaths));
  const auto& p = job.env.processes();
  REQUIRE(p.size() == 2 + InJobRecovery::kMaxSpareDeaths + 1);
  CHECK(rankOf(p.back().request) == 1);  // the newcomer, a process of its own
  CHECK(generationOf(p.back().request) == 1);
  CHECK(job.events("worker_replaced").size() == 1);
}

TEST_CASE("spare worker: it exits with its job, which ends as it would without it", "[unit]") {
  InJobJob job(2, 0, [&](const SpawnRequest& r) { return isSpare(r) ? Script{} : exits(seconds(30), 0); });
  withSpare(job);
  REQUIRE(job.run() == kExitOk);

  const auto s = spares(job);
  REQUIRE(s.size() == 1);
  CHECK(s[0]->got(SIGKILL));
  CHECK(s[0]->reaped);  // no zombie, no orphan: the agent waited for it
  const Told told = toldTo(*s[0]);
  CHECK_FALSE(told.assignment);
  CHECK(told.eof);  // its pipe closed: a spare that missed the kill would read EOF and exit
  CHECK(job.rounds.ends.empty());
}

TEST_CASE("spare worker: never for a program that did not say it waits as a spare, nor with the spare off", "[unit]") {
  const bool spare_on = GENERATE(true, false);
  // With the spare on, the workers only say "1" (they can re-form, as the agent's fake worker
  // does): no process is ever started without a rank. Rank 1's failure gets a new process.
  InJobJob job(2, 1, [&](const SpawnRequest& r) {
    if (rankOf(r) == 1 && generationOf(r) == 0) return exits(seconds(10), 3);
    return exits(seconds(30), 0);
  });
  job.config.recovery_spare = spare_on;
  if (!spare_on) job.capable = recovery::kCapableSpare;
  REQUIRE(job.run() == kExitOk);

  CHECK(spares(job).empty());
  const auto& p = job.env.processes();
  REQUIRE(p.size() == 3);
  CHECK(rankOf(p[2].request) == 1);
  CHECK(generationOf(p[2].request) == 1);
}

TEST_CASE("spare worker: a workers' store that is gone leaves the agent deaf for a look's time at most", "[unit]") {
  // The round's workers' store does not answer: its host moved on to another round while this
  // node was cut off (the chaos soak). Each look for the spare's conditions waits its whole
  // timeout there, on the agent's thread. Both workers end at 25 s: the agent must see it
  // within one look. Before, each look could take a claim's 10 s, and the next one began at
  // once (its time was counted from the start of the last), so the agent saw the exit 6 s late;
  // with the real event loop it saw nothing more at all (agent_env_test.cc).
  InJobJob job(2, 0, [&](const SpawnRequest&) { return exits(seconds(25), 0); });
  withSpare(job);
  job.env.workers_store = nullptr;
  job.env.unreachable_store_waits = true;
  REQUIRE(job.run() == kExitOk);

  CHECK(spares(job).empty());
  CHECK(job.env.clock().now() - job.env.started() <= seconds(25) + InJobRecovery::kSpareLookTimeout);
}

}  // namespace ddprun::agent::testing
