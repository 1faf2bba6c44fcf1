// The host backend with ranks as threads: its choice of transport, collectives queued
// together running in issue order, and a failed collective (a peer that left, an error in
// the collective itself) failing every later one with the same error.
#include <functional>
#include <regex>
#include <thread>

#include <fmt/format.h>
#include <catch2/catch.hpp>

#include "tests/runtime/support/reference_values.h"
#include "tests/runtime/support/thread_ranks.h"
#include "tests/runtime/support/transport_setups.h"
#include "worker_runtime/backend/host_collectives.h"

namespace {

using namespace ddprun::runtime;
using namespace ddprun::testing;

void storeBarrier(ddprun::rendezvous::Store& store, const std::string& name, int size) {
  if (store.add(name, 1) == size) store.set(name + "/all", "1");
  store.wait({name + "/all"}, kRankOpTimeout);
}

// Throws unless `work` fails with a message matching `pattern`; returns the message.
std::string failureOf(const WorkPtr& work, const std::string& pattern) {
  try {
    work->wait();
  } catch (const PeerError& e) {
    if (!std::regex_match(e.what(), std::regex(pattern))) {
      throw std::runtime_error(fmt::format("error '{}' does not match '{}'", e.what(), pattern));
    }
    if (work->isSuccess()) throw std::runtime_error("a failed Work says it succeeded");
    return e.what();
  }
  throw std::runtime_error("a collective expected to fail succeeded");
}

// Two ranks build the group over `setup`'s transport; rank 1 then leaves (destroys its
// backend), and rank 0 runs `survivor` with its backend and the error its collectives must
// fail with: the TCP mesh sees the closed connection; shared memory sees the rank missing at
// a barrier or ring, and its TCP connection closed.
void afterRankOneLeft(const TransportSetup& setup,
                      const std::function<void(HostBackend&, const std::string& pattern)>& survivor) {
  const std::string pattern = setup.shared_memory
                                  ? "all_reduce \\(shared memory\\): rank 1 \\(127\\.0\\.0\\.1:[0-9]+\\) died"
                                  : "all_reduce: (sending to|receiving from) rank 1 \\(127\\.0\\.0\\.1:[0-9]+\\) "
                                    "closed the connection \\(peer died\\?\\)";
  runThreads(2, [&](int rank, ddprun::rendezvous::Store& store) {
    auto b = std::make_unique<HostBackend>(store, "pg/", rank, 2, "127.0.0.1", kRankOpTimeout, setup.options);
    checkTransport(*b, setup);
    storeBarrier(store, "built", 2);
    if (rank == 1) {
      b.reset();
      store.set("left", "1");
      return;
    }
    store.wait({"left"}, kRankOpTimeout);
    survivor(*b, pattern);
  });
}

}  // namespace

TEST_CASE("a host backend uses shared memory for a local group unless told not to") {
  using SharedMemory = HostBackendOptions::SharedMemory;
  for (auto [mode, expected] : {std::pair{SharedMemory::kAuto, true}, std::pair{SharedMemory::kOff, false}}) {
    for (int p : {1, 3}) {
      HostBackendOptions options;
      options.shared_memory = mode;
      INFO("world size " << p << ", shared memory " << (expected ? "on" : "off"));
      REQUIRE_NOTHROW(runRanks(p, options, [&, expected = expected](HostBackend& b) {
        if (b.usesSharedMemory() != (expected && p > 1)) throw std::runtime_error("wrong transport");
      }));
    }
  }
}

TEST_CASE("collectives queued together run in the order they were issued") {
  for (const auto& setup : transportSetups()) {
    INFO(setup.name);
    REQUIRE_NOTHROW(runRanks(4, setup.options, [&](HostBackend& b) {
      checkTransport(b, setup);
      // Sizes and operators differ from one to the next: run out of order, the ranks would
      // pair up different collectives and fail, or produce other numbers.
      const std::vector<size_t> counts = {67, 1, 0, 300, 5, 67, 2, 129};
      std::vector<std::vector<uint8_t>> bufs;
      bufs.reserve(counts.size());  // the queued collectives hold references into it
      std::vector<WorkPtr> works;
      for (size_t i = 0; i < counts.size(); ++i) {
        const ReduceOp op = kAllReduceOps[i % kAllReduceOps.size()];
        bufs.push_back(inputBuffer(op, DType::kInt32, b.rank(), counts[i], static_cast<int>(i)));
        works.push_back(b.enqueue([&buf = bufs.back(), count = counts[i], op](CollectiveContext& ctx) {
          allReduce(ctx, buf.data(), count, DType::kInt32, op);
        }));
      }
      for (size_t i = 0; i < counts.size(); ++i) {
        works[i]->wait();
        checkReduced(fmt::format("all_reduce {} of the queue", i), bufs[i].data(), counts[i],
                     kAllReduceOps[i % kAllReduceOps.size()], DType::kInt32, b.size(), static_cast<int>(i));
      }
    }));
  }
}

TEST_CASE("a rank that left fails its peers' next collective naming it and every later one alike") {
  for (const auto& setup : transportSetups()) {
    INFO(setup.name);
    REQUIRE_NOTHROW(afterRankOneLeft(setup, [](HostBackend& b, const std::string& pattern) {
      std::vector<float> buf(67, 1.0f);
      const std::string first = failureOf(b.enqueue([&](CollectiveContext& ctx) {
        allReduce(ctx, buf.data(), buf.size(), DType::kFloat32, ReduceOp::kSum);
      }),
                                          pattern);
      // The streams are at unknown positions now: later collectives must not run at all.
      const std::string second = failureOf(b.enqueue([](CollectiveContext& ctx) { barrier(ctx); }), pattern);
      if (second != first) throw std::runtime_error(fmt::format("'{}' after '{}'", second, first));
    }));
  }
}

TEST_CASE("a collective that throws fails every later collective of the group with its error") {
  HostBackendOptions options;
  options.shared_memory = HostBackendOptions::SharedMemory::kOff;
  REQUIRE_NOTHROW(runRanks(2, options, [](HostBackend& b) {
    failureOf(b.enqueue([](CollectiveContext&) { throw PeerError("injected failure"); }), "injected failure");
    bool ran = false;
    failureOf(b.enqueue([&](CollectiveContext&) { ran = true; }), "injected failure");
    if (ran) throw std::runtime_error("a collective ran after the group broke");
  }));
}

// ---- run(): synchronous collectives, inline on the caller's thread when the group is idle ----

namespace {

// One all_reduce of a mixed sequence: its input, its place in the issue order, and the
// order in which the rank's collectives actually ran (appended by each as it runs; they
// never overlap, so no lock).
struct Issued {
  std::vector<uint8_t> buf;
  size_t count;
  ReduceOp op;
};

std::function<void(CollectiveContext&)> loggedAllReduce(Issued& issued, std::vector<int>& ran, int index) {
  return [&issued, &ran, index](CollectiveContext& ctx) {
    ran.push_back(index);
    allReduce(ctx, issued.buf.data(), issued.count, DType::kInt32, issued.op);
  };
}

void checkRanInOrder(const std::vector<int>& ran, int expected) {
  for (int i = 0; i < expected; ++i) {
    if (i >= static_cast<int>(ran.size()) || ran[i] != i) {
      throw std::runtime_error(fmt::format("collective {} ran in place {} of {}",
                                           i < static_cast<int>(ran.size()) ? ran[i] : -1, i, ran.size()));
    }
  }
  if (static_cast<int>(ran.size()) != expected) throw std::runtime_error("a collective ran twice");
}

}  // namespace

TEST_CASE("a synchronous collective runs after the asynchronous ones queued before it") {
  for (const auto& setup : transportSetups()) {
    INFO(setup.name);
    REQUIRE_NOTHROW(runRanks(3, setup.options, [&](HostBackend& b) {
      checkTransport(b, setup);
      // A long first collective keeps the collective thread busy while run() is called, so
      // the synchronous one must queue behind the asynchronous ones instead of going first.
      const std::vector<size_t> counts = {20000, 3, 1, 300, 17};
      std::vector<Issued> issued;
      issued.reserve(counts.size());
      std::vector<int> ran;
      std::vector<WorkPtr> works;
      for (size_t i = 0; i < counts.size(); ++i) {
        const ReduceOp op = kAllReduceOps[i % kAllReduceOps.size()];
        issued.push_back({inputBuffer(op, DType::kInt32, b.rank(), counts[i], static_cast<int>(i)), counts[i], op});
        auto collective = loggedAllReduce(issued.back(), ran, static_cast<int>(i));
        // The last is synchronous: when it returns, every earlier one must have run.
        if (i + 1 < counts.size()) {
          works.push_back(b.enqueue(collective));
        } else {
          auto work = b.run(collective);
          if (!work->isCompleted()) throw std::runtime_error("run() returned before its collective completed");
          checkRanInOrder(ran, static_cast<int>(counts.size()));
          works.push_back(work);
        }
      }
      for (size_t i = 0; i < counts.size(); ++i) {
        works[i]->wait();
        checkReduced(fmt::format("all_reduce {}", i), issued[i].buf.data(), counts[i], issued[i].op, DType::kInt32,
                     b.size(), static_cast<int>(i));
      }
    }));
  }
}

TEST_CASE("synchronous and asynchronous collectives mixed run in the order they were issued") {
  for (const auto& setup : transportSetups()) {
    INFO(setup.name);
    REQUIRE_NOTHROW(runRanks(3, setup.options, [&](HostBackend& b) {
      checkTransport(b, setup);
      constexpr int kCollectives = 40;
      std::vector<Issued> issued;
      issued.reserve(kCollectives);
      std::vector<int> ran;
      std::vector<WorkPtr> works;
      bool inline_seen = false;
      const auto caller = std::this_thread::get_id();
      for (int i = 0; i < kCollectives; ++i) {
        // The same pattern on every rank: runs of asynchronous calls of varying length, then
        // synchronous ones, so run() finds the queue busy as well as idle.
        const bool sync = (i * 7) % 5 < 2;
        const size_t count = static_cast<size_t>((i * 37) % 90);
        const ReduceOp op = kAllReduceOps[i % kAllReduceOps.size()];
        issued.push_back({inputBuffer(op, DType::kInt32, b.rank(), count, i), count, op});
        auto collective = loggedAllReduce(issued.back(), ran, i);
        if (!sync) {
          works.push_back(b.enqueue(collective));
          continue;
        }
        bool on_caller = false;
        works.push_back(b.run([&, collective](CollectiveContext& ctx) {
          on_caller = std::this_thread::get_id() == caller;
          collective(ctx);
        }));
        inline_seen = inline_seen || on_caller;
        checkRanInOrder(ran, i + 1);
      }
      for (int i = 0; i < kCollectives; ++i) {
        works[i]->wait();
        checkReduced(fmt::format("all_reduce {}", i), issued[i].buf.data(), issued[i].count, issued[i].op,
                     DType::kInt32, b.size(), i);
      }
      // The first call finds the group idle (nothing was queued before it on this rank).
      if (!inline_seen) throw std::runtime_error("no synchronous collective ran on the caller's thread");
    }));
  }
}

TEST_CASE("a rank that left fails its peers' next synchronous collective naming it and every later one alike") {
  for (const auto& setup : transportSetups()) {
    INFO(setup.name);
    REQUIRE_NOTHROW(afterRankOneLeft(setup, [](HostBackend& b, const std::string& pattern) {
      // A small message: the inline path of run() on an idle group.
      std::vector<float> buf(16, 1.0f);
      const std::string first = failureOf(b.run([&](CollectiveContext& ctx) {
        allReduce(ctx, buf.data(), buf.size(), DType::kFloat32, ReduceOp::kSum);
      }),
                                          pattern);
      // Later collectives, synchronous or queued, must not run at all.
      bool ran = false;
      const std::string second = failureOf(b.run([&](CollectiveContext&) { ran = true; }), pattern);
      const std::string third = failureOf(b.enqueue([&](CollectiveContext&) { ran = true; }), pattern);
      if (ran) throw std::runtime_error("a collective ran after the group broke");
      if (second != first || third != first) {
        throw std::runtime_error(fmt::format("'{}' and '{}' after '{}'", second, third, first));
      }
    }));
  }
}
