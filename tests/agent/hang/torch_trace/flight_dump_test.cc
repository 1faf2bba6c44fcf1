#include "agent/hang/torch_trace/flight_dump.h"

#include <catch2/catch.hpp>

#include "tests/agent/hang/torch_trace/dumps_support.h"

namespace ddprun::agent {
namespace {

std::string errorOf(const std::string& path) {
  try {
    readFlightDumpFile(path, 1);
  } catch (const FlightDumpError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST_CASE("flight dump: every field of torch's entries, from Python's pickle and torch's own pickler alike",
          "[flight_dump]") {
  for (const char* style : {"python", "torch", "torch-tagged"}) {
    INFO(style);
    testing::TempDir dir;
    REQUIRE(testing::writeDumps(dir.path(), "groups", style, 4).exit_code == 0);
    FlightDump d = readFlightDumpFile(dir.file("nccl_trace_rank_1"), 1);
    CHECK(d.rank == 1);
    CHECK(d.version == "2.10");
    CHECK_FALSE(d.truncated);
    REQUIRE(d.groups.size() == 2);
    CHECK(d.groups[0].name == "0");
    CHECK(d.groups[0].desc == "default_pg");
    CHECK(d.groups[0].ranks == std::vector<int>{0, 1, 2});
    CHECK(d.groups[1].ranks == std::vector<int>{1, 2});
    REQUIRE(d.entries.size() == 2);
    const FlightEntry& e = d.entries[1];
    CHECK(e.record_id == 1);
    CHECK(e.pg_name == "1");
    CHECK(e.pg_desc == "tp");
    CHECK(e.collective_seq_id == 1);
    CHECK(e.profiling_name == "nccl:all_reduce");
    CHECK(e.op == "all_reduce");
    CHECK_FALSE(e.is_p2p);
    CHECK(e.input_sizes == std::vector<std::vector<int64_t>>{{8}});
    CHECK(e.output_sizes == std::vector<std::vector<int64_t>>{{8}});
    CHECK(e.input_dtypes == std::vector<std::string>{"Float"});
    CHECK(e.state == FlightEntryState::kStarted);
    CHECK(e.time_created_ns == 1'700'000'010'000'000'000);
    CHECK(e.time_started_ns == 1'700'000'010'000'000'000);
    CHECK_FALSE(e.time_completed_ns);
    CHECK(e.timeout_ms == 10000);
    REQUIRE(e.frames.size() == 4);
    CHECK(e.frames[2].filename == "/job/train.py");
    CHECK(e.frames[2].line == 50);
    auto site = callSite(e.frames);
    REQUIRE(site);
    CHECK(site->name == "main");
    CHECK(site->line == 50);
    CHECK(d.entries[0].time_completed_ns.has_value());
  }
}

TEST_CASE("flight dump: send and recv name their ends in group ranks", "[flight_dump]") {
  testing::TempDir dir;
  REQUIRE(testing::writeDumps(dir.path(), "p2p").exit_code == 0);
  auto dumps = testing::readDumps(dir.path(), 2);
  const FlightEntry& send = dumps[0].entries[1];
  CHECK(send.op == "send");
  CHECK(send.is_p2p);
  CHECK(send.p2p_src == 0);
  CHECK(send.p2p_dst == 1);
  CHECK(send.p2p_seq_id == 1);
  const FlightEntry& recv = dumps[1].entries[1];
  CHECK(recv.op == "recv");
  CHECK(recv.p2p_src == 0);
  CHECK(recv.p2p_dst == 1);
}

TEST_CASE("flight dump: a ring that overwrote its oldest entries is marked truncated", "[flight_dump]") {
  testing::TempDir dir;
  REQUIRE(testing::writeDumps(dir.path(), "truncated_ring").exit_code == 0);
  CHECK(testing::readDumps(dir.path(), 2)[0].truncated);
}

TEST_CASE("flight dump: bad dumps end in one error naming the file and the place", "[flight_dump]") {
  testing::TempDir dir;
  const std::string f = dir.file("nccl_trace_rank_1");
  SECTION("a value of the wrong type") {
    REQUIRE(testing::writeDumps(dir.path(), "bad_type").exit_code == 0);
    CHECK(errorOf(f) == f + ": entry 0: 'collective_seq_id' is a string, not a int");
  }
  SECTION("a pickle of something else") {
    REQUIRE(testing::writeDumps(dir.path(), "not_a_dict").exit_code == 0);
    CHECK(errorOf(f) == f + ": the pickle holds a list, not the dict of a flight-recorder dump");
  }
  SECTION("truncated") {
    REQUIRE(testing::writeDumps(dir.path(), "truncated").exit_code == 0);
    CHECK(errorOf(f) == f + ": not a readable pickle: truncated: a string of 24 bytes at byte 191 runs past the end "
                            "of the pickle (200 bytes)");
  }
  SECTION("a hostile global") {
    REQUIRE(testing::writeDumps(dir.path(), "evil_global").exit_code == 0);
    CHECK(
        errorOf(f) ==
        f + ": not a readable pickle: at byte 2: the pickle calls os.system, which a flight-recorder dump never does");
  }
  SECTION("not a regular file, or none") {
    CHECK(errorOf(dir.path()) == dir.path() + ": not a regular file");
    CHECK(errorOf(dir.file("nope")) == dir.file("nope") + ": cannot read it: No such file or directory");
  }
  SECTION("a dict without a version") {
    std::string bytes = "\x80\x02}.";
    CHECK_THROWS_WITH(parseFlightDump(bytes, "x"), "x: no 'version': not a flight-recorder dump");
  }
}

TEST_CASE("flight dump: the call site is the innermost frame outside torch", "[flight_dump]") {
  std::vector<FlightFrame> frames = {{"all_reduce", "/usr/lib/python3/dist-packages/torch/distributed/c10d.py", 1},
                                     {"step", "/venv/lib/python3.11/site-packages/accelerate/a.py", 2},
                                     {"train", "/job/train.py", 3}};
  CHECK(callSite(frames)->name == "train");
  frames.pop_back();
  CHECK(callSite(frames)->name == "step");
  frames.pop_back();
  CHECK(callSite(frames)->name == "all_reduce");
  CHECK_FALSE(callSite({}));
}

}  // namespace
}  // namespace ddprun::agent
