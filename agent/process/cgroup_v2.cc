#include "agent/process/cgroup_v2.h"
#include "agent/process/process_signals.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

namespace ddprun::agent {
namespace fs = std::filesystem;
namespace {

bool writeFile(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  out.flush();
  return out.good();
}

// `dir` and every cgroup below it, parents before children.
std::vector<fs::path> subtree(const std::string& dir) {
  std::vector<fs::path> dirs = {dir};
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_directory(ec) && !it->is_symlink(ec)) dirs.push_back(it->path());
  }
  return dirs;
}

}  // namespace

std::optional<std::string> ownCgroupDir() {
  std::string mount;
  std::ifstream mounts("/proc/self/mounts");
  for (std::string line; std::getline(mounts, line);) {
    std::istringstream fields(line);
    std::string device, point, type;
    if (fields >> device >> point >> type && type == "cgroup2") {
      mount = point;
      break;
    }
  }
  if (mount.empty()) return std::nullopt;
  // The v2 entry is the one with hierarchy id 0: "0::/path".
  std::ifstream cgroups("/proc/self/cgroup");
  for (std::string line; std::getline(cgroups, line);) {
    if (line.rfind("0::", 0) != 0) continue;
    std::string path = line.substr(3);
    // A cgroup namespace shows a path outside it as "/.." (then we cannot name our own).
    if (path.empty() || path[0] != '/' || path.find("/..") != std::string::npos) return std::nullopt;
    return path == "/" ? mount : mount + path;
  }
  return std::nullopt;
}

void killCgroup(const std::string& dir) {
  if (writeFile(dir + "/cgroup.kill", "1")) return;
  for (const fs::path& cgroup : subtree(dir)) {
    std::ifstream procs(cgroup / "cgroup.procs");
    for (pid_t pid; procs >> pid;) {
      signalProcess(pid, SIGKILL);
    }
  }
}

bool cgroupPopulated(const std::string& dir) {
  std::ifstream events(dir + "/cgroup.events");
  for (std::string key, value; events >> key >> value;) {
    if (key == "populated") return value == "1";
  }
  return false;
}

bool removeCgroupTree(const std::string& dir) {
  std::vector<fs::path> dirs = subtree(dir);
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) ::rmdir(it->c_str());
  return ::access(dir.c_str(), F_OK) != 0 && errno == ENOENT;
}

}  // namespace ddprun::agent
