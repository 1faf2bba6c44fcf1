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

std::vector<std::string> job(const TempDir& dir, const std::string& recovery) {
  fs::create_directories(dir.file("logs"));
  return {ddprunPath(),
          "--standalone",
          "--nproc_per_node=" + std::to_string(kWorld),
          "--max_restarts=2",
          "--recovery=" + recovery,
          "--no_python",
          binDir() + "/chaos_trainer",
          "--steps",
          std::to_string(kSteps),
          "--step-ms",
          "30",
          "--checkpoint-every",
          "7",
          "--timeout",
          "60",
          "--checkpoint-dir",
          dir.file("ck"),
          "--log-dir",
          dir.file("logs")};
}

std::string readAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The pid of the chaos trainer of `rank` whose arguments name `logs` (this test's own job).
pid_t workerPid(const std::string& logs, int rank) {
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string pid = entry.path().filename().string();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string cmdline = readAll(entry.path().string() + "/cmdline");
    if (cmdline.find("chaos_trainer") == std::string::npos || cmdline.find(logs) == std::string::npos) continue;
    const std::string environ = readAll(entry.path().string() + "/environ");
    if (environ.find(std::string("\0RANK=", 6) + std::to_string(rank) + '\0') != std::string::npos) {
      return static_cast<pid_t>(std::stol(pid));
    }
  }
  return -1;
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
