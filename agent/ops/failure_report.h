// The report printed when workers fail: the root cause first, then the rest. Like
// torchrun's ChildFailedError, with the cause chosen by time (the error file's timestamp
// when the worker wrote one) rather than by rank.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "agent/ops/error_file.h"

namespace ddprun::agent {

struct WorkerFailure {
  int rank = 0;
  int local_rank = 0;
  std::string host;
  int pid = 0;
  int exit_code = 0;                           // valid when signal == 0.
  int signal = 0;                              // the signal that killed the worker, or 0.
  std::chrono::system_clock::time_point time;  // when the agent saw it exit.
  std::string error_file;
  std::optional<WorkerErrorRecord> error;
  // The last lines of the worker's stderr, when it went through the agent (--tee,
  // --redirects, --local_ranks_filter); empty otherwise.
  std::string stderr_tail;
  std::string stderr_file;        // where its stderr was saved; empty: nowhere.
  std::string stderr_file_error;  // why that file is incomplete (strerror); empty: it is not.
  // When ddprun stopped the worker as hung: why ("timer 'step' expired"); empty otherwise.
  std::string hang_reason;
  bool hang_python_abort = false;  // SIGABRT went first, for Python's tracebacks
  std::string stacks;              // its native stacks, taken before the stop
  std::string stacks_note;         // why they are missing or partial; empty: complete
  std::string stacks_tool;         // "eu-stack", "gdb"; empty: none ran
  std::string stacks_file;         // where they were saved; empty: nowhere
  // Its Python main thread's frames, taken through ddprun's Python hook before it was stopped
  // (outermost first, as a traceback, with source lines); empty: none taken.
  std::string python_stack;
  std::string python_stack_file;  // every thread's, as faulthandler wrote them; empty: nowhere
  // The traceback of its uncaught exception, saved by ddprun's Python hook; shown when it wrote
  // no error file. Empty: none.
  std::string python_exception;
  // The GPU fault it died of, with the GPU and host named (agent/gpu_watch.h):
  // "illegal memory access on GPU 0 (GPU-..., PCI 00000000:3B:00.0) of host node7: <line>";
  // empty: none seen.
  std::string gpu_fault;
  // A rank of another node that this node's hang verdict blames (its other fields but rank,
  // local_rank, host, hang_reason and python_stack are unset): where the verdict found it, e.g. "behind,
  // last called all_reduce #1 (completed) at /job/train.py:12 in main". Empty: a local worker.
  std::string elsewhere;
};

// How many lines of a hung worker's stacks the report shows (all of them are in stacks_file).
inline constexpr size_t kReportStackLines = 60;

// "SIGKILL" for 9, "signal 77" for numbers without a name.
std::string signalName(int signal);

// Orders failures root-cause first: by the error file's timestamp when present, else by
// exit time; ties by exit time, then rank.
void sortRootCauseFirst(std::vector<WorkerFailure>& failures);

// Moves the failures of `ranks` (the ranks a hang verdict blamed) to the front, each part in
// its order: after a hang stop every worker failed at about the same time, and the root cause
// is the rank that was behind, not the first one the stop reached.
void putRanksFirst(std::vector<WorkerFailure>& failures, const std::vector<int>& ranks);

// Formats the whole report; `failures` must be sorted and non-empty. A worker's stderr tail
// is shown when it wrote no error file, or when its stderr log is incomplete.
std::string formatFailureReport(std::string_view entry_name, const std::vector<WorkerFailure>& failures);

}  // namespace ddprun::agent
