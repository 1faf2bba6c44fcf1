// A POSIX shared-memory segment for the ranks of one group on one host. Rank 0 creates
// it under a name unique to the job and group; the others open it; once every rank has
// mapped it (a store barrier) the name is unlinked, so the memory vanishes with the last
// mapping even when workers are killed with SIGKILL: nothing is left in /dev/shm.
// Thread-safety: immutable once constructed; what the mapped memory holds is the owner's
// to synchronise (process-shared atomics and futexes).
#pragma once

#include <cstddef>
#include <string>

#include "rendezvous/store.h"

namespace ddprun::runtime {

class ShmSegment {
 public:
  // Collective over the group (all ranks call it). Throws DdprunError when the segment
  // cannot be made (no /dev/shm, too small); the caller then goes without shared memory.
  ShmSegment(rendezvous::Store& store, const std::string& prefix, int rank, int size, size_t bytes,
             std::chrono::milliseconds timeout);
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
