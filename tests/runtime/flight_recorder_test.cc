// The flight recorder of a host-backend group, with ranks as threads: every collective
// leaves a record with its label and final state in the rank's ring file, a failed one
// is recorded as failed, and DDPRUN_FLIGHT_RECORDER=0 turns recording off.
#include "worker_runtime/flight_recorder.h"

#include <stdlib.h>
#include <unistd.h>

#include <filesystem>

#include <fmt/format.h>
#include <catch2/catch.hpp>

#include "common/error.h"
#include "tests/runtime/support/thread_ranks.h"
#include "tests/support/scoped_env.h"
#include "worker_runtime/collectives/algorithms.h"

namespace {

using namespace ddprun::runtime;
using namespace ddprun::testing;
using ddprun::FlightOp;
using ddprun::FlightState;

struct TempFlightDir {
  TempFlightDir() {
    char name[] = "/tmp/flight_recorder_test.XXXXXX";
    if (!::mkdtemp(name)) throw std::runtime_error("mkdtemp failed");
    path = name;
  }
  ~TempFlightDir() { std::filesystem::remove_all(path); }
  std::string path;
};

}  // namespace

TEST_CASE("each collective of a group is recorded in the rank's ring file with its label and final state") {
  TempFlightDir dir;
  ScopedEnv flight_dir("DDPRUN_FLIGHT_DIR", dir.path);
  ScopedEnv on("DDPRUN_FLIGHT_RECORDER", std::nullopt);
  HostBackendOptions options;
  options.flight_group = 3;
  REQUIRE_NOTHROW(runRanks(2, options, [&](HostBackend& b) {
    std::vector<float> buf(100, 1.0f);
    b.enqueue([&](CollectiveContext& ctx) { allReduce(ctx, buf.data(), buf.size(), DType::kFloat32, ReduceOp::kSum); },
              {FlightOp::kAllReduce, ddprun::FlightDType::kFloat32, buf.size(), -1})
        ->wait();
    b.enqueue([&](CollectiveContext& ctx) { barrier(ctx); }, {FlightOp::kBarrier, ddprun::FlightDType::kNone, 0, -1})
        ->wait();
    // A failing collective: its record must say so.
    try {
      b.enqueue([](CollectiveContext&) { throw PeerError("injected failure"); },
                {FlightOp::kBroadcast, ddprun::FlightDType::kInt64, 8, 1})
          ->wait();
    } catch (const PeerError&) {
    }
    const std::string expected = fmt::format("{}/rank{}.group3.ring", dir.path, b.rank());
    if (b.flightRecorder().path() != expected) throw std::runtime_error("ring at " + b.flightRecorder().path());
  }));
  for (int rank = 0; rank < 2; ++rank) {
    INFO("rank " << rank);
    auto ring = ddprun::readFlightRingFile(fmt::format("{}/rank{}.group3.ring", dir.path, rank));
    REQUIRE(ring);
    CHECK(ring->rank == rank);
    CHECK(ring->group == 3);
    CHECK(ring->group_rank == rank);
    CHECK(ring->group_size == 2);
    REQUIRE(ring->records.size() == 3);
    CHECK(ring->records[0].info.op == FlightOp::kAllReduce);
    CHECK(ring->records[0].info.count == 100);
    CHECK(ring->records[0].state == FlightState::kCompleted);
    CHECK(ring->records[0].enqueued_ns <= ring->records[0].started_ns);
    CHECK(ring->records[0].started_ns <= ring->records[0].ended_ns);
    CHECK(ring->records[1].info.op == FlightOp::kBarrier);
    CHECK(ring->records[1].state == FlightState::kCompleted);
    CHECK(ring->records[2].info.op == FlightOp::kBroadcast);
    CHECK(ring->records[2].info.root == 1);
    CHECK(ring->records[2].state == FlightState::kFailed);
  }
}

TEST_CASE("DDPRUN_FLIGHT_RECORDER=0 turns the recorder off and a value that is not a boolean is refused") {
  TempFlightDir dir;
  ScopedEnv flight_dir("DDPRUN_FLIGHT_DIR", dir.path);
  {
    ScopedEnv off("DDPRUN_FLIGHT_RECORDER", "0");
    CHECK_FALSE(FlightRecorder::fromEnvironment(0, 0, 0, 1).on());
    CHECK(std::filesystem::is_empty(dir.path));
  }
  {
    ScopedEnv bad("DDPRUN_FLIGHT_RECORDER", "maybe");
    CHECK_THROWS_AS(FlightRecorder::fromEnvironment(0, 0, 0, 1), ddprun::UsageError);
  }
  ScopedEnv unset("DDPRUN_FLIGHT_RECORDER", std::nullopt);
  auto recorder = FlightRecorder::fromEnvironment(4, 0, 0, 1);
  CHECK(recorder.on());
  CHECK(recorder.path() == dir.path + "/rank4.group0.ring");
  // Without a directory it records into private memory: nothing to read, nothing to remove.
  ScopedEnv no_dir("DDPRUN_FLIGHT_DIR", std::nullopt);
  auto private_recorder = FlightRecorder::fromEnvironment(4, 0, 0, 1);
  CHECK(private_recorder.on());
  CHECK(private_recorder.path().empty());
}
