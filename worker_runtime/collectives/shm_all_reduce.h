// all_reduce through shared memory, for a group whose ranks all live on one host.
// The buffer goes through in chunks; for each chunk every rank reduces its 1/n share
// (vectorised loops, one rank per share, so every rank gets bitwise the same result) from
// what the others copied into their slots, publishes it, and copies the others' shares
// out (see run()). Two slot sets alternate, so one barrier per phase suffices. Buffers up
// to kOneBarrierBytes skip the split: every rank sums every slot after a single barrier. Barriers
// spin briefly, then sleep on a futex; a rank that never arrives is reported by rank and
// address within the deadline (sooner when its TCP connection shows it died).
// Thread-safety: run() is called by one thread at a time (the group's collective thread, or a
// caller running a synchronous collective inline: the backend serialises them);
// generation_ and chunks_done_ advance in step on every rank and are not locked.
#pragma once

#include <algorithm>
#include <functional>
#include <memory>

#include "rendezvous/store.h"
#include "worker_runtime/collectives/dtype.h"
#include "worker_runtime/transport/links.h"
#include "worker_runtime/transport/shm_segment.h"

namespace ddprun::runtime {

class ShmAllReduce {
 public:
  // Collective over the group. Throws DdprunError when shared memory is not usable here.
  // `peer_gone(q)` answers whether rank q is known dead; `peer_name(q)` names it.
  // `slot_bytes` (a positive multiple of 64, equal on every rank; else DDPRUN_CHECK fails) is
  // each rank's slot, the chunk the buffer goes through in: kDefaultSlotBytes unless a test
  // wants many chunks.
  ShmAllReduce(rendezvous::Store& store, const std::string& prefix, int rank, int size,
               std::chrono::milliseconds timeout, std::function<bool(int)> peer_gone,
               std::function<std::string(int)> peer_name, size_t slot_bytes = kDefaultSlotBytes);
  ~ShmAllReduce();

  // Same contract as allReduce() in algorithms.h. Throws PeerError.
  void run(void* buf, size_t count, DType dtype, ReduceOp op, Clock::time_point deadline);

  static constexpr size_t kDefaultSlotBytes = 1 << 20;
  // Up to this many bytes (and at most one slot) take the one-barrier path: every rank sums
  // every slot, which beats a second barrier at these sizes.
  static constexpr size_t kOneBarrierBytes = 16 << 10;

 private:
  struct Control;
  // A barrier of the slots' users. Throws PeerError naming the missing ranks when one died or
  // the deadline passed. Only run() may use it: another collective through the same slots and
  // barrier would meet a mismatched all_reduce and complete with its data instead of hanging
  // where the hang verdict can name the mismatch (small broadcast, all_gather, reduce_scatter
  // and the barrier collective were routed here once and were taken back for that); doing it
  // safely needs each rank's op, size and root compared at the barrier.
  void barrier(Clock::time_point deadline);
  bool fits(size_t bytes) const { return bytes > 0 && bytes <= std::min(kOneBarrierBytes, slot_bytes_); }
  // The slot set of the next phase (they alternate; see run()).
  uint8_t* nextSet() { return slots_ + (chunks_done_++ % 2) * size_ * slot_bytes_; }

  int rank_;
  int size_;
  size_t slot_bytes_;
  std::unique_ptr<ShmSegment> segment_;
  Control* control_;
  uint8_t* slots_;
  uint32_t generation_ = 0;
  uint64_t chunks_done_ = 0;  // selects the slot set; advances identically on every rank
  // The last time a barrier slept to move off a core it shared with a peer (see barrier()).
  static constexpr auto kSeparateEvery = std::chrono::milliseconds(10);
  Clock::time_point last_separation_{};
  std::function<bool(int)> peer_gone_;
  std::function<std::string(int)> peer_name_;
};

}  // namespace ddprun::runtime
