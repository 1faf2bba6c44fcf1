// The P2P engine (a HostBackend's, over the TCP mesh's point-to-point channel), ranks as
// threads: messages between a pair in order with their tags, every pair at once in both
// directions without deadlock, and the errors: a tag or size that differs, a deadline.
#include <future>
#include <memory>
#include <regex>
#include <string>

#include <fmt/format.h>
#include <catch2/catch.hpp>

#include "tests/runtime/support/reference_values.h"
#include "tests/runtime/support/thread_ranks.h"
#include "tests/support/in_memory_store.h"
#include "worker_runtime/transport/p2p_engine.h"

namespace {

using namespace ddprun::runtime;
using namespace ddprun::testing;

HostBackendOptions tcpOnly() {
  HostBackendOptions options;
  options.shared_memory = HostBackendOptions::SharedMemory::kOff;
  return options;
}

Clock::time_point deadline() { return Clock::now() + kRankOpTimeout; }

}  // namespace

TEST_CASE("point-to-point messages between a pair arrive in order with their tags and sizes") {
  // 3 MiB outgrows the socket buffers; 0 is a header alone.
  const std::vector<size_t> sizes = {0, 1, 13, size_t{3} << 20, 7, 0};
  REQUIRE_NOTHROW(runRanks(2, tcpOnly(), [&](HostBackend& b) {
    std::vector<std::vector<uint8_t>> messages;
    std::vector<WorkPtr> works;
    for (size_t i = 0; i < sizes.size(); ++i) {
      const int tag = static_cast<int>(i) * 3 - 4;  // negative tags too
      if (b.rank() == 0) {
        messages.push_back(patternBlock(0, 1, sizes[i], static_cast<int>(i)));
        works.push_back(b.p2p().send(1, tag, messages.back().data(), sizes[i], deadline()));
      } else {
        messages.emplace_back(sizes[i], 0xEE);
        works.push_back(b.p2p().recv(0, tag, messages.back().data(), sizes[i], deadline()));
      }
    }
    for (auto& w : works) w->wait();
    if (b.rank() == 1) {
      for (size_t i = 0; i < sizes.size(); ++i) {
        checkPattern(fmt::format("message {}", i), messages[i].data(), sizes[i], 0, 1, static_cast<int>(i));
      }
    }
  }));
}

TEST_CASE("every pair exchanges large point-to-point messages both ways at once") {
  for (int p : {2, 5}) {
    INFO("world size " << p);
    REQUIRE_NOTHROW(runRanks(p, tcpOnly(), [&](HostBackend& b) {
      const int r = b.rank();
      const size_t bytes = size_t{2} << 20;
      std::vector<std::vector<uint8_t>> out(p), in(p);
      std::vector<WorkPtr> works;
      // Every send is posted before any receive: only an engine that progresses all of them
      // together gets through.
      for (int peer = 0; peer < p; ++peer) {
        if (peer == r) continue;
        out[peer] = patternBlock(r, peer, bytes, 1);
        works.push_back(b.p2p().send(peer, 5, out[peer].data(), bytes, deadline()));
      }
      for (int peer = 0; peer < p; ++peer) {
        if (peer == r) continue;
        in[peer].assign(bytes, 0xEE);
        works.push_back(b.p2p().recv(peer, 5, in[peer].data(), bytes, deadline()));
      }
      for (auto& w : works) w->wait();
      for (int peer = 0; peer < p; ++peer) {
        if (peer != r) checkPattern("point-to-point", in[peer].data(), bytes, peer, r, 1);
      }
    }));
  }
}

TEST_CASE("a point-to-point message runs its success callback before its Work completes") {
  REQUIRE_NOTHROW(runRanks(2, tcpOnly(), [](HostBackend& b) {
    uint8_t byte = 42;
    bool called = false;
    auto work = b.rank() == 0 ? b.p2p().send(1, 0, &byte, 1, deadline(), [&] { called = true; })
                              : b.p2p().recv(0, 0, &byte, 1, deadline(), [&] { called = true; });
    work->wait();
    if (!called || !work->isSuccess() || byte != 42) throw std::runtime_error("callback or result missing");
  }));
}

TEST_CASE("a receive whose tag or size differs fails naming both and so does every later one from that peer") {
  REQUIRE_NOTHROW(runRanks(2, tcpOnly(), [](HostBackend& b) {
    std::vector<uint8_t> data(10);
    if (b.rank() == 0) {
      b.p2p().send(1, 7, data.data(), data.size(), deadline())->wait();
      return;
    }
    const std::string expected =
        "point-to-point with rank 0 \\(127\\.0\\.0\\.1:[0-9]+\\): message mismatch: expected tag 8 with 10 bytes, "
        "rank 0 sent tag 7 with 10 bytes";
    for (int attempt = 0; attempt < 2; ++attempt) {
      auto work = b.p2p().recv(0, 8, data.data(), data.size(), deadline());
      try {
        work->wait();
      } catch (const PeerError& e) {
        if (!std::regex_match(e.what(), std::regex(expected))) {
          throw std::runtime_error(fmt::format("attempt {}: '{}' does not match '{}'", attempt, e.what(), expected));
        }
        continue;
      }
      throw std::runtime_error(fmt::format("attempt {}: a mismatched receive succeeded", attempt));
    }
  }));
}

TEST_CASE("a receive that gets nothing fails at its deadline naming the peer") {
  REQUIRE_NOTHROW(runRanks(2, tcpOnly(), [](HostBackend& b) {
    if (b.rank() == 0) return;
    uint8_t byte = 0;
    auto work = b.p2p().recv(0, 0, &byte, 1, Clock::now() + std::chrono::milliseconds(50));
    try {
      work->wait();
    } catch (const PeerError& e) {
      const std::regex expected("point-to-point with rank 0 \\(127\\.0\\.0\\.1:[0-9]+\\): timed out");
      if (!std::regex_match(e.what(), expected)) {
        throw std::runtime_error(std::string("unexpected error: ") + e.what());
      }
      return;
    }
    throw std::runtime_error("a receive with nothing to receive succeeded");
  }));
}

TEST_CASE("a point-to-point message to this rank or outside the group is refused at once") {
  REQUIRE_NOTHROW(runRanks(2, tcpOnly(), [](HostBackend& b) {
    uint8_t byte = 0;
    for (int peer : {b.rank(), -1, 2}) {
      for (bool send : {true, false}) {
        const std::string why = peer == b.rank() ? "that is this rank" : "not in the group of 2";
        try {
          if (send) {
            b.p2p().send(peer, 0, &byte, 1, deadline());
          } else {
            b.p2p().recv(peer, 0, &byte, 1, deadline());
          }
        } catch (const ddprun::DdprunError& e) {
          const std::string expected =
              fmt::format("point-to-point {} rank {}: {}", send ? "send to" : "receive from", peer, why);
          if (e.what() != expected) throw std::runtime_error(fmt::format("'{}', expected '{}'", e.what(), expected));
          continue;
        }
        throw std::runtime_error(fmt::format("a {} with peer {} was accepted", send ? "send" : "receive", peer));
      }
    }
  }));
}

// ---- setup and failure cases over a pair of ranks ----
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

TEST_CASE("a receive from a rank that went away fails naming it", "[p2p_engine]") {
  Pair pair;
  const std::string address = pair.mesh1->peerAddress(0);
  pair.engine0.reset();
  pair.mesh0.reset();
  int got = 0;
  auto recv = pair.engine1->recv(0, 1, &got, sizeof got, Clock::now() + kGenerous);
  CHECK_THROWS_WITH(recv->wait(), "point-to-point with rank 0 (" + address + "): connection closed (peer died?)");
}
