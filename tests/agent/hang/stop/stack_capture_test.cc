#include <sys/stat.h>

#include <fstream>

#include <catch2/catch.hpp>

#include "agent/hang/stop/hung_worker_stop.h"
#include "agent/hang/stop/stack_capture.h"
#include "agent/process/process_state.h"
#include "tests/support/test_process.h"

using namespace ddprun::agent;

namespace {

void makeExecutable(const std::string& path) {
  std::ofstream(path) << "#!/bin/sh\n";
  ::chmod(path.c_str(), 0755);
}

}  // namespace

TEST_CASE("eu-stack is preferred to gdb and either is found on PATH", "[stack_capture]") {
  ddprun::testing::TempDir a, b;
  CHECK_FALSE(findStackTool(a.path() + ":" + b.path()));
  makeExecutable(b.file("gdb"));
  auto gdb = findStackTool(a.path() + ":" + b.path());
  REQUIRE(gdb);
  CHECK(gdb->name == "gdb");
  CHECK(gdb->path == b.file("gdb"));
  makeExecutable(b.file("eu-stack"));
  auto eu = findStackTool(a.path() + ":" + b.path());
  REQUIRE(eu);
  CHECK(eu->name == "eu-stack");
  // Not executable, or a relative PATH entry: not taken.
  std::ofstream(a.file("eu-stack")) << "x";
  CHECK(findStackTool(a.path() + ":" + b.path())->path == b.file("eu-stack"));
  CHECK_FALSE(findStackTool(":relative"));
}

TEST_CASE("each tool prints every thread's stack of the pid", "[stack_capture]") {
  CHECK(stackToolCommand({"eu-stack", "/usr/bin/eu-stack"}, 42) ==
        std::vector<std::string>{"/usr/bin/eu-stack", "-p", "42"});
  CHECK(stackToolCommand({"gdb", "/usr/bin/gdb"}, 42) ==
        std::vector<std::string>{"/usr/bin/gdb", "-batch", "-nx", "-p", "42", "-ex", "thread apply all bt"});
}

TEST_CASE("stacks.txt names the worker and the tool and the problem and holds the stacks", "[stack_capture]") {
  ProcessStacks s;
  s.pid = 77;
  s.tool = "gdb";
  s.text = "Thread 1\n#0 f()";
  s.problem = "gdb exited with code 1";
  const std::string file = formatStacksFile(3, 1, s, "before stopping it: timer 'x' expired");
  CHECK_THAT(file, Catch::StartsWith("# native stacks of rank 3 (local rank 1, pid 77), taken "));
  CHECK_THAT(file,
             Catch::Contains(
                 " before stopping it: timer 'x' expired\n# by gdb\n# gdb exited with code 1\nThread 1\n#0 f()\n"));
  ProcessStacks none;
  none.pid = 5;
  none.problem = kNoStackToolNote;
  CHECK_THAT(formatStacksFile(0, 0, none, "r"), Catch::EndsWith(std::string("# ") + kNoStackToolNote + "\n"));
}

TEST_CASE("process states are named", "[process_state]") {
  CHECK(processStateName('D') == "uninterruptible sleep");
  CHECK(processStateName('T') == "stopped");
  CHECK(processStateName('R') == "running");
  CHECK(processStateName('?') == "state ?");
  CHECK(describeProcessState(::getpid()) == "R (running)");
}

TEST_CASE("a process is found under the worker it is or belongs to", "[hung_worker_stop]") {
  CHECK(findOwningWorker(::getpid(), {1, ::getpid()}) == ::getpid());
  // This process is in the group its group leader leads, and below its parent.
  CHECK(findOwningWorker(::getpid(), {::getpgrp()}) == ::getpgrp());
  CHECK(findOwningWorker(::getpid(), {::getppid()}) == ::getppid());
  CHECK(findOwningWorker(::getpid(), {}) == -1);
  CHECK(findOwningWorker(0x3fffffff, {::getpgrp()}) == -1);  // no such process
}
