#include "agent/hang/python/stack_taking.h"

#include <filesystem>
#include <system_error>

#include "agent/hang/stop/hung_worker_stop.h"
#include "common/logging.h"

namespace ddprun::agent {

pid_t hookedProcess(const std::string& dir, pid_t worker_pid) {
  pid_t target = -1;
  for (pid_t pid : registeredPythonPids(dir)) {
    if (pid == worker_pid) return pid;
    if (target < 0 && findOwningWorker(pid, {worker_pid}) == worker_pid) target = pid;
  }
  return target;
}

void waitForStackFiles(const std::vector<std::string>& files, const std::function<bool(size_t)>& ended,
                       const StackTakingLoop& loop, Clock::TimePoint deadline) {
  std::vector<uintmax_t> sizes(files.size(), 0);
  while (loop.clock.now() < deadline) {
    loop.run_for(kPythonStacksPoll);
    bool all = true;
    for (size_t i = 0; i < files.size(); ++i) {
      std::error_code ec;
      const uintmax_t size = std::filesystem::file_size(files[i], ec);
      // One that ended meanwhile writes nothing more (its exception's traceback serves instead).
      const bool done = ended(i) || (!ec && size > 0 && size == sizes[i]);
      sizes[i] = ec ? 0 : size;
      all = all && done;
    }
    if (all) break;
  }
}

void logStacksTaken(size_t taken, size_t asked, size_t served, Clock::Duration took) {
  logger("agent")->info("took the Python stacks of {} of {} worker(s) in {} ms ({} from torch's worker server)",
                        taken + served, asked + served,
                        std::chrono::duration_cast<std::chrono::milliseconds>(took).count(), served);
}

}  // namespace ddprun::agent
