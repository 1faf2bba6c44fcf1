#include "agent/output/log_layout.h"

#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include <catch2/catch.hpp>

#include "tests/support/scoped_env.h"
#include "tests/support/test_process.h"

using ddprun::agent::LogLayout;
using ddprun::testing::TempDir;
namespace fs = std::filesystem;

namespace {

// What a run leaves in a worker's directory and in the run directory, as ddprun writes it.
void fillRun(const LogLayout& layout) {
  for (int rank = 0; rank < 2; ++rank) {
    const std::string dir = layout.workerDir(0, rank);
    std::ofstream(LogLayout::secretFile(dir)) << "secret\n";
    std::ofstream(LogLayout::stdoutFile(dir)) << "out\n";
  }
  std::ofstream(LogLayout::secretFile(layout.workerDir(1, 0))) << "secret\n";
  std::ofstream(layout.workerDir(1, 0) + "/stacks.txt") << "#0 main\n";
  std::ofstream(LogLayout::filteredStdoutFile(layout.attemptDir(1))) << "filtered\n";
  fs::create_directories(layout.pythonHookDir());
  std::ofstream(layout.pythonHookDir() + "/sitecustomize.py") << "pass\n";
}

}  // namespace

TEST_CASE("a temporary run directory is made under TMPDIR and removed with everything in it", "[log_layout]") {
  TempDir tmp;
  ddprun::testing::ScopedEnv env("TMPDIR", tmp.path());
  std::string run_dir;
  {
    LogLayout layout(std::nullopt, "job", false);
    run_dir = layout.runDir();
    CHECK(layout.isTemporary());
    CHECK(fs::path(run_dir).parent_path() == fs::path(tmp.path()));
    CHECK(fs::path(run_dir).filename().string().rfind("ddprun-job_", 0) == 0);
    fillRun(layout);
  }
  CHECK_FALSE(fs::exists(run_dir));
}

TEST_CASE("a run directory that stays loses the workers' RPC secrets and the Python hook, and keeps the rest",
          "[log_layout]") {
  TempDir tmp;
  ddprun::testing::ScopedEnv env("TMPDIR", tmp.path());
  // Kept three ways: under --log_dir, for logs asked for without it, for a hung worker's stacks.
  for (int how = 0; how < 3; ++how) {
    INFO("how " << how);
    std::string run_dir;
    {
      LogLayout layout(how == 0 ? std::optional<std::string>(tmp.file("logs")) : std::nullopt, "job", how == 1);
      if (how == 2) layout.keep();
      CHECK_FALSE(layout.isTemporary());
      run_dir = layout.runDir();
      fillRun(layout);
    }
    REQUIRE(fs::is_directory(run_dir));
    CHECK_FALSE(fs::exists(run_dir + "/python_hook"));
    CHECK_FALSE(fs::exists(run_dir + "/attempt_0/0/rpc_secret"));
    CHECK_FALSE(fs::exists(run_dir + "/attempt_0/1/rpc_secret"));
    CHECK_FALSE(fs::exists(run_dir + "/attempt_1/0/rpc_secret"));
    CHECK(fs::exists(run_dir + "/attempt_0/0/stdout.log"));
    CHECK(fs::exists(run_dir + "/attempt_0/1/stdout.log"));
    CHECK(fs::exists(run_dir + "/attempt_1/0/stacks.txt"));
    CHECK(fs::exists(run_dir + "/attempt_1/filtered_stdout.log"));
    fs::remove_all(run_dir);
  }
}
