// The wait for this node's torch dumps (agent/hang/verdicts/dump_settling.h) alone, on a
// manual clock that the caller's loop moves: it ends once every dump is read, after a second
// when no dump at all was written, and after three when some rank's never comes. Nothing
// sleeps: each look's wait is the clock moved on.
#include "agent/hang/verdicts/dump_settling.h"

#include <fstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "agent/torch_trace/torch_dumps.h"
#include "tests/agent/torch_trace/dumps_support.h"
#include "tests/support/manual_clock.h"
#include "tests/support/test_process.h"

namespace ddprun::agent {
namespace {

using std::chrono::milliseconds;

// Any written file reads as a dump of its rank, without entries.
FlightDump readAny(const std::string&, int rank, const PickleLimits&) {
  FlightDump d;
  d.rank = rank;
  d.version = "2.4";
  return d;
}

}  // namespace

TEST_CASE("dump settling: no dump written within a second means none is coming", "[unit]") {
  testing::TempDir dir;
  testing::ManualClock clock;
  TorchDumps dumps(testing::expectedDumps(dir.path(), 2), readAny);
  int looks = 0;
  const auto waited = settleTorchDumps(dumps, clock, [&](Clock::Duration d) {
    ++looks;
    clock.advance(d);
  });
  CHECK(waited == kTorchFirstDumpWait);
  CHECK(looks == 10);  // 100 ms apart
}

TEST_CASE("dump settling: a rank's dump that never comes is waited for three seconds, the others' read", "[unit]") {
  testing::TempDir dir;
  testing::ManualClock clock;
  TorchDumps dumps(testing::expectedDumps(dir.path(), 2), readAny);
  std::ofstream(dir.path() + "/torch_trace_rank_0") << "rank 0's dump";
  const auto waited = settleTorchDumps(dumps, clock, [&](Clock::Duration d) {
    dumps.waitForReads(std::chrono::seconds(10));  // the reading thread, as the agent's loop runs meanwhile
    clock.advance(d);
  });
  CHECK(waited == kTorchDumpWait);
  CHECK(dumps.dumps().size() == 1);
  CHECK(dumps.missing() == std::vector<int>{1});
}

TEST_CASE("dump settling: the wait ends as soon as every dump is read", "[unit]") {
  testing::TempDir dir;
  testing::ManualClock clock;
  TorchDumps dumps(testing::expectedDumps(dir.path(), 2), readAny);
  std::ofstream(dir.path() + "/torch_trace_rank_0") << "rank 0's dump";
  std::ofstream(dir.path() + "/torch_trace_rank_1") << "rank 1's dump";
  const auto waited = settleTorchDumps(dumps, clock, [&](Clock::Duration d) {
    dumps.waitForReads(std::chrono::seconds(10));
    clock.advance(d);
  });
  CHECK(waited < kTorchFirstDumpWait);
  CHECK(dumps.dumps().size() == 2);
}

}  // namespace ddprun::agent
