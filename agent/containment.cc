#include "agent/containment.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>

#include "agent/process/cgroup_v2.h"
#include "agent/process/orphan_guard.h"

namespace ddprun::agent {
namespace {

constexpr auto kGroupPollInterval = std::chrono::milliseconds(10);
// Rounds of stopping adopted orphans (each may hand its own children to the agent).
constexpr int kMaxOrphanRounds = 8;
// How often the agent looks for workers' descendants that left their process group, to
// tell the orphan guard. With cgroups too: a process can leave its cgroup as well (a write
// to another cgroup's cgroup.procs). One that left less than this before ddprun is killed
// with kill -9 can outlive it; a scan is one pass over /proc.
constexpr auto kEscapeScanInterval = std::chrono::milliseconds(500);
// How long killed processes get to leave their cgroups at the end of an attempt.
constexpr auto kCgroupRemoveTimeout = std::chrono::seconds(5);

}  // namespace

Containment::Containment(const AgentConfig& config, AgentEnv& env, const WorkerGroup& group, OrphanGuard* guard)
    : config_(config), env_(env), group_(group), guard_(guard), log_(logger("agent")), escape_scan_(env.io()) {}

Containment::~Containment() {
  if (!cgroups_ || !cgroups_->enabled()) return;
  const std::string root = cgroups_->root();
  cgroups_.reset();
  // One the agent could not remove stays with the guard, which tries again when ddprun exits.
  if (guard_ && ::access(root.c_str(), F_OK) != 0) guard_->forgetCgroup(root);
}

// Where workers are contained by cgroups the kernel keeps every descendant in; else by
// process groups. A descendant can leave either (setsid; a write to another cgroup's
// cgroup.procs, as root), so the agent watches for those that leave their process group in
// both cases: the scan is the second net under the cgroups.
void Containment::setUp() {
  // The guard learns the directory before it exists: told after, a kill -9 between the two
  // (the agent's thread preempted there on a loaded machine) would leave it to nobody.
  std::string told;
  cgroups_ = std::make_unique<WorkerCgroups>(::getpid(), config_.cgroups, [this, &told](const std::string& root) {
    if (!guard_) return;
    guard_->watchCgroup(root);
    told = root;
  });
  if (cgroups_->enabled()) {
    log_->debug("workers are contained by cgroups under {}", cgroups_->root());
  } else {
    if (!told.empty()) guard_->forgetCgroup(told);
    log_->debug("workers are contained by process groups only ({}); processes that leave them are found every {} ms",
                cgroups_->whyNot(), kEscapeScanInterval.count());
  }
  // Escaped processes are looked for to tell the guard: without one, nobody to tell.
  if (guard_) armEscapeScan();
}

std::string Containment::cgroupFor(int local_rank, int attempt) { return cgroups_->create(local_rank, attempt); }

std::string Containment::replacing(const Worker& failed, int attempt) {
  if (failed.pid > 1 && groupAlive(failed.pid)) {
    log_->debug("process group {} of replaced worker rank {} still has members; sending SIGKILL", failed.pid,
                failed.place.rank);
    env_.signalGroup(failed.pid, SIGKILL);
  }
  if (guard_ && failed.pid > 1) guard_->forget(failed.pid);
  const std::string cgroup = cgroupFor(failed.place.local_rank, attempt);
  if (!cgroup.empty() && cgroupPopulated(cgroup)) killCgroup(cgroup);
  return cgroup;
}

bool Containment::groupAlive(pid_t pgid) {
  const int err = env_.signalGroup(pgid, 0);
  return err == 0 || err == EPERM;
}

// A worker's children may outlive it in its process group; none may outlive the attempt.
void Containment::clear() {
  std::vector<pid_t> alive;
  for (const Worker& w : group_.workers()) {
    // pid -1: a worker that never started (a failed start ends the attempt) has no group.
    if (w.pid > 1 && groupAlive(w.pid)) alive.push_back(w.pid);
  }
  if (!alive.empty()) {
    log_->debug("{} worker process group(s) still have members; sending SIGTERM", alive.size());
    for (pid_t pgid : alive) env_.signalGroup(pgid, SIGTERM);
    const auto deadline = env_.clock().now() + config_.term_timeout;
    for (;;) {
      std::erase_if(alive, [this](pid_t pgid) { return !groupAlive(pgid); });
      if (alive.empty() || env_.clock().now() >= deadline) break;
      env_.runFor(kGroupPollInterval);
    }
    for (pid_t pgid : alive) env_.signalGroup(pgid, SIGKILL);
    const auto kill_deadline = env_.clock().now() + killWait();
    for (;;) {
      std::erase_if(alive, [this](pid_t pgid) { return !groupAlive(pgid); });
      if (alive.empty()) break;
      if (env_.clock().now() >= kill_deadline) {
        // Processes in uninterruptible sleep: reported, not waited for.
        for (pid_t pgid : alive) {
          log_->error("process group {} of a worker still has processes {} ms after SIGKILL; going on without them",
                      pgid, std::chrono::duration_cast<std::chrono::milliseconds>(killWait()).count());
        }
        break;
      }
      env_.runFor(kGroupPollInterval);
    }
  }
  stopAdoptedOrphans();
  removeWorkerCgroups();
  forgetEscaped();
  // One that outlived SIGKILL stays with the guard, which kills it if ddprun dies first.
  if (!guard_) return;
  for (const Worker& w : group_.workers()) {
    if (w.pid > 1 && !w.abandoned) guard_->forget(w.pid);
  }
}

// What is still in the workers' cgroups now ignored SIGTERM or was out of reach of the group
// and orphan stops above (a daemon whose parent still runs): SIGKILL, then remove the cgroups.
void Containment::removeWorkerCgroups() {
  const auto deadline = env_.clock().now() + kCgroupRemoveTimeout;
  for (;;) {
    cgroups_->killAll();
    // The killed may be the agent's children: running the loop reaps them.
    if (cgroups_->removeEmpty()) return;
    if (env_.clock().now() >= deadline) break;
    env_.runFor(kGroupPollInterval);
  }
  log_->warn("cannot remove the workers' cgroups under {}: processes still in them after {} s", cgroups_->root(),
             std::chrono::duration_cast<std::chrono::seconds>(kCgroupRemoveTimeout).count());
}

void Containment::armEscapeScan() {
  escape_scan_.expires_after(kEscapeScanInterval);
  escape_scan_.async_wait([this](const boost::system::error_code& ec) {
    if (ec) return;
    scanEscaped();
    armEscapeScan();
  });
}

// Tells the guard which of the workers' descendants are outside every worker's process
// group now, so that a kill -9 of ddprun takes them too; and which are gone.
void Containment::scanEscaped() {
  if (!group_.anyRunning()) return;
  std::vector<pid_t> groups;
  for (const Worker& w : group_.workers()) groups.push_back(w.pid);
  // The warm spare leads a process group of its own, and the guard watches it already.
  if (const pid_t spare = group_.sparePid(); spare > 1) groups.push_back(spare);
  std::set<ProcessStamp> now = escapedDescendants(guard_->pid(), groups);
  for (const ProcessStamp& p : escaped_) {
    if (!now.count(p)) guard_->forgetProcess(p);
  }
  for (const ProcessStamp& p : now) {
    if (escaped_.count(p)) continue;
    guard_->watchProcess(p);
    log_->debug("the orphan guard now watches pid {}: it left its worker's process group", p.pid);
  }
  escaped_ = std::move(now);
}

// The attempt's leftovers are stopped: nothing of it is left for the guard to kill.
void Containment::forgetEscaped() {
  for (const ProcessStamp& p : escaped_) guard_->forgetProcess(p);
  escaped_.clear();
}

// Descendants that left their worker's process group (setsid daemons) escaped the group kill
// and, their parents gone, came to the agent as subreaper. They may not outlive the attempt
// either: SIGTERM, then SIGKILL after --term_timeout. Stopping one can hand its own children
// to the agent in turn, so this repeats (a bounded number of times) until none is left.
void Containment::stopAdoptedOrphans() {
  // Neither the guard nor a worker (even one somehow still running) is an orphan, nor the warm
  // spare, which outlives the attempt to serve the next one (in_job_recovery.h).
  std::vector<pid_t> ours;
  if (guard_) ours.push_back(guard_->pid());
  for (const Worker& w : group_.workers()) {
    if (w.pid > 1) ours.push_back(w.pid);
  }
  if (const pid_t spare = group_.sparePid(); spare > 1) ours.push_back(spare);
  auto orphansNow = [this, &ours] { return env_.adoptedChildren(ours); };
  for (int round = 0; round < kMaxOrphanRounds; ++round) {
    std::vector<pid_t> orphans = orphansNow();
    if (orphans.empty()) return;
    log_->warn("stopping {} process(es) that left their worker's process group and outlived it (pid {}{})",
               orphans.size(), orphans.front(), orphans.size() > 1 ? ", ..." : "");
    for (pid_t pid : orphans) env_.signalProcess(pid, SIGTERM);
    const auto deadline = env_.clock().now() + config_.term_timeout;
    while (!orphansNow().empty() && env_.clock().now() < deadline) env_.runFor(kGroupPollInterval);
    for (pid_t pid : orphansNow()) env_.signalProcess(pid, SIGKILL);
    const auto reap_deadline = env_.clock().now() + std::chrono::seconds(5);
    while (!orphansNow().empty() && env_.clock().now() < reap_deadline) env_.runFor(kGroupPollInterval);
  }
}

}  // namespace ddprun::agent
