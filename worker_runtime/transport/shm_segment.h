// A POSIX shared-memory segment for the ranks of one group on one host. Rank 0 creates
// it under a name unique to the job and group; the others open it; once every rank has
// mapped it (a store barrier) the name is unlinked, so the memory vanishes with the last
// mapping even when workers are killed with SIGKILL: nothing is left in /dev/shm.
//
// Making the segment is all or nothing across the group: every rank reports its own
// failure (open, map) to the store before the barrier and reads everyone's after it, so a
// failure on any rank makes every rank throw the same error as soon as the last rank
// arrives, and the group falls back to TCP together instead of some ranks waiting out the
// group timeout.
// Thread-safety: immutable once constructed; what the mapped memory holds is the owner's
// to synchronise (process-shared atomics and futexes).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <string>

#include "rendezvous/store/store.h"

namespace ddprun::runtime {

// shm_open's signature: how a rank creates (rank 0) or opens (the others) the segment's
// name. Tests pass one that fails on a chosen rank; an empty one means ::shm_open.
using ShmOpenFn = std::function<int(const char* name, int flags, mode_t mode)>;

class ShmSegment {
 public:
  // Collective over the group (all ranks call it). Blocks until every rank has mapped the
  // segment or failed to, up to `timeout` (the store's timeout for rank 0's name). Throws
  // DdprunError on every rank alike when the segment cannot be made or mapped on any rank
  // (no /dev/shm, too small), naming the ranks and their errors; the caller then goes
  // without shared memory. Throws StoreError when the store fails or times out.
  ShmSegment(rendezvous::Store& store, const std::string& prefix, int rank, int size, size_t bytes,
             std::chrono::milliseconds timeout, ShmOpenFn open = {});
  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace ddprun::runtime
