// The shared-memory links with ranks as threads: the same exchanges as the TCP mesh passes,
// through rings small enough that every transfer wraps around them many times, and the
// failures: a peer known dead (here, a fake answer of peer_gone) and a deadline.
#include <atomic>

#include <catch2/catch.hpp>

#include "tests/runtime/support/links_checks.h"
#include "tests/runtime/support/thread_ranks.h"
#include "worker_runtime/transport/shm_links.h"

namespace {

using namespace ddprun::runtime;
using namespace ddprun::testing;

std::unique_ptr<ShmLinks> linksOf(
    ddprun::rendezvous::Store& store, int rank, int size, size_t ring_bytes,
    std::function<bool(int)> peer_gone = [](int) { return false; }) {
  return std::make_unique<ShmLinks>(
      store, "shm/", rank, size, kRankOpTimeout, std::move(peer_gone),
      [](int q) { return "rank " + std::to_string(q); }, ring_bytes);
}

void storeBarrier(ddprun::rendezvous::Store& store, const std::string& name, int size) {
  if (store.add(name, 1) == size) store.set(name + "/all", "1");
  store.wait({name + "/all"}, kRankOpTimeout);
}

}  // namespace

TEST_CASE("shared-memory links exchange with every peer in both directions at once") {
  // 61 bytes: not a multiple of any element size, so copies split anywhere on wrapping;
  // 4096: wraps only for the larger transfers; the default.
  for (size_t ring : {size_t{61}, size_t{4096}, ShmLinks::kDefaultRingBytes}) {
    for (int p : {1, 2, 3, 8}) {
      INFO("ring of " << ring << " bytes, world size " << p);
      REQUIRE_NOTHROW(runThreads(p, [&](int rank, ddprun::rendezvous::Store& store) {
        auto links = linksOf(store, rank, p, ring);
        int salt = 0;
        for (size_t bytes : {size_t{0}, size_t{1}, size_t{4099}, size_t{1} << 20}) {
          if (ring < 4096 && bytes > 4099) continue;  // a megabyte through 61-byte rings is just slow
          exchangeWithEveryPeer(*links, bytes, ++salt);
        }
        storeBarrier(store, "done", p);
      }));
    }
  }
}

TEST_CASE("shared-memory links report progress only for bytes that have landed") {
  REQUIRE_NOTHROW(runThreads(2, [](int rank, ddprun::rendezvous::Store& store) {
    auto links = linksOf(store, rank, 2, 4096);
    checkProgressReports(*links, 1 << 20, 100000, 1);
    checkProgressReports(*links, 4099, 7, 2);
    checkProgressReports(*links, 4099, 0, 3);
    storeBarrier(store, "done", 2);
  }));
}

TEST_CASE("a shared-memory exchange with a peer known dead fails naming the operation and the peer") {
  std::atomic<bool> rank1_gone{false};
  REQUIRE_THROWS_WITH(runThreads(2,
                                 [&](int rank, ddprun::rendezvous::Store& store) {
                                   auto gone = [&](int q) { return q == 1 && rank1_gone; };
                                   auto links = linksOf(store, rank, 2, 61, gone);
                                   storeBarrier(store, "built", 2);
                                   if (rank == 1) {
                                     rank1_gone = true;
                                     return;
                                   }
                                   // More than a ring holds: rank 0 has to wait for rank 1.
                                   std::vector<uint8_t> data(1000);
                                   Transfer t{1, true, data.data(), data.size(), {}, 0, 0};
                                   links->exchange({&t, 1}, Clock::now() + kRankOpTimeout, "test op");
                                 }),
                      "rank 0: test op: sending to rank 1 died (shared memory)");
}

TEST_CASE("a shared-memory exchange that gets nothing fails at its deadline naming the peer") {
  REQUIRE_THROWS_WITH(runThreads(2,
                                 [](int rank, ddprun::rendezvous::Store& store) {
                                   auto links = linksOf(store, rank, 2, 61);
                                   if (rank == 1) return;
                                   uint8_t byte = 0;
                                   Transfer t{1, false, &byte, 1, {}, 0, 0};
                                   links->exchange({&t, 1}, Clock::now() + std::chrono::milliseconds(50), "test op");
                                 }),
                      "rank 0: test op: receiving from rank 1 timed out (shared memory; peer hung or dead?)");
}
