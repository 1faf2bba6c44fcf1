// The shared-memory all_reduce on its own, ranks as threads: the default slot size over
// several chunks, calls of changing sizes back to back (the two slot sets alternate across
// calls), and the ranks it names when one is dead or does not come.
#include <atomic>

#include <catch2/catch.hpp>

#include "tests/runtime/support/reference_values.h"
#include "tests/runtime/support/thread_ranks.h"
#include "worker_runtime/collectives/shm_all_reduce.h"

namespace {

using namespace ddprun::runtime;
using namespace ddprun::testing;

std::unique_ptr<ShmAllReduce> shmOf(
    ddprun::rendezvous::Store& store, int rank, int size, size_t slot_bytes,
    std::function<bool(int)> peer_gone = [](int) { return false; }) {
  return std::make_unique<ShmAllReduce>(
      store, "shm/", rank, size, kRankOpTimeout, std::move(peer_gone),
      [](int q) { return "rank " + std::to_string(q); }, slot_bytes);
}

}  // namespace

TEST_CASE("the shared-memory all_reduce spans chunks of the default slot size") {
  REQUIRE_NOTHROW(runThreads(3, [](int rank, ddprun::rendezvous::Store& store) {
    auto shm = shmOf(store, rank, 3, ShmAllReduce::kDefaultSlotBytes);
    // Two full chunks and an odd part of a third, in each element size.
    int salt = 0;
    for (DType dtype : {DType::kFloat64, DType::kFloat16, DType::kUInt8}) {
      const size_t count = 2 * ShmAllReduce::kDefaultSlotBytes / elementBytes(dtype) + 12345;
      auto buf = inputBuffer(ReduceOp::kSum, dtype, rank, count, ++salt);
      shm->run(buf.data(), count, dtype, ReduceOp::kSum, Clock::now() + kRankOpTimeout);
      checkReduced("shared-memory all_reduce", buf.data(), count, ReduceOp::kSum, dtype, 3, salt);
    }
  }));
}

TEST_CASE("shared-memory all_reduce calls of changing sizes follow each other without waiting") {
  for (int p : {2, 5}) {
    INFO("world size " << p);
    REQUIRE_NOTHROW(runThreads(p, [&](int rank, ddprun::rendezvous::Store& store) {
      auto shm = shmOf(store, rank, p, 64);
      int salt = 0;
      // Odd and even chunk counts in turn, so a fast rank's next call starts on either set.
      for (int round = 0; round < 3; ++round) {
        for (size_t count : {size_t{67}, size_t{1}, size_t{0}, size_t{16}, size_t{33}, size_t{200}, size_t{3}}) {
          auto buf = inputBuffer(ReduceOp::kMax, DType::kFloat32, rank, count, ++salt);
          shm->run(buf.data(), count, DType::kFloat32, ReduceOp::kMax, Clock::now() + kRankOpTimeout);
          checkReduced("shared-memory all_reduce", buf.data(), count, ReduceOp::kMax, DType::kFloat32, p, salt);
        }
      }
    }));
  }
}

TEST_CASE("the shared-memory all_reduce names a rank known dead") {
  std::atomic<bool> rank1_gone{false};
  REQUIRE_THROWS_WITH(runThreads(2,
                                 [&](int rank, ddprun::rendezvous::Store& store) {
                                   auto shm = shmOf(store, rank, 2, 64, [&](int q) { return q == 1 && rank1_gone; });
                                   if (rank == 1) {
                                     rank1_gone = true;
                                     return;
                                   }
                                   float x = 1;
                                   shm->run(&x, 1, DType::kFloat32, ReduceOp::kSum, Clock::now() + kRankOpTimeout);
                                 }),
                      "rank 0: all_reduce (shared memory): rank 1 died");
}

TEST_CASE("the shared-memory all_reduce names the ranks that did not come by the deadline") {
  REQUIRE_THROWS_WITH(runThreads(4,
                                 [](int rank, ddprun::rendezvous::Store& store) {
                                   auto shm = shmOf(store, rank, 4, 64);
                                   if (rank == 1 || rank == 3) return;
                                   float x = 1;
                                   shm->run(&x, 1, DType::kFloat32, ReduceOp::kSum,
                                            Clock::now() + std::chrono::milliseconds(50));
                                 }),
                      Catch::Matches("rank [02]: all_reduce \\(shared memory\\): timed out waiting for "
                                     "rank 1, rank 3"));
}
