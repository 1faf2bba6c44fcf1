// Every collective of the core, on every transport and algorithm (transport_setups.h), for
// every dtype and reduce operator, at world sizes 1 to 8, with empty, one-element, odd and
// multi-chunk buffers: ranks are threads (thread_ranks.h) and every result is checked
// against one computed independently (reference_values.h).
#include <array>
#include <atomic>
#include <functional>
#include <numeric>

#include <fmt/format.h>
#include <catch2/catch.hpp>

#include "tests/runtime/support/reference_values.h"
#include "tests/runtime/support/thread_ranks.h"
#include "tests/runtime/support/transport_setups.h"
#include "worker_runtime/backend/host_collectives.h"
#include "worker_runtime/collectives/algorithms.h"

namespace {

using namespace ddprun::runtime;
using namespace ddprun::testing;

constexpr int kMaxWorldSize = 8;
// Element counts: empty, one, fewer than 8 ranks (some ring segments and shm shares empty),
// and odd, over several 64-byte shm chunks and past the lowered ring threshold.
const std::vector<size_t> kCounts = {0, 1, 7, 67};
// Byte sizes for the collectives that only move bytes: 200 wraps the 61-byte rings.
const std::vector<size_t> kBytes = {0, 1, 13, 200};

void runOn(HostBackend& backend, std::function<void(CollectiveContext&)> collective) {
  backend.enqueue(std::move(collective))->wait();
}

// body(backend) on every rank, for every transport setup and world size.
void onEveryTransport(const std::function<void(HostBackend&)>& body) {
  for (const auto& setup : transportSetups()) {
    for (int p = 1; p <= kMaxWorldSize; ++p) {
      INFO(setup.name << ", world size " << p);
      REQUIRE_NOTHROW(runRanks(p, setup.options, [&](HostBackend& backend) {
        checkTransport(backend, setup);
        body(backend);
      }));
    }
  }
}

// Counts the exchanges an algorithm makes: its rounds.
class CountingLinks final : public Links {
 public:
  explicit CountingLinks(Links& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  void exchange(std::span<Transfer> transfers, Clock::time_point deadline, const char* what) override {
    ++exchanges;
    inner_.exchange(transfers, deadline, what);
  }
  int exchanges = 0;

 private:
  Links& inner_;
};

std::vector<uint8_t> concat(const std::vector<std::vector<uint8_t>>& blocks) {
  std::vector<uint8_t> all;
  for (const auto& b : blocks) all.insert(all.end(), b.begin(), b.end());
  return all;
}

}  // namespace

TEST_CASE("all_reduce equals the independent result for every algorithm dtype and operator") {
  onEveryTransport([](HostBackend& b) {
    int salt = 0;
    for (DType dtype : kAllDTypes) {
      for (ReduceOp op : kAllReduceOps) {
        for (size_t count : kCounts) {
          auto buf = inputBuffer(op, dtype, b.rank(), count, ++salt);
          runOn(b, [&](CollectiveContext& ctx) { allReduce(ctx, buf.data(), count, dtype, op); });
          checkReduced("all_reduce", buf.data(), count, op, dtype, b.size(), salt);
        }
      }
    }
  });
}

TEST_CASE("all_reduce takes recursive doubling up to small_all_reduce_bytes and the ring above it") {
  struct Case {
    size_t threshold;
    size_t count;  // float32 elements
    int rounds;    // of 4 ranks: log2(4) for recursive doubling, 2 * (4 - 1) for the ring
  };
  const size_t kDefault = CollectiveOptions{}.small_all_reduce_bytes;
  const Case cases[] = {{64, 16, 2}, {64, 17, 6}, {kDefault, kDefault / 4, 2}, {kDefault, kDefault / 4 + 1, 6}};
  CHECK(kDefault == 64 * 1024);  // the production default is unchanged
  HostBackendOptions options;
  options.shared_memory = HostBackendOptions::SharedMemory::kOff;
  REQUIRE_NOTHROW(runRanks(4, options, [&](HostBackend& b) {
    int salt = 0;
    for (const Case& c : cases) {
      auto buf = inputBuffer(ReduceOp::kSum, DType::kFloat32, b.rank(), c.count, ++salt);
      int rounds = 0;
      runOn(b, [&](CollectiveContext& ctx) {
        CountingLinks counting(ctx.links);
        CollectiveOptions chosen;
        chosen.small_all_reduce_bytes = c.threshold;
        allReduce(AlgorithmContext{counting, ctx.deadline, ctx.scratch, chosen}, buf.data(), c.count, DType::kFloat32,
                  ReduceOp::kSum);
        rounds = counting.exchanges;
      });
      checkReduced("all_reduce", buf.data(), c.count, ReduceOp::kSum, DType::kFloat32, b.size(), salt);
      if (rounds != c.rounds) {
        throw std::runtime_error(fmt::format("{} bytes with threshold {}: {} rounds, expected {}", c.count * 4,
                                             c.threshold, rounds, c.rounds));
      }
    }
  }));
}

TEST_CASE("reduce lands the independent result on every root and leaves the other ranks' buffers alone") {
  onEveryTransport([](HostBackend& b) {
    int salt = 0;
    for (DType dtype : kAllDTypes) {
      for (ReduceOp op : kAllReduceOps) {
        for (size_t count : kCounts) {
          const int root = ++salt % b.size();  // every root comes round, with every size
          auto buf = inputBuffer(op, dtype, b.rank(), count, salt);
          const auto input = buf;
          runOn(b, [&](CollectiveContext& ctx) { reduce(ctx, buf.data(), count, dtype, op, root); });
          if (b.rank() == root) {
            checkReduced(fmt::format("reduce to root {}", root), buf.data(), count, op, dtype, b.size(), salt);
          } else if (buf != input) {
            throw std::runtime_error(fmt::format("reduce to root {}: a non-root buffer changed", root));
          }
        }
      }
    }
  });
}

TEST_CASE("reduce_scatter gives each rank the independent result of its block and keeps the input") {
  onEveryTransport([](HostBackend& b) {
    int salt = 0;
    const int p = b.size(), r = b.rank();
    for (DType dtype : kAllDTypes) {
      for (ReduceOp op : kAllReduceOps) {
        for (size_t count : {size_t{0}, size_t{1}, size_t{5}}) {
          // Element i of block j is element j * count + i of one long input.
          auto in = inputBuffer(op, dtype, r, count * p, ++salt);
          const auto input = in;
          std::vector<uint8_t> out(count * elementBytes(dtype), 0xEE);
          runOn(b, [&](CollectiveContext& ctx) { reduceScatter(ctx, in.data(), out.data(), count, dtype, op); });
          checkReduced("reduce_scatter", out.data(), count, op, dtype, p, salt, r * count);
          if (in != input) throw std::runtime_error("reduce_scatter changed its input");
        }
      }
    }
  });
}

TEST_CASE("broadcast copies the root's bytes to every rank from every root") {
  onEveryTransport([](HostBackend& b) {
    int salt = 0;
    for (size_t bytes : kBytes) {
      for (int root = 0; root < b.size(); ++root) {
        ++salt;
        auto buf = b.rank() == root ? patternBlock(root, -1, bytes, salt) : std::vector<uint8_t>(bytes, 0xEE);
        runOn(b, [&](CollectiveContext& ctx) { broadcast(ctx, buf.data(), bytes, root); });
        checkPattern(fmt::format("broadcast from root {}", root), buf.data(), bytes, root, -1, salt);
      }
    }
  });
}

TEST_CASE("all_gather puts every rank's block in rank order and works in place") {
  onEveryTransport([](HostBackend& b) {
    int salt = 0;
    const int p = b.size(), r = b.rank();
    for (size_t bytes : kBytes) {
      for (bool in_place : {false, true}) {
        const auto mine = patternBlock(r, -1, bytes, ++salt);
        std::vector<uint8_t> out(bytes * p, 0xEE);
        if (in_place) std::copy(mine.begin(), mine.end(), out.begin() + r * bytes);
        const void* in = in_place ? out.data() + r * bytes : mine.data();
        runOn(b, [&](CollectiveContext& ctx) { allGather(ctx, in, out.data(), bytes); });
        for (int j = 0; j < p; ++j) {
          checkPattern(in_place ? "all_gather in place" : "all_gather", out.data() + j * bytes, bytes, j, -1, salt);
        }
      }
    }
  });
}

TEST_CASE("all_gather and reduce_scatter take their blocks from separate buffers and reduce_scatter works in place") {
  onEveryTransport([](HostBackend& b) {
    int salt = 0;
    const int p = b.size(), r = b.rank();
    for (size_t bytes : kBytes) {
      const auto mine = patternBlock(r, -1, bytes, ++salt);
      std::vector<std::vector<uint8_t>> blocks(p, std::vector<uint8_t>(bytes, 0xEE));
      std::vector<void*> outs;
      for (auto& block : blocks) outs.push_back(block.data());
      runOn(b, [&](CollectiveContext& ctx) { allGatherInto(ctx, mine.data(), outs.data(), bytes); });
      for (int j = 0; j < p; ++j) checkPattern("all_gather into blocks", blocks[j].data(), bytes, j, -1, salt);
    }
    for (size_t count : {size_t{0}, size_t{1}, size_t{5}, size_t{40}}) {
      const auto in = inputBuffer(ReduceOp::kSum, DType::kFloat64, r, count * p, ++salt);
      const size_t block = count * elementBytes(DType::kFloat64);
      std::vector<std::vector<uint8_t>> blocks(p);
      std::vector<const void*> ins;
      for (int j = 0; j < p; ++j) {
        blocks[j].assign(in.begin() + j * block, in.begin() + (j + 1) * block);
        ins.push_back(blocks[j].data());
      }
      std::vector<uint8_t> out(block, 0xEE);
      runOn(b, [&](CollectiveContext& ctx) {
        reduceScatterFrom(ctx, ins.data(), out.data(), count, DType::kFloat64, ReduceOp::kSum);
      });
      checkReduced("reduce_scatter from blocks", out.data(), count, ReduceOp::kSum, DType::kFloat64, p, salt,
                   r * count);
      // In place: the result lands on this rank's own input block.
      runOn(b, [&](CollectiveContext& ctx) {
        reduceScatterFrom(ctx, ins.data(), blocks[r].data(), count, DType::kFloat64, ReduceOp::kSum);
      });
      checkReduced("reduce_scatter in place", blocks[r].data(), count, ReduceOp::kSum, DType::kFloat64, p, salt,
                   r * count);
    }
  });
}

TEST_CASE("gather collects every rank's block on every root") {
  onEveryTransport([](HostBackend& b) {
    int salt = 0;
    const int p = b.size(), r = b.rank();
    for (size_t bytes : kBytes) {
      for (int root = 0; root < p; ++root) {
        const auto mine = patternBlock(r, root, bytes, ++salt);
        std::vector<uint8_t> out(r == root ? bytes * p : 0, 0xEE);
        runOn(b,
              [&](CollectiveContext& ctx) { gather(ctx, mine.data(), r == root ? out.data() : nullptr, bytes, root); });
        if (r != root) continue;
        for (int j = 0; j < p; ++j) {
          checkPattern(fmt::format("gather to root {}", root), out.data() + j * bytes, bytes, j, root, salt);
        }
      }
    }
  });
}

TEST_CASE("scatter hands each rank its block from every root") {
  onEveryTransport([](HostBackend& b) {
    int salt = 0;
    const int p = b.size(), r = b.rank();
    for (size_t bytes : kBytes) {
      for (int root = 0; root < p; ++root) {
        ++salt;
        std::vector<std::vector<uint8_t>> blocks;
        if (r == root) {
          for (int j = 0; j < p; ++j) blocks.push_back(patternBlock(root, j, bytes, salt));
        }
        const auto in = concat(blocks);
        std::vector<uint8_t> out(bytes, 0xEE);
        runOn(b,
              [&](CollectiveContext& ctx) { scatter(ctx, r == root ? in.data() : nullptr, out.data(), bytes, root); });
        checkPattern(fmt::format("scatter from root {}", root), out.data(), bytes, root, r, salt);
      }
    }
  });
}

TEST_CASE("all_to_all delivers block j of rank i to block i of rank j") {
  onEveryTransport([](HostBackend& b) {
    int salt = 0;
    const int p = b.size(), r = b.rank();
    for (size_t bytes : kBytes) {
      ++salt;
      std::vector<std::vector<uint8_t>> blocks;
      for (int j = 0; j < p; ++j) blocks.push_back(patternBlock(r, j, bytes, salt));
      const auto in = concat(blocks);
      std::vector<uint8_t> out(bytes * p, 0xEE);
      runOn(b, [&](CollectiveContext& ctx) { allToAll(ctx, in.data(), out.data(), bytes); });
      for (int j = 0; j < p; ++j) checkPattern("all_to_all", out.data() + j * bytes, bytes, j, r, salt);
    }
  });
}

TEST_CASE("uneven all_to_all delivers blocks of every size including empty ones") {
  onEveryTransport([](HostBackend& b) {
    const int p = b.size(), r = b.rank();
    for (int salt = 1; salt <= 4; ++salt) {
      // Sizes differ per ordered pair, some zero, some wrapping the shm rings several times.
      auto size = [&](int from, int to) {
        return static_cast<size_t>((from * 3 + to * 5 + salt) % 11 + ((from + to + salt) % 4 == 0 ? 150 : 0));
      };
      std::vector<std::vector<uint8_t>> ins, outs;
      for (int j = 0; j < p; ++j) {
        ins.push_back(patternBlock(r, j, size(r, j), salt));
        outs.emplace_back(size(j, r), 0xEE);
      }
      std::vector<std::span<const uint8_t>> in_spans(ins.begin(), ins.end());
      std::vector<std::span<uint8_t>> out_spans(outs.begin(), outs.end());
      runOn(b, [&](CollectiveContext& ctx) { allToAllV(ctx, in_spans, out_spans); });
      for (int j = 0; j < p; ++j) checkPattern("uneven all_to_all", outs[j].data(), outs[j].size(), j, r, salt);
    }
  });
}

TEST_CASE("uneven all_to_all refuses a block to itself of another length") {
  HostBackendOptions options;
  options.shared_memory = HostBackendOptions::SharedMemory::kOff;
  REQUIRE_THROWS_WITH(runRanks(1, options,
                               [](HostBackend& b) {
                                 std::vector<uint8_t> in(3), out(4);
                                 std::vector<std::span<const uint8_t>> ins{in};
                                 std::vector<std::span<uint8_t>> outs{out};
                                 runOn(b, [&](CollectiveContext& ctx) { allToAllV(ctx, ins, outs); });
                               }),
                      Catch::Contains("rank 0's block to itself is 3 bytes in and 4 bytes out"));
}

TEST_CASE("no rank leaves a barrier before every rank has entered it") {
  for (const auto& setup : transportSetups()) {
    for (int p = 1; p <= kMaxWorldSize; ++p) {
      INFO(setup.name << ", world size " << p);
      std::array<std::atomic<int>, 16> entered{};
      REQUIRE_NOTHROW(runRanks(p, setup.options, [&](HostBackend& b) {
        checkTransport(b, setup);
        for (size_t round = 0; round < entered.size(); ++round) {
          entered[round].fetch_add(1);
          runOn(b, [](CollectiveContext& ctx) { barrier(ctx); });
          const int seen = entered[round].load();
          if (seen != p) {
            throw std::runtime_error(fmt::format("barrier {}: left after {} of {} ranks entered", round, seen, p));
          }
        }
      }));
    }
  }
}
