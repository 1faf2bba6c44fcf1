#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "tests/support/test_process.h"

using namespace ddprun::testing;

namespace {

std::vector<pid_t> pidsIn(const std::string& file) {
  std::vector<pid_t> pids;
  std::istringstream in(readFile(file));
  for (pid_t pid; in >> pid;) pids.push_back(pid);
  return pids;
}

// True once none of `pids` runs, within `limit`.
bool allGone(const std::vector<pid_t>& pids, std::chrono::milliseconds limit) {
  return eventually(
      [&] {
        for (pid_t pid : pids) {
          if (processAlive(pid)) return false;
        }
        return true;
      },
      limit);
}

// The entries of `dir` whose names start with `prefix`.
std::vector<std::string> entriesStartingWith(const std::string& dir, const std::string& prefix) {
  std::vector<std::string> found;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().filename().string().rfind(prefix, 0) == 0) found.push_back(entry.path());
  }
  return found;
}

// kill -9 of the ddprun under test; returns once it is reaped.
void killNine(TestProcess& ddprun) {
  ::kill(ddprun.pid(), SIGKILL);
  REQUIRE(ddprun.wait(10s));
  CHECK(ddprun.termSignal() == SIGKILL);
}

}  // namespace

TEST_CASE("kill -9 of ddprun leaves no worker or grandchild running", "[e2e][orphans]") {
  TempDir dir;
  std::vector<pid_t> pids;
  {
    TestProcess ddprun({ddprunPath(), "--standalone", "--nproc_per_node=2", "--no_python", testWorkerPath(),
                        "grandchild", dir.file("pids")});
    REQUIRE(ddprun.waitForOutput("ready rank=", 20s, 2));
    pids = pidsIn(dir.file("pids"));
    REQUIRE(pids.size() == 4);
    for (pid_t pid : pids) REQUIRE(processAlive(pid));
    killNine(ddprun);
  }
  CHECK(allGone(pids, 10s));
}

TEST_CASE("a worker's background child does not outlive a successful job", "[e2e][orphans]") {
  TempDir dir;
  std::string pid_file = dir.file("bg");
  auto r = run({ddprunPath(), "--standalone", "--nproc_per_node=1", "--term_timeout=2", "--no_python", "sh", "-c",
                "sleep 300 & echo $! > " + pid_file + "; exit 0"},
               {}, 30s);
  REQUIRE(r.finished);
  CHECK(r.exit_code == 0);
  auto pids = pidsIn(pid_file);
  REQUIRE(pids.size() == 1);
  CHECK(eventually([&] { return !processAlive(pids[0]); }, 5s));
}

TEST_CASE("stopping on a signal leaves no grandchild behind", "[e2e][orphans]") {
  TempDir dir;
  TestProcess ddprun({ddprunPath(), "--standalone", "--nproc_per_node=2", "--no_python", testWorkerPath(), "grandchild",
                      dir.file("pids")});
  REQUIRE(ddprun.waitForOutput("ready rank=", 20s, 2));
  auto pids = pidsIn(dir.file("pids"));
  REQUIRE(pids.size() == 4);
  ddprun.signal(SIGTERM);
  REQUIRE(ddprun.wait(20s));
  CHECK(ddprun.exitCode() == 128 + SIGTERM);
  for (pid_t pid : pids) CHECK_FALSE(processAlive(pid));
}

namespace {

// The orphan guard ddprun forks first, from its main thread: its child named "ddprun-guard"
// (0 when there is none).
pid_t guardOf(pid_t ddprun) {
  const std::string self = std::to_string(ddprun);
  std::istringstream children(readFile("/proc/" + self + "/task/" + self + "/children"));
  for (pid_t child; children >> child;) {
    if (readFile("/proc/" + std::to_string(child) + "/comm") == "ddprun-guard\n") return child;
  }
  return 0;
}

}  // namespace

TEST_CASE("a stopped orphan guard does not keep ddprun from exiting", "[e2e][orphans]") {
  TempDir dir;
  std::string go = dir.file("go");
  TestProcess ddprun({ddprunPath(), "--standalone", "--no_python", "sh", "-c",
                      "echo worker-up; while [ ! -e " + go + " ]; do sleep 0.05; done"});
  REQUIRE(ddprun.waitForOutput("worker-up", 20s));
  pid_t guard = 0;
  REQUIRE(eventually([&] { return (guard = guardOf(ddprun.pid())) > 0; }, 5s));
  REQUIRE(::kill(guard, SIGSTOP) == 0);
  { std::ofstream(go) << "go"; }
  // The job ends normally; before the fix ddprun then waited for the stopped guard forever.
  REQUIRE(ddprun.wait(20s));
  CHECK(ddprun.exitCode() == 0);
  CHECK_THAT(ddprun.err(), Catch::Contains("orphan guard"));
  CHECK(eventually([&] { return !processAlive(guard); }, 5s));
}

TEST_CASE("a worker's setsid daemon does not outlive a successful job", "[e2e][orphans]") {
  TempDir dir;
  std::string pid_file = dir.file("daemon");
  // setsid leaves the worker's process group (and session): the group kill cannot reach it.
  auto r = run({ddprunPath(), "--standalone", "--nproc_per_node=1", "--term_timeout=2", "--no_python", "sh", "-c",
                // Exit only once the daemon leads its own session (field 6 of its stat).
                "setsid sleep 300 & d=$!; echo $d > " + pid_file +
                    "; while [ \"$(cut -d' ' -f6 /proc/$d/stat)\" != \"$d\" ]; do sleep 0.01; done; exit 0"},
               {}, 30s);
  REQUIRE(r.finished);
  CHECK(r.exit_code == 0);
  auto pids = pidsIn(pid_file);
  REQUIRE(pids.size() == 1);
  const bool gone = eventually([&] { return !processAlive(pids[0]); }, 5s);
  if (!gone) ::kill(pids[0], SIGKILL);  // leave nothing behind, pass or fail
  CHECK(gone);
  CHECK_THAT(r.err, Catch::Contains("left their worker's process group"));
}

namespace {

// This process's cgroup v2 directory if a child cgroup can be created in it here (and so by
// the ddprun it starts, which inherits its cgroup); empty otherwise (no cgroup2 mount, not
// root, a read-only container).
std::string writableCgroupDir() {
  std::string mount;
  std::istringstream mounts(readFile("/proc/self/mounts"));
  for (std::string line; std::getline(mounts, line);) {
    std::istringstream fields(line);
    std::string device, point, type;
    if (fields >> device >> point >> type && type == "cgroup2") {
      mount = point;
      break;
    }
  }
  if (mount.empty()) return {};
  std::istringstream cgroups(readFile("/proc/self/cgroup"));
  std::string dir;
  for (std::string line; std::getline(cgroups, line);) {
    if (line.rfind("0::/", 0) == 0) dir = line == "0::/" ? mount : mount + line.substr(3);
  }
  if (dir.empty()) return {};
  const std::string probe = dir + "/ddprun-test-probe-" + std::to_string(::getpid());
  if (::mkdir(probe.c_str(), 0755) != 0) return {};
  ::rmdir(probe.c_str());
  return dir;
}

// Removes what a failed test left of a ddprun's cgroups (deepest first), so that nothing outlives
// the test, pass or fail; returns whether there was anything.
bool removeLeftCgroups(const std::string& dir) {
  if (!fileExists(dir)) return false;
  std::vector<std::string> dirs;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    if (entry.is_directory()) dirs.push_back(entry.path());
  }
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) ::rmdir(it->c_str());
  ::rmdir(dir.c_str());
  return true;
}

// A worker that starts two daemons that leave its process group and session: one with setsid,
// one with setsid from a subshell that then exits (so it comes to ddprun as subreaper). It
// writes their pids and then its own to `pid_file`, and says "daemons-ready" once both lead
// their own sessions (field 6 of their stat).
std::vector<std::string> daemonWorker(const std::string& pid_file, const std::string& then) {
  const std::string leads = "[ \"$(cut -d' ' -f6 /proc/$1/stat)\" = \"$1\" ]";
  return {"sh", "-c",
          "leads() { " + leads + "; }; setsid sleep 300 & echo $! > " + pid_file + "; (setsid sleep 301 & echo $! >> " +
              pid_file + "); echo $$ >> " + pid_file + "; for d in $(head -n 2 " + pid_file +
              "); do while ! leads $d; do sleep 0.01; done; done; echo daemons-ready; " + then};
}

// kill -9 of ddprun while its worker's daemons run: afterwards neither they nor the worker may
// be left, nor any cgroup of that ddprun. `no_cgroups` forces the process-group fallback.
void killDuringDaemons(bool no_cgroups) {
  TempDir dir;
  const std::string pid_file = dir.file("pids");
  const std::string cgroup_dir = no_cgroups ? std::string() : writableCgroupDir();
  std::vector<std::string> argv = {ddprunPath(), "--standalone", "--nproc_per_node=1", "--no_python"};
  for (const std::string& arg : daemonWorker(pid_file, "exec sleep 300")) argv.push_back(arg);
  std::vector<pid_t> pids;
  std::string our_cgroups;
  {
    TestProcess ddprun(argv, {{"DDPRUN_LOG_LEVEL", "agent=debug"}, {"DDPRUN_NO_CGROUPS", no_cgroups ? "1" : ""}});
    REQUIRE(ddprun.waitForOutput("daemons-ready", 20s));
    pids = pidsIn(pid_file);
    REQUIRE(pids.size() == 3);
    if (!cgroup_dir.empty()) {
      our_cgroups = cgroup_dir + "/ddprun-" + std::to_string(ddprun.pid());
      CHECK_THAT(ddprun.err(), Catch::Contains("workers are contained by cgroups under " + our_cgroups));
      CHECK(fileExists(our_cgroups + "/w0-a0"));
    } else {
      CHECK_THAT(ddprun.err(), Catch::Contains("workers are contained by process groups only"));
      // The agent finds the daemons by a periodic scan; kill -9 must come after it told the guard.
      for (int i = 0; i < 2; ++i) {
        CHECK(ddprun.waitForOutput("the orphan guard now watches pid " + std::to_string(pids[i]) + ":", 10s));
      }
    }
    killNine(ddprun);
  }
  const bool gone = allGone(pids, 10s);
  for (pid_t pid : pids) {
    if (processAlive(pid)) ::kill(pid, SIGKILL);  // leave nothing behind, pass or fail
  }
  CHECK(gone);
  if (!our_cgroups.empty()) {
    const bool removed = eventually([&] { return !fileExists(our_cgroups); }, 10s);
    if (!removed) removeLeftCgroups(our_cgroups);
    CHECK(removed);
  }
}

}  // namespace

TEST_CASE("kill -9 of ddprun stops its workers' setsid daemons (cgroups where writable)", "[e2e][orphans]") {
  killDuringDaemons(false);
}

TEST_CASE("kill -9 of ddprun stops its workers' setsid daemons with DDPRUN_NO_CGROUPS=1", "[e2e][orphans]") {
  killDuringDaemons(true);
}

namespace {

// A successful job whose worker leaves daemons: none may outlive it, nor any cgroup.
void succeedWithDaemons(bool no_cgroups) {
  TempDir dir;
  const std::string pid_file = dir.file("pids");
  const std::string cgroup_dir = no_cgroups ? std::string() : writableCgroupDir();
  std::vector<std::string> argv = {ddprunPath(), "--standalone", "--nproc_per_node=1", "--term_timeout=2",
                                   "--no_python"};
  for (const std::string& arg : daemonWorker(pid_file, "exit 0")) argv.push_back(arg);
  auto r = run(argv, {{"DDPRUN_LOG_LEVEL", "agent=debug"}, {"DDPRUN_NO_CGROUPS", no_cgroups ? "1" : ""}}, 30s);
  REQUIRE(r.finished);
  CHECK(r.exit_code == 0);
  auto pids = pidsIn(pid_file);
  REQUIRE(pids.size() == 3);
  const bool gone = allGone(pids, 5s);
  for (pid_t pid : pids) {
    if (processAlive(pid)) ::kill(pid, SIGKILL);
  }
  CHECK(gone);
  if (!cgroup_dir.empty()) {
    const std::string needle = "workers are contained by cgroups under ";
    const auto at = r.err.find(needle);
    REQUIRE(at != std::string::npos);
    const std::string ours = r.err.substr(at + needle.size(), r.err.find('\n', at) - at - needle.size());
    CHECK_THAT(ours, Catch::StartsWith(cgroup_dir + "/ddprun-"));
    const bool left = removeLeftCgroups(ours);
    CHECK_FALSE(left);
  } else {
    CHECK_THAT(r.err, Catch::Contains("workers are contained by process groups only"));
  }
}

}  // namespace

TEST_CASE("setsid daemons do not outlive a successful job and no cgroup is left", "[e2e][orphans]") {
  succeedWithDaemons(false);
}

TEST_CASE("setsid daemons do not outlive a successful job with DDPRUN_NO_CGROUPS=1", "[e2e][orphans]") {
  succeedWithDaemons(true);
}

TEST_CASE("kill -9 of ddprun stops a daemon that left both its process group and its cgroup", "[e2e][orphans]") {
  const std::string cgroup_dir = writableCgroupDir();
  if (cgroup_dir.empty()) {
    WARN("SKIPPED: no writable cgroup2 directory here (needs root and a cgroup2 mount)");
    return;
  }
  TempDir dir;
  const std::string pid_file = dir.file("daemon");
  // The daemon leaves its worker's session and moves itself into this test's own cgroup, out
  // of the agent's subtree (issue 39, #3), then says where it is.
  const std::string daemon = "echo $$ > " + cgroup_dir + "/cgroup.procs && echo $$ > " + pid_file + ".tmp && mv " +
                             pid_file + ".tmp " + pid_file + " && exec sleep 302";
  const std::string worker = "(setsid sh -c '" + daemon + "' &); while [ ! -e " + pid_file +
                             " ]; do sleep 0.01; done; echo daemon-ready; exec sleep 300";
  pid_t daemon_pid = 0;
  {
    TestProcess ddprun({ddprunPath(), "--standalone", "--nproc_per_node=1", "--no_python", "sh", "-c", worker},
                       {{"DDPRUN_LOG_LEVEL", "agent=debug"}, {"DDPRUN_NO_CGROUPS", ""}});
    REQUIRE(ddprun.waitForOutput("daemon-ready", 20s));
    const auto pids = pidsIn(pid_file);
    REQUIRE(pids.size() == 1);
    daemon_pid = pids[0];
    CHECK_THAT(ddprun.err(), Catch::Contains("workers are contained by cgroups under " + cgroup_dir + "/ddprun-"));
    // The agent's scan finds it even with cgroups on; kill -9 comes after it told the guard.
    CHECK(ddprun.waitForOutput("the orphan guard now watches pid " + std::to_string(daemon_pid) + ":", 10s));
    killNine(ddprun);
  }
  const bool gone = eventually([&] { return !processAlive(daemon_pid); }, 10s);
  if (!gone) ::kill(daemon_pid, SIGKILL);  // leave nothing behind, pass or fail
  CHECK(gone);
}

TEST_CASE("kill -9 of ddprun without --log_dir leaves no temporary run directory", "[e2e][orphans]") {
  TempDir tmp;
  std::vector<pid_t> pids;
  {
    TestProcess ddprun({ddprunPath(), "--standalone", "--nproc_per_node=2", "--no_python", testWorkerPath(),
                        "grandchild", tmp.file("pids")},
                       {{"TMPDIR", tmp.path()}});
    REQUIRE(ddprun.waitForOutput("ready rank=", 20s, 2));
    pids = pidsIn(tmp.file("pids"));
    // The run directory, with each worker's files (and rpc_secret where there is one).
    const auto runDirs = [&] { return entriesStartingWith(tmp.path(), "ddprun-"); };
    REQUIRE(runDirs().size() == 1);
    killNine(ddprun);
    CHECK(eventually([&] { return runDirs().empty(); }, 10s));
  }
  CHECK(allGone(pids, 10s));
}

// A run directory that stays (--log_dir here; one kept for a hung worker's stacks is the same)
// keeps its logs when ddprun is killed, but not the job's RPC secrets or ddprun's Python hook.
TEST_CASE("kill -9 of ddprun with --log_dir leaves the run directory without RPC secrets or Python hook",
          "[e2e][orphans]") {
  TempDir tmp;
  const std::string script = tmp.file("sleeper.py");
  std::ofstream(script) << "import os, time\n"
                           "with open(os.environ['PIDS'], 'a') as f:\n"
                           "    f.write(f'{os.getpid()}\\n')\n"
                           "os.write(1, f\"ready rank={os.environ['RANK']}\\n\".encode())\n"
                           "time.sleep(60)\n";
  const std::string logs = tmp.file("logs");
  const auto leftovers = [&] {
    std::vector<std::string> found;
    for (const auto& entry : std::filesystem::recursive_directory_iterator(logs)) {
      const std::string name = entry.path().filename().string();
      if (name == "rpc_secret" || name == "python_hook") found.push_back(entry.path().string());
    }
    return found;
  };
  std::vector<pid_t> pids;
  {
    TestProcess ddprun({ddprunPath(), "--standalone", "--nproc_per_node=2", "--log_dir", logs, script},
                       {{"PYTHON", "/usr/bin/python3"}, {"PIDS", tmp.file("pids")}});
    REQUIRE(ddprun.waitForOutput("ready rank=", 30s, 2));
    pids = pidsIn(tmp.file("pids"));
    // Both workers' secrets and the hook are there while the job runs.
    REQUIRE(leftovers().size() == 3);
    killNine(ddprun);
    const bool scrubbed = eventually([&] { return leftovers().empty(); }, 10s);
    for (const std::string& path : leftovers()) WARN("left behind: " << path);
    CHECK(scrubbed);
  }
  CHECK(allGone(pids, 10s));
  const auto runs = entriesStartingWith(logs, "");
  REQUIRE(runs.size() == 1);
  CHECK(std::filesystem::is_directory(runs[0] + "/attempt_0/0"));
  CHECK(std::filesystem::is_directory(runs[0] + "/attempt_0/1"));
}

// The file timers' pipe (TORCHELASTIC_ENABLE_FILE_TIMER=1, in $TMPDIR) goes with a killed agent
// too: the chaos soak found one FIFO left per agent killed with kill -9 (issue 36).
TEST_CASE("kill -9 of ddprun with file timers leaves no timer pipe in TMPDIR", "[e2e][orphans]") {
  TempDir tmp;
  std::vector<pid_t> pids;
  const auto pipes = [&] { return entriesStartingWith(tmp.path(), "watchdog_timer_"); };
  {
    TestProcess ddprun({ddprunPath(), "--standalone", "--nproc_per_node=1", "--no_python", testWorkerPath(),
                        "grandchild", tmp.file("pids")},
                       {{"TMPDIR", tmp.path()}, {"TORCHELASTIC_ENABLE_FILE_TIMER", "1"}});
    REQUIRE(ddprun.waitForOutput("ready rank=", 20s, 1));
    pids = pidsIn(tmp.file("pids"));
    REQUIRE(pipes().size() == 1);
    killNine(ddprun);
    CHECK(eventually([&] { return pipes().empty(); }, 10s));
  }
  CHECK(allGone(pids, 10s));
}
