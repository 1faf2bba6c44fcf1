// In-job recovery end to end: the chaos trainer under `ddprun --recovery=in-job`, a worker
// killed mid-training. Only that worker starts again (the agent's side), it takes its state
// from a survivor (the runtime's side), and every step on every rank stays bit-identical to
// an uninterrupted run, each step applied once.
#include <signal.h>

#include <catch2/catch.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "tests/runtime/recovery/step_logs.h"
#include "tests/support/test_process.h"

namespace {

using namespace ddprun::testing;
using namespace ddprun::testing::recovery;
namespace fs = std::filesystem;

constexpr int kSteps = 30;
constexpr int kWorld = 2;

// `ddprun_args` followed by the chaos trainer: `steps` of `step_ms`, a checkpoint every 7 in
// `dir`'s ck/, its step logs in `logs` (made here).
std::vector<std::string> withTrainer(std::vector<std::string> ddprun_args, const TempDir& dir, const std::string& logs,
                                     int steps, int step_ms) {
  fs::create_directories(logs);
  ddprun_args.insert(ddprun_args.end(), {"--no_python", binDir() + "/chaos_trainer", "--steps", std::to_string(steps),
                                         "--step-ms", std::to_string(step_ms), "--checkpoint-every", "7", "--timeout",
                                         "60", "--checkpoint-dir", dir.file("ck"), "--log-dir", logs});
  return ddprun_args;
}

// `spare`: --recovery_spare's value; `step_ms`: the trainer's step.
std::vector<std::string> job(const TempDir& dir, const std::string& recovery, const std::string& spare = "off",
                             int steps = kSteps, int step_ms = 30) {
  return withTrainer({ddprunPath(), "--standalone", "--nproc_per_node=" + std::to_string(kWorld), "--max_restarts=2",
                      "--recovery=" + recovery, "--recovery_spare=" + spare},
                     dir, dir.file("logs"), steps, step_ms);
}

// Empty when the file cannot be read: a process of /proc may end while it is read.
std::string readAll(const std::string& path) {
  try {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  } catch (const std::exception&) {
    return {};
  }
}

// The pid of this job's chaos trainer (its arguments name `logs`) whose environment, as it
// started, holds `wanted`; -1: none.
pid_t processWith(const std::string& logs, const std::string& wanted) {
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string pid = entry.path().filename().string();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string cmdline = readAll(entry.path().string() + "/cmdline");
    if (cmdline.find("chaos_trainer") == std::string::npos || cmdline.find(logs) == std::string::npos) continue;
    // A NUL first, so that `wanted`'s own leading NUL finds the first variable too.
    const std::string environ = std::string(1, '\0') + readAll(entry.path().string() + "/environ");
    if (environ.find(wanted) != std::string::npos) return static_cast<pid_t>(std::stol(pid));
  }
  return -1;
}

// The pid of the chaos trainer of `rank` (a spare that took a rank shows its starting
// environment there: no RANK).
pid_t workerPid(const std::string& logs, int rank) {
  return processWith(logs, std::string("\0RANK=", 6) + std::to_string(rank) + '\0');
}

// One agent of a two-node elastic job (--nnodes=1:2) on loopback, two chaos trainers with the
// spare on; `port` 0 for the host, which then announces its port.
std::vector<std::string> elasticAgent(const TempDir& dir, const std::string& logs, int port, int steps) {
  return withTrainer({ddprunPath(), "--nnodes=1:2", "--nproc_per_node=" + std::to_string(kWorld), "--rdzv_backend=c10d",
                      "--rdzv_endpoint=127.0.0.1:" + std::to_string(port), "--rdzv_id=spare-across-rounds",
                      std::string("--rdzv_conf=last_call_timeout=1,is_host=") + (port == 0 ? "true" : "false"),
                      "--max_restarts=2", "--recovery=in-job", "--recovery_spare=on"},
                     dir, logs, steps, 100);
}

// `name`'s value in the environment `pid` started with; empty: none (or the process is gone).
std::string startEnv(pid_t pid, const std::string& name) {
  const std::string environ = std::string(1, '\0') + readAll("/proc/" + std::to_string(pid) + "/environ");
  const std::string key = std::string(1, '\0') + name + "=";
  const size_t at = environ.find(key);
  if (at == std::string::npos) return {};
  const size_t from = at + key.size();
  return environ.substr(from, environ.find('\0', from) - from);
}

}  // namespace

TEST_CASE("in-job recovery under ddprun: a killed worker restarts alone, every step stays bit-identical") {
  TempDir reference_dir;
  const RunResult reference = run(job(reference_dir, "restart"), {}, std::chrono::seconds(120));
  INFO(reference.out << reference.err);
  REQUIRE(reference.exit_code == 0);

  TempDir dir;
  TestProcess ddprun(job(dir, "in-job"));
  const std::string logs = dir.file("logs");
  REQUIRE(eventually([&] { return lastStep(logs, 1) >= 8; }, std::chrono::seconds(60)));
  const pid_t survivor = workerPid(logs, 0);
  const pid_t victim = workerPid(logs, 1);
  REQUIRE(survivor > 0);
  REQUIRE(victim > 0);
  const long long killed_at = nowMs();
  REQUIRE(::kill(victim, SIGKILL) == 0);
  REQUIRE(ddprun.wait(std::chrono::seconds(120)));
  INFO(ddprun.out() << ddprun.err());
  CHECK(ddprun.exitCode() == 0);
  CHECK(countOf(ddprun.out() + ddprun.err(), "replaced alone") == 1);
  for (int r = 0; r < kWorld; ++r) {
    INFO("rank " << r);
    const RankLog mine = readRank(logs, r);
    const RankLog theirs = readRank(reference_dir.file("logs"), r);
    CHECK(mine.problems.empty());
    CHECK(mine.done);
    REQUIRE(mine.sums.size() == static_cast<size_t>(kSteps));
    for (int s = 1; s <= kSteps; ++s) CHECK(mine.sums.at(s) == theirs.sums.at(s));
  }
  // Rank 0 ran in one process from the first step to the last.
  CHECK(readRank(logs, 0).starts == 1);
  CHECK(readRank(logs, 1).starts == 2);
  WARN("under ddprun: kill -> first step after it on rank 0: " << firstStepAfter(logs, 0, killed_at) << " ms (pid "
                                                               << survivor << " kept)");
}

TEST_CASE("in-job recovery under ddprun: the warm spare takes a killed worker's place, steps stay bit-identical") {
  // Longer steps than above: the spare starts after the workers joined their group, and the
  // job must still run when the kill comes.
  constexpr int kSpareSteps = 40;
  constexpr int kStepMs = 100;
  TempDir reference_dir;
  const RunResult reference =
      run(job(reference_dir, "restart", "off", kSpareSteps, kStepMs), {}, std::chrono::seconds(120));
  INFO(reference.out << reference.err);
  REQUIRE(reference.exit_code == 0);

  TempDir dir;
  TestProcess ddprun(job(dir, "in-job", "on", kSpareSteps, kStepMs));
  const std::string logs = dir.file("logs");
  // The spare: a chaos trainer of this job started with DDPRUN_SPARE=1 and no rank.
  pid_t spare = -1;
  REQUIRE(eventually([&] { return (spare = processWith(logs, std::string("\0DDPRUN_SPARE=1\0", 16))) > 0; },
                     std::chrono::seconds(60)));
  REQUIRE(eventually([&] { return lastStep(logs, 1) >= 8; }, std::chrono::seconds(60)));
  const pid_t victim = workerPid(logs, 1);
  REQUIRE(victim > 0);
  REQUIRE(::kill(victim, SIGKILL) == 0);
  REQUIRE(ddprun.wait(std::chrono::seconds(120)));
  const std::string said = ddprun.out() + ddprun.err();
  INFO(said);
  CHECK(ddprun.exitCode() == 0);
  // Rank 1's place went to the spare: its pid, no process started for it.
  CHECK(countOf(said, "replaced alone: pid " + std::to_string(spare) + " (the spare)") == 1);
  CHECK(countOf(said, "started a spare worker (pid " + std::to_string(spare) + ")") == 1);
  for (int r = 0; r < kWorld; ++r) {
    INFO("rank " << r);
    const RankLog mine = readRank(logs, r);
    const RankLog theirs = readRank(reference_dir.file("logs"), r);
    CHECK(mine.problems.empty());
    CHECK(mine.done);
    REQUIRE(mine.sums.size() == static_cast<size_t>(kSpareSteps));
    for (int s = 1; s <= kSpareSteps; ++s) CHECK(mine.sums.at(s) == theirs.sums.at(s));
  }
  CHECK(readRank(logs, 0).starts == 1);
  CHECK(readRank(logs, 1).starts == 2);
  // Nothing of the job is left: not the spare that followed, nor the one that took rank 1.
  CHECK(processWith(logs, "") == -1);
}

TEST_CASE("in-job recovery under ddprun: the warm spare outlives a re-form and takes a rank of the next round") {
  // Node A runs alone (world 2) until it has a spare; node B joins and the job re-forms with
  // world 4 (a new attempt on A: its workers start again). A's spare, started in the first
  // round, stays through it (the agent's sweep of the attempt's processes leaves it) and takes
  // the place of A's worker killed in the second round. Ended with each round instead, the
  // spare of a round that re-formed seconds before a failure was still loading.
  TempDir dir;
  const std::string logs_a = dir.file("logs_a");
  const std::string logs_b = dir.file("logs_b");
  TestProcess a(elasticAgent(dir, logs_a, 0, 300));
  const int port = announcedPort(a);
  pid_t spare = -1;
  REQUIRE(eventually([&] { return (spare = processWith(logs_a, std::string("\0DDPRUN_SPARE=1\0", 16))) > 0; },
                     std::chrono::seconds(90)));
  CHECK(startEnv(spare, "WORLD_SIZE") == "2");  // started in the first round
  TestProcess b(elasticAgent(dir, logs_b, port, 300));
  // B's spare comes once B's workers joined the world-4 group, and so had A's.
  REQUIRE(eventually([&] { return processWith(logs_b, std::string("\0DDPRUN_SPARE=1\0", 16)) > 0; },
                     std::chrono::seconds(90)));
  const pid_t victim = processWith(logs_a, std::string("\0WORLD_SIZE=4\0", 14));
  REQUIRE(victim > 0);
  const int victim_rank = std::stoi(startEnv(victim, "RANK"));
  const long long joined_at = nowMs();
  REQUIRE(eventually([&] { return firstStepAfter(logs_a, victim_rank, joined_at) >= 0; }, std::chrono::seconds(60)));
  CHECK(processAlive(spare));
  REQUIRE(::kill(victim, SIGKILL) == 0);
  REQUIRE(a.wait(std::chrono::seconds(150)));
  REQUIRE(b.wait(std::chrono::seconds(30)));
  const std::string said = a.out() + a.err();
  INFO("A:\n" << said << "\nB:\n" << b.out() << b.err());
  CHECK(a.exitCode() == 0);
  CHECK(b.exitCode() == 0);
  CHECK_THAT(said, Catch::Contains("scales up from 1 to 2 node(s)"));
  CHECK(countOf(said, "started a spare worker (pid " + std::to_string(spare) + ")") == 1);
  CHECK(countOf(said, "replaced alone: pid " + std::to_string(spare) + " (the spare)") == 1);
  CHECK(countOf(said, "the spare worker (pid " + std::to_string(spare) + ")") == 0);  // never died waiting
  CHECK(readRank(logs_a, victim_rank).problems.empty());
  CHECK(readRank(logs_a, victim_rank).done);
  // Nothing of the job is left on either node.
  CHECK(processWith(logs_a, "") == -1);
  CHECK(processWith(logs_b, "") == -1);
}
