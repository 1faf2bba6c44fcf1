#include "worker_runtime/transport/p2p_engine.h"

#include <future>
#include <memory>
#include <string>

#include <catch2/catch.hpp>

#include "rendezvous/in_memory_store.h"

using namespace ddprun::runtime;
using namespace std::chrono_literals;
using ddprun::rendezvous::InMemoryStore;

namespace {

constexpr auto kGenerous = 30s;

// Two ranks as threads of this process, each with its mesh and engine.
struct Pair {
  InMemoryStore store;
  std::unique_ptr<TcpMesh> mesh0, mesh1;
  std::unique_ptr<P2PEngine> engine0, engine1;
  Pair() {
    auto rank1 = std::async(std::launch::async,
                            [&] { return std::make_unique<TcpMesh>(store, "p2p/", 1, 2, "127.0.0.1", kGenerous); });
    mesh0 = std::make_unique<TcpMesh>(store, "p2p/", 0, 2, "127.0.0.1", kGenerous);
    mesh1 = rank1.get();
    engine0 = std::make_unique<P2PEngine>(*mesh0);
    engine1 = std::make_unique<P2PEngine>(*mesh1);
  }
};

}  // namespace

TEST_CASE("messages between two ranks arrive whole and in order", "[p2p_engine]") {
  Pair pair;
  const std::string small = "hello";
  std::string large(4 << 20, '\0');
  for (size_t i = 0; i < large.size(); ++i) large[i] = static_cast<char>(i * 7);
  std::string got_small(small.size(), '\0');
  std::string got_large(large.size(), '\0');
  const auto deadline = Clock::now() + kGenerous;
  auto recv_small = pair.engine1->recv(0, 7, got_small.data(), got_small.size(), deadline);
  auto recv_large = pair.engine1->recv(0, 8, got_large.data(), got_large.size(), deadline);
  auto send_small = pair.engine0->send(1, 7, small.data(), small.size(), deadline);
  auto send_large = pair.engine0->send(1, 8, large.data(), large.size(), deadline);
  for (const auto& work : {send_small, send_large, recv_small, recv_large}) CHECK_NOTHROW(work->wait());
  CHECK(got_small == small);
  CHECK(got_large == large);
}

TEST_CASE("a message with another tag than the receive expects fails naming both", "[p2p_engine]") {
  Pair pair;
  int value = 1;
  int got = 0;
  const auto deadline = Clock::now() + kGenerous;
  auto recv = pair.engine1->recv(0, 5, &got, sizeof got, deadline);
  pair.engine0->send(1, 6, &value, sizeof value, deadline)->wait();
  CHECK_THROWS_WITH(recv->wait(), Catch::Contains("message mismatch: expected tag 5 with 4 bytes, rank 0 sent tag 6"));
}

TEST_CASE("a receive from a rank that went away fails naming it", "[p2p_engine]") {
  Pair pair;
  const std::string address = pair.mesh1->peerAddress(0);
  pair.engine0.reset();
  pair.mesh0.reset();
  int got = 0;
  auto recv = pair.engine1->recv(0, 1, &got, sizeof got, Clock::now() + kGenerous);
  CHECK_THROWS_WITH(recv->wait(),
                    "point-to-point with rank 0 (" + address + "): connection closed (peer died?)");
}

TEST_CASE("a receive nobody sends to times out at its deadline", "[p2p_engine]") {
  Pair pair;
  int got = 0;
  const auto deadline = Clock::now() + 50ms;
  auto recv = pair.engine1->recv(0, 1, &got, sizeof got, deadline);
  CHECK_THROWS_WITH(recv->wait(), Catch::EndsWith("): timed out"));
  CHECK(Clock::now() >= deadline);
}
