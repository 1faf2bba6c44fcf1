// What the agent and its orphan guard read about other processes from /proc/<pid>/stat: parent, process group, state
// and start time. The start time (clock ticks since boot) tells a process apart from a later one that was given the
// same pid.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace ddprun::agent {

struct ProcStat {
  pid_t pid = 0;
  pid_t ppid = 0;
  pid_t pgid = 0;
  char state = 0;           // 'Z' for a zombie
  uint64_t start_time = 0;  // field 22: clock ticks after boot
};

// One process's fields; nothing when it is gone (or /proc cannot be read). Never throws.
std::optional<ProcStat> readProcStat(pid_t pid);

// Every process visible in /proc, in no particular order. Never throws.
std::vector<ProcStat> readAllProcStats();

}  // namespace ddprun::agent
