#include "common/worker_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include <catch2/catch.hpp>

#include "tests/support/bounded_call.h"
#include "tests/support/test_process.h"

using ddprun::readWorkerFile;
using ddprun::WorkerFile;
using ddprun::testing::BoundedCall;
using ddprun::testing::callWithin;
using ddprun::testing::TempDir;
using namespace std::chrono_literals;

TEST_CASE("a worker's regular file is read whole, and a missing one says so", "[unit]") {
  TempDir dir;
  std::ofstream(dir.file("error.json")) << "{\"message\": \"boom\"}";
  WorkerFile f = readWorkerFile(dir.file("error.json"), 1 << 20);
  CHECK(f.ok());
  CHECK(f.bytes == "{\"message\": \"boom\"}");
  CHECK_FALSE(f.cut);
  CHECK(f.problem.empty());

  std::ofstream(dir.file("empty")).flush();
  WorkerFile empty = readWorkerFile(dir.file("empty"), 1 << 20);
  CHECK(empty.ok());
  CHECK(empty.bytes.empty());

  WorkerFile none = readWorkerFile(dir.file("none"), 1 << 20);
  CHECK(none.missing());
  CHECK_THAT(none.problem, Catch::Contains(dir.file("none")));
}

TEST_CASE("a FIFO where a worker's file should be is refused at once, writer or not", "[unit]") {
  TempDir dir;
  const std::string fifo = dir.file("py_exception.42");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  // No writer: a plain open() waits for one for ever.
  auto refused = [](const WorkerFile& f) { return !f.ok() && f.error == EINVAL && f.bytes.empty(); };
  CHECK(callWithin(
            10s, [&] { return readWorkerFile(fifo, 1 << 20); }, refused) == BoundedCall::kReturned);
  // A writer that holds it open and writes nothing: a plain read() waits for ever.
  const int writer_keeper = ::open(fifo.c_str(), O_RDWR | O_CLOEXEC);
  REQUIRE(writer_keeper >= 0);
  CHECK(callWithin(
            10s, [&] { return readWorkerFile(fifo, 1 << 20); }, refused) == BoundedCall::kReturned);
  ::close(writer_keeper);
  WorkerFile f = readWorkerFile(fifo, 1 << 20);
  CHECK(f.problem == fifo + ": a FIFO, not a regular file; not read");
}

TEST_CASE("a symbolic link, to a file, a FIFO or /dev/zero, is not followed", "[unit]") {
  TempDir dir;
  std::ofstream(dir.file("real")) << "text";
  REQUIRE(::symlink(dir.file("real").c_str(), dir.file("to_real").c_str()) == 0);
  REQUIRE(::symlink("/dev/zero", dir.file("to_zero").c_str()) == 0);
  REQUIRE(::mkfifo(dir.file("fifo").c_str(), 0600) == 0);
  REQUIRE(::symlink(dir.file("fifo").c_str(), dir.file("to_fifo").c_str()) == 0);
  for (const char* name : {"to_real", "to_zero", "to_fifo"}) {
    INFO(name);
    auto refused = [](const WorkerFile& f) { return f.error == ELOOP && f.bytes.empty(); };
    CHECK(callWithin(
              10s, [&] { return readWorkerFile(dir.file(name), 1 << 20); }, refused) == BoundedCall::kReturned);
    CHECK(readWorkerFile(dir.file(name), 1 << 20).problem ==
          dir.file(name) + ": a symbolic link, not followed; not read");
  }
  // A device named directly is not a regular file either.
  WorkerFile zero = readWorkerFile("/dev/zero", 1 << 20);
  CHECK(zero.error == EINVAL);
  CHECK(zero.bytes.empty());
  CHECK(zero.problem == "/dev/zero: a character device, not a regular file; not read");
  CHECK(readWorkerFile(dir.path(), 1 << 20).error == EINVAL);
}

TEST_CASE("a file larger than the bound is cut at the bound and says so", "[unit]") {
  TempDir dir;
  const std::string big(100'000, 'x');
  std::ofstream(dir.file("big")) << big << "tail";
  WorkerFile f = readWorkerFile(dir.file("big"), 100'000);
  CHECK(f.ok());
  CHECK(f.cut);
  CHECK(f.bytes == big);
  // Exactly the bound is not cut.
  std::ofstream(dir.file("exact")) << big;
  WorkerFile exact = readWorkerFile(dir.file("exact"), 100'000);
  CHECK(exact.bytes.size() == 100'000);
  CHECK_FALSE(exact.cut);
  WorkerFile small = readWorkerFile(dir.file("big"), 10);
  CHECK(small.bytes == "xxxxxxxxxx");
  CHECK(small.cut);
}

TEST_CASE("the path in a worker file's problem is escaped", "[unit]") {
  TempDir dir;
  const std::string name = dir.file("bad\x1b[2Jname");
  WorkerFile f = readWorkerFile(name, 10);
  CHECK(f.missing());
  CHECK(f.problem.find('\x1b') == std::string::npos);
}

TEST_CASE("ddprun's own file in a worker's directory is not opened through a FIFO or a link left there", "[unit]") {
  TempDir dir;
  std::string reason;
  // A FIFO without a reader: a plain open for writing waits for one for ever.
  REQUIRE(::mkfifo(dir.file("stacks.txt").c_str(), 0600) == 0);
  auto refused = [](const ddprun::UniqueFd& fd) { return !fd.valid(); };
  CHECK(callWithin(
            10s, [&] { return ddprun::createWorkerFile(dir.file("stacks.txt"), O_TRUNC, 0644); }, refused) ==
        BoundedCall::kReturned);
  CHECK_FALSE(ddprun::createWorkerFile(dir.file("stacks.txt"), O_TRUNC, 0644, &reason));
  CHECK(reason == "a FIFO, not a regular file");
  // With a reader (the worker holding it open), the open succeeds: the descriptor is checked.
  const int reader = ::open(dir.file("stacks.txt").c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  REQUIRE(reader >= 0);
  CHECK_FALSE(ddprun::createWorkerFile(dir.file("stacks.txt"), O_TRUNC, 0644, &reason));
  CHECK(reason == "a FIFO, not a regular file");
  ::close(reader);
  // A link to a file elsewhere is not followed, so that file is not truncated.
  std::ofstream(dir.file("elsewhere")) << "keep";
  REQUIRE(::symlink(dir.file("elsewhere").c_str(), dir.file("stdout.log").c_str()) == 0);
  CHECK_FALSE(ddprun::createWorkerFile(dir.file("stdout.log"), O_TRUNC, 0644, &reason));
  CHECK(reason == "a symbolic link, not followed");
  CHECK(readWorkerFile(dir.file("elsewhere"), 100).bytes == "keep");
  // A regular file is made, and written in blocking mode.
  ddprun::UniqueFd fd = ddprun::createWorkerFile(dir.file("stderr.log"), O_TRUNC, 0644, &reason);
  REQUIRE(fd);
  CHECK((::fcntl(fd.get(), F_GETFL) & O_NONBLOCK) == 0);
  CHECK(::write(fd.get(), "line\n", 5) == 5);
  CHECK(readWorkerFile(dir.file("stderr.log"), 100).bytes == "line\n");
}
