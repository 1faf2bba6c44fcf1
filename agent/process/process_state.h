// A process's scheduler state in words, for the lines ddprun logs about workers that do
// not stop: "T (stopped)", "D (uninterruptible sleep, in nfs_wait_on_request)". A worker in
// uninterruptible sleep (D) cannot be killed until the kernel call it waits in returns;
// a stopped one (T) keeps its signals pending until SIGKILL or SIGCONT.
#pragma once

#include <sys/types.h>

#include <string>

namespace ddprun::agent {

// The meaning of a state letter of /proc/PID/stat ('R' -> "running"); "state X" for one
// it does not know.
std::string processStateName(char state);

// "<letter> (<meaning>)", with the kernel function it waits in (/proc/PID/wchan) when
// it sleeps; "gone" when the process no longer exists. Never throws.
std::string describeProcessState(pid_t pid);

}  // namespace ddprun::agent
