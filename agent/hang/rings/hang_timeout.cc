#include "agent/hang/rings/hang_timeout.h"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

namespace ddprun::agent {

Clock::Duration hangTimeoutLook(Clock::Duration timeout) {
  return std::clamp<Clock::Duration>(timeout / 4, std::chrono::milliseconds(50), std::chrono::seconds(1));
}

std::vector<RankPosition> positionsOfRanks(const std::vector<FlightRingSnapshot>& rings, const std::vector<int>& ranks,
                                           int64_t now_ns) {
  std::vector<RankPosition> positions;
  for (const FlightRingSnapshot& ring : rings) {
    for (int rank : ranks) {
      if (rank == ring.rank) positions.push_back(positionOf(ring, now_ns));
    }
  }
  return positions;
}

std::string hangTimeoutTrigger(double timeout_s) {
  return fmt::format("--hang_timeout: no rank on this node completed an operation for {:g} s while one was pending",
                     timeout_s);
}

NoRings noRingsLine(double timeout_s, bool python_running, bool python_workers, bool python_stacks) {
  // Rings appear with a worker's first collective: C++ workers on ddprun's runtime keep them,
  // and Python workers through ddprun's hook.
  if (python_running) {
    return {spdlog::level::info,
            fmt::format("--hang_timeout {:g} s: no worker on this node has called a torch.distributed collective yet",
                        timeout_s)};
  }
  if (python_workers && !python_stacks) {
    return {spdlog::level::warn,
            fmt::format("--hang_timeout {:g} s: --no_python_stacks turns off ddprun's Python hook, which records the "
                        "Python workers' collectives, so hangs cannot be judged here",
                        timeout_s)};
  }
  return {spdlog::level::warn,
          fmt::format("--hang_timeout {:g} s: no worker on this node keeps a flight recorder (C++ workers on ddprun's "
                      "runtime and Python workers through ddprun's hook do), so hangs cannot be judged here; torch's "
                      "file timer (TORCHELASTIC_ENABLE_FILE_TIMER=1) can serve instead",
                      timeout_s)};
}

}  // namespace ddprun::agent
