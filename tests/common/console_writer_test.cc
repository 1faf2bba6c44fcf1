#include "common/console_writer.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include <catch2/catch.hpp>

#include "common/unique_fd.h"
#include "tests/support/test_process.h"

using namespace ddprun;
using namespace ddprun::testing;

namespace {

struct Pipe {
  UniqueFd read_end;
  UniqueFd write_end;
  Pipe() {
    int fds[2];
    REQUIRE(::pipe2(fds, O_CLOEXEC) == 0);
    read_end.reset(fds[0]);
    write_end.reset(fds[1]);
  }
  // Reads what is there, waiting at most `ms` for the first byte.
  std::string drain(int ms) {
    std::string out;
    char buf[65536];
    for (;;) {
      pollfd p{read_end.get(), POLLIN, 0};
      if (::poll(&p, 1, out.empty() ? ms : 0) <= 0) return out;
      ssize_t n = ::read(read_end.get(), buf, sizeof buf);
      if (n <= 0) return out;
      out.append(buf, static_cast<size_t>(n));
    }
  }
};

// Reads a pipe on a thread of its own, as a console's reader would, until stopped.
class Reader {
 public:
  explicit Reader(int fd) : fd_(fd), thread_([this] { run(); }) {}
  ~Reader() { stop(); }
  // Once the pipe is empty: what was read from it.
  std::string stop() {
    if (thread_.joinable()) {
      stop_.write_end.reset();  // its read end then polls as hung up
      thread_.join();
    }
    return got_;
  }

 private:
  void run() {
    char buf[65536];
    for (;;) {
      pollfd p[2] = {{fd_, POLLIN, 0}, {stop_.read_end.get(), POLLIN, 0}};
      if (::poll(p, 2, -1) < 0) {
        if (errno == EINTR) continue;
        return;
      }
      // The data before the stop: stopped, it leaves nothing written before the stop behind.
      if (p[0].revents & POLLIN) {
        const ssize_t n = ::read(fd_, buf, sizeof buf);
        if (n > 0) got_.append(buf, static_cast<size_t>(n));
        continue;
      }
      if (p[1].revents != 0 || p[0].revents != 0) return;
    }
  }

  int fd_;
  Pipe stop_;
  std::string got_;  // the thread's until it is joined
  std::thread thread_;
};

}  // namespace

TEST_CASE("the console writer keeps each stream's lines in order", "[console_writer]") {
  Pipe out, err;
  ConsoleWriter::Options options;
  options.stdout_fd = out.write_end.get();
  options.stderr_fd = err.write_end.get();
  ConsoleWriter writer(options);
  CHECK(writer.write(ConsoleStream::kStdout, "one\n"));
  CHECK(writer.write(ConsoleStream::kStderr, "err\n"));
  CHECK(writer.write(ConsoleStream::kStdout, "two\nthree\n"));
  REQUIRE(writer.flush(std::chrono::seconds(10)));
  CHECK(out.drain(1000) == "one\ntwo\nthree\n");
  CHECK(err.drain(1000) == "err\n");
  CHECK(writer.droppedLines() == 0);
}

TEST_CASE("a console nobody reads never blocks the writer's callers and lines over the bound are dropped and counted",
          "[console_writer]") {
  Pipe out;
  std::mutex reported_mutex;
  std::condition_variable reported_cv;
  uint64_t reported = 0;  // under reported_mutex
  ConsoleWriter::Options options;
  options.stdout_fd = out.write_end.get();
  options.stderr_fd = out.write_end.get();
  options.capacity = 64 * 1024;
  options.report_interval = std::chrono::milliseconds(0);
  options.on_dropped = [&](uint64_t n) {
    {
      std::lock_guard lock(reported_mutex);
      reported += n;
    }
    reported_cv.notify_all();
  };
  ConsoleWriter writer(options);
  const std::string line(99, 'x');
  // 2 MB: far more than the pipe buffer and the queue together. No call may wait for the
  // reader (if one did, this loop would never end).
  constexpr int kLines = 20000;
  int accepted = 0;
  for (int i = 0; i < kLines; ++i) accepted += writer.write(ConsoleStream::kStdout, line + "\n") ? 1 : 0;
  CHECK(accepted < kLines);
  CHECK(writer.droppedLines() == static_cast<uint64_t>(kLines - accepted));
  CHECK_FALSE(writer.flush(std::chrono::milliseconds(0)));  // nobody reads: it cannot have drained
  // The console is read again: what was queued comes out, and the whole count is reported.
  Reader reader(out.read_end.get());
  {
    std::unique_lock lock(reported_mutex);
    REQUIRE(reported_cv.wait_for(lock, std::chrono::seconds(20),
                                 [&] { return reported == static_cast<uint64_t>(kLines - accepted); }));
  }
  // What is still queued can be more than the pipe holds: it is read while the writer flushes.
  REQUIRE(writer.flush(std::chrono::seconds(20)));
  CHECK(countOf(reader.stop(), "\n") == accepted);
  CHECK(writer.finish(std::chrono::seconds(1)));
}

// Its subject is the destructor's real bound on a thread stuck in write(): integration.
TEST_CASE("destroying a writer stuck on a stalled console does not wait for the console",
          "[console_writer][integration]") {
  Pipe out;
  {
    ConsoleWriter::Options options;
    options.stdout_fd = out.write_end.get();
    ConsoleWriter writer(options);
    const std::string chunk(1 << 20, 'y');
    for (int i = 0; i < 3; ++i) writer.write(ConsoleStream::kStdout, chunk);
    CHECK_FALSE(writer.finish(std::chrono::milliseconds(100)));
  }  // returns after at most kDestroyTimeout, its thread left in write()
  // That thread gets EPIPE once the reader is gone, and ends. The write end stays open (until
  // the process exits): the thread may still be writing to it, and a closed descriptor's
  // number could be handed to another file that the thread would then write into.
  out.read_end.reset();
  [[maybe_unused]] const int left_open = out.write_end.release();
}
