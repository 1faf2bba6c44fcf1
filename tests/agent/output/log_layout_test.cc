#include "agent/output/log_layout.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include <catch2/catch.hpp>

#include "common/error.h"
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

TEST_CASE("no run directory is made where another user could swap it: a parent writable by others, not sticky",
          "[log_layout]") {
  TempDir tmp;
  // mode, and whether a run directory may be made there
  const std::vector<std::pair<mode_t, bool>> modes = {{0777, false}, {0770, false}, {0730, false}, {01777, true},
                                                      {01770, true}, {0755, true},  {0700, true}};
  for (const auto& [mode, safe] : modes) {
    INFO("mode " << std::oct << mode);
    const std::string parent = tmp.file("parent");
    REQUIRE(fs::create_directory(parent));
    REQUIRE(::chmod(parent.c_str(), mode) == 0);
    if (safe) {
      LogLayout under_log_dir(parent, "job", false);
      CHECK(fs::path(under_log_dir.runDir()).parent_path() == fs::path(parent));
      ddprun::testing::ScopedEnv env("TMPDIR", parent);
      LogLayout under_tmp(std::nullopt, "job", false);
      CHECK(fs::path(under_tmp.runDir()).parent_path() == fs::path(parent));
      fs::remove_all(under_log_dir.runDir());
    } else {
      char octal[8];
      std::snprintf(octal, sizeof octal, "%04o", static_cast<unsigned>(mode));
      const std::string reason = std::string(": unsafe for a run directory: writable by ") +
                                 ((mode & S_IWOTH) != 0 ? "others" : "its group") + " without the sticky bit (mode " +
                                 octal + ")";
      CHECK_THROWS_AS(LogLayout(parent, "job", false), ddprun::UsageError);
      CHECK_THROWS_WITH(LogLayout(parent, "job", false), Catch::StartsWith("--log_dir " + parent + reason));
      ddprun::testing::ScopedEnv env("TMPDIR", parent);
      CHECK_THROWS_WITH(LogLayout(std::nullopt, "job", false), Catch::StartsWith("TMPDIR " + parent + reason));
      CHECK_THROWS_AS(ddprun::agent::ensureWritableDirectory(parent), ddprun::UsageError);
      CHECK(fs::is_empty(parent));
    }
    fs::remove_all(parent);
  }
}

TEST_CASE("no run directory is made in a directory another user owns, even a sticky one", "[log_layout]") {
  if (::geteuid() != 0) {
    WARN("SKIPPED: making a directory another user owns needs root");
    return;
  }
  TempDir tmp;
  const std::string theirs = tmp.file("theirs");
  REQUIRE(fs::create_directory(theirs));
  for (mode_t mode : {0755, 01777}) {
    REQUIRE(::chmod(theirs.c_str(), mode) == 0);
    REQUIRE(::chown(theirs.c_str(), 65534, 65534) == 0);
    CHECK_THROWS_AS(LogLayout(theirs, "job", false), ddprun::UsageError);
    CHECK_THROWS_WITH(LogLayout(theirs, "job", false),
                      Catch::StartsWith("--log_dir " + theirs + ": unsafe for a run directory: owned by ") &&
                          Catch::Contains("uid 65534"));
    ddprun::testing::ScopedEnv env("TMPDIR", theirs);
    CHECK_THROWS_AS(LogLayout(std::nullopt, "job", false), ddprun::UsageError);
    CHECK(fs::is_empty(theirs));
  }
  // Root's own sticky directory (/tmp's kind) is fine for anyone.
  REQUIRE(::chown(theirs.c_str(), 0, 0) == 0);
  LogLayout layout(theirs, "job", false);
  CHECK(fs::path(layout.runDir()).parent_path() == fs::path(theirs));
  fs::remove_all(layout.runDir());
}

TEST_CASE("the run directory is private, and a link where an attempt's directory goes is refused", "[log_layout]") {
  TempDir tmp;
  LogLayout layout(tmp.file("logs"), "job", false);
  struct stat st {};
  REQUIRE(::stat(layout.runDir().c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);
  CHECK(st.st_uid == ::geteuid());
  // A worker of attempt 0 that leaves a link for attempt 1 does not send the agent's files there.
  TempDir elsewhere;
  fs::create_directory_symlink(elsewhere.path(), layout.runDir() + "/attempt_1");
  CHECK_THROWS_AS(layout.workerDir(1, 0), ddprun::SystemError);
  CHECK(fs::is_empty(elsewhere.path()));
  CHECK(layout.workerDir(0, 3) == layout.runDir() + "/attempt_0/3");
  CHECK(fs::is_directory(layout.runDir() + "/attempt_0/3"));
  fs::remove_all(layout.runDir());
}
