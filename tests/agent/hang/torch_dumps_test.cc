// Gathering the local ranks' torch flight-recorder dumps (agent/hang/torch_dumps.h), on files that
// tests/agent/hang/torch_trace/flight_dumps.py writes: a file already there when the worker started
// does not count, a dump is read once two looks find the same size, and a missing or corrupt
// one is named. No clock: each poll() is one look.
#include "agent/hang/torch_dumps.h"

#include <fstream>

#include <catch2/catch.hpp>

#include "agent/hang/torch_trace/dump_verdict.h"

#include "tests/agent/hang/torch_trace/dumps_support.h"

using namespace ddprun::agent;
using namespace ddprun::testing;

namespace {

std::vector<ExpectedDump> expect(const std::string& dir, int n) {
  std::vector<ExpectedDump> expected;
  for (int r = 0; r < n; ++r) {
    const std::string path = dir + "/torch_trace_rank_" + std::to_string(r);
    expected.push_back(ExpectedDump{r, path, stampOf(path)});
  }
  return expected;
}

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
  TorchDumps dumps(expect(dir.path(), 2));
  CHECK_FALSE(dumps.written());
  CHECK_FALSE(dumps.poll());
  CHECK(dumps.missing() == std::vector<int>{0, 1});

  writeRank(dir.path(), "behind", 1);
  CHECK(dumps.written() == 1);
  CHECK_FALSE(dumps.poll());  // first look at it: not read yet
  CHECK(dumps.dumps().empty());
  CHECK_FALSE(dumps.poll());  // read; rank 0 still missing
  REQUIRE(dumps.dumps().size() == 1);
  CHECK(dumps.dumps()[0].rank == 1);
  CHECK(dumps.missing() == std::vector<int>{0});

  writeRank(dir.path(), "behind", 0);
  CHECK_FALSE(dumps.poll());
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
  TorchDumps dumps(expect(dir.path(), 1));
  const std::string path = dir.file("torch_trace_rank_0");
  writeRank(dir.path(), "behind", 0);
  const std::string whole = readFile(path);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << whole.substr(0, whole.size() / 2);
  CHECK_FALSE(dumps.poll());
  std::ofstream(path, std::ios::binary | std::ios::trunc) << whole;
  CHECK_FALSE(dumps.poll());  // it grew: not read yet
  CHECK(dumps.poll());
  CHECK(dumps.dumps().size() == 1);
  CHECK(dumps.unreadable().empty());
}

TEST_CASE("a corrupt dump is named, once, and settles the gathering", "[torch_dumps]") {
  TempDir dir;
  TorchDumps dumps(expect(dir.path(), 2));
  writeRank(dir.path(), "corrupt", 0);
  writeRank(dir.path(), "corrupt", 1);
  CHECK_FALSE(dumps.poll());
  CHECK(dumps.poll());
  CHECK(dumps.dumps().size() == 1);
  const auto unreadable = dumps.unreadable();
  REQUIRE(unreadable.size() == 1);
  CHECK_THAT(unreadable[0], Catch::StartsWith("rank 1: " + dir.file("torch_trace_rank_1") + ": "));
  CHECK(dumps.poll());  // not read again at the same size
}
