// What the Python verdict (python_stacks.h's pythonHangVerdict) reads of each rank: a rank of
// this node by what it left, in order of trust: the traceback of an exception its hook saved
// (the rank failed, or is failing: its stacks may have been taken in its excepthook), its
// error file's, the stacks taken while it ran, then, once it ended, its stderr's last
// traceback; a rank of another node by the frames its node's summary sent
// (stack_summary.h). Pure but for reading the worker's files.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "agent/hang/python/python_stacks.h"
#include "agent/hang/python/stack_summary.h"

namespace ddprun::agent {

// One rank of this node, as its worker left it.
struct RankEvidence {
  int rank = 0;
  bool running = false;
  bool python_hook = false;  // it got ddprun's hook: `dir` may hold its saved exception
  std::string dir;           // the worker's directory (python_hook.h's py_exception.<pid>)
  std::string error_file;    // its TORCHELASTIC_ERROR_FILE
  std::string python_stack;  // its stacks taken while it ran (a faulthandler dump); empty: none
  std::string stderr_tail;   // its stderr's last lines; empty: none kept
};

// The evidence of the agent's workers (agent/worker.h's: place.rank, running, python_hook,
// dir, error_file, python_stack, stderr_record).
template <class Workers>
std::vector<RankEvidence> rankEvidence(const Workers& workers) {
  std::vector<RankEvidence> out;
  for (const auto& w : workers) {
    out.push_back(RankEvidence{w.place.rank, w.running, w.python_hook, w.dir, w.error_file, w.python_stack,
                               w.stderr_record ? w.stderr_record->tail.text() : std::string()});
  }
  return out;
}

// Each local rank's frames (failed: it left an exception's traceback, or ended), then each
// remote rank's from `remote` (running), in order.
std::vector<RankFrames> rankFrames(const std::vector<RankEvidence>& local, const std::map<int, RemoteStack>& remote);

}  // namespace ddprun::agent
