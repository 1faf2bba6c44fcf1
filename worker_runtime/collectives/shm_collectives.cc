#include "worker_runtime/collectives/shm_collectives.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <mutex>
#include <thread>

#include <sched.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <fmt/format.h>

#include "common/error.h"
#include "common/logging.h"
#include "worker_runtime/transport/shm_wait.h"

namespace ddprun::runtime {

// A rank's arrival at one barrier generation, with everything a peer reads of it there: on
// one cache line of its own, so the peer that sees the arrival has the call and a tiny op's
// data in the same line transfer (ranks writing neighbouring words would pass a line back
// and forth on every barrier; a second line read per op, the data slot, was a second miss).
struct alignas(64) Arrival {
  std::atomic<uint32_t> generation;
  std::atomic<int32_t> cpu;  // where the rank ran when it arrived
  // The call the rank made (Call), written before it arrives.
  std::atomic<uint64_t> what;
  std::atomic<uint64_t> bytes;
  // A tiny op's data (ShmCollectives::kInlineBytes at most), written before the rank
  // arrives; the peers read it once they see the arrival, before they arrive at the next
  // generation, so this line is written again (two generations on) only once all have.
  unsigned char payload[ShmCollectives::kInlineBytes];
};
static_assert(sizeof(Arrival) == 64, "a rank's arrival fills one cache line");

// Each rank's barrier words. Two arrivals, [g % 2] for generation g, because a rank that has
// passed barrier g may arrive at g + 1 before a slower one has read its arrival at g; it
// cannot arrive at g + 2 before all have arrived at g + 1.
struct Reached {
  Arrival at[2];
  // A single-copy all_gather's input in this rank's address space, for the call at [g % 2].
  alignas(64) std::atomic<uint64_t> source[2];
  // Whether this rank failed to read some peer's input in the single-copy all_gather whose
  // second barrier is g, in [g % 2].
  std::atomic<uint32_t> read_failed[2];
};

// What a rank publishes once, before its first arrival, for the single-copy path: the peers
// read `probe_value` at `probe_address` in process `pid` after the first barrier, and each
// says in `reads_peers` whether it could read every peer's (published with its next
// arrival, so every rank knows every rank's answer once the second barrier is passed).
struct ShmCollectives::Identity {
  int32_t pid;
  uint64_t probe_address;
  uint64_t probe_value;
  std::atomic<uint32_t> reads_peers;  // kUnknown, kYes or kNo
  static constexpr uint32_t kUnknown = 0, kYes = 1, kNo = 2;
};

struct ShmCollectives::Control {
  // Sleeping waiters' futex word, rung by arriving ranks when someone sleeps.
  alignas(64) std::atomic<uint32_t> bell;
  std::atomic<uint32_t> sleepers;  // ranks (about to be) asleep on `bell`
  // Each rank's arrivals: a rank passes barrier g once every rank's generation reached g.
  // Reading the peers' own lines (rather than one shared counter that every rank increments
  // and one generation word the last one writes) costs one cache-line transfer per peer, and
  // brings each peer's call along on the same line.
  Reached reached[1];
};

ShmCollectives::ShmCollectives(rendezvous::Store& store, const std::string& prefix, int rank, int size,
                               std::chrono::milliseconds timeout, std::function<bool(int)> peer_gone,
                               std::function<std::string(int)> peer_name, size_t slot_bytes, size_t single_copy_bytes)
    : rank_(rank),
      size_(size),
      slot_bytes_(slot_bytes),
      single_copy_bytes_(single_copy_bytes),
      peer_gone_(std::move(peer_gone)),
      peer_name_(std::move(peer_name)) {
  // Multiples of 64 keep every slot aligned for any element type (and on its own cache lines).
  DDPRUN_CHECK(slot_bytes > 0 && slot_bytes % 64 == 0,
               "shared-memory collectives' slot of " + std::to_string(slot_bytes) + " bytes");
  const size_t masks = sizeof(Control) + sizeof(Reached) * size;
  const size_t identities = masks + sizeof(cpu_set_t) * size;
  const size_t control = (identities + sizeof(Identity) * size + 4095) / 4096 * 4096;
  segment_ = std::make_unique<ShmSegment>(store, prefix, rank, size, control + 2 * size * slot_bytes_, timeout);
  // A fresh segment is zero-filled: every counter starts at 0.
  control_ = static_cast<Control*>(segment_->data());
  cpus_ = reinterpret_cast<cpu_set_t*>(static_cast<uint8_t*>(segment_->data()) + masks);
  // The CPUs this rank may run on, for learnCpus(); published by the first barrier's arrival.
  // Unknown (more CPUs than a cpu_set_t holds): all, so the group never counts as oversubscribed.
  if (::sched_getaffinity(0, sizeof(cpu_set_t), &cpus_[rank_]) != 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c) CPU_SET(c, &cpus_[rank_]);
  }
  identities_ = reinterpret_cast<Identity*>(static_cast<uint8_t*>(segment_->data()) + identities);
  Identity& me = identities_[rank_];
  me.pid = ::getpid();
  me.probe_address = reinterpret_cast<uintptr_t>(&probe_value_);
  // Anything a peer could not read by chance from another address or process.
  probe_value_ = std::chrono::steady_clock::now().time_since_epoch().count() ^ (static_cast<uint64_t>(me.pid) << 32) ^
                 reinterpret_cast<uintptr_t>(this);
  me.probe_value = probe_value_;
  if (single_copy_bytes_ != kNoSingleCopy) allowPeerReads();
  slots_ = static_cast<uint8_t*>(segment_->data()) + control;
  own_ = std::make_unique<uint8_t[]>(std::min(kOneBarrierBytes, slot_bytes_));
}

ShmCollectives::~ShmCollectives() = default;

ShmCollectives::Call ShmCollectives::callOf(Op op, uint64_t bytes, DType dtype, ReduceOp reduce, int root) {
  const uint64_t what = static_cast<uint64_t>(op) | static_cast<uint64_t>(dtype) << 8 |
                        static_cast<uint64_t>(reduce) << 16 | static_cast<uint64_t>(static_cast<uint32_t>(root)) << 32;
  return Call{what, bytes};
}

const char* ShmCollectives::opName(const Call& call) {
  switch (static_cast<Op>(call.what & 0xff)) {
    case Op::kAllReduce: return "all_reduce";
    case Op::kBroadcast: return "broadcast";
    case Op::kAllGather: return "all_gather";
    case Op::kReduceScatter: return "reduce_scatter";
    case Op::kBarrier: return "barrier";
  }
  return "collective";
}

std::string ShmCollectives::describe(const Call& call) {
  const auto op = static_cast<Op>(call.what & 0xff);
  const auto dtype = static_cast<DType>((call.what >> 8) & 0xff);
  const auto reduce = static_cast<ReduceOp>((call.what >> 16) & 0xff);
  const auto root = static_cast<int32_t>(call.what >> 32);
  switch (op) {
    case Op::kAllReduce:
      return fmt::format("all_reduce of {} bytes ({}, {})", call.bytes, dtypeName(dtype), reduceOpName(reduce));
    case Op::kBroadcast: return fmt::format("broadcast of {} bytes from rank {}", call.bytes, root);
    case Op::kAllGather: return fmt::format("all_gather of {} bytes per rank", call.bytes);
    case Op::kReduceScatter:
      return fmt::format("reduce_scatter of {} bytes per rank ({}, {})", call.bytes, dtypeName(dtype),
                         reduceOpName(reduce));
    case Op::kBarrier: return "barrier";
  }
  return fmt::format("an unknown call ({:#x})", call.what);
}

template <typename Meanwhile>
uint32_t ShmCollectives::meetWhile(const Call& call, Clock::time_point deadline, const void* payload,
                                   size_t payload_bytes, Meanwhile meanwhile) {
  settle(deadline);
  const uint32_t target = arrive(call, payload, payload_bytes);
  meanwhile();
  wait(target, call, deadline);
  if (!cpus_known_) learnPeers();
  checkCalls(target, call);
  return target;
}

uint32_t ShmCollectives::meet(const Call& call, Clock::time_point deadline, const void* payload, size_t payload_bytes) {
  return meetWhile(call, deadline, payload, payload_bytes, [] {});
}

const unsigned char* ShmCollectives::payloadOf(int q, uint32_t generation) const {
  return control_->reached[q].at[generation % 2].payload;
}

unsigned char* ShmCollectives::nextPayload() { return control_->reached[rank_].at[(generation_ + 1) % 2].payload; }

uint8_t* ShmCollectives::nextSet(Clock::time_point deadline) {
  settle(deadline);
  return slots_ + (chunks_done_++ % 2) * size_ * slot_bytes_;
}

uint32_t ShmCollectives::arrive(const Call& call, const void* payload, size_t payload_bytes) {
  const uint32_t target = ++generation_;
  Arrival& mine = control_->reached[rank_].at[target % 2];
  mine.cpu.store(shm_wait::currentCpu(), std::memory_order_relaxed);
  mine.what.store(call.what, std::memory_order_relaxed);
  mine.bytes.store(call.bytes, std::memory_order_relaxed);
  if (payload_bytes > 0) std::memcpy(mine.payload, payload, payload_bytes);
  // Releases this rank's call, payload and slot writes to the peers that acquire it. A plain
  // store, not a locked one: this rank goes on to read the peers' lines (here, then in
  // wait()) while its store waits for the line, instead of stalling until it has it.
  mine.generation.store(target, std::memory_order_release);
  // Only a peer that arrived here first waits for this rank, so only then may one be asleep
  // (and it sleeps only after waiting for milliseconds): then the fence orders the store
  // before ring()'s read of the sleepers, as ring() needs. A peer that arrives after this
  // read finds this rank's arrival (drained within microseconds) long before it would sleep.
  for (int q = 0; q < size_; ++q) {
    if (q != rank_ && reached(q, target)) {
      std::atomic_thread_fence(std::memory_order_seq_cst);
      shm_wait::ring(&control_->bell, &control_->sleepers);
      break;
    }
  }
  return target;
}

void ShmCollectives::settle(Clock::time_point deadline) {
  if (!unsettled_) return;
  const Unsettled last = *unsettled_;
  unsettled_.reset();
  wait(last.generation, last.call, deadline);
  if (!cpus_known_) learnPeers();
  checkCalls(last.generation, last.call);
}

void ShmCollectives::learnPeers() {
  // Every rank wrote its mask and identity before it first arrived, and this rank has seen
  // them all arrive.
  cpu_set_t all;
  CPU_ZERO(&all);
  for (int q = 0; q < size_; ++q) CPU_OR(&all, &all, &cpus_[q]);
  oversubscribed_ = size_ > CPU_COUNT(&all);
  cpus_known_ = true;
  bool reads = single_copy_bytes_ != kNoSingleCopy;
  for (int q = 0; q < size_ && reads; ++q) {
    if (q == rank_) continue;
    uint64_t seen = ~identities_[q].probe_value;
    reads = readPeer(q, &seen, identities_[q].probe_address, sizeof seen) && seen == identities_[q].probe_value;
  }
  // Published by this rank's next arrival.
  identities_[rank_].reads_peers.store(reads ? Identity::kYes : Identity::kNo, std::memory_order_relaxed);
}

bool ShmCollectives::singleCopy() {
  // Every rank asks at the same generation (calls go in step), with that generation passed:
  // from the second barrier on, every rank's answer is in, so every rank decides alike.
  if (single_copy_known_ || generation_ < 2) return single_copy_;
  single_copy_ = true;
  for (int q = 0; q < size_; ++q) {
    single_copy_ = single_copy_ && identities_[q].reads_peers.load(std::memory_order_relaxed) == Identity::kYes;
  }
  single_copy_known_ = true;
  return single_copy_;
}

bool ShmCollectives::readPeer(int q, void* to, uint64_t from, size_t bytes) const {
  if (read_) return read_(identities_[q].pid, to, from, bytes);
  auto* out = static_cast<uint8_t*>(to);
  while (bytes > 0) {
    iovec local{out, bytes};
    iovec remote{reinterpret_cast<void*>(from), bytes};
    const ssize_t got = ::process_vm_readv(identities_[q].pid, &local, 1, &remote, 1, 0);
    if (got <= 0) return false;
    out += got;
    from += got;
    bytes -= got;
  }
  return true;
}

void ShmCollectives::allowPeerReads() {
  // Where Yama allows ptrace only from ancestors (scope 1, Ubuntu's default), sibling ranks
  // cannot read each other's memory unless each names them; every process of this user is
  // as much as the kernel lets a rank name (Open MPI's shared-memory transport does the
  // same). Stricter scopes refuse it whatever we do: the probe then finds out.
  static std::once_flag once;
  std::call_once(once, [] {
    int scope = 0;
    std::ifstream("/proc/sys/kernel/yama/ptrace_scope") >> scope;
    if (scope == 1) ::prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
  });
}

void ShmCollectives::checkCalls(uint32_t generation, const Call& call) const {
  // Every rank compares every call with rank 0's, so every rank throws the same line (and
  // the slot sets stay in step). A rank's call at `generation` stays on its line until it
  // names the one at generation + 2, which it can only do once this rank arrived at + 1.
  auto callAt = [&](int q) {
    const Arrival& a = control_->reached[q].at[generation % 2];
    return q == rank_ ? call : Call{a.what.load(std::memory_order_relaxed), a.bytes.load(std::memory_order_relaxed)};
  };
  const Call first = callAt(0);
  for (int q = 1; q < size_; ++q) {
    const Call other = callAt(q);
    if (other == first) continue;
    throw DdprunError(fmt::format("mismatched collectives (shared memory): {} called {} where {} called {}",
                                  peer_name_(q), describe(other), peer_name_(0), describe(first)));
  }
}

bool ShmCollectives::reached(int q, uint32_t target) const {
  // Wrap-safe: ranks are never more than one generation apart, so q's arrival of this parity
  // is at target - 2 (not yet) or target.
  return static_cast<int32_t>(control_->reached[q].at[target % 2].generation.load(std::memory_order_acquire) -
                              target) >= 0;
}

void ShmCollectives::wait(uint32_t target, const Call& call, Clock::time_point deadline) {
  const int32_t cpu = control_->reached[rank_].at[target % 2].cpu.load(std::memory_order_relaxed);
  int next = rank_ == 0 ? 1 : 0;  // the first rank not known to have arrived
  auto all_here = [&] {
    for (; next < size_; ++next) {
      if (next != rank_ && !reached(next, target)) return false;
    }
    return true;
  };
  // A missing rank last seen on this CPU is not running: spinning would only delay it.
  auto missing_here = [&] {
    for (int q = next; q < size_; ++q) {
      // Not arrived at target: its last arrival, at target - 1, says where it ran.
      if (q != rank_ && !reached(q, target) &&
          control_->reached[q].at[(target + 1) % 2].cpu.load(std::memory_order_relaxed) == cpu) {
        return true;
      }
    }
    return false;
  };
  // The clock starts at the first check after spin 0: most waits end before it, and a read
  // of it (the TSC, under this hypervisor) cost about a sixth of a small collective when
  // every wait took two.
  Clock::time_point start{};
  // With more ranks than CPUs some rank is always off a CPU: spinning only keeps it off.
  bool yield_now = oversubscribed_;
  for (int spin = 0;; ++spin) {
    if (all_here()) return;
    if (yield_now && (spin & 15) != 0) {
      // Yielding: the clock and the peers' CPUs only now and then, as every nanosecond
      // here delays the rank this one yields to when they share a core.
      std::this_thread::yield();
      continue;
    }
    if (!yield_now && (spin & 63) != 0) continue;
    yield_now = yield_now || missing_here();
    if (spin == 0) continue;
    const auto now = Clock::now();
    if (start == Clock::time_point{}) start = now;
    const auto waited = now - start;
    // Long waits (a late or dead peer) go on to the checks below. With more ranks than
    // CPUs there is no idle core to move to.
    if (yield_now && !oversubscribed_ && waited < shm_wait::kYieldFor && now - last_separation_ > kSeparateEvery) {
      // Yielding back and forth keeps both ranks on this core: each always has just run,
      // so the kernel's balancer never moves one. Sleeping instead lets the peer run alone,
      // and its wake-up of this rank places it on an idle core if there is one. Only now
      // and then: when no core is idle, the futex round trip costs more than the yield.
      shm_wait::sleepUnless(&control_->bell, &control_->sleepers, all_here);
      last_separation_ = Clock::now();
      continue;
    }
    if (waited < shm_wait::kSpinFor && !yield_now) continue;
    if (waited < shm_wait::kYieldFor) {
      std::this_thread::yield();
      continue;
    }
    shm_wait::sleepUnless(&control_->bell, &control_->sleepers, all_here);
    if (all_here()) return;
    // Who is missing, and is it dead or just late? Every dead rank is named, not the first:
    // a rank that gave up on a dead peer has left too, and when its number is the lower,
    // the first name alone would blame it for the other's death.
    std::string missing, dead;
    for (int q = 0; q < size_; ++q) {
      if (q == rank_ || reached(q, target)) continue;
      std::string& list = peer_gone_(q) ? dead : missing;
      list += (list.empty() ? "" : ", ") + peer_name_(q);
    }
    if (!dead.empty()) throw PeerError(fmt::format("{} (shared memory): {} died", opName(call), dead));
    if (Clock::now() >= deadline) {
      throw PeerError(fmt::format("{} (shared memory): timed out waiting for {}", opName(call), missing));
    }
  }
}

// Per chunk, with share q = elements [len*q/n, len*(q+1)/n): each rank copies into its
// slot only the shares the others reduce (its own share stays in its buffer), reduces its
// own share in its own buffer (own data first, then ranks in order: one rank computes each
// share, so every rank gets the same bits), publishes that result in its slot, and after
// a barrier copies the others' results out. About half the memory traffic of copying
// whole chunks in and out.
void ShmCollectives::allReduce(void* buf, size_t count, DType dtype, ReduceOp op, Clock::time_point deadline) {
  const size_t esize = dtypeSize(dtype);
  const size_t bytes = count * esize;
  const Call call = callOf(Op::kAllReduce, bytes, dtype, op);
  if (bytes > 0 && bytes <= kInlineBytes) {
    // Tiny: the data rides on the arrival line; rank order from rank 0's, as below.
    // This rank's own data from a copy of its own, not from its line: reading that line
    // back after a peer has read it costs about as much as the peer's read (measured: 0.55
    // against 0.42 us for a 2-rank all_reduce of 8 bytes).
    unsigned char own[kInlineBytes];
    const uint32_t met = meetWhile(call, deadline, buf, bytes, [&] { std::memcpy(own, buf, bytes); });
    auto from = [&](int q) { return q == rank_ ? own : payloadOf(q, met); };
    std::memcpy(buf, from(0), bytes);
    for (int q = 1; q < size_; ++q) reduceInto(buf, from(q), count, dtype, op);
    if (op == ReduceOp::kAvg) divideBy(buf, count, dtype, size_);
    return;
  }
  if (small(bytes)) {
    // Small: latency is barriers (each a cache-line round trip, or a context switch when
    // both ranks share a core), not bandwidth. Every rank copies its whole buffer into its
    // slot and, after one barrier, sums all slots itself, in rank order (so every rank gets
    // the same bits). One barrier suffices because the sets alternate: a rank can only
    // write this set again after the next call's barrier, which every rank reaches only
    // once it has read this one. The other one-barrier collectives below rely on the same.
    // This rank's own data is not read back from its slot, which the peers are reading at
    // that moment (see the tiny path above): rank 0's stays in buf, the others' in a copy.
    uint8_t* set = nextSet(deadline);
    std::memcpy(slot(set, rank_), buf, bytes);
    meetWhile(call, deadline, nullptr, 0, [&] {
      if (rank_ != 0) std::memcpy(own_.get(), buf, bytes);
    });
    if (rank_ != 0) std::memcpy(buf, set, bytes);
    for (int q = 1; q < size_; ++q) reduceInto(buf, q == rank_ ? own_.get() : slot(set, q), count, dtype, op);
    if (op == ReduceOp::kAvg) divideBy(buf, count, dtype, size_);
    return;
  }
  const size_t per_chunk = slot_bytes_ / esize;
  auto* user = static_cast<uint8_t*>(buf);
  for (size_t offset = 0; offset < count; offset += per_chunk) {
    const size_t len = std::min(per_chunk, count - offset);
    // Sets alternate across calls too: a fast rank starting the next call (whose shares
    // may fall elsewhere) writes the other set while a slow one still reads this one.
    uint8_t* set = nextSet(deadline);
    uint8_t* chunk = user + offset * esize;
    auto begin = [&](int q) { return len * q / size_ * esize; };
    for (int q = 0; q < size_; ++q) {
      if (q != rank_) std::memcpy(slot(set, rank_) + begin(q), chunk + begin(q), begin(q + 1) - begin(q));
    }
    meet(call, deadline);
    const size_t mine = begin(rank_), mine_bytes = begin(rank_ + 1) - mine;
    if (mine_bytes > 0) {
      for (int q = 0; q < size_; ++q) {
        if (q != rank_) reduceInto(chunk + mine, slot(set, q) + mine, mine_bytes / esize, dtype, op);
      }
      if (op == ReduceOp::kAvg) divideBy(chunk + mine, mine_bytes / esize, dtype, size_);
      std::memcpy(slot(set, rank_) + mine, chunk + mine, mine_bytes);
    }
    meet(call, deadline);
    for (int q = 0; q < size_; ++q) {
      if (q != rank_) std::memcpy(chunk + begin(q), slot(set, q) + begin(q), begin(q + 1) - begin(q));
    }
  }
}

void ShmCollectives::barrier(Clock::time_point deadline) { meet(callOf(Op::kBarrier, 0), deadline); }

// Buffers go through in chunks of kPipelineBytes (per rank, for all_gather), one barrier
// per chunk: the sets alternate, so a rank writes a set again only after the
// next chunk's barrier, which every rank reaches only once it has read this one. The copies
// into the slots of chunk k+1 overlap the copies out of chunk k on the other ranks.
// The root does not wait for the others to copy out (they wait for it): it leaves as soon as
// its data is in, as an eager send would, and settles before it next writes a set (so a
// large broadcast's root runs a chunk ahead). Unless the ranks outnumber the CPUs: then
// every rank meets once more at the end. There a root that leaves early goes on with its own
// work on a CPU that a receiver still copying shares, and the scheduler lets it run for
// milliseconds, while yielding does not hand the CPU over. Measured with 3 ranks on 2 CPUs
// and 2 MiB, the root sharing its CPU with a receiver: the root left after 0.15 ms, and
// that receiver had the data after 0.9 ms. Waiting at the end hands the CPU to the
// receivers, and every rank has the data sooner.
void ShmCollectives::broadcast(void* buf, size_t bytes, int root, Clock::time_point deadline) {
  const Call call = callOf(Op::kBroadcast, bytes, DType::kUInt8, ReduceOp::kSum, root);
  auto* data = static_cast<uint8_t*>(buf);
  if (bytes > 0 && bytes <= kInlineBytes) {
    if (rank_ == root) {
      settle(deadline);
      unsettled_ = Unsettled{arrive(call, data, bytes), call};
    } else {
      const uint32_t met = meet(call, deadline);
      std::memcpy(data, payloadOf(root, met), bytes);
    }
    return;
  }
  size_t offset = 0;
  const size_t chunk = std::min(slot_bytes_, kPipelineBytes);
  bool wait_for_all = false;
  do {
    const size_t len = std::min(chunk, bytes - offset);
    uint8_t* set = nextSet(deadline);
    // Read here, every rank has passed every barrier before this chunk's, so all know
    // alike whether they are oversubscribed (see learnPeers()): all meet at the end, or none.
    wait_for_all = oversubscribed_;
    if (rank_ == root) {
      std::memcpy(slot(set, root), data + offset, len);
      unsettled_ = Unsettled{arrive(call), call};
    } else {
      meet(call, deadline);
      std::memcpy(data + offset, slot(set, root), len);
    }
    offset += len;
  } while (offset < bytes);
  if (wait_for_all) meet(call, deadline);
}

void ShmCollectives::allGather(const void* in, void* const* outs, size_t bytes_per_rank, Clock::time_point deadline) {
  const Call call = callOf(Op::kAllGather, bytes_per_rank);
  const auto* mine = static_cast<const uint8_t*>(in);
  auto* own = static_cast<uint8_t*>(outs[rank_]);
  settle(deadline);  // singleCopy() needs the last generation passed
  if (bytes_per_rank > 0 && bytes_per_rank <= kInlineBytes) {
    const uint32_t met = meetWhile(call, deadline, mine, bytes_per_rank, [&] {
      if (own != mine) std::memcpy(own, mine, bytes_per_rank);
    });
    for (int q = 0; q < size_; ++q) {
      if (q != rank_) std::memcpy(outs[q], payloadOf(q, met), bytes_per_rank);
    }
    return;
  }
  if (bytes_per_rank >= single_copy_bytes_ && bytes_per_rank <= kSingleCopyMaxBytes && singleCopy() &&
      allGatherSingleCopy(in, outs, bytes_per_rank, call, deadline)) {
    return;
  }
  size_t offset = 0;
  const size_t chunk = std::min(slot_bytes_, kPipelineBytes);
  do {
    const size_t len = std::min(chunk, bytes_per_rank - offset);
    uint8_t* set = nextSet(deadline);
    std::memcpy(slot(set, rank_), mine + offset, len);
    // Its own block straight from the input, while the others may still be copying in.
    meetWhile(call, deadline, nullptr, 0, [&] {
      if (own != mine) std::memcpy(own + offset, mine + offset, len);
    });
    for (int q = 0; q < size_; ++q) {
      if (q != rank_) std::memcpy(static_cast<uint8_t*>(outs[q]) + offset, slot(set, q), len);
    }
    offset += len;
  } while (offset < bytes_per_rank);
}

// Each rank names where its input is, meets the others, and reads their inputs straight
// into its outputs (one copy a block, where the slots take two); a second barrier keeps
// every input in place until all have read it. Its own block is copied while the others
// arrive. The calls are checked before any rank reads: a peer's buffer is as large as
// the call says.
bool ShmCollectives::allGatherSingleCopy(const void* in, void* const* outs, size_t bytes_per_rank, const Call& call,
                                         Clock::time_point deadline) {
  const uint32_t target = generation_ + 1;
  control_->reached[rank_].source[target % 2].store(reinterpret_cast<uintptr_t>(in), std::memory_order_relaxed);
  arrive(call);
  if (outs[rank_] != in) std::memcpy(outs[rank_], in, bytes_per_rank);
  wait(target, call, deadline);
  checkCalls(target, call);
  int failed = -1, error = 0;
  for (int q = 0; q < size_ && failed < 0; ++q) {
    if (q == rank_) continue;
    const uint64_t from = control_->reached[q].source[target % 2].load(std::memory_order_relaxed);
    if (!readPeer(q, outs[q], from, bytes_per_rank)) failed = q, error = errno;
  }
  const uint32_t second = target + 1;
  control_->reached[rank_].read_failed[second % 2].store(failed >= 0, std::memory_order_relaxed);
  // A read fails when its rank died, maybe only because another rank died first and it
  // gave up: the barrier names the dead the way every other barrier does. A rank can also
  // die after arriving there (once it has read the others' blocks).
  meet(call, deadline);
  if (failed >= 0 && error == ESRCH) {
    throw PeerError(fmt::format("all_gather (shared memory): {} died", peer_name_(failed)));
  }
  bool all_read = true;
  for (int q = 0; q < size_; ++q) {
    all_read = all_read && control_->reached[q].read_failed[second % 2].load(std::memory_order_relaxed) == 0;
  }
  if (all_read) return true;
  // Some rank could not read some input: memory the kernel does not hand to process_vm_readv
  // (CUDA's pinned host memory, device mappings). Every rank saw the same flags after the
  // barrier, and every input is still in place: all take the slots, now and from here on.
  if (failed >= 0) {
    logger("runtime")->info(
        "all_gather (shared memory): reading {}'s block failed ({}); the group copies "
        "through shared memory from now on",
        peer_name_(failed), std::strerror(error));
  }
  single_copy_ = false;
  return false;
}

// Small: every rank copies its whole input into its slot and, after one barrier, sums block
// rank() of every slot in rank order. Larger, per chunk of each block (a slot holds the chunk
// of every block): each rank copies the chunks the others reduce (its own stays in its
// input), meets, and reduces its own chunk, its own data first, then the others in order.
void ShmCollectives::reduceScatter(const void* const* ins, void* out, size_t count_per_rank, DType dtype, ReduceOp op,
                                   Clock::time_point deadline) {
  const size_t esize = dtypeSize(dtype);
  const size_t block = count_per_rank * esize;
  const Call call = callOf(Op::kReduceScatter, block, dtype, op);
  auto* result = static_cast<uint8_t*>(out);
  if (block > 0 && block * size_ <= kInlineBytes) {
    // Every block of the input gathered straight onto the arrival line; block rank() of each
    // rank's, in rank order. This rank's own block from a copy (see allReduce()), taken
    // before the output is written: the output may be one of the inputs.
    settle(deadline);
    unsigned char* line = nextPayload();
    for (int q = 0; q < size_; ++q) std::memcpy(line + q * block, ins[q], block);
    unsigned char own[kInlineBytes];
    const uint32_t met = meetWhile(call, deadline, nullptr, 0, [&] { std::memcpy(own, ins[rank_], block); });
    auto from = [&](int q) { return q == rank_ ? own : payloadOf(q, met) + rank_ * block; };
    std::memcpy(result, from(0), block);
    for (int q = 1; q < size_; ++q) reduceInto(result, from(q), count_per_rank, dtype, op);
  } else if (small(block * size_)) {
    uint8_t* set = nextSet(deadline);
    for (int q = 0; q < size_; ++q) std::memcpy(slot(set, rank_) + q * block, ins[q], block);
    // Its own block from a copy, not its slot (see allReduce()); the output may be that block.
    meetWhile(call, deadline, nullptr, 0, [&] { std::memcpy(own_.get(), ins[rank_], block); });
    // Rank order from rank 0's block, as all_reduce sums: the same bits as an all_reduce.
    auto from = [&](int q) { return q == rank_ ? own_.get() : slot(set, q) + rank_ * block; };
    std::memcpy(result, from(0), block);
    for (int q = 1; q < size_; ++q) reduceInto(result, from(q), count_per_rank, dtype, op);
  } else {
    // Each block's chunk: a slot's share per block, whole elements (on 64-byte boundaries
    // unless the slot is too small for that).
    const size_t piece = std::max<size_t>(esize, slot_bytes_ / size_ / 64 * 64 / esize * esize);
    DDPRUN_CHECK(piece * size_ <= slot_bytes_,
                 fmt::format("shared-memory reduce_scatter: {} ranks' elements of {} bytes "
                             "in a slot of {}",
                             size_, esize, slot_bytes_));
    for (size_t offset = 0; offset < block; offset += piece) {
      const size_t len = std::min(piece, block - offset);
      uint8_t* set = nextSet(deadline);
      for (int q = 0; q < size_; ++q) {
        if (q != rank_) std::memcpy(slot(set, rank_) + q * piece, static_cast<const uint8_t*>(ins[q]) + offset, len);
      }
      meet(call, deadline);
      const auto* own = static_cast<const uint8_t*>(ins[rank_]) + offset;
      if (own != result + offset) std::memcpy(result + offset, own, len);  // in place: already there
      for (int q = 0; q < size_; ++q) {
        if (q != rank_) reduceInto(result + offset, slot(set, q) + rank_ * piece, len / esize, dtype, op);
      }
    }
  }
  if (op == ReduceOp::kAvg) divideBy(out, count_per_rank, dtype, size_);
}

}  // namespace ddprun::runtime
