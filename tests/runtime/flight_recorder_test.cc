// The flight recorder of a host-backend group, with ranks as threads: every collective
// leaves a record with its label and final state in the rank's ring file, a failed one
// is recorded as failed, and DDPRUN_FLIGHT_RECORDER=0 turns recording off. Point-to-point
// messages go to the group's second ring, with the peer, count, dtype and state of each, and
// leave the collectives' sequence numbers alone.
#include "worker_runtime/flight_recorder.h"

#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <thread>

#include <fmt/format.h>
#include <catch2/catch.hpp>

#include "common/error.h"
#include "tests/runtime/support/thread_ranks.h"
#include "tests/support/scoped_env.h"
#include "tests/support/watchdog.h"
#include "worker_runtime/backend/host_collectives.h"

namespace {

using namespace ddprun::runtime;
using namespace ddprun::testing;
using ddprun::FlightDType;
using ddprun::FlightOp;
using ddprun::FlightRecord;
using ddprun::FlightRingKind;
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

namespace {

// Throws (rank bodies must not use Catch2) unless `r` is what `what` says.
void expectRecord(const FlightRecord& r, uint64_t seq, FlightOp op, int peer, uint64_t count, FlightDType dtype,
                  FlightState state, const std::string& what) {
  if (r.seq != seq || r.info.op != op || r.info.root != peer || r.info.count != count || r.info.dtype != dtype ||
      r.state != state) {
    throw std::runtime_error(fmt::format("{}: #{} {} peer {} {} {} {}", what, r.seq, ddprun::flightOpName(r.info.op),
                                         r.info.root, r.info.count, ddprun::flightDTypeName(r.info.dtype),
                                         ddprun::flightStateName(r.state)));
  }
}

}  // namespace

TEST_CASE("point-to-point messages are recorded in the group's second ring and leave the collective numbers alone") {
  TempFlightDir dir;
  ScopedEnv flight_dir("DDPRUN_FLIGHT_DIR", dir.path);
  ScopedEnv on("DDPRUN_FLIGHT_RECORDER", std::nullopt);
  HostBackendOptions options;
  options.flight_group = 2;
  REQUIRE_NOTHROW(runRanks(2, options, [&](HostBackend& b) {
    const auto deadline = [&] { return Clock::now() + kRankOpTimeout; };
    std::vector<float> sum(8, 1.0f);
    auto allReduce8 = [&] {
      b.enqueue(
           [&](CollectiveContext& ctx) { allReduce(ctx, sum.data(), sum.size(), DType::kFloat32, ReduceOp::kSum); },
           {FlightOp::kAllReduce, FlightDType::kFloat32, sum.size(), -1})
          ->wait();
    };
    auto barrierNow = [&] {
      b.enqueue([](CollectiveContext& ctx) { barrier(ctx); }, {FlightOp::kBarrier, FlightDType::kNone, 0, -1})->wait();
    };
    std::vector<float> four(4, 2.0f);
    std::vector<int64_t> three(3, 7);
    std::vector<char> five(5, 'x');
    allReduce8();
    if (b.rank() == 0) {
      // Two receives from rank 1, posted before it sends (it waits in the barrier): the first
      // is started, the second waits behind it.
      auto a = b.p2p().recv(1, 1, four.data(), 16, deadline(), {}, FlightDType::kFloat32);
      auto c = b.p2p().recv(1, 2, three.data(), 24, deadline(), {}, FlightDType::kInt64);
      auto ring = ddprun::readFlightRingFile(b.p2p().flightRecorder().path());
      if (!ring || ring->kind != FlightRingKind::kPointToPoint || ring->records.size() != 2) {
        throw std::runtime_error("no point-to-point ring with two messages at " + b.p2p().flightRecorder().path());
      }
      expectRecord(ring->records[0], 1, FlightOp::kRecv, 1, 4, FlightDType::kFloat32, FlightState::kStarted, "first");
      expectRecord(ring->records[1], 2, FlightOp::kRecv, 1, 3, FlightDType::kInt64, FlightState::kEnqueued, "second");
      barrierNow();
      a->wait();
      c->wait();
      b.p2p().send(1, 3, five.data(), five.size(), deadline())->wait();
      allReduce8();
      // A receive nobody sends for, with its deadline already passed: it fails.
      try {
        b.p2p().recv(1, 4, five.data(), five.size(), Clock::now())->wait();
      } catch (const PeerError&) {
      }
    } else {
      barrierNow();
      auto a = b.p2p().send(0, 1, four.data(), 16, deadline(), {}, FlightDType::kFloat32);
      b.p2p().send(0, 2, three.data(), 24, deadline(), {}, FlightDType::kInt64)->wait();
      a->wait();
      b.p2p().recv(0, 3, five.data(), five.size(), deadline())->wait();
      allReduce8();
    }
  }));
  for (int rank = 0; rank < 2; ++rank) {
    INFO("rank " << rank);
    // The collectives: all_reduce, barrier, all_reduce, numbered 1-3 whatever the messages between them.
    auto collectives = ddprun::readFlightRingFile(fmt::format("{}/rank{}.group2.ring", dir.path, rank));
    REQUIRE(collectives);
    CHECK(collectives->kind == FlightRingKind::kCollective);
    CHECK(collectives->last_seq == 3);
    REQUIRE(collectives->records.size() == 3);
    CHECK(collectives->records[0].info.op == FlightOp::kAllReduce);
    CHECK(collectives->records[1].info.op == FlightOp::kBarrier);
    CHECK(collectives->records[2].info.op == FlightOp::kAllReduce);
    CHECK(collectives->records[2].seq == 3);

    auto messages = ddprun::readFlightRingFile(fmt::format("{}/rank{}.group2.p2pring", dir.path, rank));
    REQUIRE(messages);
    CHECK(messages->kind == FlightRingKind::kPointToPoint);
    CHECK(messages->rank == rank);
    CHECK(messages->group == 2);
    CHECK(messages->group_rank == rank);
    const int peer = 1 - rank;
    const auto& m = messages->records;
    REQUIRE(m.size() == (rank == 0 ? 4u : 3u));
    const FlightOp in = FlightOp::kRecv, out = FlightOp::kSend;
    CHECK(m[0].info.op == (rank == 0 ? in : out));
    CHECK(m[1].info.op == (rank == 0 ? in : out));
    CHECK(m[2].info.op == (rank == 0 ? out : in));
    for (size_t i = 0; i < 3; ++i) {
      CHECK(m[i].seq == i + 1);
      CHECK(m[i].info.root == peer);
      CHECK(m[i].state == FlightState::kCompleted);
      CHECK(m[i].enqueued_ns <= m[i].started_ns);
      CHECK(m[i].started_ns <= m[i].ended_ns);
    }
    CHECK(m[0].info.dtype == FlightDType::kFloat32);
    CHECK(m[0].info.count == 4);
    CHECK(m[1].info.dtype == FlightDType::kInt64);
    CHECK(m[1].info.count == 3);
    CHECK(m[2].info.dtype == FlightDType::kNone);
    CHECK(m[2].info.count == 5);
    if (rank == 0) {
      CHECK(m[3].info.op == FlightOp::kRecv);
      CHECK(m[3].state == FlightState::kFailed);
      CHECK(m[3].ended_ns != 0);
    }
  }
}

TEST_CASE("DDPRUN_FLIGHT_RECORDER=0 turns off the point-to-point ring too") {
  TempFlightDir dir;
  ScopedEnv flight_dir("DDPRUN_FLIGHT_DIR", dir.path);
  ScopedEnv off("DDPRUN_FLIGHT_RECORDER", "0");
  REQUIRE_NOTHROW(runRanks(2, HostBackendOptions{}, [&](HostBackend& b) {
    char byte = 1;
    auto w = b.rank() == 0 ? b.p2p().send(1, 0, &byte, 1, Clock::now() + kRankOpTimeout)
                           : b.p2p().recv(0, 0, &byte, 1, Clock::now() + kRankOpTimeout);
    w->wait();
    if (b.p2p().flightRecorder().on() || b.flightRecorder().on()) throw std::runtime_error("a recorder is on");
  }));
  CHECK(std::filesystem::is_empty(dir.path));
}

TEST_CASE("ops queued by another thread while a synchronous one runs inline run after it, recorded in that order") {
  // The inline op owns the group without a lock; ops queued meanwhile must wait for it and
  // get their records (numbered after its) only when it ends. Each round holds the inline op
  // until the other thread has queued its ops, so every round takes that handoff.
  TempFlightDir dir;
  ScopedEnv flight_dir("DDPRUN_FLIGHT_DIR", dir.path);
  ScopedEnv on("DDPRUN_FLIGHT_RECORDER", std::nullopt);
  constexpr int kRounds = 60, kQueuedPerRound = 3;  // 240 ops: within the ring's 256 slots
  REQUIRE_NOTHROW(runRanks(1, HostBackendOptions{}, [&](HostBackend& b) {
    std::vector<uint64_t> ran;  // op ids in the order they ran; a race shows as an overlap
    std::atomic<bool> inside{false}, overlap{false};
    auto body = [&](uint64_t id) {
      if (inside.exchange(true)) overlap = true;
      ran.push_back(id);
      inside = false;
    };
    auto info = [](uint64_t id) { return ddprun::FlightOpInfo{FlightOp::kAllReduce, FlightDType::kInt32, id, -1}; };
    // The two threads hand over by waiting on these atomics (notified at each store); kStopped
    // ends the other thread. A guard ends the process if a handover never comes.
    constexpr int kStopped = -2;
    std::atomic<int> round_inline{-1}, queued_in_round{0};
    ddprun::testing::Watchdog watchdog(std::chrono::seconds(60), "the handover between the inline op and the queuer");
    std::vector<WorkPtr> works(kRounds * kQueuedPerRound);
    std::thread queuer([&] {
      for (int r = 0; r < kRounds; ++r) {
        for (int seen = round_inline.load(); seen != r; seen = round_inline.load()) {
          if (seen == kStopped) return;
          round_inline.wait(seen);
        }
        for (int k = 0; k < kQueuedPerRound; ++k) {
          const uint64_t id = r * (kQueuedPerRound + 1) + 1 + k;
          works[r * kQueuedPerRound + k] = b.enqueue([&, id](CollectiveContext&) { body(id); }, info(id));
        }
        queued_in_round = r + 1;
        queued_in_round.notify_all();
      }
    });
    // Joins the other thread however this body ends.
    struct Join {
      std::thread& thread;
      std::atomic<int>& round_inline;
      ~Join() {
        round_inline = kStopped;
        round_inline.notify_all();
        thread.join();
      }
    } join{queuer, round_inline};
    bool all_inline = true;
    const auto caller = std::this_thread::get_id();
    for (int r = 0; r < kRounds; ++r) {
      const uint64_t id = r * (kQueuedPerRound + 1);
      auto work = b.run(
          [&](CollectiveContext&) {
            all_inline = all_inline && std::this_thread::get_id() == caller;
            round_inline = r;
            round_inline.notify_all();
            for (int seen = queued_in_round.load(); seen != r + 1; seen = queued_in_round.load()) {
              queued_in_round.wait(seen);
            }
            body(id);
          },
          info(id));
      work->wait();
      if (queued_in_round.load() != r + 1) throw std::runtime_error("the other thread did not queue its ops");
      // The group is idle again before the next round's synchronous op.
      for (int k = 0; k < kQueuedPerRound; ++k) works[r * kQueuedPerRound + k]->wait();
    }
    if (!all_inline) throw std::runtime_error("a synchronous op on an idle group did not run inline");
    if (overlap) throw std::runtime_error("two ops of the group ran at once");
    for (size_t i = 0; i < ran.size(); ++i) {
      if (ran[i] != i) throw std::runtime_error(fmt::format("op {} ran as number {}", ran[i], i));
    }
  }));
  auto ring = ddprun::readFlightRingFile(dir.path + "/rank0.group0.ring");
  REQUIRE(ring);
  REQUIRE(ring->records.size() == kRounds * (kQueuedPerRound + 1));
  for (size_t i = 0; i < ring->records.size(); ++i) {
    INFO("record " << i);
    CHECK(ring->records[i].seq == i + 1);
    CHECK(ring->records[i].info.count == i);  // the op's id: numbered in the order they ran
    CHECK(ring->records[i].state == FlightState::kCompleted);
  }
}
