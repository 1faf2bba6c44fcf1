#include "agent/adopted_children.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace ddprun::agent {

std::vector<pid_t> liveChildren(const std::vector<pid_t>& except) {
  const pid_t self = ::getpid();
  std::vector<pid_t> children;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(entry.path() / "stat");
    std::string stat;
    if (!std::getline(in, stat)) continue;  // gone meanwhile
    // "pid (comm) state ppid ...": comm may hold spaces and parentheses, so parse after the last ')'.
    const auto close = stat.rfind(')');
    if (close == std::string::npos || close + 2 > stat.size()) continue;
    std::istringstream rest(stat.substr(close + 2));
    char state = 0;
    pid_t ppid = 0;
    if (!(rest >> state >> ppid) || ppid != self || state == 'Z') continue;
    const pid_t pid = static_cast<pid_t>(std::stol(name));
    if (std::find(except.begin(), except.end(), pid) != except.end()) continue;
    children.push_back(pid);
  }
  return children;
}

}  // namespace ddprun::agent
