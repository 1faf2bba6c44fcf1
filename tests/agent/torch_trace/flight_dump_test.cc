#include "agent/torch_trace/flight_dump.h"

#include <catch2/catch.hpp>

#include "tests/agent/torch_trace/capped_child.h"
#include "tests/agent/torch_trace/dumps_support.h"

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

// Issue 44: a 140 KB dump whose one entry dict (with a 100 KB frame name) is memoized and named
// by 20,000 entries was copied per entry: 2 GB, bad_alloc, no failure report. Its frames are
// one shared list now, and the copies that remain (its strings per entry) stay within the
// dump's budget: well under a 256 MiB cap, it reads, each entry sharing the one stack.
TEST_CASE("flight dump: one entry dict memoized and named by 20,000 entries reads without copying it 20,000 times",
          "[flight_dump]") {
  testing::TempDir dir;
  REQUIRE(testing::writeDumps(dir.path(), "memo_bomb").exit_code == 0);
  const std::string f = dir.file("nccl_trace_rank_0");
  const auto run = testing::inCappedChild(size_t{256} << 20, std::chrono::seconds(60), [&] {
    FlightDump d = readFlightDumpFile(f, 0);
    const bool shared = d.entries.size() == 20000 && d.entries.back().frames.sharedWith(d.entries.front().frames) &&
                        d.entries.back().frames[0].name.size() == 100000;
    return shared ? 0 : 1;
  });
  CHECK(run.finished);
  CHECK(run.exit_code == 0);
}

TEST_CASE("flight dump: what the entries copy is bounded, and beyond it one error names the entry", "[flight_dump]") {
  testing::TempDir dir;
  REQUIRE(testing::writeDumps(dir.path(), "memo_bomb").exit_code == 0);
  const std::string f = dir.file("nccl_trace_rank_0");
  PickleLimits limits;
  limits.dump_bytes_floor = 1 << 20;  // 1 MiB + 16 x 140 KB: a few thousand entries' copies
  CHECK_THROWS_WITH(readFlightDumpFile(f, 0, limits),
                    Catch::Matches(f + ": entry [0-9]+: the dump would take more than 3292448 bytes \\(16 times the "
                                       "pickle's 140242 bytes, plus 1048576\\), more than a flight-recorder dump "
                                       "ever does"));
}

// Issue 44: 0.46 MB whose one entry dict has 100,000 duplicate keys, named by 30,000 entries,
// took 30 s (each key of each entry a scan of the dict): a large dict is indexed now.
TEST_CASE("flight dump: a dict of 100,000 duplicate keys named by 30,000 entries reads in seconds", "[flight_dump]") {
  testing::TempDir dir;
  REQUIRE(testing::writeDumps(dir.path(), "dup_keys").exit_code == 0);
  const std::string f = dir.file("nccl_trace_rank_0");
  const auto run = testing::inCappedChild(size_t{1} << 30, std::chrono::seconds(20), [&] {
    FlightDump d = readFlightDumpFile(f, 0);
    return d.entries.size() == 30000 && d.entries.back().op_id == 7 && d.entries.back().op == "all_reduce" ? 0 : 1;
  });
  INFO(run.seconds << " s");
  CHECK(run.finished);
  CHECK(run.exit_code == 0);
}

TEST_CASE("flight dump: the newest max_entries entries are kept (marked truncated), the innermost max_frames frames",
          "[flight_dump]") {
  testing::TempDir dir;
  REQUIRE(testing::writeDumps(dir.path(), "behind", "torch").exit_code == 0);
  PickleLimits limits;
  limits.max_entries = 1;
  limits.max_frames = 2;
  FlightDump d = readFlightDumpFile(dir.file("nccl_trace_rank_0"), 0, limits);
  REQUIRE(d.entries.size() == 1);
  CHECK(d.truncated);
  CHECK(d.entries[0].record_id == 1);
  CHECK(d.entries[0].frames.size() == 2);
  CHECK(d.entries[0].frames[1].name == "wrapper");
}

TEST_CASE("flight dump: entries of one call site share their frames, and a cancelled read is one error",
          "[flight_dump]") {
  testing::TempDir dir;
  REQUIRE(testing::writeDumps(dir.path(), "done", "torch").exit_code == 0);
  const std::string f = dir.file("nccl_trace_rank_0");
  FlightDump d = readFlightDumpFile(f, 0);
  REQUIRE(d.entries.size() == 2);
  // Lines 12 and 14: two stacks, each read once.
  CHECK_FALSE(d.entries[0].frames.sharedWith(d.entries[1].frames));
  std::atomic<bool> cancel{true};
  PickleLimits limits;
  limits.cancel = &cancel;
  CHECK_THROWS_WITH(readFlightDumpFile(f, 0, limits), f + ": not a readable pickle: cancelled");
}

}  // namespace
}  // namespace ddprun::agent
