// The transports and algorithm choices every collective test runs on, with the sizes that
// pick algorithms lowered so that small buffers reach every algorithm and code path:
//   "TCP/doubling": the TCP mesh, all_reduce always by recursive doubling;
//   "TCP/ring": the TCP mesh, all_reduce by the ring whenever count >= world size, the
//     reduction following the data in 3-byte steps (mid-element);
//   "shm": shared memory, all_reduce in 64-byte chunks (many chunks, some shares empty),
//     the other collectives over 61-byte rings (every transfer wraps around).
#pragma once

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "worker_runtime/backend/host_backend.h"

namespace ddprun::testing {

struct TransportSetup {
  std::string name;
  runtime::HostBackendOptions options;
  bool shared_memory;  // whether a group of two or more ranks must use it
};

inline std::vector<TransportSetup> transportSetups() {
  using SharedMemory = runtime::HostBackendOptions::SharedMemory;
  TransportSetup doubling{"TCP/doubling", {}, false};
  doubling.options.shared_memory = SharedMemory::kOff;
  doubling.options.collectives.small_all_reduce_bytes = std::numeric_limits<size_t>::max();
  TransportSetup ring{"TCP/ring", {}, false};
  ring.options.shared_memory = SharedMemory::kOff;
  ring.options.collectives.small_all_reduce_bytes = 0;
  ring.options.collectives.reduce_step_bytes = 3;
  TransportSetup shm{"shm", {}, true};
  shm.options.shm_slot_bytes = 64;
  shm.options.shm_ring_bytes = 61;
  return {doubling, ring, shm};
}

// Throws unless `backend` went the way `setup` asks (shared memory can silently be off:
// DDPRUN_SHM=0 in the environment, or no /dev/shm).
inline void checkTransport(const runtime::HostBackend& backend, const TransportSetup& setup) {
  const bool expected = setup.shared_memory && backend.size() > 1;
  if (backend.usesSharedMemory() != expected) {
    throw std::runtime_error(setup.name + ": the backend " + (expected ? "does not use" : "uses") + " shared memory");
  }
}

}  // namespace ddprun::testing
