// The one way the agent, its orphan guard and the launcher send signals: kill(2) behind a
// guard against the pids that reach far more than the one process or group meant. kill(0)
// is the caller's own process group, kill(-1) every process it may signal, kill(1) and
// kill(-1) the init process; a pid left at -1 (a worker that never started) negated for a
// group signal is kill(1). These are refused here, so that no caller can send them by
// mistake, and the refusal is an error value like any other.
// Every function is async-signal-safe (no allocation, no logging): the orphan guard and
// forked children may call them. Thread-safe.
#pragma once

#include <sys/types.h>

namespace ddprun::agent {

// Sends `signal` (0: only checks that the process exists) to the process `pid`. Returns 0,
// or the errno value of kill(2); EINVAL, without calling kill, when `pid` <= 1.
int signalProcess(pid_t pid, int signal) noexcept;

// Sends `signal` (0: only checks) to every process of the process group `pgid`. Returns 0,
// or the errno value of kill(2); EINVAL, without calling kill, when `pgid` <= 1.
int signalGroup(pid_t pgid, int signal) noexcept;

}  // namespace ddprun::agent
