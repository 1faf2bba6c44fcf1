// The ranks of a group as threads of the test process (gloo's way of testing collectives):
// each rank runs on its own thread over one InMemoryStore, building its own transports on
// loopback (the TCP mesh, shared memory when asked for, the P2P engine: a HostBackend, or
// whatever the test builds itself), so every collective runs on every transport without
// processes, LibTorch or the launcher.
//
// Rank bodies must not use Catch2 assertions (Catch2 is not thread-safe): they throw on a
// wrong result, and the first failure is rethrown, naming its rank, on the test's thread.
// A rank that fails leaves the group (its transports close), so its peers fail quickly
// instead of waiting out their deadlines. runRanks() records the failure before closing the
// rank's backend, so the cause is what gets reported, not a peer's reaction to it; in
// runThreads() a body's own transports close as its exception unwinds, before it is
// recorded. The one time bound is a watchdog: ranks that have not all finished within the
// limit end the test process with a message naming them (a hung thread can be neither
// stopped nor abandoned safely). No assertion is made on speed.
#pragma once

#include <chrono>
#include <functional>
#include <stdexcept>
#include <string>

#include "tests/support/in_memory_store.h"
#include "worker_runtime/backend/host_backend.h"

namespace ddprun::testing {

using namespace std::chrono_literals;

// The first exception a rank's body threw: what() is "rank R: <its message>".
class RankFailure : public std::runtime_error {
 public:
  RankFailure(int rank, const std::string& what);
  int rank() const { return rank_; }

 private:
  int rank_;
};

inline constexpr std::chrono::seconds kRankWatchdog = 60s;
// Deadline of every collective, P2P message and store wait inside a rank: well inside the
// watchdog, so a hang shows up as a PeerError naming the peer rather than as the watchdog.
inline constexpr std::chrono::milliseconds kRankOpTimeout = 20s;

// Runs body(rank, store) for every rank of `world_size` at once, each on its own thread, over
// one fresh InMemoryStore (timeout kRankOpTimeout). Returns when every rank has finished;
// throws RankFailure for the first body (in time) that threw. Calls std::_Exit(1) after
// printing the ranks still running if they have not all finished within `watchdog`.
void runThreads(int world_size, const std::function<void(int rank, rendezvous::Store& store)>& body,
                std::chrono::seconds watchdog = kRankWatchdog);

// The same with a HostBackend per rank (TCP mesh on 127.0.0.1, shared memory unless
// `options` turn it off, P2P engine; op timeout kRankOpTimeout): body(backend) runs once
// every rank's backend is up. A failing rank's backend is destroyed as soon as the failure
// is recorded.
void runRanks(int world_size, const runtime::HostBackendOptions& options,
              const std::function<void(runtime::HostBackend& backend)>& body,
              std::chrono::seconds watchdog = kRankWatchdog);

}  // namespace ddprun::testing
