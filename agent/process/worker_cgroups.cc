#include "agent/process/worker_cgroups.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "agent/process/cgroup_v2.h"
#include "common/logging.h"

namespace ddprun::agent {
namespace {

// The destructor's wait for killed processes to leave (they go within milliseconds).
constexpr auto kRemoveTimeout = std::chrono::seconds(5);

}  // namespace

WorkerCgroups::WorkerCgroups(pid_t agent_pid, bool allowed, const BeforeCreate& before_create) {
  if (!allowed) {
    why_not_ = "DDPRUN_NO_CGROUPS is set";
    return;
  }
  const auto own = ownCgroupDir();
  if (!own) {
    why_not_ = "no cgroup2 file system is mounted";
    return;
  }
  const std::string root = *own + "/ddprun-" + std::to_string(agent_pid);
  if (before_create) before_create(root);
  if (::mkdir(root.c_str(), 0755) != 0 && errno != EEXIST) {
    why_not_ = "cannot create " + root + ": " + std::strerror(errno);
    return;
  }
  root_ = root;
}

WorkerCgroups::~WorkerCgroups() {
  if (!enabled()) return;
  const auto deadline = std::chrono::steady_clock::now() + kRemoveTimeout;
  for (;;) {
    killCgroup(root_);
    if (removeCgroupTree(root_)) return;
    if (std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  logger("agent")->warn("cannot remove cgroup {}: processes are still in it", root_);
}

std::string WorkerCgroups::create(int local_rank, int attempt) {
  if (!enabled()) return {};
  const std::string dir = root_ + "/w" + std::to_string(local_rank) + "-a" + std::to_string(attempt);
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    logger("agent")->warn(
        "cannot create cgroup {}: {}; local rank {} is "
        "contained by its process group only",
        dir, std::strerror(errno), local_rank);
    return {};
  }
  workers_.push_back(dir);
  return dir;
}

void WorkerCgroups::killAll() {
  for (const std::string& dir : workers_) {
    if (cgroupPopulated(dir)) killCgroup(dir);
  }
}

bool WorkerCgroups::removeEmpty() {
  std::erase_if(workers_, [](const std::string& dir) { return !cgroupPopulated(dir) && removeCgroupTree(dir); });
  return workers_.empty();
}

}  // namespace ddprun::agent
