#include "agent/process/worker_cgroups.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>

#include <catch2/catch.hpp>

#include "agent/process/cgroup_v2.h"
#include "agent/process/orphan_guard.h"
#include "common/unique_fd.h"
#include "tests/support/child_exit.h"
#include "tests/support/test_process.h"

using ddprun::agent::WorkerCgroups;
using ddprun::testing::fileExists;

TEST_CASE("worker cgroups turned off create nothing and say why", "[worker_cgroups]") {
  WorkerCgroups cgroups(::getpid(), false);
  CHECK_FALSE(cgroups.enabled());
  CHECK(cgroups.root().empty());
  CHECK(cgroups.whyNot() == "DDPRUN_NO_CGROUPS is set");
  CHECK(cgroups.create(0, 0).empty());
  cgroups.killAll();
  CHECK(cgroups.removeEmpty());
}

// Where cgroups v2 cannot be written here, WorkerCgroups must say so instead of failing.
TEST_CASE("worker cgroups are created below the own cgroup and all removed, or not enabled with a reason",
          "[worker_cgroups]") {
  std::string root;
  std::string worker;
  {
    WorkerCgroups cgroups(::getpid(), true);
    if (!cgroups.enabled()) {
      CHECK_FALSE(cgroups.whyNot().empty());
      CHECK(cgroups.create(0, 0).empty());
      return;
    }
    root = cgroups.root();
    const auto own = ddprun::agent::ownCgroupDir();
    REQUIRE(own);
    CHECK(root == *own + "/ddprun-" + std::to_string(::getpid()));
    worker = cgroups.create(1, 2);
    CHECK(worker == root + "/w1-a2");
    CHECK(fileExists(worker + "/cgroup.procs"));
    CHECK_FALSE(ddprun::agent::cgroupPopulated(worker));
    CHECK(cgroups.removeEmpty());
    CHECK_FALSE(fileExists(worker));
    worker = cgroups.create(0, 3);
    CHECK(fileExists(worker));
  }
  CHECK_FALSE(fileExists(worker));
  CHECK_FALSE(fileExists(root));
}

TEST_CASE("worker cgroups name the agent's directory to the caller before they make it", "[worker_cgroups]") {
  std::string told;
  bool existed = true;
  {
    WorkerCgroups cgroups(::getpid(), true, [&](const std::string& root) {
      told = root;
      existed = fileExists(root);
    });
    if (!cgroups.enabled()) {
      WARN("SKIPPED: cgroups v2 cannot be written here: " << cgroups.whyNot());
      return;
    }
    CHECK(told == cgroups.root());
    CHECK_FALSE(existed);
    CHECK(fileExists(told));
  }
  CHECK_FALSE(fileExists(told));
}

namespace {

// Reads one pid written by a child on `fd`; -1 at EOF.
pid_t readPid(int fd) {
  pid_t pid = -1;
  return ::read(fd, &pid, sizeof pid) == static_cast<ssize_t>(sizeof pid) ? pid : -1;
}

}  // namespace

// An agent that tells its guard through the hook, as Containment does, and dies by SIGKILL the moment it regains
// control with its directory made: the guard alone removes it. (That the hook runs before the directory exists, the
// case above, is what leaves no moment in between where a kill would leave it to nobody.)
TEST_CASE(
    "an agent killed by SIGKILL the moment its cgroup directory exists leaves it to its orphan guard, which "
    "removes it",
    "[worker_cgroups]") {
  {
    WorkerCgroups probe(::getpid(), true);
    if (!probe.enabled()) {
      WARN("SKIPPED: cgroups v2 cannot be written here: " << probe.whyNot());
      return;
    }
  }
  const auto own = ddprun::agent::ownCgroupDir();
  REQUIRE(own);
  int to_parent[2];
  int to_child[2];
  REQUIRE(::pipe2(to_parent, O_CLOEXEC) == 0);
  REQUIRE(::pipe2(to_child, O_CLOEXEC) == 0);
  ddprun::UniqueFd from_child(to_parent[0]), child_out(to_parent[1]);
  ddprun::UniqueFd child_in(to_child[0]), to_child_w(to_child[1]);
  const pid_t agent = ::fork();
  REQUIRE(agent >= 0);
  if (agent == 0) {
    // The agent: its guard first, as main() forks it; the guard's pid goes to the test, which holds a pidfd on it
    // before the directory is made (the guard outlives the agent, so the pid cannot be reused meanwhile).
    from_child.reset();
    to_child_w.reset();
    ddprun::agent::OrphanGuard guard;
    const pid_t guard_pid = guard.pid();
    (void)!::write(child_out.get(), &guard_pid, sizeof guard_pid);
    char go;
    if (::read(child_in.get(), &go, 1) != 1) ::_exit(2);
    WorkerCgroups cgroups(::getpid(), true, [&](const std::string& root) { guard.watchCgroup(root); });
    ::raise(SIGKILL);
    ::_exit(3);
  }
  child_out.reset();
  child_in.reset();
  const std::string root = *own + "/ddprun-" + std::to_string(agent);
  const pid_t guard_pid = readPid(from_child.get());
  int guard_fd = guard_pid > 0 ? static_cast<int>(::syscall(SYS_pidfd_open, guard_pid, 0)) : -1;
  ddprun::UniqueFd guard_pidfd(guard_fd);
  (void)!::write(to_child_w.get(), "g", 1);
  int status = 0;
  const bool agent_ended = ddprun::testing::reapWithin(agent, &status, std::chrono::seconds(20));
  if (!agent_ended) {
    ::kill(agent, SIGKILL);
    ::waitpid(agent, &status, 0);
  }
  // The guard removes what it was told of and exits: its exit is the moment to look.
  bool guard_ended = false;
  if (guard_pidfd) {
    pollfd p{guard_pidfd.get(), POLLIN, 0};
    guard_ended = ::poll(&p, 1, 20000) == 1;
    if (!guard_ended) ::syscall(SYS_pidfd_send_signal, guard_pidfd.get(), SIGKILL, nullptr, 0);
    ::waitpid(guard_pid, nullptr, WNOHANG);  // reaped here if this process is a subreaper that adopted it
  }
  const bool left = fileExists(root);
  if (left) ::rmdir(root.c_str());  // leave nothing behind, pass or fail
  REQUIRE(guard_pid > 0);
  REQUIRE(guard_fd >= 0);
  CHECK(agent_ended);
  CHECK((WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL));
  CHECK(guard_ended);
  INFO(root);
  CHECK_FALSE(left);
}
