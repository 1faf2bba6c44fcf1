// The TCP mesh with ranks as threads on loopback: full-duplex exchanges with every peer at
// once, progress reports a reduction can follow, and failures that name the operation,
// the peer rank and its address.
#include <future>
#include <memory>
#include <string>
#include <utility>

#include <catch2/catch.hpp>

#include "common/socket_io.h"
#include "tests/runtime/support/links_checks.h"
#include "tests/runtime/support/thread_ranks.h"
#include "tests/support/in_memory_store.h"
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
                                       mesh->exchange({&t, 1}, Clock::now() + std::chrono::milliseconds(50), "test op");
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

// ---- setup and failure cases over a pair of ranks ----
using ddprun::connectTcp;
using ddprun::UniqueFd;
using namespace ddprun::runtime;
using namespace std::chrono_literals;
using ddprun::rendezvous::InMemoryStore;

namespace {

// Bounds every wait that should end at once: a broken mesh fails the test, never hangs it.
constexpr auto kGenerous = 30s;

}  // namespace

TEST_CASE("a connection that never says hello fails the mesh at its deadline instead of hanging it", "[tcp_mesh]") {
  // The hello was read with a blocking recv(): a stray connection that sent nothing held
  // the accepting rank past every deadline.
  InMemoryStore store;
  auto rank0 = std::async(std::launch::async, [&] { TcpMesh(store, "mesh/", 0, 2, "127.0.0.1", 1s); });
  const std::string address = store.get("mesh/addr/0");
  const auto colon = address.rfind(':');
  UniqueFd silent = connectTcp(address.substr(0, colon), address.substr(colon + 1), Clock::now() + kGenerous);
  // A rank stuck for good is let go (end of stream) so the test ends; the check below fails then.
  if (rank0.wait_for(kGenerous) != std::future_status::ready) silent.reset();
  CHECK_THROWS_WITH(rank0.get(), "handshake with a connecting peer: timed out");
}

TEST_CASE("a rank whose peers never come fails at its deadline naming them", "[tcp_mesh]") {
  InMemoryStore store;
  CHECK_THROWS_WITH(TcpMesh(store, "mesh/", 0, 3, "127.0.0.1", 50ms), "rank 0: ranks 1 2 did not connect within 50 ms");
}
