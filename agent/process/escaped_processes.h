// A worker's descendant that leaves its process group (setsid, a daemon) is out of reach of the group kill that the
// orphan guard does when the agent is killed, and, if it also left its cgroup, of the cgroup kill. The agent finds such
// processes by a scan of /proc, and tells the guard each one's pid and start time, so that the guard can kill it later
// without the risk of hitting an unrelated process that was given the same pid.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <set>
#include <vector>

namespace ddprun::agent {

struct ProcessStamp {
  pid_t pid = 0;
  uint64_t start_time = 0;  // clock ticks after boot, /proc/<pid>/stat field 22
  auto operator<=>(const ProcessStamp&) const = default;
};

// The live descendants of this process, not counting `except` and its descendants, that are in none of `groups`. One
// pass over /proc; never throws.
std::set<ProcessStamp> escapedDescendants(pid_t except, const std::vector<pid_t>& groups);

// SIGKILLs `process` if it still is the process it was when stamped, and its process group too when it leads one (a
// setsid daemon's children share its group). Returns whether it was still there. Never throws; async-signal-unsafe
// (reads /proc).
bool killStamped(const ProcessStamp& process);

}  // namespace ddprun::agent
