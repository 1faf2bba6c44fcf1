// Capturing the stacks of a real process: with the installed eu-stack or gdb, with none,
// and with stand-in tools that fail or never finish (killed at the deadline).
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <thread>

#include <catch2/catch.hpp>

#include "agent/hang/stop/stack_capture.h"
#include "common/unique_fd.h"
#include "tests/support/scoped_env.h"
#include "tests/support/test_process.h"

using namespace ddprun::agent;
using namespace std::chrono_literals;

// Not inlined and not static: the child's stacks show them by name.
// Each writes one byte to `ready_fd` once it is there, so that the capture starts only
// when both threads wait in them.
__attribute__((noinline)) void childWaitsHere(int ready_fd) {
  (void)!::write(ready_fd, "m", 1);
  for (;;) ::pause();
}
__attribute__((noinline)) void childThreadWaitsHere(int ready_fd) {
  (void)!::write(ready_fd, "t", 1);
  for (;;) ::pause();
}

namespace {

// A child that waits in childWaitsHere until killed; killed and reaped on destruction.
class Sleeper {
 public:
  Sleeper() {
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    ddprun::UniqueFd read_end(fds[0]);
    ddprun::UniqueFd write_end(fds[1]);
    pid_ = ::fork();
    if (pid_ == 0) {
      // Two threads: the capture must show both.
      std::thread second(childThreadWaitsHere, write_end.get());
      childWaitsHere(write_end.get());
    }
    write_end.reset();
    char ready[2];
    for (size_t got = 0; got < 2;) {
      const ssize_t n = ::read(read_end.get(), ready + got, 2 - got);
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
  }
  ~Sleeper() {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_;
};

// The executable `name` in the directories of PATH; "" when there is none.
std::string onPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "";
  for (size_t start = 0; start <= dirs.size();) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    const std::string candidate = dirs.substr(start, end - start) + "/" + name;
    if (!candidate.empty() && candidate[0] == '/' && ::access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return "";
}

void writeTool(const std::string& path, const std::string& body) {
  std::ofstream(path) << "#!/bin/sh\n" << body << "\n";
  ::chmod(path.c_str(), 0755);
}

}  // namespace

TEST_CASE("each installed tool shows every thread's stack of a live process which goes on", "[stack_capture]") {
  // scripts/setup installs elfutils (eu-stack); gdb is tried too where it is installed.
  std::vector<std::string> installed;
  for (const char* name : {"eu-stack", "gdb"}) {
    if (const std::string path = onPath(name); !path.empty()) installed.push_back(path);
  }
  REQUIRE(!installed.empty());
  for (const std::string& real : installed) {
    // A PATH with only this tool on it.
    ddprun::testing::TempDir bin;
    const std::string name = real.substr(real.rfind('/') + 1);
    REQUIRE(::symlink(real.c_str(), bin.file(name).c_str()) == 0);
    ddprun::testing::ScopedEnv path("PATH", bin.path());
    Sleeper child;
    auto stacks = captureNativeStacks({child.pid()}, 60s);
    REQUIRE(stacks.size() == 1);
    INFO(name << ":\n" << stacks[0].text);
    CHECK(stacks[0].pid == child.pid());
    CHECK(stacks[0].tool == name);
    CHECK(stacks[0].problem.empty());
    CHECK_THAT(stacks[0].text, Catch::Contains("childWaitsHere"));
    CHECK_THAT(stacks[0].text, Catch::Contains("childThreadWaitsHere"));
    // Detached again: the child still runs, sleeping, not stopped.
    std::ifstream stat("/proc/" + std::to_string(child.pid()) + "/stat");
    std::string pid, comm, state;
    stat >> pid >> comm >> state;
    CHECK(state == "S");
  }
}

TEST_CASE("with neither tool on PATH the stacks say so", "[stack_capture]") {
  ddprun::testing::TempDir empty;
  ddprun::testing::ScopedEnv path("PATH", empty.path());
  Sleeper child;
  auto stacks = captureNativeStacks({child.pid()}, 5s);
  REQUIRE(stacks.size() == 1);
  CHECK(stacks[0].tool.empty());
  CHECK(stacks[0].problem == kNoStackToolNote);
  CHECK(stacks[0].text.empty());
}

TEST_CASE("a tool that does not finish is killed at the deadline and its output kept", "[stack_capture]") {
  ddprun::testing::TempDir bin;
  const std::string marker = bin.file("sleeper.pid");
  // It starts a child of its own, which must go with it (the tool's process group is killed).
  writeTool(bin.file("gdb"), "echo partial output; /bin/sleep 60 & echo $! > " + marker + "; wait");
  ddprun::testing::ScopedEnv path("PATH", bin.path());
  Sleeper a, b;
  auto stacks = captureNativeStacks({a.pid(), b.pid()}, 300ms);
  REQUIRE(stacks.size() == 2);
  for (const auto& s : stacks) {
    CHECK(s.tool == "gdb");
    CHECK_THAT(s.text, Catch::StartsWith("partial output"));
    CHECK(s.problem == "gdb did not finish within 0.3 s and was killed; its output so far follows");
  }
  std::ifstream in(marker);
  pid_t grandchild = 0;
  in >> grandchild;
  REQUIRE(grandchild > 0);
  // The sleep was the tool's child, now an orphan reparented away: gone within a moment.
  CHECK(ddprun::testing::eventually([&] { return !ddprun::testing::processAlive(grandchild); }, 5s));
}

TEST_CASE("a tool that fails says how and what it printed is kept", "[stack_capture]") {
  ddprun::testing::TempDir bin;
  writeTool(bin.file("eu-stack"), "echo 'eu-stack: cannot attach' >&2; exit 3");
  ddprun::testing::ScopedEnv path("PATH", bin.path());
  Sleeper child;
  auto stacks = captureNativeStacks({child.pid()}, 30s);
  REQUIRE(stacks.size() == 1);
  CHECK(stacks[0].tool == "eu-stack");
  CHECK(stacks[0].text == "eu-stack: cannot attach\n");
  CHECK(stacks[0].problem == "eu-stack exited with code 3");
}
