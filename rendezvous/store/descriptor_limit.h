// The descriptor limit of a process that serves a store: every client connection holds one
// descriptor, so a store for N clients needs RLIMIT_NOFILE above N. The soft limit is often
// 1024 while the hard one is far higher; a process may raise its soft limit up to the hard one
// without privileges, so the server does that when it starts. Raising the hard limit needs
// privileges (CAP_SYS_RESOURCE): when it is too low, the server says what to raise.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ddprun::rendezvous {

// Descriptors a store process keeps for itself beyond its clients (listener, epoll, eventfd,
// logs, the agent's own files and pipes).
inline constexpr uint64_t kReservedDescriptors = 64;

struct DescriptorLimit {
  uint64_t soft = 0;
  uint64_t hard = 0;  // RLIM_INFINITY as it is: larger than any count
};

struct DescriptorPlan {
  uint64_t new_soft = 0;  // what to set the soft limit to (equal to the old one: nothing to do)
  std::string warning;    // empty, or one line saying the hard limit cannot serve `clients`
};

// Pure: the soft limit goes up to the hard one; with `clients` > 0 (clients expected at once),
// a hard limit below clients + kReservedDescriptors gives a warning naming what to raise.
DescriptorPlan planDescriptorLimit(DescriptorLimit current, uint64_t clients);

// The warning for an accept() that failed for want of descriptors, with the limit as it is.
std::string outOfDescriptorsAdvice(DescriptorLimit current);

// Reads RLIMIT_NOFILE, raises the soft limit to the hard one, and returns the limit now in
// force and the plan's warning (empty when none). Process-wide: other threads' descriptors
// count against the same limit. Never throws; a failed setrlimit leaves the limit as it was.
// Thread-safe (the kernel serialises rlimit updates).
DescriptorPlan raiseDescriptorLimit(uint64_t clients, DescriptorLimit* now = nullptr);

// The soft limit this process had before raiseDescriptorLimit() first raised it; 0 when it
// never did. The agent gives it back to the workers it starts (agent/process/process_spawner.cc): a
// worker inherits the limits of the user who ran ddprun, not the store's, as under torchrun
// (a program that closes every descriptor up to its limit before exec, say, would loop over a
// million of them where the hard limit is that high). Thread-safe.
uint64_t descriptorSoftLimitBeforeRaise();

}  // namespace ddprun::rendezvous
