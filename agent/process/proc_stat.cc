#include "agent/process/proc_stat.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/unique_fd.h"

namespace ddprun::agent {

std::optional<ProcStat> readProcStat(pid_t pid) {
  // Plain read(2) rather than streams: the guard also calls this, and a scan reads every process.
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  UniqueFd fd(::open(path, O_RDONLY | O_CLOEXEC));
  if (!fd) return std::nullopt;
  char buf[1024];
  ssize_t n = ::read(fd.get(), buf, sizeof buf - 1);
  fd.reset();
  if (n <= 0) return std::nullopt;
  buf[n] = '\0';
  // "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses, so parse after the last ')'.
  const char* close = std::strrchr(buf, ')');
  if (close == nullptr || close[1] != ' ') return std::nullopt;
  ProcStat stat;
  stat.pid = pid;
  const char* p = close + 2;
  stat.state = *p;
  // Fields 4 onwards are numbers; the start time is field 22.
  long long fields[19] = {};
  p += 1;
  for (long long& field : fields) {
    char* end = nullptr;
    field = std::strtoll(p, &end, 10);
    if (end == p) return std::nullopt;
    p = end;
  }
  stat.ppid = static_cast<pid_t>(fields[0]);
  stat.pgid = static_cast<pid_t>(fields[1]);
  stat.start_time = static_cast<uint64_t>(fields[18]);
  return stat;
}

std::vector<ProcStat> readAllProcStats() {
  std::vector<ProcStat> all;
  DIR* dir = ::opendir("/proc");
  if (dir == nullptr) return all;
  while (const dirent* entry = ::readdir(dir)) {
    char* end = nullptr;
    const long pid = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || pid <= 0) continue;
    if (auto stat = readProcStat(static_cast<pid_t>(pid))) all.push_back(*stat);
  }
  ::closedir(dir);
  return all;
}

}  // namespace ddprun::agent
