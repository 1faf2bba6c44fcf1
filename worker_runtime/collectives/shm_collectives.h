// Collectives through shared memory, for a group whose ranks all live on one host: every
// rank has a slot (two sets of them, alternating) and two arrival cache lines of its own (for
// even and odd generations), and the ranks meet at a barrier where each waits for the others'
// lines to show the barrier's generation.
//   all_reduce: the buffer goes through in chunks; for each chunk every rank reduces its 1/n
//     share (vectorised loops, one rank per share, so every rank gets bitwise the same result)
//     from what the others copied into their slots, publishes it, and copies the others'
//     shares out (see allReduce()). Buffers up to kOneBarrierBytes skip the split: every rank
//     sums every slot after a single barrier.
//   broadcast, all_gather, reduce_scatter: the ranks copy into their slots, meet, copy out
//     (and reduce_scatter reduces on the way out), one barrier per chunk; a broadcast's root
//     does not wait at it (the others wait for the root, not the root for them; with more
//     ranks than CPUs all wait for all at a last barrier instead, see broadcast()). Large
//     all_gather blocks skip the slots where the kernel lets ranks read each other's memory
//     (process_vm_readv, as Open MPI's CMA): one copy a block instead of two (a call where
//     some rank cannot read some input goes through the slots after all, as do all after it);
//   barrier: one barrier.
//   Tiny ops (kInlineBytes) skip the slots: each rank's data rides on the cache line that
//     announces its arrival at the barrier, so a peer reads one line per op instead of two.
// Each rank names what it calls (op, size, type, operator, root) on its line before every
// barrier, and checks everyone's after it: mismatched collectives throw a DdprunError naming
// both calls on every rank, where they would otherwise complete with each other's data.
// Barriers spin briefly (with more ranks than CPUs, not at all), yield, then sleep on a
// futex; a rank that never arrives is reported by rank
// and address within the deadline (sooner when its TCP connection shows it died).
// Thread-safety: one thread at a time (the group's collective thread, or a caller running a
// synchronous collective inline: the backend serialises them); generation_ and chunks_done_
// advance in step on every rank and are not locked.
#pragma once

#include <sched.h>
#include <sys/types.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <optional>

#include "rendezvous/store/store.h"
#include "worker_runtime/collectives/dtype.h"
#include "worker_runtime/transport/links.h"
#include "worker_runtime/transport/shm_segment.h"

namespace ddprun::runtime {

class ShmCollectives {
 public:
  // Collective over the group. Throws DdprunError when shared memory is not usable here.
  // `peer_gone(q)` answers whether rank q is known dead; `peer_name(q)` names it.
  // `slot_bytes` (a positive multiple of 64, equal on every rank; else DDPRUN_CHECK fails) is
  // each rank's slot, the chunk the buffer goes through in: kDefaultSlotBytes unless a test
  // wants many chunks.
  ShmCollectives(rendezvous::Store& store, const std::string& prefix, int rank, int size,
                 std::chrono::milliseconds timeout, std::function<bool(int)> peer_gone,
                 std::function<std::string(int)> peer_name, size_t slot_bytes = kDefaultSlotBytes,
                 size_t single_copy_bytes = kSingleCopyBytes);
  ~ShmCollectives();

  // Same contracts as in algorithms.h; each throws PeerError (a peer died or the deadline
  // passed) or DdprunError (the ranks called different collectives).
  void allReduce(void* buf, size_t count, DType dtype, ReduceOp op, Clock::time_point deadline);
  void barrier(Clock::time_point deadline);
  // A broadcast's root returns once its data is in shared memory; it waits for the others
  // (and learns of a mismatch or a dead peer) at its next call. With more ranks than CPUs
  // (oversubscribed()) a broadcast of more than kInlineBytes returns on every rank, root
  // included, once every rank has the data.
  void broadcast(void* buf, size_t bytes, int root, Clock::time_point deadline);
  // The blocks of all_gather and reduce_scatter are in rank order, size() of them.
  void allGather(const void* in, void* const* outs, size_t bytes_per_rank, Clock::time_point deadline);
  void reduceScatter(const void* const* ins, void* out, size_t count_per_rank, DType dtype, ReduceOp op,
                     Clock::time_point deadline);

  // Whether the ranks outnumber the CPUs they may run on together (then waiters yield at once
  // instead of spinning). Known from the first completed barrier on; false before.
  bool oversubscribed() const { return oversubscribed_; }

  // Whether all_gather blocks of single_copy_bytes to kSingleCopyMaxBytes go from each
  // rank's input straight into the others' outputs (process_vm_readv) instead of through the
  // slots. Known from the second completed barrier on: every rank must be able to read every
  // other's memory, which the kernel may refuse (Yama's ptrace rules, a seccomp filter,
  // another pid namespace). False before, after a refused read, and always with kNoSingleCopy.
  bool singleCopy();

  // What reads a peer's memory: process_vm_readv unless a test puts another reader in
  // (one that fails as the kernel would for memory it does not hand over). Returns false,
  // errno set, on failure.
  using PeerReader = std::function<bool(pid_t pid, void* to, uint64_t from, size_t bytes)>;
  void setPeerReader(PeerReader reader) { read_ = std::move(reader); }

  static constexpr size_t kDefaultSlotBytes = 1 << 20;
  static constexpr size_t kSingleCopyBytes = 256 << 10;
  // Above this, the slots' pipeline wins again (2 ranks, 2-core VM: blocks of 1-4 MiB 10-20%
  // faster with the single copy, of 16 MiB 5-10% slower: the slots' chunks stay in cache).
  static constexpr size_t kSingleCopyMaxBytes = 4 << 20;
  static constexpr size_t kNoSingleCopy = SIZE_MAX;
  // all_reduce and reduce_scatter buffers up to this many bytes (and at most one slot) go
  // through whole: every rank reads every slot after one barrier, which beats splitting the
  // work (and all_reduce's second barrier) at these sizes.
  static constexpr size_t kOneBarrierBytes = 16 << 10;
  // broadcast and all_gather move chunks of this many bytes (at most a slot): small enough
  // that the copies out of one chunk overlap the copies into the next (measured on 2 ranks:
  // 256 KiB beat 1 MiB by up to 20% from 512 KiB to 8 MiB, and 64 and 32 KiB).
  static constexpr size_t kPipelineBytes = 256 << 10;
  // Tiny ops carry their data on the line that announces a rank's arrival at the barrier (a
  // peer then reads one cache line per op, not two): an all_reduce or broadcast of up to this
  // many bytes, an all_gather of this many per rank, a reduce_scatter whose input (every
  // rank's block) is this large.
  static constexpr size_t kInlineBytes = 40;

 private:
  struct Control;
  // Whether a buffer of `bytes` goes through the slots in one barrier (every rank decides
  // alike, from sizes that match on every rank).
  bool small(size_t bytes) const { return bytes > 0 && bytes <= std::min(kOneBarrierBytes, slot_bytes_); }
  // What a rank calls, as it names it on its line at each barrier.
  struct Call {
    uint64_t what;   // op, dtype, operator, root
    uint64_t bytes;  // the buffer (all_reduce, broadcast), or per rank (all_gather, reduce_scatter)
    bool operator==(const Call&) const = default;
  };
  enum class Op : uint8_t { kAllReduce = 1, kBroadcast, kAllGather, kReduceScatter, kBarrier };
  static Call callOf(Op op, uint64_t bytes, DType dtype = DType::kUInt8, ReduceOp reduce = ReduceOp::kSum,
                     int root = -1);
  static const char* opName(const Call& call);
  static std::string describe(const Call& call);
  // Meets every rank of the group having named `call` (settle(), arrive(), wait(), then
  // checkCalls()). Throws PeerError naming the missing ranks when one died or the deadline
  // passed, and DdprunError when a rank named another call.
  // `payload` (at most kInlineBytes): data the peers read with payloadOf() once it returns.
  // Returns the generation met at.
  uint32_t meet(const Call& call, Clock::time_point deadline, const void* payload = nullptr, size_t payload_bytes = 0);
  // meet(), running meanwhile() once this rank has arrived: work no peer waits for (copies
  // of this rank's own data) done while the peers' arrivals are on their way, not before.
  template <typename Meanwhile>
  uint32_t meetWhile(const Call& call, Clock::time_point deadline, const void* payload, size_t payload_bytes,
                     Meanwhile meanwhile);
  // Names `call` (and puts `payload` beside it) at the next generation and marks this rank
  // arrived there; returns it.
  uint32_t arrive(const Call& call, const void* payload = nullptr, size_t payload_bytes = 0);
  // The payload rank q arrived at `generation` with (valid until this rank arrives at the next).
  const unsigned char* payloadOf(int q, uint32_t generation) const;
  // Where this rank's payload for its next arrival goes, to be written in place (then
  // arrive() with none). Only once settled: until every rank has arrived at the current
  // generation, a peer may still read the payload two generations back from there.
  unsigned char* nextPayload();
  // Throws DdprunError when some rank named another call than rank 0's at `generation`
  // (every rank has arrived there).
  void checkCalls(uint32_t generation, const Call& call) const;
  // A rank that arrived without waiting (a broadcast's root) waits, and checks the calls,
  // here: before it writes a slot set again or meets the others, each op calls this first.
  // A set is written again two chunks later, by when every rank has read it (they read it
  // before they arrive at the next generation).
  void settle(Clock::time_point deadline);
  // Until every rank has arrived at barrier generation `target` (the rest of meet()).
  void wait(uint32_t target, const Call& call, Clock::time_point deadline);
  // Whether rank q has arrived at generation `target`.
  bool reached(int q, uint32_t target) const;
  // Once all have arrived at the first barrier: sets oversubscribed_ from every rank's
  // CPUs, and tries to read every peer's probe value (this rank's answer for singleCopy()).
  void learnPeers();
  // Reads `bytes` at address `from` of rank q's process into `to`; false (errno set) when
  // the kernel refuses or the process is gone.
  bool readPeer(int q, void* to, uint64_t from, size_t bytes) const;
  // Lets the ranks of this user read this process's memory where Yama would refuse it.
  static void allowPeerReads();
  // False when some rank could not read some peer's input: then every rank goes through
  // the slots instead (and does from then on).
  bool allGatherSingleCopy(const void* in, void* const* outs, size_t bytes_per_rank, const Call& call,
                           Clock::time_point deadline);
  // The slot set of the next phase (they alternate; see allReduce()), once settled.
  uint8_t* nextSet(Clock::time_point deadline);
  uint8_t* slot(uint8_t* set, int q) const { return set + q * slot_bytes_; }

  int rank_;
  int size_;
  size_t slot_bytes_;
  size_t single_copy_bytes_;
  std::unique_ptr<ShmSegment> segment_;
  struct Identity;
  Control* control_;
  Identity* identities_;
  uint64_t probe_value_ = 0;  // read by the peers' probes
  PeerReader read_;
  bool single_copy_ = false;
  bool single_copy_known_ = false;
  uint8_t* slots_;
  // A small op's own data, kept here rather than read back from this rank's slot.
  std::unique_ptr<uint8_t[]> own_;
  uint32_t generation_ = 0;
  uint64_t chunks_done_ = 0;  // selects the slot set; advances identically on every rank
  // The generation and call this rank arrived at without waiting (see settle()).
  struct Unsettled {
    uint32_t generation;
    Call call;
  };
  std::optional<Unsettled> unsettled_;
  // The last time a barrier slept to move off a core it shared with a peer (see wait()).
  static constexpr auto kSeparateEvery = std::chrono::milliseconds(10);
  Clock::time_point last_separation_{};
  // Whether the group has more ranks than the CPUs its ranks may run on together (each
  // rank's affinity mask is in the segment; known after the first barrier: until then, no).
  bool oversubscribed_ = false;
  bool cpus_known_ = false;
  cpu_set_t* cpus_;
  std::function<bool(int)> peer_gone_;
  std::function<std::string(int)> peer_name_;
};

}  // namespace ddprun::runtime
