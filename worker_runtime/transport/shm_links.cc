#include "worker_runtime/transport/shm_links.h"

#include <atomic>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "common/error.h"
#include "worker_runtime/transport/shm_wait.h"

namespace ddprun::runtime {

// The header of a ring; its ring_bytes_ of data follow.
struct ShmLinks::Ring {
  alignas(64) std::atomic<uint64_t> head;  // total bytes written by the sender
  alignas(64) std::atomic<uint64_t> tail;  // total bytes taken by the receiver
  uint8_t* data() { return reinterpret_cast<uint8_t*>(this) + sizeof(Ring); }
};

struct ShmLinks::Doorbell {
  alignas(64) std::atomic<uint32_t> rings;  // bumped whenever a peer changes a shared ring
  std::atomic<uint32_t> sleepers;           // the owner is (about to be) asleep on `rings`
  // Where the owner ran when it last entered exchange(); a line of its own, as only the
  // owner writes it.
  alignas(64) std::atomic<int32_t> cpu;
};

namespace {}  // namespace

size_t ShmLinks::doorbellBytes(int size) { return (sizeof(Doorbell) * size + 4095) / 4096 * 4096; }

ShmLinks::ShmLinks(rendezvous::Store& store, const std::string& prefix, int rank, int size,
                   std::chrono::milliseconds timeout, std::function<bool(int)> peer_gone,
                   std::function<std::string(int)> peer_name, size_t ring_bytes)
    : rank_(rank),
      size_(size),
      ring_bytes_(ring_bytes),
      ring_stride_((sizeof(Ring) + ring_bytes + 63) / 64 * 64),  // each ring on cache lines of its own
      peer_gone_(std::move(peer_gone)),
      peer_name_(std::move(peer_name)) {
  DDPRUN_CHECK(ring_bytes > 0, "shared-memory links with empty rings");
  const size_t bytes = doorbellBytes(size) + ring_stride_ * size * size;
  segment_ = std::make_unique<ShmSegment>(store, prefix + "links/", rank, size, bytes, timeout);
  base_ = static_cast<uint8_t*>(segment_->data());  // zero-filled: every ring starts empty
}

ShmLinks::~ShmLinks() = default;

ShmLinks::Doorbell* ShmLinks::doorbell(int rank) const {
  return reinterpret_cast<Doorbell*>(base_ + sizeof(Doorbell) * rank);
}

ShmLinks::Ring* ShmLinks::ring(int from, int to) const {
  return reinterpret_cast<Ring*>(base_ + doorbellBytes(size_) + ring_stride_ * (from * size_ + to));
}

size_t ShmLinks::progress(Transfer& t) {
  Ring* r = t.send ? ring(rank_, t.peer) : ring(t.peer, rank_);
  const uint64_t head = t.send ? r->head.load(std::memory_order_relaxed) : r->head.load(std::memory_order_acquire);
  const uint64_t tail = t.send ? r->tail.load(std::memory_order_acquire) : r->tail.load(std::memory_order_relaxed);
  const size_t room = t.send ? ring_bytes_ - static_cast<size_t>(head - tail) : static_cast<size_t>(head - tail);
  const size_t n = std::min(room, t.bytes - t.done);
  if (n == 0) return 0;
  const uint64_t at = t.send ? head : tail;
  const size_t offset = static_cast<size_t>(at % ring_bytes_);
  const size_t first = std::min(n, ring_bytes_ - offset);
  auto* user = static_cast<uint8_t*>(t.data) + t.done;
  if (t.send) {
    std::memcpy(r->data() + offset, user, first);
    std::memcpy(r->data(), user + first, n - first);
    r->head.store(head + n, std::memory_order_release);
  } else {
    std::memcpy(user, r->data() + offset, first);
    std::memcpy(user + first, r->data(), n - first);
    r->tail.store(tail + n, std::memory_order_release);
  }
  const size_t before = t.done;
  t.done += n;
  // The peer may be asleep waiting for exactly this.
  Doorbell* bell = doorbell(t.peer);
  bell->rings.fetch_add(1, std::memory_order_seq_cst);
  shm_wait::wakeSleepers(&bell->rings, &bell->sleepers);
  if (!t.send && t.on_progress &&
      (t.done == t.bytes || t.progress_step == 0 || t.done / t.progress_step != before / t.progress_step)) {
    t.on_progress(t.done);
  }
  return n;
}

void ShmLinks::waitForPeers(uint32_t seen, Clock::time_point deadline, std::span<Transfer> transfers,
                            const char* what) {
  Doorbell* mine = doorbell(rank_);
  shm_wait::sleepWhile(&mine->rings, seen, &mine->sleepers);
  if (mine->rings.load(std::memory_order_acquire) != seen) return;
  for (const auto& t : transfers) {
    if (t.done == t.bytes) continue;
    if (peer_gone_(t.peer)) {
      throw PeerError(fmt::format("{}: {} {} died (shared memory)", what, t.send ? "sending to" : "receiving from",
                                  peer_name_(t.peer)));
    }
  }
  if (Clock::now() >= deadline) {
    for (const auto& t : transfers) {
      if (t.done == t.bytes) continue;
      throw PeerError(fmt::format("{}: {} {} timed out (shared memory; peer hung or dead?)", what,
                                  t.send ? "sending to" : "receiving from", peer_name_(t.peer)));
    }
  }
}

void ShmLinks::exchange(std::span<Transfer> transfers, Clock::time_point deadline, const char* what) {
  for (auto& t : transfers) t.done = 0;
  const int32_t cpu = shm_wait::currentCpu();
  doorbell(rank_)->cpu.store(cpu, std::memory_order_relaxed);
  // A peer still owing this rank something that was last seen on this CPU is not running:
  // spinning would only delay it.
  auto peer_here = [&] {
    for (const auto& t : transfers) {
      if (t.done < t.bytes && doorbell(t.peer)->cpu.load(std::memory_order_relaxed) == cpu) return true;
    }
    return false;
  };
  auto idle_since = Clock::now();
  for (;;) {
    // Read the doorbell first: a peer's change after this read wakes the wait below.
    const uint32_t seen = doorbell(rank_)->rings.load(std::memory_order_acquire);
    bool pending = false;
    size_t moved = 0;
    for (auto& t : transfers) {
      if (t.done < t.bytes) moved += progress(t);
      pending = pending || t.done < t.bytes;
    }
    if (!pending) return;
    const auto now = Clock::now();
    if (moved > 0) {
      idle_since = now;
      continue;
    }
    const auto idle = now - idle_since;
    if (idle < shm_wait::kSpinFor && !peer_here()) continue;
    if (idle < shm_wait::kYieldFor) {
      std::this_thread::yield();
      continue;
    }
    waitForPeers(seen, deadline, transfers, what);
  }
}

}  // namespace ddprun::runtime
