#include "worker_runtime/transport/tcp_mesh.h"

#include <future>
#include <memory>
#include <string>
#include <utility>

#include <catch2/catch.hpp>

#include "common/socket_io.h"
#include "rendezvous/in_memory_store.h"

using namespace ddprun;
using namespace ddprun::runtime;
using namespace std::chrono_literals;
using rendezvous::InMemoryStore;

namespace {

// Bounds every wait that should end at once: a broken mesh fails the test, never hangs it.
constexpr auto kGenerous = 30s;

struct MeshPair {
  std::unique_ptr<TcpMesh> rank0;
  std::unique_ptr<TcpMesh> rank1;
};

// Two ranks as threads of this process, connected through one in-memory store.
MeshPair connectPair(InMemoryStore& store) {
  auto rank1 = std::async(std::launch::async,
                          [&] { return std::make_unique<TcpMesh>(store, "mesh/", 1, 2, "127.0.0.1", kGenerous); });
  auto rank0 = std::make_unique<TcpMesh>(store, "mesh/", 0, 2, "127.0.0.1", kGenerous);
  return {std::move(rank0), rank1.get()};
}

std::string pattern(size_t size, int seed) {
  std::string bytes(size, '\0');
  for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<char>(i * 31 + seed);
  return bytes;
}

// Sends `out` to `peer` and receives as many bytes from it, both at once.
std::string swapWith(TcpMesh& mesh, int peer, std::string out, size_t* last_progress = nullptr) {
  std::string in(out.size(), '\0');
  Transfer transfers[2];
  transfers[0].peer = peer;
  transfers[0].send = true;
  transfers[0].data = out.data();
  transfers[0].bytes = out.size();
  transfers[1].peer = peer;
  transfers[1].data = in.data();
  transfers[1].bytes = in.size();
  transfers[1].progress_step = 64 << 10;
  transfers[1].on_progress = [last_progress](size_t received) {
    if (last_progress) *last_progress = received;
  };
  mesh.exchange(transfers, Clock::now() + kGenerous, "swap");
  return in;
}

Transfer receiveFrom(int peer, std::string& into) {
  Transfer t;
  t.peer = peer;
  t.data = into.data();
  t.bytes = into.size();
  return t;
}

}  // namespace

TEST_CASE("two ranks connect through the store and exchange in both directions at once", "[tcp_mesh]") {
  InMemoryStore store;
  MeshPair mesh = connectPair(store);
  CHECK(mesh.rank0->peerAddress(1) == store.get("mesh/addr/1"));
  CHECK(mesh.rank1->peerAddress(0) == store.get("mesh/addr/0"));
  // More than the socket buffers hold: neither side finishes sending before it receives.
  const std::string from0 = pattern(8 << 20, 1);
  const std::string from1 = pattern(8 << 20, 2);
  size_t progress1 = 0;
  auto at1 = std::async(std::launch::async, [&] { return swapWith(*mesh.rank1, 0, from1, &progress1); });
  CHECK(swapWith(*mesh.rank0, 1, from0) == from1);
  CHECK(at1.get() == from0);
  CHECK(progress1 == from0.size());
}

TEST_CASE("an exchange with a peer that closed its sockets fails naming the peer", "[tcp_mesh]") {
  InMemoryStore store;
  MeshPair mesh = connectPair(store);
  const std::string address = mesh.rank0->peerAddress(1);
  mesh.rank1.reset();
  std::string buffer(16, '\0');
  Transfer t = receiveFrom(1, buffer);
  CHECK_THROWS_WITH(mesh.rank0->exchange({&t, 1}, Clock::now() + kGenerous, "all_reduce"),
                    "all_reduce: receiving from rank 1 (" + address + ") closed the connection (peer died?)");
}

TEST_CASE("an exchange with a silent peer times out at its deadline", "[tcp_mesh]") {
  InMemoryStore store;
  MeshPair mesh = connectPair(store);
  std::string buffer(16, '\0');
  Transfer t = receiveFrom(1, buffer);
  const auto deadline = Clock::now() + 50ms;
  CHECK_THROWS_WITH(mesh.rank0->exchange({&t, 1}, deadline, "broadcast"),
                    Catch::EndsWith(") timed out (peer hung or dead?)"));
  CHECK(Clock::now() >= deadline);
}

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
  CHECK_THROWS_WITH(TcpMesh(store, "mesh/", 0, 3, "127.0.0.1", 50ms),
                    "rank 0: ranks 1 2 did not connect within 50 ms");
}
