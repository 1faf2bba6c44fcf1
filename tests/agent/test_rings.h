// Flight recorder rings (common/flight_ring.h) as a worker writes them into the agent's
// directory (DDPRUN_FLIGHT_DIR), for the tests of what the agent judges from them.
#pragma once

#include <chrono>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "common/flight_ring.h"

namespace ddprun::agent::testing {

// Writes rank `rank`'s collective ring of the default group into `dir`, as a worker of a
// `size`-rank job would: `completed` all_reduces done a minute ago and, when `pending`, one
// more started 50 s ago and still running. The times are the workers' steady clock (the
// agent's hang watch reads them against it, whatever clock the agent runs on).
inline void writeTestRing(const std::string& dir, int rank, int size, int completed, bool pending) {
  using std::chrono::seconds;
  const auto ns = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
  };
  constexpr uint32_t kCapacity = 16;
  std::vector<char> memory(flightRingBytes(kCapacity) + 64);
  void* aligned = memory.data() + (64 - reinterpret_cast<uintptr_t>(memory.data()) % 64) % 64;
  FlightRingWriter writer(aligned, kCapacity, rank, 0, rank, size);
  const auto now = std::chrono::steady_clock::now();
  const FlightOpInfo all_reduce{FlightOp::kAllReduce, FlightDType::kFloat32, 1024, -1};
  for (int i = 0; i < completed; ++i) {
    const uint64_t seq = writer.enqueueStarted(all_reduce, ns(now - seconds(61)));
    writer.finish(seq, true, ns(now - seconds(60)));
  }
  if (pending) writer.enqueueStarted(all_reduce, ns(now - seconds(50)));
  std::ofstream(dir + "/" + flightRingFileName(rank, 0), std::ios::binary)
      .write(static_cast<const char*>(aligned), static_cast<std::streamsize>(flightRingBytes(kCapacity)));
}

}  // namespace ddprun::agent::testing
