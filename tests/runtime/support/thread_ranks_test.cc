// The thread-rank harness itself: it reports the failure that came first, with its rank,
// and its watchdog ends a run whose ranks hang (in a child process, which it ends).
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include "common/unique_fd.h"
#include "tests/runtime/support/thread_ranks.h"
#include "worker_runtime/backend/host_collectives.h"

namespace {

using namespace ddprun::runtime;
using namespace ddprun::testing;

// Reads `fd` into `out` to its end (returns true) or until `timeout` passes (false).
bool readAll(int fd, std::chrono::milliseconds timeout, std::string& out) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd pfd{fd, POLLIN, 0};
    if (left.count() <= 0 || ::poll(&pfd, 1, static_cast<int>(left.count())) <= 0) return false;
    char buf[4096];
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) return true;
    out.append(buf, static_cast<size_t>(n));
  }
}

}  // namespace

TEST_CASE("thread ranks report the first failure with its rank and not the peers' errors it caused") {
  HostBackendOptions options;
  options.shared_memory = HostBackendOptions::SharedMemory::kOff;
  // Rank 2 fails before the all_reduce the others are in: they fail in turn (it left), later.
  auto body = [](HostBackend& b) {
    if (b.rank() == 2) throw std::runtime_error("the first failure");
    float x = 1;
    b.enqueue([&](CollectiveContext& ctx) { allReduce(ctx, &x, 1, DType::kFloat32, ReduceOp::kSum); })->wait();
  };
  REQUIRE_THROWS_WITH(runRanks(4, options, body), "rank 2: the first failure");
}

TEST_CASE("thread ranks still running at the watchdog end the process naming them") {
  int pipe_fds[2];
  REQUIRE(::pipe(pipe_fds) == 0);
  ddprun::UniqueFd read_end(pipe_fds[0]);
  ddprun::UniqueFd write_end(pipe_fds[1]);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    // Ranks 1 and 3 wait for a key that never comes (for longer than the watchdog allows).
    ::dup2(write_end.get(), STDERR_FILENO);
    read_end.reset();
    runThreads(
        4,
        [](int rank, ddprun::rendezvous::Store& store) {
          if (rank % 2 == 1) store.wait({"never"}, std::chrono::seconds(30));
        },
        std::chrono::seconds(1));
    std::_Exit(0);  // not reached when the watchdog works
  }
  write_end.reset();
  std::string err;
  // Its end of the pipe closes when it exits; if it hangs instead, it is killed.
  const bool exited = readAll(read_end.get(), std::chrono::seconds(30), err);
  read_end.reset();
  if (!exited) ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  CHECK(exited);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 1);
  CHECK_THAT(err, Catch::Contains("thread ranks: rank(s) 1, 3 still running after 1s (watchdog)"));
}
