// Waiting on a word in shared memory, shared by the shared-memory all_reduce and links.
// Peers usually answer within microseconds: spin that long (a futex round trip costs
// more), then yield for a while, then sleep on the futex in slices (so the caller can check
// deadlines and dead peers). PAUSE is avoided: under a hypervisor it can trap and cost far
// more than the wait itself; and a spinner sharing a core with the peer it waits for only
// delays it, hence the short spin. Better still, a rank that finds the peer it waits for
// last seen on its own CPU does not spin at all: that peer cannot be running, so the
// waiter yields to it at once (ranks are not pinned, and under load the scheduler often
// puts both on one core, where every spin would be pure delay).
#pragma once

#include <sched.h>

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <ctime>

namespace ddprun::runtime::shm_wait {

inline constexpr auto kSpinFor = std::chrono::microseconds(5);
inline constexpr auto kYieldFor = std::chrono::milliseconds(2);
inline constexpr auto kSleepSlice = std::chrono::milliseconds(50);

// The CPU this thread runs on now (a vDSO call, tens of nanoseconds); -1 when unknown,
// which never matches a peer's.
inline int32_t currentCpu() { return ::sched_getcpu(); }

// Sleeps while *word == expected, at most one slice (process-shared futex).
inline void sleepWhile(std::atomic<uint32_t>* word, uint32_t expected) {
  timespec slice{0, static_cast<long>(std::chrono::nanoseconds(kSleepSlice).count())};
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &slice, nullptr, 0);
}

inline void wakeAll(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// The same, counting the sleeper in `sleepers` so that a waker can skip the FUTEX_WAKE system
// call (several microseconds under a hypervisor, on every small collective's critical path)
// when nobody sleeps. Pairs with wakeSleepers(); the seq_cst order of the counter and the
// word is what makes a lost wake-up impossible: either the waker sees the count, or the
// sleeper sees the new word.
inline void sleepWhile(std::atomic<uint32_t>* word, uint32_t expected, std::atomic<uint32_t>* sleepers) {
  sleepers->fetch_add(1, std::memory_order_seq_cst);
  if (word->load(std::memory_order_seq_cst) == expected) sleepWhile(word, expected);
  sleepers->fetch_sub(1, std::memory_order_seq_cst);
}

// Wakes the sleepers of `word` if there are any; the caller has just changed it with a
// seq_cst store or read-modify-write.
inline void wakeSleepers(std::atomic<uint32_t>* word, std::atomic<uint32_t>* sleepers) {
  if (sleepers->load(std::memory_order_seq_cst) != 0) wakeAll(word);
}

// For a wait on a condition of several words (done()): sleeps on `bell` (one slice) unless
// done() holds once the sleeper is counted. Pairs with ring(): a rank that may complete the
// condition stores its part with seq_cst and then rings; either the ringer sees the count
// (and changes the bell, so the futex call returns at once or is woken), or the sleeper's
// done() sees the ringer's store.
template <typename Done>
void sleepUnless(std::atomic<uint32_t>* bell, std::atomic<uint32_t>* sleepers, Done done) {
  sleepers->fetch_add(1, std::memory_order_seq_cst);
  const uint32_t seen = bell->load(std::memory_order_seq_cst);
  if (!done()) sleepWhile(bell, seen);
  sleepers->fetch_sub(1, std::memory_order_seq_cst);
}

inline void ring(std::atomic<uint32_t>* bell, std::atomic<uint32_t>* sleepers) {
  if (sleepers->load(std::memory_order_seq_cst) == 0) return;
  bell->fetch_add(1, std::memory_order_seq_cst);
  wakeAll(bell);
}

}  // namespace ddprun::runtime::shm_wait
