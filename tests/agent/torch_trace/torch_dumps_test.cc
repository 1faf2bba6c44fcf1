// Gathering the local ranks' torch flight-recorder dumps (agent/torch_trace/torch_dumps.h), on files that
// tests/agent/torch_trace/flight_dumps.py writes: a file already there when the worker started
// does not count, a dump is read once two looks find the same size, and a missing or corrupt
// one is named. No clock: each poll() is one look.
#include "agent/torch_trace/torch_dumps.h"

#include <atomic>
#include <chrono>
#include <fstream>

#include <catch2/catch.hpp>

#include "agent/torch_trace/dump_verdict.h"

#include "tests/agent/torch_trace/dumps_support.h"
#include "tests/support/watchdog.h"

using namespace ddprun::agent;
using namespace ddprun::testing;
using namespace std::chrono_literals;

namespace {

// `scenario`'s dump of `rank`, written into `dir` as a worker would.
void writeRank(const std::string& dir, const std::string& scenario, int rank) {
  auto r = run({"/usr/bin/python3", flightDumpsScript(), dir, scenario, "--prefix", "torch_trace_rank_", "--rank",
                std::to_string(rank)},
               {}, std::chrono::seconds(60));
  REQUIRE(r.exit_code == 0);
}

}  // namespace

TEST_CASE("torch's dump prefix: TORCH_FR_DUMP_TEMP_FILE first, then its older name, else none", "[torch_dumps]") {
  CHECK(torchDumpPrefix({{"TORCH_FR_DUMP_TEMP_FILE", "/a/fr_"}, {"TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "/b/nccl_"}}) ==
        "/a/fr_");
  CHECK(torchDumpPrefix({{"TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "/b/nccl_"}}) == "/b/nccl_");
  CHECK(torchDumpPrefix({{"TORCH_FR_DUMP_TEMP_FILE", ""}}).empty());
  CHECK(torchDumpPrefix({}).empty());
}

TEST_CASE("a dump counts when written after its worker started, and is read once its size holds", "[torch_dumps]") {
  TempDir dir;
  // An older job's dump of rank 0 under the same prefix.
  std::ofstream(dir.file("torch_trace_rank_0")) << "an older job's dump";
  TorchDumps dumps(expectedDumps(dir.path(), 2));
  CHECK_FALSE(dumps.written());
  CHECK_FALSE(dumps.poll());
  CHECK(dumps.missing() == std::vector<int>{0, 1});

  writeRank(dir.path(), "behind", 1);
  CHECK(dumps.written() == 1);
  CHECK_FALSE(dumps.poll());  // first look at it: not read yet
  CHECK(dumps.dumps().empty());
  CHECK_FALSE(dumps.poll());  // handed to the reading thread; rank 0 still missing
  REQUIRE(dumps.waitForReads(10s));
  REQUIRE(dumps.dumps().size() == 1);
  CHECK(dumps.dumps()[0].rank == 1);
  CHECK(dumps.missing() == std::vector<int>{0});

  writeRank(dir.path(), "behind", 0);
  CHECK_FALSE(dumps.poll());
  CHECK_FALSE(dumps.poll());
  REQUIRE(dumps.waitForReads(10s));
  CHECK(dumps.poll());
  CHECK(dumps.missing().empty());
  CHECK(dumps.unreadable().empty());
  CHECK(dumps.writtenRanks() == std::vector<int>{0, 1});
  auto read = dumps.dumps();
  REQUIRE(read.size() == 2);
  CHECK(dumpVerdict(read).culprits == std::vector<int>{1});
  // flight_dumps.py sets the files' time: 2023-11-14 22:13:40 UTC.
  CHECK(dumps.newestNs() == (1'700'000'000LL + 20) * 1'000'000'000LL);
}

TEST_CASE("a dump that grows between two looks is read when it holds still", "[torch_dumps]") {
  TempDir dir;
  TorchDumps dumps(expectedDumps(dir.path(), 1));
  const std::string path = dir.file("torch_trace_rank_0");
  writeRank(dir.path(), "behind", 0);
  const std::string whole = readFile(path);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << whole.substr(0, whole.size() / 2);
  CHECK_FALSE(dumps.poll());
  std::ofstream(path, std::ios::binary | std::ios::trunc) << whole;
  CHECK_FALSE(dumps.poll());  // it grew: not read yet
  CHECK_FALSE(dumps.poll());  // being read
  REQUIRE(dumps.waitForReads(10s));
  CHECK(dumps.poll());
  CHECK(dumps.dumps().size() == 1);
  CHECK(dumps.unreadable().empty());
}

TEST_CASE("a corrupt dump is named, once, and settles the gathering", "[torch_dumps]") {
  TempDir dir;
  TorchDumps dumps(expectedDumps(dir.path(), 2));
  writeRank(dir.path(), "corrupt", 0);
  writeRank(dir.path(), "corrupt", 1);
  CHECK_FALSE(dumps.poll());
  CHECK_FALSE(dumps.poll());
  REQUIRE(dumps.waitForReads(10s));
  CHECK(dumps.poll());
  CHECK(dumps.dumps().size() == 1);
  const auto unreadable = dumps.unreadable();
  REQUIRE(unreadable.size() == 1);
  CHECK_THAT(unreadable[0], Catch::StartsWith("rank 1: " + dir.file("torch_trace_rank_1") + ": "));
  CHECK(dumps.poll());  // not read again at the same size
}

// Issue 44: a dump that took 30 s to parse froze the agent's event loop (its SIGTERM unanswered)
// while poll() read it. The reading is a thread's now: poll() hands the dump over and returns,
// and destroying the gathering cancels the read in flight.
TEST_CASE("a dump that takes long to read holds up neither poll nor the end of the gathering", "[torch_dumps]") {
  TempDir dir;
  std::atomic<bool> started{false};
  // A stand-in for a reader on a dump that would take minutes: it runs until cancelled, woken
  // by the cancel itself. The watchdog bounds both waits on the atomics, which have no timeout.
  DumpReader slow = [&](const std::string& path, int, const PickleLimits& limits) -> FlightDump {
    started = true;
    started.notify_all();
    if (limits.cancel != nullptr) limits.cancel->wait(false);
    throw FlightDumpError(path + ": cancelled");
  };
  Watchdog guard(60s, "the slow read's start and its cancel");
  const auto start = std::chrono::steady_clock::now();
  {
    TorchDumps dumps(expectedDumps(dir.path(), 1), slow);
    writeRank(dir.path(), "behind", 0);
    CHECK_FALSE(dumps.poll());
    const auto before = std::chrono::steady_clock::now();
    CHECK_FALSE(dumps.poll());  // handed over
    CHECK_FALSE(dumps.poll());  // still being read
    CHECK(std::chrono::steady_clock::now() - before < 2s);
    started.wait(false);
    CHECK_FALSE(dumps.waitForReads(0ms));  // the stand-in ends only when cancelled
    CHECK(started);
    REQUIRE(dumps.unreadable().size() == 1);
    CHECK(dumps.unreadable()[0] == "rank 0: " + dir.file("torch_trace_rank_0") + ": still being read");
  }
  // The destructor cancelled the read (the stand-in's only way out) and joined the thread.
  CHECK(std::chrono::steady_clock::now() - start < 30s);
}

TEST_CASE("a dump whose read fails comes back as its error, the others read", "[torch_dumps]") {
  TempDir dir;
  DumpReader reader = [](const std::string& path, int rank, const PickleLimits& limits) -> FlightDump {
    if (rank == 1) throw std::bad_alloc();
    return readFlightDumpFile(path, rank, limits);
  };
  TorchDumps dumps(expectedDumps(dir.path(), 2), reader);
  writeRank(dir.path(), "behind", 0);
  writeRank(dir.path(), "behind", 1);
  CHECK_FALSE(dumps.poll());
  CHECK_FALSE(dumps.poll());
  REQUIRE(dumps.waitForReads(10s));
  CHECK(dumps.poll());
  CHECK(dumps.dumps().size() == 1);
  CHECK(dumps.unreadable() ==
        std::vector<std::string>{"rank 1: " + dir.file("torch_trace_rank_1") + ": out of memory while reading it"});
}
