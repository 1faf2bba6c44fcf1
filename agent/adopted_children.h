// The agent is a child subreaper (PR_SET_CHILD_SUBREAPER): a worker's descendant whose parent
// dies comes to it. One that also left the worker's process group (setsid, a daemon) escapes
// the group kill that ends an attempt, so the agent finds such children here and stops them.
#pragma once

#include <sys/types.h>

#include <vector>

namespace ddprun::agent {

// The live (non-zombie) children of this process, from /proc, leaving out `except` and
// anything in `also_except`.
std::vector<pid_t> liveChildren(pid_t except, const std::vector<pid_t>& also_except = {});

}  // namespace ddprun::agent
