#include "agent/hang/verdicts/dump_settling.h"

#include "agent/torch_trace/torch_dumps.h"

namespace ddprun::agent {

std::chrono::milliseconds settleTorchDumps(TorchDumps& dumps, Clock& clock,
                                           const std::function<void(Clock::Duration)>& run_for) {
  const auto start = clock.now();
  for (;;) {
    if (dumps.poll()) break;
    const auto waited = clock.now() - start;
    if (waited >= kTorchDumpWait) break;
    if (waited >= kTorchFirstDumpWait && dumps.writtenRanks().empty()) break;
    const auto next = clock.now() + kTorchDumpSettleLook;
    while (clock.now() < next) run_for(next - clock.now());
  }
  return std::chrono::duration_cast<std::chrono::milliseconds>(clock.now() - start);
}

}  // namespace ddprun::agent
