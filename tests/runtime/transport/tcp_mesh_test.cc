// The TCP mesh with ranks as threads on loopback: full-duplex exchanges with every peer at
// once, progress reports a reduction can follow, and failures that name the operation,
// the peer rank and its address.
#include <catch2/catch.hpp>

#include "tests/runtime/support/links_checks.h"
#include "tests/runtime/support/thread_ranks.h"
#include "worker_runtime/transport/tcp_mesh.h"

namespace {

using namespace ddprun::runtime;
using namespace ddprun::testing;

std::unique_ptr<TcpMesh> meshOf(ddprun::rendezvous::Store& store, int rank, int size) {
  return std::make_unique<TcpMesh>(store, "mesh/", rank, size, "127.0.0.1", kRankOpTimeout);
}

// Every rank has built its mesh (or whatever it waits on) before any goes on.
void storeBarrier(ddprun::rendezvous::Store& store, const std::string& name, int size) {
  if (store.add(name, 1) == size) store.set(name + "/all", "1");
  store.wait({name + "/all"}, kRankOpTimeout);
}

}  // namespace

TEST_CASE("the TCP mesh exchanges with every peer in both directions at once") {
  for (int p : {1, 2, 3, 8}) {
    INFO("world size " << p);
    REQUIRE_NOTHROW(runThreads(p, [&](int rank, ddprun::rendezvous::Store& store) {
      auto mesh = meshOf(store, rank, p);
      int salt = 0;
      // 3 MiB per pair outgrows the socket buffers: sends go out in parts, interleaved.
      for (size_t bytes : {size_t{0}, size_t{1}, size_t{4099}, size_t{3} << 20}) {
        exchangeWithEveryPeer(*mesh, bytes, ++salt);
      }
      storeBarrier(store, "done", p);
    }));
  }
}

TEST_CASE("the TCP mesh reports progress only for bytes that have landed") {
  REQUIRE_NOTHROW(runThreads(2, [](int rank, ddprun::rendezvous::Store& store) {
    auto mesh = meshOf(store, rank, 2);
    checkProgressReports(*mesh, 3 << 20, 100000, 1);
    checkProgressReports(*mesh, 4099, 7, 2);
    checkProgressReports(*mesh, 4099, 0, 3);  // 0: a report after every receive
    storeBarrier(store, "done", 2);
  }));
}

TEST_CASE("a TCP exchange with a peer that left fails naming the operation and the peer") {
  REQUIRE_THROWS_WITH(runThreads(2,
                                 [](int rank, ddprun::rendezvous::Store& store) {
                                   auto mesh = meshOf(store, rank, 2);
                                   storeBarrier(store, "built", 2);
                                   if (rank == 1) {
                                     mesh.reset();
                                     store.set("left", "1");
                                     return;
                                   }
                                   store.wait({"left"}, kRankOpTimeout);
                                   uint8_t byte = 0;
                                   Transfer t{1, false, &byte, 1, {}, 0, 0};
                                   mesh->exchange({&t, 1}, Clock::now() + kRankOpTimeout, "test op");
                                 }),
                      Catch::Matches("rank 0: test op: receiving from rank 1 \\(127\\.0\\.0\\.1:[0-9]+\\) closed the "
                                     "connection \\(peer died\\?\\)"));
}

TEST_CASE("a TCP exchange that gets nothing fails at its deadline naming the peer") {
  REQUIRE_THROWS_WITH(runThreads(2,
                                 [](int rank, ddprun::rendezvous::Store& store) {
                                   auto mesh = meshOf(store, rank, 2);
                                   if (rank == 0) {
                                     uint8_t byte = 0;
                                     Transfer t{1, false, &byte, 1, {}, 0, 0};
                                     try {
                                       mesh->exchange({&t, 1}, Clock::now() + std::chrono::milliseconds(50),
                                                      "test op");
                                     } catch (...) {
                                       store.set("failed", "1");  // rank 1 keeps its end open until then
                                       throw;
                                     }
                                   } else {
                                     store.wait({"failed"}, kRankOpTimeout);
                                   }
                                 }),
                      Catch::Matches("rank 0: test op: receiving from rank 1 \\(127\\.0\\.0\\.1:[0-9]+\\) timed out "
                                     "\\(peer hung or dead\\?\\)"));
}
