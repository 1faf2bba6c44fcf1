// ShmSegment with ranks as threads over an in-memory store: every rank maps the same memory
// and leaves nothing in /dev/shm; and when creating, opening or mapping the segment fails
// on any rank (injected through the open function), every rank throws the same error naming
// that rank, without waiting for the group timeout, so the group falls back to TCP together.
#include "worker_runtime/transport/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "common/unique_fd.h"
#include "tests/support/in_memory_store.h"
#include "tests/support/scoped_env.h"
#include "tests/support/test_process.h"

using ddprun::runtime::ShmOpenFn;
using ddprun::runtime::ShmSegment;

namespace {

using namespace std::chrono_literals;

constexpr size_t kBytes = 64 * 1024;
// Long enough that a rank left waiting for the barrier (the defect) fails on its store
// timeout rather than passing; the fixed code never waits on it.
constexpr auto kGroupTimeout = 20s;

// What one rank got: its segment, or the message of what it threw.
struct Outcome {
  std::unique_ptr<ShmSegment> segment;
  std::string error;
};

// Makes the segment on `size` ranks, each a thread, all with `open` (given each rank's number).
std::vector<Outcome> makeOnRanks(int size, const std::function<ShmOpenFn(int rank)>& open_for) {
  ddprun::rendezvous::InMemoryStore store(kGroupTimeout);
  std::vector<Outcome> outcomes(size);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        outcomes[rank].segment =
            std::make_unique<ShmSegment>(store, "pg/0/", rank, size, kBytes, kGroupTimeout, open_for(rank));
      } catch (const std::exception& e) {
        outcomes[rank].error = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return outcomes;
}

// shm_open failing with `err` on `failing` ranks, the real one elsewhere.
std::function<ShmOpenFn(int)> failOpenOn(std::set<int> failing, int err) {
  return [failing, err](int rank) -> ShmOpenFn {
    if (!failing.count(rank)) return {};
    return [err](const char*, int, mode_t) {
      errno = err;
      return -1;
    };
  };
}

// Entries of /dev/shm for this job's run id.
std::vector<std::string> leftovers(const std::string& run_id) {
  return ddprun::testing::shmEntriesWithPrefix("ddprun-" + run_id + "-");
}

void requireAllFailedAlike(const std::vector<Outcome>& outcomes, const std::string& naming) {
  for (size_t rank = 0; rank < outcomes.size(); ++rank) {
    INFO("rank " << rank << ": " << outcomes[rank].error);
    CHECK(outcomes[rank].segment == nullptr);
    CHECK_THAT(outcomes[rank].error, Catch::StartsWith("shared memory segment unusable: ") && Catch::Contains(naming));
    CHECK(outcomes[rank].error == outcomes[0].error);
  }
}

}  // namespace

TEST_CASE("shm segment: every rank maps the same memory and the name is gone afterwards", "[unit][shm]") {
  const std::string run_id = "shmtest" + std::to_string(::getpid());
  ddprun::testing::ScopedEnv run("TORCHELASTIC_RUN_ID", run_id);
  auto outcomes = makeOnRanks(3, [](int) { return ShmOpenFn{}; });
  for (int rank = 0; rank < 3; ++rank) {
    INFO("rank " << rank << ": " << outcomes[rank].error);
    REQUIRE(outcomes[rank].segment != nullptr);
    REQUIRE(outcomes[rank].segment->bytes() == kBytes);
    static_cast<char*>(outcomes[rank].segment->data())[rank] = static_cast<char>('a' + rank);
  }
  // Three mappings of one segment: each sees what the others wrote.
  for (int rank = 0; rank < 3; ++rank) {
    CHECK(std::string(static_cast<char*>(outcomes[rank].segment->data()), 3) == "abc");
  }
  CHECK(outcomes[0].segment->data() != outcomes[1].segment->data());
  CHECK(leftovers(run_id).empty());
}

TEST_CASE("shm segment: shm_open failing on one rank makes every rank fail at once with its error", "[unit][shm]") {
  for (int failing : {1, 2}) {
    INFO("shm_open fails on rank " << failing);
    auto outcomes = makeOnRanks(3, failOpenOn({failing}, EACCES));
    requireAllFailedAlike(outcomes, "rank " + std::to_string(failing) + ": shm_open(/ddprun-");
    CHECK_THAT(outcomes[0].error, Catch::Contains(std::strerror(EACCES)));
  }
}

TEST_CASE("shm segment: failures on several ranks are all named in rank order", "[unit][shm]") {
  auto outcomes = makeOnRanks(4, failOpenOn({3, 1}, ENOENT));
  requireAllFailedAlike(outcomes, "rank 1: shm_open(");
  const std::string& error = outcomes[0].error;
  const auto first = error.find("rank 1: shm_open(");
  const auto second = error.find("; rank 3: shm_open(");
  CHECK(first != std::string::npos);
  CHECK(second != std::string::npos);
  CHECK(first < second);
}

TEST_CASE("shm segment: rank 0 unable to create the segment fails every rank", "[unit][shm]") {
  const std::string run_id = "shmcreate" + std::to_string(::getpid());
  ddprun::testing::ScopedEnv run("TORCHELASTIC_RUN_ID", run_id);
  auto outcomes = makeOnRanks(3, failOpenOn({0}, ENOSPC));
  requireAllFailedAlike(outcomes,
                        std::string("rank 0: cannot create a segment of 65536 bytes: ") + std::strerror(ENOSPC));
  CHECK(leftovers(run_id).empty());
}

TEST_CASE("shm segment: mmap failing on one rank makes every rank fail and unmap", "[unit][shm]") {
  // A pipe opens but cannot be mapped (ENODEV): the failure comes from mmap itself.
  int pipe_fds[2];
  REQUIRE(::pipe2(pipe_fds, O_CLOEXEC) == 0);
  const ddprun::UniqueFd write_end(pipe_fds[1]);  // unused; closed whatever the outcome
  const std::string run_id = "shmmap" + std::to_string(::getpid());
  ddprun::testing::ScopedEnv run("TORCHELASTIC_RUN_ID", run_id);
  auto outcomes = makeOnRanks(3, [&](int rank) -> ShmOpenFn {
    if (rank != 2) return {};
    return [&](const char*, int, mode_t) { return pipe_fds[0]; };  // ShmSegment closes it
  });
  requireAllFailedAlike(outcomes, "rank 2: mmap of 65536 bytes: ");
  CHECK(leftovers(run_id).empty());
}
