// How the collective algorithms move bytes: a set of transfers to and from peers that
// progress together (full duplex) until all are done. Implementations: the TCP mesh;
// the algorithms never know which one they run on.
#pragma once

#include <time.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <span>
#include <stdexcept>
#include <string>

#include "common/error.h"
#include "worker_runtime/peer_error.h"

namespace ddprun::runtime {

using Clock = std::chrono::steady_clock;

// Clock::now() as of the kernel's last tick (CLOCK_MONOTONIC_COARSE, steady_clock's time base):
// a few nanoseconds a call instead of tens, at most a tick (1-4 ms) behind. For deadlines
// set on every small collective, where a few milliseconds do not matter.
inline Clock::time_point coarseNow() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return Clock::time_point(std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec));
}

struct Transfer {
  int peer = 0;
  bool send = false;
  void* data = nullptr;  // for a send: read only
  size_t bytes = 0;
  // For receives: called with the number of bytes received so far, whenever it crosses
  // a multiple of progress_step (and at the end), so a reduction can follow the data in.
  std::function<void(size_t received)> on_progress;
  size_t progress_step = 0;
  size_t done = 0;  // progress, maintained by the implementation
};

class Links {
 public:
  virtual ~Links() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Runs every transfer to completion, all at once. Throws PeerError (naming `what` and
  // the peer) on a broken connection or when `deadline` passes. Not thread-safe.
  virtual void exchange(std::span<Transfer> transfers, Clock::time_point deadline, const char* what) = 0;
};

}  // namespace ddprun::runtime
