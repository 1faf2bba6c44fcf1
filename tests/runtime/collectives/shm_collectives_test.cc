// The shared-memory collectives on their own, ranks as threads: all_reduce over several
// chunks of the default slot size, calls of changing sizes back to back (the two slot sets
// alternate across calls), the one-barrier broadcast, all_gather, reduce_scatter and barrier
// among them, mismatched calls named on every rank, the ranks named when one is dead or
// does not come, when the group counts as having more ranks than CPUs, and when a
// broadcast root waits for its receivers.
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>

#include <catch2/catch.hpp>

#include "tests/runtime/support/reference_values.h"
#include "tests/runtime/support/thread_ranks.h"
#include "worker_runtime/collectives/shm_collectives.h"

namespace {

using namespace ddprun::runtime;
using namespace ddprun::testing;

// The deadline of one op.
Clock::time_point inTime() { return Clock::now() + kRankOpTimeout; }

std::unique_ptr<ShmCollectives> shmOf(
    ddprun::rendezvous::Store& store, int rank, int size, size_t slot_bytes,
    std::function<bool(int)> peer_gone = [](int) { return false; },
    size_t single_copy_bytes = ShmCollectives::kSingleCopyBytes) {
  return std::make_unique<ShmCollectives>(
      store, "shm/", rank, size, kRankOpTimeout, std::move(peer_gone),
      [](int q) { return "rank " + std::to_string(q); }, slot_bytes, single_copy_bytes);
}

// all_gather of `bytes` per rank (a multiple of 4) into blocks of their own, or in place
// (this rank's block of the output is its input); throws unless every block is its rank's.
void checkedAllGather(ShmCollectives& shm, int rank, int size, size_t bytes, int round, bool in_place) {
  const size_t count = bytes / 4;
  auto value = [&](int q, size_t i) { return static_cast<float>(q * 1000003 + i * 7 + round); };
  std::vector<std::vector<float>> all(size, std::vector<float>(count, -1.f));
  std::vector<float> input(count);
  for (size_t i = 0; i < count; ++i) input[i] = value(rank, i);
  float* in = input.data();
  if (in_place) all[rank] = input, in = all[rank].data();
  std::vector<void*> outs;
  for (auto& a : all) outs.push_back(a.data());
  shm.allGather(in, outs.data(), bytes, inTime());
  for (int q = 0; q < size; ++q) {
    for (size_t i = 0; i < count; ++i) {
      if (all[q][i] != value(q, i)) {
        throw std::runtime_error("all_gather of " + std::to_string(bytes) + " bytes: block " + std::to_string(q) +
                                 " element " + std::to_string(i) + " wrong");
      }
    }
  }
}

// Catch's assertions are not thread-safe: rank threads throw instead (runThreads reports it).
void expect(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what + ": wrong result");
}

std::vector<float> broadcastValues(size_t count, int round) {
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = static_cast<float>(i * 3 + round);
  return v;
}

// Two ranks; rank 1 leaves at once and is then known dead; rank 0 runs `op`. Throws what
// runThreads() throws.
void afterRankOneDied(const std::function<void(ShmCollectives&)>& op) {
  std::atomic<bool> rank1_gone{false};
  runThreads(2, [&](int rank, ddprun::rendezvous::Store& store) {
    auto shm = shmOf(store, rank, 2, 64, [&](int q) { return q == 1 && rank1_gone; });
    if (rank == 1) {
      rank1_gone = true;
      return;
    }
    op(*shm);
  });
}

// Lets the calling thread run on `cpus` only (a rank's thread, before it builds its side).
void pinThisThread(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) CPU_SET(c, &set);
  if (::pthread_setaffinity_np(::pthread_self(), sizeof set, &set) != 0) throw std::runtime_error("affinity");
}

// Runs `body(shm, rank, world size)` on every rank (threads) at world sizes 2, 3 and 5, each
// group with slots of `slot_bytes`.
void onWorldSizes(size_t slot_bytes, const std::function<void(ShmCollectives&, int, int)>& body) {
  for (int p : {2, 3, 5}) {
    INFO("world size " << p);
    REQUIRE_NOTHROW(runThreads(p, [&](int rank, ddprun::rendezvous::Store& store) {
      auto shm = shmOf(store, rank, p, slot_bytes);
      body(*shm, rank, p);
    }));
  }
}

}  // namespace

TEST_CASE("the shared-memory all_reduce spans chunks of the default slot size") {
  REQUIRE_NOTHROW(runThreads(3, [](int rank, ddprun::rendezvous::Store& store) {
    auto shm = shmOf(store, rank, 3, ShmCollectives::kDefaultSlotBytes);
    // Two full chunks and an odd part of a third, in each element size.
    int salt = 0;
    for (DType dtype : {DType::kFloat64, DType::kFloat16, DType::kUInt8}) {
      const size_t count = 2 * ShmCollectives::kDefaultSlotBytes / elementBytes(dtype) + 12345;
      auto buf = inputBuffer(ReduceOp::kSum, dtype, rank, count, ++salt);
      shm->allReduce(buf.data(), count, dtype, ReduceOp::kSum, inTime());
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
          shm->allReduce(buf.data(), count, DType::kFloat32, ReduceOp::kMax, inTime());
          checkReduced("shared-memory all_reduce", buf.data(), count, ReduceOp::kMax, DType::kFloat32, p, salt);
        }
      }
    }));
  }
}

TEST_CASE("the shared-memory all_reduce names a rank known dead") {
  REQUIRE_THROWS_WITH(afterRankOneDied([](ShmCollectives& shm) {
                        float x = 1;
                        shm.allReduce(&x, 1, DType::kFloat32, ReduceOp::kSum, inTime());
                      }),
                      "rank 0: all_reduce (shared memory): rank 1 died");
}

TEST_CASE("the shared-memory all_reduce names the ranks that did not come by the deadline") {
  REQUIRE_THROWS_WITH(runThreads(4,
                                 [](int rank, ddprun::rendezvous::Store& store) {
                                   auto shm = shmOf(store, rank, 4, 64);
                                   if (rank == 1 || rank == 3) return;
                                   float x = 1;
                                   shm->allReduce(&x, 1, DType::kFloat32, ReduceOp::kSum,
                                                  Clock::now() + std::chrono::milliseconds(50));
                                 }),
                      Catch::Matches("rank [02]: all_reduce \\(shared memory\\): timed out waiting for "
                                     "rank 1, rank 3"));
}

TEST_CASE("small broadcast all_gather reduce_scatter and barrier through the slots between all_reduces") {
  onWorldSizes(256, [](ShmCollectives& shm, int rank, int p) {
    int salt = 0;
    // Each one-barrier op takes one slot set, an all_reduce of several chunks several: the
    // ops below land on either set, and a fast rank's next op writes one a slow rank may read.
    for (int round = 0; round < 4; ++round) {
      const size_t count = 1 + round * 19;  // up to 58 floats: one 256-byte slot
      auto reduced = inputBuffer(ReduceOp::kSum, DType::kFloat32, rank, 200 + round, ++salt);
      shm.allReduce(reduced.data(), 200 + round, DType::kFloat32, ReduceOp::kSum, inTime());
      checkReduced("all_reduce", reduced.data(), 200 + round, ReduceOp::kSum, DType::kFloat32, p, salt);

      const int root = round % p;
      std::vector<float> b(count, -1.f);
      if (rank == root) b = broadcastValues(count, round);
      shm.broadcast(b.data(), count * 4, root, inTime());
      expect(b == broadcastValues(count, round), "broadcast");

      // Blocks anywhere (each its own vector), as a torch user's list of tensors.
      std::vector<float> mine(count, static_cast<float>(rank * 100 + round));
      std::vector<std::vector<float>> all(p, std::vector<float>(count, -1.f));
      std::vector<void*> outs;
      for (auto& a : all) outs.push_back(a.data());
      shm.allGather(mine.data(), outs.data(), count * 4, inTime());
      for (int q = 0; q < p; ++q) {
        expect(all[q] == std::vector<float>(count, static_cast<float>(q * 100 + round)), "all_gather");
      }

      const size_t block = 256 / 4 / p;  // the whole input fills at most one slot
      std::vector<std::vector<float>> in(p);
      std::vector<const void*> ins;
      for (int q = 0; q < p; ++q) in[q].assign(block, static_cast<float>(rank + q)), ins.push_back(in[q].data());
      std::vector<float> out(block, -1.f);
      shm.reduceScatter(ins.data(), out.data(), block, DType::kFloat32, ReduceOp::kMax, inTime());
      expect(out == std::vector<float>(block, static_cast<float>(p - 1 + rank)), "reduce_scatter");

      shm.barrier(inTime());
    }
  });
}

TEST_CASE("tiny ops on the arrival line: every op at and around its limit, in place, among slot ops") {
  // kInlineBytes is 40: 36 and 40 bytes ride on the arrival line, 44 go through the slots; a
  // reduce_scatter's limit is its whole input (every rank's block).
  static_assert(ShmCollectives::kInlineBytes == 40);
  onWorldSizes(256, [](ShmCollectives& shm, int rank, int p) {
    int salt = 0;
    for (int round = 0; round < 3; ++round) {
      for (size_t count : {size_t{1}, size_t{9}, size_t{10}, size_t{11}}) {
        const std::string at = " of " + std::to_string(count * 4) + " bytes";
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kAvg}) {
          auto buf = inputBuffer(op, DType::kFloat32, rank, count, ++salt);
          shm.allReduce(buf.data(), count, DType::kFloat32, op, inTime());
          checkReduced("all_reduce" + at, buf.data(), count, op, DType::kFloat32, p, salt);
        }
        // Rank order matters for float sums: every rank must get the same bits.
        auto f64 = inputBuffer(ReduceOp::kSum, DType::kFloat64, rank, count / 2 + 1, ++salt);
        shm.allReduce(f64.data(), count / 2 + 1, DType::kFloat64, ReduceOp::kSum, inTime());
        checkReduced("float64 all_reduce" + at, f64.data(), count / 2 + 1, ReduceOp::kSum, DType::kFloat64, p, salt);

        const int root = (round + static_cast<int>(count)) % p;
        std::vector<float> b(count, -1.f);
        if (rank == root) b = broadcastValues(count, round);
        shm.broadcast(b.data(), count * 4, root, inTime());
        expect(b == broadcastValues(count, round), "broadcast" + at);

        checkedAllGather(shm, rank, p, count * 4, round, /*in_place=*/count % 2 == 0);
      }
      // reduce_scatter: blocks of 1 to 6 floats, so whole inputs below, at and above 40 bytes
      // for each world size; in place (the output is this rank's input block) every other time.
      for (size_t block = 1; block <= 6; ++block) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kAvg}) {
          ++salt;
          std::vector<std::vector<uint8_t>> in(p);
          std::vector<const void*> ins;
          for (int q = 0; q < p; ++q) {
            in[q] = inputBuffer(op, DType::kFloat32, rank, block, salt, q * block);
            ins.push_back(in[q].data());
          }
          std::vector<uint8_t> separate(block * 4, 0xff);
          const bool in_place = (block + static_cast<size_t>(round)) % 2 == 0;
          void* out = in_place ? in[rank].data() : separate.data();
          shm.reduceScatter(ins.data(), out, block, DType::kFloat32, op, inTime());
          checkReduced("reduce_scatter of " + std::to_string(block * 4 * p) + " bytes" + (in_place ? " in place" : ""),
                       out, block, op, DType::kFloat32, p, salt, rank * block);
        }
      }
      // A slot op between rounds: the arrival lines and the slot sets alternate apart.
      auto big = inputBuffer(ReduceOp::kSum, DType::kFloat32, rank, 150, ++salt);
      shm.allReduce(big.data(), 150, DType::kFloat32, ReduceOp::kSum, inTime());
      checkReduced("all_reduce through the slots", big.data(), 150, ReduceOp::kSum, DType::kFloat32, p, salt);
      shm.barrier(inTime());
    }
  });
}

TEST_CASE("mismatched collectives on shared memory fail on every rank naming both calls") {
  struct Case {
    const char* name;
    std::function<void(ShmCollectives&)> others, rank1;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"broadcast where the others all_reduce",
       [&](ShmCollectives& s) {
         float x[4] = {};
         s.allReduce(x, 4, DType::kFloat32, ReduceOp::kSum, inTime());
       },
       [&](ShmCollectives& s) {
         float x[4] = {};
         s.broadcast(x, 16, 0, inTime());
       },
       "mismatched collectives (shared memory): rank 1 called broadcast of 16 bytes from rank 0 where rank 0 "
       "called all_reduce of 16 bytes (float32, sum)"},
      {"another size",
       [&](ShmCollectives& s) {
         float x[4] = {};
         s.allReduce(x, 4, DType::kFloat32, ReduceOp::kSum, inTime());
       },
       [&](ShmCollectives& s) {
         float x[4] = {};
         s.allReduce(x, 3, DType::kFloat32, ReduceOp::kSum, inTime());
       },
       "mismatched collectives (shared memory): rank 1 called all_reduce of 12 bytes (float32, sum) where rank 0 "
       "called all_reduce of 16 bytes (float32, sum)"},
      {"another root",
       [&](ShmCollectives& s) {
         float x[4] = {};
         s.broadcast(x, 16, 0, inTime());
       },
       [&](ShmCollectives& s) {
         float x[4] = {};
         s.broadcast(x, 16, 2, inTime());
       },
       "mismatched collectives (shared memory): rank 1 called broadcast of 16 bytes from rank 2 where rank 0 "
       "called broadcast of 16 bytes from rank 0"},
      {"barrier where the others reduce_scatter with max",
       [&](ShmCollectives& s) {
         float in[3] = {}, out[1] = {};
         const void* ins[3] = {in, in + 1, in + 2};
         s.reduceScatter(ins, out, 1, DType::kFloat32, ReduceOp::kMax, inTime());
       },
       [&](ShmCollectives& s) { s.barrier(inTime()); },
       "mismatched collectives (shared memory): rank 1 called barrier where rank 0 called reduce_scatter of 4 "
       "bytes per rank (float32, max)"},
  };
  for (const auto& c : cases) {
    INFO(c.name);
    std::vector<std::string> errors(3);
    REQUIRE_NOTHROW(runThreads(3, [&](int rank, ddprun::rendezvous::Store& store) {
      auto shm = shmOf(store, rank, 3, 64);
      try {
        (rank == 1 ? c.rank1 : c.others)(*shm);
        // A broadcast's root does not wait for the others: it finds out at its next call.
        shm->barrier(inTime());
      } catch (const ddprun::DdprunError& e) {
        errors[rank] = e.what();
      }
    }));
    for (const auto& e : errors) CHECK(e == c.message);
  }
}

TEST_CASE("a shared-memory broadcast names a rank known dead to its receivers and to its root at its next call") {
  for (int root : {1, 0}) {
    INFO("root " << root);
    REQUIRE_THROWS_WITH(afterRankOneDied([root](ShmCollectives& shm) {
                          float x = 1;
                          shm.broadcast(&x, 4, root, inTime());
                          shm.barrier(inTime());
                        }),
                        "rank 0: broadcast (shared memory): rank 1 died");
  }
}

TEST_CASE("a shared-memory barrier names every rank known dead and not only the first") {
  // Rank 1 may only have left because rank 2 died: both are named.
  std::atomic<int> gone{0};
  REQUIRE_THROWS_WITH(runThreads(3,
                                 [&](int rank, ddprun::rendezvous::Store& store) {
                                   auto shm = shmOf(store, rank, 3, 64, [&](int q) { return q != 0 && gone == 2; });
                                   if (rank != 0) {
                                     ++gone;
                                     return;
                                   }
                                   shm->barrier(inTime());
                                 }),
                      "rank 0: barrier (shared memory): rank 1, rank 2 died");
}

// The receivers dawdle on the wall clock (2 ms now and then) so that the root runs ahead of
// them: integration, not unit.
TEST_CASE("a broadcast root runs ahead of slow receivers without overwriting what they have not read",
          "[integration]") {
  REQUIRE_NOTHROW(runThreads(3, [](int rank, ddprun::rendezvous::Store& store) {
    auto shm = shmOf(store, rank, 3, 64);
    for (int i = 0; i < 60; ++i) {
      // 1 to 5 slot-sized chunks; the root never waits, the receivers now and then dawdle.
      const size_t count = 1 + (i * 37) % 80;
      std::vector<float> buf(count, rank == 0 ? static_cast<float>(i) : -1.f);
      if (rank != 0 && i % 7 == rank) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      shm->broadcast(buf.data(), count * 4, 0, inTime());
      expect(buf == std::vector<float>(count, static_cast<float>(i)), "broadcast " + std::to_string(i));
      if (i % 10 == 9) {
        // Other ops in between start from a settled root too.
        float x = 1;
        shm->allReduce(&x, 1, DType::kFloat32, ReduceOp::kSum, inTime());
        expect(x == 3.f, "all_reduce after broadcast " + std::to_string(i));
      }
    }
  }));
}

// A receiver that calls 100 ms late, or once the root has returned: real time between ranks
// (a root that did not wait would be gone), so integration, not unit.
TEST_CASE("a broadcast root leaves before its receivers but waits for them when ranks outnumber CPUs",
          "[integration]") {
  const int cpus = static_cast<int>(std::thread::hardware_concurrency());
  // Two ranks, each thread pinned to `cpus_of(rank)`; one chunk (64 bytes, slots of 64) from
  // rank 0, after a barrier (from which the ranks know whether they are oversubscribed).
  // Rank 1 calls once `go()` returns; returns whether rank 0's call returned before that.
  auto rootLeftFirst = [](std::function<std::vector<int>(int)> cpus_of, std::function<void(std::atomic<bool>&)> go) {
    std::atomic<bool> root_returned{false}, receiver_called{false};
    bool left_first = false;
    REQUIRE_NOTHROW(runThreads(2, [&](int rank, ddprun::rendezvous::Store& store) {
      pinThisThread(cpus_of(rank));
      auto shm = shmOf(store, rank, 2, 64);
      shm->barrier(inTime());
      std::vector<float> buf(16, rank == 0 ? 7.f : -1.f);
      if (rank == 0) {
        shm->broadcast(buf.data(), 64, 0, inTime());
        left_first = !receiver_called;
        root_returned = true;
      } else {
        go(root_returned);
        receiver_called = true;
        shm->broadcast(buf.data(), 64, 0, inTime());
      }
      expect(buf == std::vector<float>(16, 7.f), "broadcast");
      shm->barrier(inTime());
    }));
    return left_first;
  };
  SECTION("more ranks than CPUs: the root returns once the receiver has the data") {
    // The receiver calls 100 ms late: a root that did not wait would be long gone.
    CHECK_FALSE(rootLeftFirst([](int) { return std::vector<int>{0}; },
                              [](std::atomic<bool>&) { std::this_thread::sleep_for(std::chrono::milliseconds(100)); }));
  }
  if (cpus >= 2) {
    SECTION("a CPU per rank: the root returns at once") {
      // The receiver calls only once the root has returned (or 10 s have passed, when a root
      // that waited for it would have waited in vain).
      CHECK(rootLeftFirst([](int rank) { return std::vector<int>{rank}; },
                          [](std::atomic<bool>& root_returned) {
                            const auto give_up = Clock::now() + std::chrono::seconds(10);
                            while (!root_returned && Clock::now() < give_up)
                              std::this_thread::sleep_for(std::chrono::milliseconds(1));
                          }));
    }
  }
}

TEST_CASE("ranks count as oversubscribed once they are known to outnumber the CPUs they may use together") {
  const int cpus = static_cast<int>(std::thread::hardware_concurrency());
  // Each rank's thread pinned to the CPUs `cpus_of(rank)` names before it builds its side.
  auto oversubscribedWith = [](int world, std::function<std::vector<int>(int)> cpus_of) {
    std::vector<int> before(world, -1), after(world, -1);
    REQUIRE_NOTHROW(runThreads(world, [&](int rank, ddprun::rendezvous::Store& store) {
      pinThisThread(cpus_of(rank));
      auto shm = shmOf(store, rank, world, 64);
      before[rank] = shm->oversubscribed();
      shm->barrier(inTime());
      after[rank] = shm->oversubscribed();
    }));
    CHECK(before == std::vector<int>(world, 0));
    return after;
  };
  CHECK(oversubscribedWith(3, [](int) { return std::vector<int>{0}; }) == std::vector<int>{1, 1, 1});
  CHECK(oversubscribedWith(2, [](int) { return std::vector<int>{0}; }) == std::vector<int>{1, 1});
  if (cpus >= 2) {
    // One CPU each: as many CPUs as ranks, though no rank alone may use more than one.
    CHECK(oversubscribedWith(2, [](int rank) { return std::vector<int>{rank}; }) == std::vector<int>{0, 0});
    CHECK(oversubscribedWith(3, [](int rank) { return std::vector<int>{rank % 2}; }) == std::vector<int>{1, 1, 1});
  }
}

TEST_CASE("large all_gather blocks go from each rank's input straight into the others' outputs") {
  for (int p : {2, 3, 5}) {
    INFO("world size " << p);
    REQUIRE_NOTHROW(runThreads(p, [&](int rank, ddprun::rendezvous::Store& store) {
      // Blocks of 1 KiB and more take the single copy here; the slots (256 B) take the rest.
      auto shm = shmOf(
          store, rank, p, 256, [](int) { return false; }, 1024);
      // Every rank's answer to the probe is known from the second barrier on.
      std::vector<bool> known;
      known.push_back(shm->singleCopy());
      shm->barrier(inTime());
      known.push_back(shm->singleCopy());
      shm->barrier(inTime());
      known.push_back(shm->singleCopy());
      if (known != std::vector<bool>{false, false, true}) throw std::runtime_error("single copy not agreed");
      for (int round = 1; round < 9; ++round) {
        // Odd sizes on either side of the threshold, in place or not, between all_reduces
        // (the slot sets go on alternating around the single-copy calls).
        checkedAllGather(*shm, rank, p, round % 3 == 0 ? 1020 : 1024 + 4 * 331 * round, round, round % 2 == 0);
        auto reduced = inputBuffer(ReduceOp::kSum, DType::kFloat32, rank, 100, round);
        shm->allReduce(reduced.data(), 100, DType::kFloat32, ReduceOp::kSum, inTime());
        checkReduced("all_reduce", reduced.data(), 100, ReduceOp::kSum, DType::kFloat32, p, round);
      }
    }));
  }
}

TEST_CASE("a rank that cannot read its peers' memory keeps every rank's all_gather on the slots") {
  REQUIRE_NOTHROW(runThreads(3, [](int rank, ddprun::rendezvous::Store& store) {
    // Rank 1 says no (as a rank whose probe the kernel refused does): the others must agree.
    auto shm = shmOf(
        store, rank, 3, 256, [](int) { return false; }, rank == 1 ? ShmCollectives::kNoSingleCopy : size_t{1024});
    shm->barrier(inTime());
    shm->barrier(inTime());
    if (shm->singleCopy()) throw std::runtime_error("rank " + std::to_string(rank) + " would read its peers");
    for (int round = 0; round < 3; ++round) checkedAllGather(*shm, rank, 3, 8192 + 4 * round, round, round == 1);
  }));
}

TEST_CASE("an input the kernel will not hand over sends that all_gather and the later ones through the slots") {
  for (int p : {2, 3}) {
    INFO("world size " << p);
    std::atomic<int> refused{0};
    REQUIRE_NOTHROW(runThreads(p, [&](int rank, ddprun::rendezvous::Store& store) {
      auto shm = shmOf(
          store, rank, p, 256, [](int) { return false; }, 1024);
      shm->barrier(inTime());
      shm->barrier(inTime());
      if (!shm->singleCopy()) throw std::runtime_error("no single copy");
      // The last rank's reads fail as they do from CUDA's pinned host memory.
      if (rank == p - 1) {
        shm->setPeerReader([&](pid_t, void*, uint64_t, size_t) {
          ++refused;
          errno = EFAULT;
          return false;
        });
      }
      for (int round = 0; round < 3; ++round) {
        checkedAllGather(*shm, rank, p, 2048 + 4 * round, round, round == 1);
        if (shm->singleCopy()) throw std::runtime_error("rank " + std::to_string(rank) + " still reads its peers");
      }
    }));
    // Once, by the one rank: the group agreed to stop after the first refusal.
    CHECK(refused == 1);
  }
}

TEST_CASE("a single-copy all_gather names a dead peer and a mismatched call before reading anything") {
  // Rank 1 passes the two barriers that make the single copy known, then dies.
  std::atomic<bool> rank1_gone{false};
  REQUIRE_THROWS_WITH(runThreads(2,
                                 [&](int rank, ddprun::rendezvous::Store& store) {
                                   auto shm = shmOf(
                                       store, rank, 2, 64, [&](int q) { return q == 1 && rank1_gone; }, 1024);
                                   shm->barrier(inTime());
                                   shm->barrier(inTime());
                                   if (!shm->singleCopy()) throw std::runtime_error("no single copy");
                                   if (rank == 1) {
                                     rank1_gone = true;
                                     return;
                                   }
                                   checkedAllGather(*shm, rank, 2, 4096, 0, false);
                                 }),
                      "rank 0: all_gather (shared memory): rank 1 died");
  // A block size the peer's buffer does not have is never read.
  std::vector<std::string> errors(2);
  REQUIRE_NOTHROW(runThreads(2, [&](int rank, ddprun::rendezvous::Store& store) {
    auto shm = shmOf(
        store, rank, 2, 64, [](int) { return false; }, 1024);
    shm->barrier(inTime());
    shm->barrier(inTime());
    try {
      checkedAllGather(*shm, rank, 2, rank == 1 ? 8192 : 4096, 0, false);
    } catch (const ddprun::DdprunError& e) {
      errors[rank] = e.what();
    }
  }));
  for (const auto& e : errors) {
    CHECK(e ==
          "mismatched collectives (shared memory): rank 1 called all_gather of 8192 bytes per rank where rank 0 "
          "called all_gather of 4096 bytes per rank");
  }
}
