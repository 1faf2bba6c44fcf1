// --hang_timeout's parts over the rings (agent/hang/rings/hang_timeout.h) alone: how often
// it looks, which rings are this node's ranks', its trigger, and what it says when no ring
// showed up within a timeout.
#include "agent/hang/rings/hang_timeout.h"

#include <chrono>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

namespace ddprun::agent {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

FlightRingSnapshot ringOf(int rank, FlightRingKind kind, uint64_t completed) {
  FlightRingSnapshot s;
  s.kind = kind;
  s.rank = rank;
  s.group_rank = rank;
  s.group_size = 4;
  for (uint64_t seq = 1; seq <= completed; ++seq) {
    s.records.push_back({seq,
                         {FlightOp::kAllReduce, FlightDType::kFloat32, 16, -1},
                         FlightState::kCompleted,
                         0,
                         1000000000,
                         1000000000});
  }
  s.last_seq = completed;
  return s;
}

}  // namespace

TEST_CASE("hang timeout: a few looks per timeout, at most one a second, at least 50 ms apart", "[unit]") {
  CHECK(hangTimeoutLook(seconds(2)) == milliseconds(500));
  CHECK(hangTimeoutLook(seconds(600)) == seconds(1));
  CHECK(hangTimeoutLook(milliseconds(100)) == milliseconds(50));
}

TEST_CASE("hang timeout: the positions of this node's ranks' rings only, each of its rings", "[unit]") {
  const std::vector<FlightRingSnapshot> rings = {ringOf(0, FlightRingKind::kCollective, 3),
                                                 ringOf(2, FlightRingKind::kCollective, 5),
                                                 ringOf(0, FlightRingKind::kPointToPoint, 1)};
  const std::vector<RankPosition> positions = positionsOfRanks(rings, {0, 1}, 3000000000);
  REQUIRE(positions.size() == 2);
  CHECK((positions[0].rank == 0 && positions[0].kind == FlightRingKind::kCollective &&
         positions[0].last_completed_seq == 3));
  CHECK((positions[1].rank == 0 && positions[1].kind == FlightRingKind::kPointToPoint));
  CHECK(positions[0].last_completed_age_s == Approx(2.0));
  CHECK(positionsOfRanks(rings, {1, 3}, 3000000000).empty());
}

TEST_CASE("hang timeout: its trigger, and what it says when no ring showed up", "[unit]") {
  CHECK(hangTimeoutTrigger(10) ==
        "--hang_timeout: no rank on this node completed an operation for 10 s while one was pending");
  CHECK(hangTimeoutTrigger(0.5) ==
        "--hang_timeout: no rank on this node completed an operation for 0.5 s while one was pending");

  // Python workers running with the hook: not yet in a collective, news only.
  NoRings said = noRingsLine(10, true, true, true);
  CHECK(said.level == spdlog::level::info);
  CHECK(said.line == "--hang_timeout 10 s: no worker on this node has called a torch.distributed collective yet");
  // The hook turned off: nothing to judge with, and why.
  said = noRingsLine(10, false, true, false);
  CHECK(said.level == spdlog::level::warn);
  CHECK(said.line ==
        "--hang_timeout 10 s: --no_python_stacks turns off ddprun's Python hook, which records the Python workers' "
        "collectives, so hangs cannot be judged here");
  // Workers that keep no rings at all: what can serve instead.
  for (bool python_workers : {false, true}) {
    said = noRingsLine(10, false, python_workers, true);
    CHECK(said.level == spdlog::level::warn);
    CHECK(said.line ==
          "--hang_timeout 10 s: no worker on this node keeps a flight recorder (C++ workers on ddprun's runtime and "
          "Python workers through ddprun's hook do), so hangs cannot be judged here; torch's file timer "
          "(TORCHELASTIC_ENABLE_FILE_TIMER=1) can serve instead");
  }
}

}  // namespace ddprun::agent
