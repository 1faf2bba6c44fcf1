// The C++ workers' file timer: the lines it writes are torch's, read back by the agent's
// parser, through a real named pipe held open here as the agent would.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <ctime>

#include <catch2/catch.hpp>

#include "agent/hang/timers/timer_request.h"
#include "common/error.h"
#include "common/unique_fd.h"
#include "tests/support/scoped_env.h"
#include "tests/support/test_process.h"
#include "worker_runtime/scoped_timer.h"

using ddprun::agent::parseTimerRequest;
using ddprun::agent::TimerLineBuffer;
using ddprun::runtime::expires;
using ddprun::testing::ScopedEnv;

namespace {

// The agent's end of the pipe: opened before any client, read without blocking.
class PipeReader {
 public:
  explicit PipeReader(const std::string& path) {
    REQUIRE(::mkfifo(path.c_str(), 0600) == 0);
    fd_.reset(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
    REQUIRE(fd_);
  }
  std::vector<std::string> lines() {
    std::vector<std::string> out;
    char buf[8192];
    for (ssize_t n; (n = ::read(fd_.get(), buf, sizeof buf)) > 0;) {
      for (auto& line : buffer_.feed(std::string_view(buf, static_cast<size_t>(n)))) out.push_back(line.text);
    }
    return out;
  }

 private:
  ddprun::UniqueFd fd_;
  TimerLineBuffer buffer_;
};

double now() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

}  // namespace

TEST_CASE("the C++ timer's request line is torch's and the agent reads it back", "[scoped_timer]") {
  const std::string line = ddprun::runtime::timerRequestLine(4242, "step \"7\"", 1700000000.5, 9);
  CHECK(line ==
        R"({"version": 1, "pid": 4242, "scope_id": "step \"7\"", "expiration_time": 1700000000.500000, "signal": 9})");
  auto parsed = parseTimerRequest(line);
  REQUIRE(parsed.request);
  CHECK(parsed.request->pid == 4242);
  CHECK(parsed.request->scope_id == "step \"7\"");
  CHECK(parsed.request->expiration_time == 1700000000.5);
  CHECK(parsed.request->signal == 9);
}

TEST_CASE("without TORCHELASTIC_TIMER_FILE a timer is a no-op", "[scoped_timer]") {
  ScopedEnv unset("TORCHELASTIC_TIMER_FILE", std::nullopt);
  auto timer = expires(std::chrono::seconds(1), "step");
  CHECK_FALSE(timer.armed());
  timer.release();  // nothing to release, no error
}

TEST_CASE("a timer is set on the pipe and released when its scope ends", "[scoped_timer]") {
  ddprun::testing::TempDir dir;
  const std::string path = dir.file("timer");
  PipeReader agent(path);
  ScopedEnv env("TORCHELASTIC_TIMER_FILE", path);
  const double before = now();
  {
    auto timer = expires(std::chrono::seconds(30), "train_step");
    CHECK(timer.armed());
    CHECK(timer.scope() == "train_step");
    auto lines = agent.lines();
    REQUIRE(lines.size() == 1);
    auto set = parseTimerRequest(lines[0]);
    REQUIRE(set.request);
    CHECK(set.request->pid == ::getpid());
    CHECK(set.request->scope_id == "train_step");
    CHECK(set.request->signal == SIGKILL);
    // The line carries microseconds: compare to them.
    CHECK(set.request->expiration_time >= before + 30 - 1e-6);
    CHECK(set.request->expiration_time <= now() + 30 + 1e-6);
    // Moved out: only the new owner releases.
    auto moved = std::move(timer);
    CHECK_FALSE(timer.armed());
    CHECK(moved.armed());
    CHECK(agent.lines().empty());
  }
  auto lines = agent.lines();
  REQUIRE(lines.size() == 1);
  auto release = parseTimerRequest(lines[0]);
  REQUIRE(release.request);
  CHECK(release.request->isRelease());
  CHECK(release.request->scope_id == "train_step");
  CHECK(release.request->pid == ::getpid());

  auto once = expires(std::chrono::milliseconds(1), "x", SIGTERM);
  once.release();
  once.release();
  lines = agent.lines();
  REQUIRE(lines.size() == 2);  // one set, one release: the second release does nothing
  CHECK(parseTimerRequest(lines[0]).request->signal == SIGTERM);
}

TEST_CASE("a timer pipe nobody reads or a scope too long is an error naming the pipe", "[scoped_timer]") {
  ddprun::testing::TempDir dir;
  const std::string path = dir.file("timer");
  REQUIRE(::mkfifo(path.c_str(), 0600) == 0);
  ScopedEnv env("TORCHELASTIC_TIMER_FILE", path);
  // Opened non-blocking: no reader is ENXIO at once, never a hang.
  CHECK_THROWS_WITH(expires(std::chrono::seconds(1), "step"),
                    Catch::Contains("TORCHELASTIC_TIMER_FILE=" + path) && Catch::Contains("no agent reads it"));
  ScopedEnv missing("TORCHELASTIC_TIMER_FILE", dir.file("absent"));
  CHECK_THROWS_AS(expires(std::chrono::seconds(1), "step"), ddprun::DdprunError);
  PipeReader agent(dir.file("timer2"));
  ScopedEnv readable("TORCHELASTIC_TIMER_FILE", dir.file("timer2"));
  CHECK_THROWS_WITH(expires(std::chrono::seconds(1), std::string(5000, 's')), Catch::Contains("PIPE_BUF"));
  CHECK(agent.lines().empty());
}
