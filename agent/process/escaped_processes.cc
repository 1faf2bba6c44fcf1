#include "agent/process/escaped_processes.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <map>

#include "agent/process/proc_stat.h"
#include "agent/process/process_signals.h"

namespace ddprun::agent {

std::set<ProcessStamp> escapedDescendants(pid_t except, const std::vector<pid_t>& groups) {
  // /proc/<pid>/task/<tid>/children would walk only our subtree, but kernels without CONFIG_PROC_CHILDREN lack it; one
  // pass over every process's stat works everywhere.
  std::multimap<pid_t, ProcStat> by_parent;
  for (const ProcStat& p : readAllProcStats()) by_parent.emplace(p.ppid, p);
  std::set<ProcessStamp> escaped;
  std::vector<pid_t> todo = {::getpid()};
  while (!todo.empty()) {
    const pid_t parent = todo.back();
    todo.pop_back();
    auto [first, last] = by_parent.equal_range(parent);
    for (auto it = first; it != last; ++it) {
      const ProcStat& child = it->second;
      if (child.pid == except || child.state == 'Z') continue;
      todo.push_back(child.pid);
      if (std::find(groups.begin(), groups.end(), child.pgid) == groups.end()) {
        escaped.insert({child.pid, child.start_time});
      }
    }
  }
  return escaped;
}

bool killStamped(const ProcessStamp& process) {
  const auto now = readProcStat(process.pid);
  if (!now || now->start_time != process.start_time || now->state == 'Z') return false;
  // While it lives its pid cannot be reused as a group id, so this group is its own.
  if (now->pgid == process.pid) signalGroup(process.pid, SIGKILL);
  signalProcess(process.pid, SIGKILL);
  return true;
}

}  // namespace ddprun::agent
