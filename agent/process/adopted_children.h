// The agent is a child subreaper (PR_SET_CHILD_SUBREAPER): a worker's descendant whose parent
// dies comes to it. One that also left the worker's process group (setsid, a daemon) escapes
// the group kill that ends an attempt, so the agent finds such children here and stops them.
#pragma once

#include <sys/types.h>

#include <vector>

namespace ddprun::agent {

// The live (non-zombie) children of this process, from /proc, leaving out those in `except`.
std::vector<pid_t> liveChildren(const std::vector<pid_t>& except);

}  // namespace ddprun::agent
