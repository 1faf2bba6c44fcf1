// `ddprun hang-report DIR` through the real binary, on directories of flight-recorder dumps
// that tests/agent/torch_trace/flight_dumps.py writes: the verdict on stdout and exit 0; a
// corrupt, truncated or missing dump exits 4 with one line; an empty directory, a wrong
// prefix or a bad flag exits 2 with one line. Nothing crashes or hangs.
#include <sys/stat.h>

#include <sstream>
#include <string>

#include <catch2/catch.hpp>

#include "tests/agent/torch_trace/dumps_support.h"
#include "tests/support/sanitizers.h"
#include "tests/support/test_process.h"

using namespace ddprun::testing;

namespace {

RunResult hangReport(const std::vector<std::string>& extra) {
  std::vector<std::string> args = {ddprunPath(), "hang-report"};
  args.insert(args.end(), extra.begin(), extra.end());
  return run(args, {}, 30s);
}

// The dumps of `scenario`, then ddprun hang-report on them.
RunResult reportOn(const TempDir& dir, const std::string& scenario, const std::string& style = "python") {
  auto written = writeDumps(dir.path(), scenario, style);
  REQUIRE(written.exit_code == 0);
  return hangReport({dir.path()});
}

// One line on stderr, none on stdout.
void requireOneErrorLine(const RunResult& r) {
  INFO(r.err);
  CHECK(r.out.empty());
  CHECK(countOf(r.err, "\n") == 1);
  CHECK(r.term_signal == 0);
}

TEST_CASE("hang-report names the rank behind, with both call sites", "[hang_report]") {
  TempDir dir;
  RunResult r = reportOn(dir, "behind", "torch");
  INFO(r.err);
  CHECK(r.exit_code == 0);
  CHECK(r.out ==
        "hang: rank 1 has not called all_reduce #2 of group 0 (default_pg); rank 0 has waited in it for 10.0 s — "
        "rank 1 is behind\n"
        "  rank 0: waiting in all_reduce #2 (started), called at /job/train.py:14 in main\n"
        "  rank 1: behind, last called all_reduce #1 (completed) at /job/train.py:12 in main\n");
}

TEST_CASE("hang-report names the rank that called another op, size or dtype", "[hang_report]") {
  TempDir op, size, dtype;
  CHECK(reportOn(op, "mismatch_op")
            .out.find("hang: rank 1 called broadcast where rank 0 called all_reduce (#2 of "
                      "group 0 (default_pg)) — rank 1 mismatches\n") == 0);
  CHECK(reportOn(size, "mismatch_size")
            .out.find("hang: rank 1 called all_reduce with input sizes [[4]] where ranks "
                      "0,2 have [[8]]") == 0);
  CHECK(reportOn(dtype, "mismatch_dtype")
            .out.find("hang: rank 1 called all_reduce of dtype Int where rank 0 has "
                      "Float") == 0);
}

TEST_CASE("hang-report matches sends to recvs and follows the hang across process groups", "[hang_report]") {
  TempDir p2p, groups;
  RunResult a = reportOn(p2p, "p2p");
  CHECK(a.exit_code == 0);
  CHECK(a.out.find("hang: rank 1 has not called the recv from rank 0; rank 0 has waited in send to rank 1 (p2p #2 "
                   "of group 0 (default_pg)) for 10.0 s — rank 1 is behind\n") == 0);
  RunResult b = reportOn(groups, "groups", "torch-tagged");
  CHECK(b.exit_code == 0);
  CHECK(b.out.find("hang: rank 2 has not called all_reduce #1 of group 1 (tp); rank 1 has waited in it for 10.0 s — "
                   "rank 2 is behind\n") != std::string::npos);
  CHECK(b.out.find("hang: root cause rank 2\n") != std::string::npos);
}

TEST_CASE("hang-report says so when the dumps show no hang", "[hang_report]") {
  TempDir dir;
  RunResult r = reportOn(dir, "done");
  CHECK(r.exit_code == 0);
  CHECK(r.out == "no hang: the dumps of 2 ranks agree on every operation of 1 group, and none is pending\n");
}

TEST_CASE("hang-report reads dumps under another prefix with --prefix", "[hang_report]") {
  TempDir dir;
  auto written = run({"/usr/bin/python3", flightDumpsScript(), dir.path(), "behind", "--prefix", "fr_"}, {}, 60s);
  REQUIRE(written.exit_code == 0);
  RunResult plain = hangReport({dir.path()});
  CHECK(plain.exit_code == 2);
  CHECK(plain.err == "ddprun: error: hang-report: no dump named nccl_trace_rank_<rank> in " + dir.path() +
                         " (torch writes them under the prefix of TORCH_NCCL_DEBUG_INFO_TEMP_FILE; another one: "
                         "--prefix)\n");
  RunResult prefixed = hangReport({"--prefix", "fr_", dir.path()});
  CHECK(prefixed.exit_code == 0);
  CHECK(prefixed.out.find("rank 1 is behind") != std::string::npos);
}

TEST_CASE("hang-report: a rank without a dump exits 4 with one line", "[hang_report]") {
  TempDir dir;
  RunResult r = reportOn(dir, "missing");
  CHECK(r.exit_code == 4);
  requireOneErrorLine(r);
  CHECK(r.err == "ddprun: hang-report: no dump of rank 1 in " + dir.path() + " (expected " + dir.path() +
                     "/nccl_trace_rank_1); the dumps there are of ranks 0,2 (of 3 in all)\n");
}

TEST_CASE("hang-report: a corrupt or truncated dump exits 4 with one line naming it", "[hang_report]") {
  for (const char* scenario : {"corrupt", "truncated", "not_a_dict", "bad_type", "evil_global"}) {
    INFO(scenario);
    TempDir dir;
    RunResult r = reportOn(dir, scenario);
    CHECK(r.exit_code == 4);
    requireOneErrorLine(r);
    CHECK(r.err.find("ddprun: hang-report: " + dir.file("nccl_trace_rank_1") + ": ") == 0);
  }
}

TEST_CASE("hang-report: deep nesting and huge lengths exit 4 at once, without a crash", "[hang_report][fuzz]") {
  for (const char* scenario : {"deep", "huge_string"}) {
    INFO(scenario);
    TempDir dir;
    const auto start = std::chrono::steady_clock::now();
    RunResult r = reportOn(dir, scenario);
    CHECK(std::chrono::steady_clock::now() - start < 20s);
    CHECK(r.exit_code == 4);
    requireOneErrorLine(r);
  }
  TempDir dir;
  CHECK(reportOn(dir, "deep").err.find("nesting deeper than 512") != std::string::npos);
}

TEST_CASE("hang-report: an empty directory, no directory, a FIFO or a bad flag is a usage error", "[hang_report]") {
  TempDir dir;
  RunResult empty = hangReport({dir.path()});
  CHECK(empty.exit_code == 2);
  requireOneErrorLine(empty);
  RunResult none = hangReport({dir.file("nope")});
  CHECK(none.exit_code == 2);
  CHECK(none.err == "ddprun: error: hang-report: " + dir.file("nope") + " is not a directory\n");
  RunResult missing_dir = hangReport({});
  CHECK(missing_dir.exit_code == 2);
  requireOneErrorLine(missing_dir);
  RunResult bad_prefix = hangReport({"--prefix", "a/b", dir.path()});
  CHECK(bad_prefix.exit_code == 2);
  requireOneErrorLine(bad_prefix);
  // A FIFO named like a dump must not block the read.
  REQUIRE(::mkfifo(dir.file("nccl_trace_rank_0").c_str(), 0600) == 0);
  RunResult fifo = hangReport({dir.path()});
  CHECK(fifo.finished);
  CHECK(fifo.exit_code == 4);
  CHECK(fifo.err == "ddprun: hang-report: " + dir.file("nccl_trace_rank_0") + ": not a regular file\n");
}

// Issue 44: dumps built to amplify memory or time (64 MB of None, 96 MB of memoized None,
// 48 MB of nested lists, a 140 KB memo bomb that expanded to 2 GB, 0.46 MB of duplicate keys
// that took 30 s) read within the reader's bounds: under a 1 GiB address-space cap, each ends
// in its verdict or one line and exit 4, in seconds, never in bad_alloc.
TEST_CASE("hang-report: dumps built to amplify memory and time answer under a 1 GiB address-space cap",
          "[hang_report][fuzz]") {
  for (const char* scenario : {"tiny_nones", "tiny_memos", "tiny_lists", "memo_bomb", "dup_keys"}) {
    INFO(scenario);
    TempDir dir;
    REQUIRE(writeDumps(dir.path(), scenario).exit_code == 0);
    // A sanitized build's shadow memory does not fit any such cap: there, only the outcome.
    const std::string cap = kSanitizedHeap ? "" : "ulimit -v 1048576 && ";
    const auto start = std::chrono::steady_clock::now();
    RunResult r = run({"/bin/sh", "-c", cap + "exec \"$0\" hang-report \"$1\"", ddprunPath(), dir.path()}, {}, 90s);
    INFO(r.out << r.err);
    CHECK(r.finished);
    CHECK(std::chrono::steady_clock::now() - start < 60s);
    CHECK(r.term_signal == 0);
    if (std::string(scenario).rfind("tiny_", 0) == 0) {
      // No 'version' (or, for the lists, more memory than the bound): one line naming the file.
      CHECK(r.exit_code == 4);
      requireOneErrorLine(r);
      CHECK(r.err.find("ddprun: hang-report: " + dir.file("nccl_trace_rank_0") + ": ") == 0);
    } else {
      CHECK(r.exit_code == 0);
      CHECK_THAT(r.out, Catch::Contains("rank 0"));
    }
    // The verdict quotes a bounded piece of what the dump holds: 30,000 entries of one call
    // once made one 330 KB line of "all_reduce+all_reduce+...".
    std::istringstream lines(r.out + r.err);
    for (std::string line; std::getline(lines, line);) CHECK(line.size() < 4096);
  }
}

}  // namespace
