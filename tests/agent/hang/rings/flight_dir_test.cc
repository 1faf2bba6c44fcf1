#include "agent/hang/rings/flight_dir.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include <catch2/catch.hpp>

#include "tests/support/bounded_call.h"
#include "tests/support/test_process.h"

namespace ddprun::agent {

TEST_CASE("the flight directory holds the rings and is emptied between attempts and removed with the agent") {
  testing::TempDir parent;
  std::string path;
  {
    FlightDir dir("job/1 x", parent.path());
    path = dir.path();
    REQUIRE(!path.empty());
    // The run id's unsafe characters do not reach the file system.
    CHECK(path == parent.path() + "/ddprun_flight-job_1_x-" + std::to_string(::getpid()));
    CHECK((std::filesystem::status(path).permissions() & std::filesystem::perms::all) ==
          std::filesystem::perms::owner_all);

    std::vector<char> memory(flightRingBytes(4) + 64);
    void* aligned = memory.data() + (64 - reinterpret_cast<uintptr_t>(memory.data()) % 64) % 64;
    FlightRingWriter writer(aligned, 4, 7, 0, 1, 2);
    writer.enqueue({FlightOp::kAllReduce, FlightDType::kFloat32, 4, -1}, 1);
    std::ofstream(path + "/" + flightRingFileName(7, 0), std::ios::binary)
        .write(static_cast<const char*>(aligned), static_cast<std::streamsize>(flightRingBytes(4)));
    std::ofstream(path + "/notes.txt") << "not a ring";
    std::ofstream(path + "/broken.ring") << "not a ring either";

    auto rings = dir.read();
    REQUIRE(rings.size() == 1);
    CHECK(rings[0].rank == 7);
    CHECK(rings[0].records.size() == 1);

    dir.clear();
    CHECK(std::filesystem::is_empty(path));
    std::ofstream(path + "/" + flightRingFileName(7, 0)) << "left by a worker";
  }
  CHECK_FALSE(std::filesystem::exists(path));
}

TEST_CASE("the flight directory reads a group's point-to-point ring beside its collective ring") {
  testing::TempDir parent;
  FlightDir dir("job", parent.path());
  REQUIRE(!dir.path().empty());
  for (auto kind : {FlightRingKind::kCollective, FlightRingKind::kPointToPoint}) {
    std::vector<char> memory(flightRingBytes(4) + 64);
    void* aligned = memory.data() + (64 - reinterpret_cast<uintptr_t>(memory.data()) % 64) % 64;
    FlightRingWriter writer(aligned, 4, 2, 0, 2, 4, kind);
    writer.enqueue({kind == FlightRingKind::kCollective ? FlightOp::kBarrier : FlightOp::kRecv, FlightDType::kNone, 0,
                    kind == FlightRingKind::kCollective ? -1 : 3},
                   1);
    std::ofstream(dir.path() + "/" + flightRingFileName(2, 0, kind), std::ios::binary)
        .write(static_cast<const char*>(aligned), static_cast<std::streamsize>(flightRingBytes(4)));
  }
  auto rings = dir.read();
  REQUIRE(rings.size() == 2);
  std::sort(rings.begin(), rings.end(), [](const auto& a, const auto& b) { return a.kind < b.kind; });
  CHECK(rings[0].kind == FlightRingKind::kCollective);
  REQUIRE(rings[0].records.size() == 1);
  CHECK(rings[0].records[0].info.op == FlightOp::kBarrier);
  CHECK(rings[1].kind == FlightRingKind::kPointToPoint);
  CHECK(rings[1].rank == 2);
  REQUIRE(rings[1].records.size() == 1);
  CHECK(rings[1].records[0].info.op == FlightOp::kRecv);
  CHECK(rings[1].records[0].info.root == 3);
}

TEST_CASE("a flight directory that cannot be made says why and reads nothing") {
  FlightDir dir("job", "/nonexistent/parent");
  CHECK(dir.path().empty());
  CHECK_THAT(dir.problem(), Catch::Contains("mkdir /nonexistent/parent/ddprun_flight-job-"));
  CHECK(dir.read().empty());
  dir.clear();
}

TEST_CASE("a FIFO or a link named like a ring does not block the agent's read of the flight directory") {
  using namespace std::chrono_literals;
  testing::TempDir parent;
  FlightDir dir("job", parent.path());
  REQUIRE(!dir.path().empty());
  REQUIRE(::mkfifo((dir.path() + "/" + flightRingFileName(0, 0)).c_str(), 0600) == 0);
  REQUIRE(::symlink("/dev/zero", (dir.path() + "/" + flightRingFileName(1, 0)).c_str()) == 0);
  auto none = [](const std::vector<FlightRingSnapshot>& rings) { return rings.empty(); };
  CHECK(testing::callWithin(
            10s, [&] { return dir.read(); }, none) == testing::BoundedCall::kReturned);
  std::string error;
  CHECK_FALSE(readFlightRingFile(dir.path() + "/" + flightRingFileName(0, 0), &error));
  CHECK(error == dir.path() + "/" + flightRingFileName(0, 0) + ": a FIFO, not a regular file; not read");
}

TEST_CASE("a worker that fills the flight directory with ring files costs one look kMaxRingFiles reads at most") {
  testing::TempDir parent;
  FlightDir dir("many", parent.path());
  REQUIRE(!dir.path().empty());
  std::vector<char> memory(flightRingBytes(1) + 64);
  void* aligned = memory.data() + (64 - reinterpret_cast<uintptr_t>(memory.data()) % 64) % 64;
  FlightRingWriter writer(aligned, 1, 0, 0, 0, 2);
  for (size_t i = 0; i < kMaxRingFiles + 100; ++i) {
    std::ofstream(dir.path() + "/" + flightRingFileName(0, static_cast<int>(i)), std::ios::binary)
        .write(static_cast<const char*>(aligned), static_cast<std::streamsize>(flightRingBytes(1)));
  }
  CHECK(dir.read().size() == kMaxRingFiles);
}

}  // namespace ddprun::agent
