// Many jobs on one machine (CI farms, eight 1-GPU jobs on a node): standalone jobs started at
// once must each get their own store, segments, run directory and cgroup, and leave none of
// them behind. DDPRUN_STRESS_ROUNDS repeats the whole batch (the long label runs several).
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>

#include <catch2/catch.hpp>

#include "common/env_reader.h"
#include "tests/support/test_process.h"

using namespace ddprun::testing;
namespace fs = std::filesystem;

namespace {

constexpr int kJobs = 16;

int rounds() { return ddprun::env::integerOr<int>("DDPRUN_STRESS_ROUNDS", 1, 1, 1000); }

std::vector<pid_t> pidsIn(const std::string& file) {
  std::vector<pid_t> pids;
  std::ifstream in(file);
  for (pid_t pid; in >> pid;) pids.push_back(pid);
  return pids;
}

// This process's cgroup v2 directory (ddprun puts its workers in ddprun-<agent pid> below it).
std::string ownCgroupDir() {
  std::ifstream in("/proc/self/cgroup");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("0::", 0) == 0) return "/sys/fs/cgroup" + line.substr(3);
  }
  return {};
}

// /dev/shm entries that ddprun or its workers name after `pid` (segments "ddprun-<run>-<pid>-...",
// flight directories "ddprun_flight-<run>-<pid>").
std::vector<std::string> shmNamedAfter(pid_t pid) {
  std::vector<std::string> found;
  const std::string mid = "-" + std::to_string(pid) + "-";
  const std::string tail = "-" + std::to_string(pid);
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/dev/shm", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("ddprun", 0) != 0) continue;
    const bool at_end = name.size() > tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
    if (name.find(mid) != std::string::npos || at_end) found.push_back(name);
  }
  return found;
}

struct Job {
  std::string token;
  std::string pid_file;
  int nproc = 0;
  bool python = false;
  std::unique_ptr<TestProcess> process;
};

}  // namespace

TEST_CASE("16 standalone jobs at once, C++ and torch workers mixed, each keeps to its own store and leaves nothing",
          "[stress]") {
  for (int round = 0; round < rounds(); ++round) {
    TempDir dir;
    const std::string tmp = dir.file("tmp");
    fs::create_directory(tmp);
    std::vector<Job> jobs(kJobs);
    for (int j = 0; j < kJobs; ++j) {
      Job& job = jobs[j];
      job.token = "job" + std::to_string(j) + "-round" + std::to_string(round);
      job.pid_file = dir.file("pids-" + std::to_string(j));
      job.nproc = 2 + j % 3;
      job.python = j % 2 == 1;
      std::vector<std::string> argv = {ddprunPath(), "--standalone", "--nproc_per_node=" + std::to_string(job.nproc)};
      // Most jobs keep torchrun's default run id ("none"), as users do: names must not rely on it.
      if (j % 4 == 0) argv.push_back("--rdzv_id=" + job.token);
      if (job.python) {
        argv.insert(argv.end(), {sourceDir() + "/tests/stress/isolation_worker.py", job.token, job.pid_file, "5"});
      } else {
        argv.insert(argv.end(), {testWorkerPath(), "isolation", job.token, job.pid_file, "20"});
      }
      job.process = std::make_unique<TestProcess>(
          argv, std::map<std::string, std::string>{{"PYTHON", pythonPath()}, {"TMPDIR", tmp}});
    }
    // Read every job's output in turn, so that no job blocks on a full pipe while another is waited on.
    const auto deadline = std::chrono::steady_clock::now() + 400s;
    for (bool running = true; running && std::chrono::steady_clock::now() < deadline;) {
      running = false;
      for (Job& job : jobs) {
        if (!job.process->exited() && !job.process->wait(20ms)) running = true;
      }
    }
    std::set<pid_t> pids;
    for (Job& job : jobs) {
      INFO("round " << round << ", " << job.token << (job.python ? " (torch)" : " (C++)") << ":\n"
                    << job.process->out() << job.process->err());
      REQUIRE(job.process->exited());
      CHECK(job.process->exitCode() == 0);
      CHECK(countOf(job.process->out(), "isolated rank=") == job.nproc);
      const auto workers = pidsIn(job.pid_file);
      CHECK(static_cast<int>(workers.size()) == job.nproc);
      pids.insert(workers.begin(), workers.end());
      pids.insert(job.process->pid());
    }
    for (pid_t pid : pids) {
      INFO("pid " << pid);
      CHECK_FALSE(processAlive(pid));
      CHECK(shmNamedAfter(pid).empty());
    }
    const std::string cgroups = ownCgroupDir();
    for (Job& job : jobs) {
      const std::string cgroup = cgroups + "/ddprun-" + std::to_string(job.process->pid());
      INFO(cgroup);
      CHECK_FALSE(fs::exists(cgroup));
    }
    // Run directories (and the timer FIFOs and Python hooks inside them) are gone.
    std::vector<std::string> left;
    for (const auto& entry : fs::directory_iterator(tmp)) left.push_back(entry.path().filename().string());
    INFO("left in TMPDIR: " << left.size());
    for (const auto& name : left) UNSCOPED_INFO(name);
    CHECK(left.empty());
  }
}
