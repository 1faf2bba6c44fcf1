// The spare's wait in the runtime (worker_runtime/spare_wait.h) in a real process: a program
// on the runtime started with DDPRUN_SPARE=1 runs nothing of its main until its assignment
// arrives on the pipe, then runs with exactly the assigned environment; the pipe closed
// without one, it exits 0 and its main never runs; a bad descriptor is one line and exit 2.
#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <chrono>
#include <string>

#include "common/spare_assignment.h"
#include "common/unique_fd.h"
#include "tests/support/test_process.h"

namespace {

using namespace ddprun::testing;

// A pipe whose read end the probe inherits (the write end stays here, close-on-exec).
struct SparePipe {
  ddprun::UniqueFd read_end, write_end;
  SparePipe() {
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    read_end.reset(fds[0]);
    write_end.reset(fds[1]);
    REQUIRE(::fcntl(write_end.get(), F_SETFD, FD_CLOEXEC) == 0);
  }
};

std::vector<std::string> probe() { return {binDir() + "/spare_probe"}; }

}  // namespace

TEST_CASE("spare wait: main runs only once assigned, with the assigned environment and no DDPRUN_SPARE") {
  SparePipe pipe;
  TestProcess spare(probe(), {{"DDPRUN_SPARE", "1"},
                              {"DDPRUN_SPARE_FD", std::to_string(pipe.read_end.get())},
                              {"RANK", ""},
                              {"LOCAL_RANK", ""}});
  pipe.read_end.reset();
  // Not assigned: nothing of main has run (it would print at once). Not a timed check of
  // the wait: the process is still there and has said nothing when the assignment goes.
  CHECK(spare.out().empty());
  const std::string wire = ddprun::recovery::encodeSpareAssignment({{"DDPRUN_SPARE", "1"}, {"DDPRUN_SPARE_FD", "x"}},
                                                                   {{"RANK", "3"}, {"LOCAL_RANK", "5"}});
  REQUIRE(::write(pipe.write_end.get(), wire.data(), wire.size()) == static_cast<ssize_t>(wire.size()));
  REQUIRE(spare.wait(std::chrono::seconds(30)));
  INFO(spare.out() << spare.err());
  CHECK(spare.exitCode() == 0);
  CHECK(spare.out() == "main RANK=3 DDPRUN_SPARE=(unset)\ndevice 5\n");
}

TEST_CASE("spare wait: a spare whose pipe closes unassigned exits 0 and never runs main") {
  SparePipe pipe;
  TestProcess spare(probe(), {{"DDPRUN_SPARE", "1"}, {"DDPRUN_SPARE_FD", std::to_string(pipe.read_end.get())}});
  pipe.read_end.reset();
  pipe.write_end.reset();
  REQUIRE(spare.wait(std::chrono::seconds(30)));
  CHECK(spare.exitCode() == 0);
  CHECK(spare.out().empty());
  CHECK(spare.err().empty());
}

TEST_CASE("spare wait: a bad DDPRUN_SPARE_FD is one line and exit 2, main never runs") {
  TestProcess spare(probe(), {{"DDPRUN_SPARE", "1"}, {"DDPRUN_SPARE_FD", "abc"}});
  REQUIRE(spare.wait(std::chrono::seconds(30)));
  CHECK(spare.exitCode() == 2);
  CHECK(spare.out().empty());
  CHECK(countOf(spare.err(), "DDPRUN_SPARE_FD=abc") == 1);
}

TEST_CASE("spare wait: without DDPRUN_SPARE the program runs as before") {
  TestProcess worker(probe(), {{"RANK", "1"}, {"LOCAL_RANK", "2"}, {"DDPRUN_SPARE", ""}});
  REQUIRE(worker.wait(std::chrono::seconds(30)));
  CHECK(worker.exitCode() == 0);
  CHECK(worker.out() == "main RANK=1 DDPRUN_SPARE=(unset)\ndevice 2\n");
}
