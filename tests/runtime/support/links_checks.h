// Checks that every Links implementation must pass, run by each rank of a thread-rank group
// (thread_ranks.h) on its own Links: the TCP mesh and the shared-memory rings get the same
// tests. Each throws std::runtime_error (or the transport's PeerError) on failure.
#pragma once

#include <cstddef>

#include "worker_runtime/transport/links.h"

namespace ddprun::testing {

// Sends a distinct block of `bytes` to every peer and receives one from each, all in one
// exchange (both directions of every pair at once), then checks every received byte.
void exchangeWithEveryPeer(runtime::Links& links, size_t bytes, int salt);

// In a group of two: rank 0 sends `bytes`, rank 1 receives them with progress reports every
// `step` bytes and checks that the reports increase, cross a multiple of `step` each (or end
// the transfer), end at `bytes`, and never count a byte that has not landed yet.
void checkProgressReports(runtime::Links& links, size_t bytes, size_t step, int salt);

}  // namespace ddprun::testing
