// Every thread's native stack of running processes, taken from outside by elfutils'
// eu-stack or, where that is missing, gdb in batch mode (both attach with ptrace, print,
// and detach: the process goes on). Used before ddprun stops a hung or timed-out worker,
// and by `ddprun status --stacks`. Each capture is bounded in time: a tool that has not
// finished by then (a process in uninterruptible sleep cannot be attached) is killed, and
// what it printed so far is kept with a note.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun::agent {

struct StackTool {
  std::string name;  // "eu-stack" or "gdb"
  std::string path;  // absolute
};

// What the reports say where no tool is installed.
inline constexpr const char* kNoStackToolNote =
    "no native stacks: neither eu-stack (Debian package elfutils) nor gdb is installed";
// How long a capture may take by default (per call: the processes are captured at once).
inline constexpr std::chrono::seconds kStackCaptureTimeout{10};

// The first of eu-stack and gdb found in the directories of `path_env` (a PATH value);
// nothing when neither is there. Never throws.
std::optional<StackTool> findStackTool(std::string_view path_env);

// The command line that prints every thread's stack of `pid` with `tool`.
std::vector<std::string> stackToolCommand(const StackTool& tool, pid_t pid);

struct ProcessStacks {
  pid_t pid = 0;
  std::string tool;     // the tool that ran; empty when none could
  std::string text;     // what it printed, stdout and stderr as they came (at most 1 MiB)
  std::string problem;  // empty when the tool ran to the end and exited 0; else why the stacks are missing or partial
};

// Says, just before a tool attaches to `pid`, why it must not (empty: it may). A pid read
// from a file may have been given to another process since it was checked.
using AttachCheck = std::function<std::string(pid_t)>;

// Captures the stacks of every pid at once with the tool on this process's PATH. Blocks
// until every tool has exited, and at most `timeout` (tools still running then are killed
// with their process groups and reaped). `check`, when given, is asked about each pid right
// before its tool starts; a pid it refuses gets no tool and its answer as the problem.
// Never throws. Waits for its own children by pid only, so it can run beside a SIGCHLD
// handler that reaps others; not thread-safe.
std::vector<ProcessStacks> captureNativeStacks(const std::vector<pid_t>& pids,
                                               std::chrono::milliseconds timeout = kStackCaptureTimeout,
                                               const AttachCheck& check = {});

// A worker's stacks.txt: a header naming the worker, when and why the stacks were taken
// and by which tool, then the tool's output (or the note saying why there is none).
std::string formatStacksFile(int rank, int local_rank, const ProcessStacks& stacks, std::string_view reason);

// The file name of the stacks in a worker's log directory (LogLayout::workerDir).
inline constexpr const char* kStacksFileName = "stacks.txt";

}  // namespace ddprun::agent
