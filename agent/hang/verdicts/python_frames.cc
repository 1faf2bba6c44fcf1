#include "agent/hang/verdicts/python_frames.h"

#include <string_view>

#include "agent/hang/python/python_hook.h"
#include "agent/ops/error_file.h"

namespace ddprun::agent {

std::vector<RankFrames> rankFrames(const std::vector<RankEvidence>& local, const std::map<int, RemoteStack>& remote) {
  std::vector<RankFrames> ranks;
  for (const RankEvidence& w : local) {
    RankFrames r;
    r.rank = w.rank;
    if (w.python_hook) r.frames = lastTraceback(readPythonException(w.dir));
    if (r.frames.empty()) {
      if (auto error = readErrorFile(w.error_file)) r.frames = lastTraceback(error->traceback);
    }
    r.failed = !r.frames.empty() || !w.running;
    if (r.frames.empty() && !w.python_stack.empty()) r.frames = mainThreadFrames(w.python_stack);
    if (r.frames.empty() && !w.running) r.frames = lastTraceback(w.stderr_tail);
    ranks.push_back(std::move(r));
  }
  // formatTraceback's lines, as the summary carried them, read back as a traceback.
  for (const auto& [rank, stack] : remote) {
    std::string traceback = "Traceback (most recent call last):\n";
    for (std::string_view rest = stack.traceback; !rest.empty();) {
      const size_t newline = rest.find('\n');
      traceback += "  " + std::string(rest.substr(0, newline)) + "\n";
      rest = newline == std::string_view::npos ? std::string_view{} : rest.substr(newline + 1);
    }
    ranks.push_back(RankFrames{rank, lastTraceback(traceback), false});
  }
  return ranks;
}

}  // namespace ddprun::agent
