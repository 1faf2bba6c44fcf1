#include "common/port_holder.h"

#include <dirent.h>
#include <unistd.h>

#include <array>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/text_escape.h"

namespace ddprun {
namespace {

constexpr const char* kListen = "0A";  // TCP_LISTEN in /proc/net/tcp's "st" column

// Socket inodes bound to `port` in /proc/net/tcp and tcp6, listening ones first.
std::vector<std::string> socketInodes(int port) {
  std::vector<std::string> listening;
  std::vector<std::string> other;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
      if (!(fields >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >> timeout >> inode))
        continue;
      const auto colon = local.rfind(':');
      if (colon == std::string::npos || inode == "0") continue;
      char* end = nullptr;
      const long local_port = std::strtol(local.c_str() + colon + 1, &end, 16);
      if (*end != '\0' || local_port != port) continue;
      (state == kListen ? listening : other).push_back(inode);
    }
  }
  listening.insert(listening.end(), other.begin(), other.end());
  return listening;
}

// Escaped: a process names itself (prctl, exec's argv[0]), with escape codes if it likes.
std::string commandName(const std::string& pid) {
  std::ifstream in("/proc/" + pid + "/comm");
  std::string name;
  std::getline(in, name);
  return printable(name);
}

// The pid whose descriptor table holds socket:[inode], or "".
std::string pidHolding(const std::vector<std::string>& inodes) {
  std::vector<std::string> targets;
  for (const auto& inode : inodes) targets.push_back("socket:[" + inode + "]");
  DIR* proc = ::opendir("/proc");
  if (!proc) return {};
  std::string found;
  while (found.empty()) {
    dirent* entry = ::readdir(proc);
    if (!entry) break;
    const std::string pid = entry->d_name;
    if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string fd_dir = "/proc/" + pid + "/fd";
    DIR* fds = ::opendir(fd_dir.c_str());
    if (!fds) continue;  // another user's process, or gone
    while (dirent* fd = ::readdir(fds)) {
      std::array<char, 64> target{};
      const std::string link = fd_dir + "/" + fd->d_name;
      const ssize_t n = ::readlink(link.c_str(), target.data(), target.size() - 1);
      if (n <= 0) continue;
      const std::string text(target.data(), static_cast<size_t>(n));
      bool match = false;
      for (const auto& t : targets) match = match || text == t;
      if (match) {
        found = pid;
        break;
      }
    }
    ::closedir(fds);
  }
  ::closedir(proc);
  return found;
}

}  // namespace

std::string portHolder(int port) {
  if (port <= 0 || port > 65535) return {};
  const auto inodes = socketInodes(port);
  if (inodes.empty()) return {};
  const std::string pid = pidHolding(inodes);
  if (pid.empty()) return {};
  const std::string name = commandName(pid);
  return "pid " + pid + (name.empty() ? "" : " (" + name + ")");
}

std::string portHolderSuffix(int port) {
  const std::string holder = portHolder(port);
  return holder.empty() ? "" : ", held by " + holder;
}

}  // namespace ddprun
