// Links over shared memory, for a group whose ranks all live on one host: one ring
// buffer per ordered pair of ranks in a single segment (see ShmSegment). exchange() moves
// all its transfers at once, copying straight between the callers' buffers and the rings;
// a rank with nothing to do spins briefly, then sleeps on its own futex "doorbell", which a
// peer rings whenever it adds or frees data in a ring shared with that rank. A peer that
// dies is noticed through its (idle) TCP connection; one that hangs, at the deadline.
// Thread-safety: exchange() runs on one thread at a time (the group's collective thread);
// the rings are shared with the peer processes through atomics in the segment, not locks.
#pragma once

#include <functional>
#include <memory>

#include "rendezvous/store/store.h"
#include "worker_runtime/transport/links.h"
#include "worker_runtime/transport/shm_segment.h"

namespace ddprun::runtime {

class ShmLinks final : public Links {
 public:
  // Collective over the group; throws DdprunError when shared memory is not usable.
  // `ring_bytes` (positive, equal on every rank; else DDPRUN_CHECK fails) is the capacity of
  // each ring: kDefaultRingBytes unless a test wants transfers to wrap around small rings.
  ShmLinks(rendezvous::Store& store, const std::string& prefix, int rank, int size, std::chrono::milliseconds timeout,
           std::function<bool(int)> peer_gone, std::function<std::string(int)> peer_name,
           size_t ring_bytes = kDefaultRingBytes);
  ~ShmLinks() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void exchange(std::span<Transfer> transfers, Clock::time_point deadline, const char* what) override;

  static constexpr size_t kDefaultRingBytes = 512 * 1024;

 private:
  struct Ring;
  struct Doorbell;
  Ring* ring(int from, int to) const;
  Doorbell* doorbell(int rank) const;
  static size_t doorbellBytes(int size);
  // Moves what it can for one transfer; returns the bytes moved.
  size_t progress(Transfer& t);
  void waitForPeers(uint32_t seen, Clock::time_point deadline, std::span<Transfer> transfers, const char* what);

  int rank_;
  int size_;
  size_t ring_bytes_;
  size_t ring_stride_;
  std::unique_ptr<ShmSegment> segment_;
  uint8_t* base_ = nullptr;
  std::function<bool(int)> peer_gone_;
  std::function<std::string(int)> peer_name_;
};

}  // namespace ddprun::runtime
