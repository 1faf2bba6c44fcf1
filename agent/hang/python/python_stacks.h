// Python workers seen from their stacks, for torch jobs that keep no flight recorder (gloo,
// torch 1.13 and 2.6; any Python job): which stderr lines say a torch collective failed, the
// frames of a faulthandler dump or of a traceback, and the verdict from every rank's frames
// when a collective timed out: a rank that is not inside a torch.distributed call is behind,
// one inside another call than the others is a mismatch, e.g.
//   hang: rank 1 is not in a collective (at /job/train.py:11 in <module>: time.sleep(60));
//   rank 0 waits in all_reduce (/job/train.py:12) — rank 1 is behind
// Pure functions over text (no clock, no I/O), except sourceLine, which reads a file.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "agent/hang/rings/hang_verdict.h"

namespace ddprun::agent {

// The line of `text` (one stderr line, or several) that says a torch collective failed, in
// the words of torch 1.13 through 2.11 and of gloo: gloo's "Timed out waiting 5000ms for recv
// operation to complete" (send too), ProcessGroupNCCL's "Watchdog caught collective operation
// timeout", "Process group watchdog thread terminated with exception", "Some NCCL operations
// have failed or timed out", "NCCL communicator was aborted", "NCCL error in:". The line is
// returned trimmed (at most 300 bytes); nothing when no line says so. Never throws.
std::optional<std::string> collectiveFailureIn(std::string_view text);

struct PyFrame {
  std::string file;
  int line = 0;
  std::string function;
  bool operator==(const PyFrame&) const = default;
};

// The main thread's frames in a faulthandler dump (`faulthandler.dump_traceback` or a
// registered signal, all threads), outermost first. The main thread is the one whose
// outermost frame is `<module>` (the "Current thread" first when several are); else the
// current thread; else the first. Empty when the text holds no frame. Here and in
// lastTraceback, the frames of ddprun's hook (_ddprun_progress.py's wrapper between a call
// and torch's function) are left out.
std::vector<PyFrame> mainThreadFrames(std::string_view dump);

// The frames of the last "Traceback (most recent call last):" in `text` (a worker's stderr,
// with or without a "[rank0]:" prefix per line, or an error file's traceback), outermost
// first. Empty when there is none.
std::vector<PyFrame> lastTraceback(std::string_view text);

// Where a rank's main thread is in torch.distributed: the API it called (the outermost frame
// in torch/distributed/distributed_c10d.py, else in torch/distributed/, that is not a
// wrapper) and the frame that called it. Nothing when no frame is in torch/distributed/
// (torch/distributed/elastic/, @record's wrapper and the timers, does not count).
struct CollectiveCall {
  std::string op;  // "all_reduce", "broadcast", "barrier", ...
  PyFrame site;    // the caller, outside torch/distributed/
};
std::optional<CollectiveCall> collectiveCallOf(const std::vector<PyFrame>& frames);

// One rank's Python frames, outermost first, and where they come from.
struct RankFrames {
  int rank = 0;
  std::vector<PyFrame> frames;
  bool failed = false;  // it died (the frames are its exception's traceback); else it runs
};

// `file:line in function`, with the source line when `source` is not empty.
std::string describeFrame(const PyFrame& frame, std::string_view source = {});

// The verdict over the ranks' frames after a collective failed: nullopt when no rank is
// behind or a mismatch (every rank is in the same torch.distributed call, or none is). The
// others' call is the one most ranks are in (a tie: the lowest such rank's). `source_of`
// gives a frame's source line ("" when unknown). Culprits ascending.
std::optional<HangVerdict> pythonHangVerdict(const std::vector<RankFrames>& ranks,
                                             std::string (*source_of)(const PyFrame&) = nullptr);

// The text of line `frame.line` of `frame.file`, trimmed; "" when it cannot be read, is not
// a regular file (a FIFO named in a traceback is not opened for reading, so this never
// blocks), or lies beyond its first 4 MiB.
std::string sourceLine(const PyFrame& frame);

// `frames` as a traceback's lines, `File "f.py", line 12, in main` each with its source line
// under it (sourceLine, indented); "" without frames.
std::string formatTraceback(const std::vector<PyFrame>& frames);

}  // namespace ddprun::agent
