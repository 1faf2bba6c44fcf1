// Runs a read of a hostile dump in a forked child whose address space is capped (the memory
// bound of agent/torch_trace/pickle_reader.h, checked as a user would meet it: a
// std::bad_alloc, not a number the code reports) and whose time is bounded (the child is killed
// at the deadline). The child reports by exit status, never by Catch2 assertions.
#pragma once

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <new>
#include <string>

#include "tests/support/child_exit.h"
#include "tests/support/sanitizers.h"

namespace ddprun::testing {

struct CappedRun {
  bool finished = false;  // false: still running at the deadline, killed
  int exit_code = -1;     // the body's, or kOutOfMemory, or kThrew
  int term_signal = 0;
  double seconds = 0;
};
inline constexpr int kOutOfMemory = 70;  // the body threw std::bad_alloc
inline constexpr int kThrew = 71;        // the body threw something else

// This process's address space (VmSize), in bytes; 0 when unknown.
inline size_t addressSpaceBytes() {
  std::ifstream status("/proc/self/status");
  std::string key;
  while (status >> key) {
    if (key == "VmSize:") {
      size_t kb = 0;
      status >> kb;
      return kb * 1024;
    }
    std::getline(status, key);
  }
  return 0;
}

// `body()` (an int exit status) in a child whose address space may grow by `headroom` bytes
// beyond what it has when it starts (no cap in a sanitized build, whose shadow memory scales
// with the heap), killed after `limit`.
template <typename Body>
CappedRun inCappedChild(size_t headroom, std::chrono::milliseconds limit, Body body) {
  CappedRun result;
  const auto start = std::chrono::steady_clock::now();
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) return result;
  if (pid == 0) {
    if (!kSanitizedHeap) {
      const rlimit cap{addressSpaceBytes() + headroom, addressSpaceBytes() + headroom};
      if (::setrlimit(RLIMIT_AS, &cap) != 0) ::_exit(72);
    }
    int code = kThrew;
    try {
      code = body();
    } catch (const std::bad_alloc&) {
      code = kOutOfMemory;
    } catch (...) {
      code = kThrew;
    }
    ::_exit(code);
  }
  int status = 0;
  if (!reapWithin(pid, &status, limit)) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return result;
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.finished = true;
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) result.term_signal = WTERMSIG(status);
  return result;
}

}  // namespace ddprun::testing
