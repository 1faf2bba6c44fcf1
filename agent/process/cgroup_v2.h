// The few cgroup v2 operations that contain a worker and everything it starts: finding this process's own cgroup
// directory, killing every process in a cgroup subtree, and removing the subtree. Used by the agent (WorkerCgroups) and
// by its orphan guard after the agent died, so nothing here logs or throws.
#pragma once

#include <optional>
#include <string>

namespace ddprun::agent {

// The directory of this process's cgroup in the v2 hierarchy (the cgroup2 mount, which is /sys/fs/cgroup or
// /sys/fs/cgroup/unified on hybrid systems, plus the path in /proc/self/cgroup). Nothing when no cgroup2 file system is
// mounted.
std::optional<std::string> ownCgroupDir();

// SIGKILLs every process in `dir` and its descendant cgroups: one write to cgroup.kill (Linux 5.14+), else a SIGKILL to
// each pid listed in cgroup.procs. A process forked meanwhile may survive a call without cgroup.kill: callers repeat
// until not populated.
void killCgroup(const std::string& dir);

// Whether any process is left in `dir` or below (false too when `dir` is gone).
bool cgroupPopulated(const std::string& dir);

// Removes `dir` and its descendant cgroups, deepest first. Returns whether `dir` is gone (a cgroup with a live process
// in it cannot be removed).
bool removeCgroupTree(const std::string& dir);

}  // namespace ddprun::agent
