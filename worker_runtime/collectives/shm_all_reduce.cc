#include "worker_runtime/collectives/shm_all_reduce.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "common/error.h"
#include "worker_runtime/transport/shm_wait.h"

namespace ddprun::runtime {

// Each rank's word on a cache line of its own: ranks writing neighbouring words would
// pass the line back and forth on every barrier.
struct alignas(64) Reached {
  std::atomic<uint32_t> generation;
  std::atomic<int32_t> cpu;  // where the rank ran when it last arrived at a barrier
};

struct ShmAllReduce::Control {
  alignas(64) std::atomic<uint32_t> arrived;
  alignas(64) std::atomic<uint32_t> generation;
  std::atomic<uint32_t> sleepers;  // ranks (about to be) asleep on `generation`
  // Last barrier generation each rank reached: names the ranks that are missing.
  Reached reached[1];
};

ShmAllReduce::ShmAllReduce(rendezvous::Store& store, const std::string& prefix, int rank, int size,
                           std::chrono::milliseconds timeout, std::function<bool(int)> peer_gone,
                           std::function<std::string(int)> peer_name, size_t slot_bytes)
    : rank_(rank),
      size_(size),
      slot_bytes_(slot_bytes),
      peer_gone_(std::move(peer_gone)),
      peer_name_(std::move(peer_name)) {
  // Multiples of 64 keep every slot aligned for any element type (and on its own cache lines).
  DDPRUN_CHECK(slot_bytes > 0 && slot_bytes % 64 == 0,
               "shared-memory all_reduce slot of " + std::to_string(slot_bytes) + " bytes");
  const size_t control = (sizeof(Control) + sizeof(Reached) * size + 4095) / 4096 * 4096;
  segment_ = std::make_unique<ShmSegment>(store, prefix, rank, size, control + 2 * size * slot_bytes_, timeout);
  // A fresh segment is zero-filled: every counter starts at 0.
  control_ = static_cast<Control*>(segment_->data());
  slots_ = static_cast<uint8_t*>(segment_->data()) + control;
}

ShmAllReduce::~ShmAllReduce() = default;

void ShmAllReduce::barrier(Clock::time_point deadline) {
  const uint32_t target = ++generation_;
  const int32_t cpu = shm_wait::currentCpu();
  control_->reached[rank_].cpu.store(cpu, std::memory_order_relaxed);
  control_->reached[rank_].generation.store(target, std::memory_order_relaxed);
  if (control_->arrived.fetch_add(1, std::memory_order_acq_rel) == static_cast<uint32_t>(size_ - 1)) {
    control_->arrived.store(0, std::memory_order_relaxed);
    control_->generation.store(target, std::memory_order_seq_cst);
    shm_wait::wakeSleepers(&control_->generation, &control_->sleepers);
    return;
  }
  // A missing rank last seen on this CPU is not running: spinning would only delay it.
  auto missing_here = [&] {
    for (int q = 0; q < size_; ++q) {
      if (q != rank_ && control_->reached[q].generation.load(std::memory_order_relaxed) < target &&
          control_->reached[q].cpu.load(std::memory_order_relaxed) == cpu) {
        return true;
      }
    }
    return false;
  };
  const auto start = Clock::now();
  bool yield_now = false;
  for (int spin = 0;; ++spin) {
    const uint32_t seen = control_->generation.load(std::memory_order_acquire);
    if (seen == target) return;
    if (!yield_now && (spin & 63) != 0) continue;
    const auto waited = Clock::now() - start;
    yield_now = yield_now || missing_here();
    // Long waits (a late or dead peer) go on to the checks below.
    if (yield_now && waited < shm_wait::kYieldFor && Clock::now() - last_separation_ > kSeparateEvery) {
      // Yielding back and forth keeps both ranks on this core: each always has just run,
      // so the kernel's balancer never moves one. Sleeping instead lets the peer run alone,
      // and its wake-up of this rank places it on an idle core if there is one. Only now
      // and then: when no core is idle, the futex round trip costs more than the yield.
      shm_wait::sleepWhile(&control_->generation, seen, &control_->sleepers);
      last_separation_ = Clock::now();
      continue;
    }
    if (waited < shm_wait::kSpinFor && !yield_now) continue;
    if (waited < shm_wait::kYieldFor) {
      std::this_thread::yield();
      continue;
    }
    shm_wait::sleepWhile(&control_->generation, seen, &control_->sleepers);
    if (control_->generation.load(std::memory_order_acquire) == target) return;
    // Who is missing, and is it dead or just late?
    std::string missing;
    for (int q = 0; q < size_; ++q) {
      if (control_->reached[q].generation.load(std::memory_order_relaxed) >= target) continue;
      if (peer_gone_(q)) throw PeerError(fmt::format("all_reduce (shared memory): {} died", peer_name_(q)));
      missing += (missing.empty() ? "" : ", ") + peer_name_(q);
    }
    if (Clock::now() >= deadline) {
      throw PeerError(fmt::format("all_reduce (shared memory): timed out waiting for {}", missing));
    }
  }
}

// Per chunk, with share q = elements [len*q/n, len*(q+1)/n): each rank copies into its
// slot only the shares the others reduce (its own share stays in its buffer), reduces its
// own share in its own buffer (own data first, then ranks in order: one rank computes each
// share, so every rank gets the same bits), publishes that result in its slot, and after
// a barrier copies the others' results out. About half the memory traffic of copying
// whole chunks in and out.
void ShmAllReduce::run(void* buf, size_t count, DType dtype, ReduceOp op, Clock::time_point deadline) {
  const size_t esize = dtypeSize(dtype);
  if (fits(count * esize)) {
    // Small: latency is barriers (each a cache-line round trip, or a context switch when
    // both ranks share a core), not bandwidth. Every rank copies its whole buffer into its
    // slot and, after one barrier, sums all slots itself, in rank order (so every rank gets
    // the same bits). One barrier suffices because the sets alternate: a rank can only
    // write this set again after the next call's barrier, which every rank reaches only
    // once it has read this one.
    uint8_t* set = nextSet();
    const size_t bytes = count * esize;
    std::memcpy(set + rank_ * slot_bytes_, buf, bytes);
    barrier(deadline);
    std::memcpy(buf, set, bytes);
    for (int q = 1; q < size_; ++q) reduceInto(buf, set + q * slot_bytes_, count, dtype, op);
    if (op == ReduceOp::kAvg) divideBy(buf, count, dtype, size_);
    return;
  }
  const size_t per_chunk = slot_bytes_ / esize;
  auto* user = static_cast<uint8_t*>(buf);
  for (size_t offset = 0; offset < count; offset += per_chunk, ++chunks_done_) {
    const size_t len = std::min(per_chunk, count - offset);
    // Sets alternate across calls too: a fast rank starting the next call (whose shares
    // may fall elsewhere) writes the other set while a slow one still reads this one.
    uint8_t* set = slots_ + (chunks_done_ % 2) * size_ * slot_bytes_;
    uint8_t* chunk = user + offset * esize;
    auto begin = [&](int q) { return len * q / size_ * esize; };
    auto slot = [&](int q) { return set + q * slot_bytes_; };
    for (int q = 0; q < size_; ++q) {
      if (q != rank_) std::memcpy(slot(rank_) + begin(q), chunk + begin(q), begin(q + 1) - begin(q));
    }
    barrier(deadline);
    const size_t mine = begin(rank_), mine_bytes = begin(rank_ + 1) - mine;
    if (mine_bytes > 0) {
      for (int q = 0; q < size_; ++q) {
        if (q != rank_) reduceInto(chunk + mine, slot(q) + mine, mine_bytes / esize, dtype, op);
      }
      if (op == ReduceOp::kAvg) divideBy(chunk + mine, mine_bytes / esize, dtype, size_);
      std::memcpy(slot(rank_) + mine, chunk + mine, mine_bytes);
    }
    barrier(deadline);
    for (int q = 0; q < size_; ++q) {
      if (q != rank_) std::memcpy(chunk + begin(q), slot(q) + begin(q), begin(q + 1) - begin(q));
    }
  }
}

}  // namespace ddprun::runtime
