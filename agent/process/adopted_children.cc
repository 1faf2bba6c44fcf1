#include "agent/process/adopted_children.h"

#include <unistd.h>

#include <algorithm>

#include "agent/process/proc_stat.h"

namespace ddprun::agent {

std::vector<pid_t> liveChildren(const std::vector<pid_t>& except) {
  const pid_t self = ::getpid();
  std::vector<pid_t> children;
  for (const ProcStat& p : readAllProcStats()) {
    if (p.ppid != self || p.state == 'Z') continue;
    if (std::find(except.begin(), except.end(), p.pid) != except.end()) continue;
    children.push_back(p.pid);
  }
  return children;
}

}  // namespace ddprun::agent
