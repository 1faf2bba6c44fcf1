#include "agent/process/process_state.h"

#include <fstream>

#include "agent/process/proc_stat.h"

namespace ddprun::agent {

std::string processStateName(char state) {
  switch (state) {
    case 'R': return "running";
    case 'S': return "sleeping";
    case 'D': return "uninterruptible sleep";
    case 'T': return "stopped";
    case 't': return "stopped by a tracer";
    case 'Z': return "zombie";
    case 'X': return "dead";
    case 'I': return "idle";
    case 'P': return "parked";
    default: return std::string("state ") + state;
  }
}

std::string describeProcessState(pid_t pid) {
  const std::optional<ProcStat> stat = readProcStat(pid);
  if (!stat) return "gone";
  std::string out = std::string(1, stat->state) + " (" + processStateName(stat->state);
  if (stat->state == 'D' || stat->state == 'S') {
    std::string wchan;
    std::ifstream in("/proc/" + std::to_string(pid) + "/wchan");
    if (in >> wchan && wchan != "0") out += ", in " + wchan;
  }
  return out + ")";
}

}  // namespace ddprun::agent
