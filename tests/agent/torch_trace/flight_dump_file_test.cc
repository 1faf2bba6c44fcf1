// Reading a dump file that a worker (or anyone sharing its directory) controls: it must never
// block the agent or `ddprun hang-report`, whatever is at the path when it is opened.
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <thread>

#include <catch2/catch.hpp>

#include "agent/torch_trace/flight_dump.h"
#include "tests/support/bounded_call.h"
#include "tests/support/test_process.h"

namespace ddprun::agent {
namespace {

using namespace std::chrono_literals;

std::string errorOf(const std::string& path) {
  try {
    readFlightDumpFile(path, 0);
  } catch (const FlightDumpError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST_CASE("flight dump file: a FIFO renamed over a dump while it is read never blocks the read", "[flight_dump]") {
  testing::TempDir dir;
  const std::string path = dir.file("nccl_trace_rank_0");
  // Another process swaps a dump and a FIFO in at the path as fast as it can; a check of the
  // path followed by an open of it (the race) finds a file and opens the FIFO.
  std::atomic<bool> stop{false};
  std::thread swapper([&] {
    const std::string file = dir.file("file.tmp");
    const std::string fifo = dir.file("fifo.tmp");
    while (!stop) {
      std::ofstream(file) << "not a pickle";
      ::rename(file.c_str(), path.c_str());
      ::mkfifo(fifo.c_str(), 0600);
      ::rename(fifo.c_str(), path.c_str());
    }
  });
  // Reads for 3 s in a child; it blocks for good on the first FIFO it opens for a read.
  auto reads = [&] {
    int reads = 0;
    for (const auto end = std::chrono::steady_clock::now() + 3s; std::chrono::steady_clock::now() < end; ++reads) {
      errorOf(path);
    }
    return reads;
  };
  const auto outcome = testing::callWithin(20s, reads, [](int n) { return n > 0; });
  stop = true;
  swapper.join();
  CHECK(outcome == testing::BoundedCall::kReturned);
}

TEST_CASE("flight dump file: a FIFO, a link or a device at the path is named, not read", "[flight_dump]") {
  testing::TempDir dir;
  REQUIRE(::mkfifo(dir.file("fifo").c_str(), 0600) == 0);
  CHECK(errorOf(dir.file("fifo")) == dir.file("fifo") + ": not a regular file");
  REQUIRE(::symlink("/dev/zero", dir.file("zero").c_str()) == 0);
  CHECK(errorOf(dir.file("zero")) == dir.file("zero") + ": a symbolic link, not followed");
  CHECK(errorOf("/dev/zero") == "/dev/zero: not a regular file");
  std::ofstream(dir.file("big")) << std::string(2000, 'x');
  PickleLimits limits;
  limits.max_bytes = 1000;
  try {
    readFlightDumpFile(dir.file("big"), 0, limits);
    FAIL("no error");
  } catch (const FlightDumpError& e) {
    CHECK(std::string(e.what()) == dir.file("big") + ": 2000 bytes, more than the 1000 a dump may have");
  }
}

}  // namespace
}  // namespace ddprun::agent
