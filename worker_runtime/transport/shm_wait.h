// Waiting on a word in shared memory, shared by the shared-memory all_reduce and links.
// Peers usually answer within microseconds: spin that long (a futex round trip costs
// more), then yield for a while, then sleep on the futex in slices (so the caller can check
// deadlines and dead peers). PAUSE is avoided: under a hypervisor it can trap and cost far
// more than the wait itself; and a spinner sharing a core with the peer it waits for only
// delays it, hence the short spin.
#pragma once

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

// Sleeps while *word == expected, at most one slice (process-shared futex).
inline void sleepWhile(std::atomic<uint32_t>* word, uint32_t expected) {
  timespec slice{0, static_cast<long>(std::chrono::nanoseconds(kSleepSlice).count())};
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &slice, nullptr, 0);
}

inline void wakeAll(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace ddprun::runtime::shm_wait
