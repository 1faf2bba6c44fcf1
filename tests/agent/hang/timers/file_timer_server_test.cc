// The file timer server over a real named pipe on an io_context of the test's own: what it
// refuses (pids that are no worker's, timers past a worker's bound), what it logs and how
// (once, then a count; every worker string escaped), and a fuzz loop of hostile requests
// whose expiries are written to an events file that must stay JSON.
#include "agent/hang/timers/file_timer_server.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <random>
#include <sstream>

#include <fmt/format.h>
#include <catch2/catch.hpp>

#include "agent/ops/event_log.h"
#include "common/logging.h"
#include "common/text_escape.h"
#include "common/unique_fd.h"
#include "tests/support/agent_log.h"
#include "tests/support/fuzz_run.h"
#include "tests/support/test_process.h"

using namespace ddprun::agent;
using ddprun::UniqueFd;
using ddprun::testing::TempDir;
using namespace std::chrono_literals;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

std::string request(int64_t pid, const std::string& scope_json, double expires, int signal = 9) {
  return fmt::format(
      "{{\"version\": 1, \"pid\": {}, \"scope_id\": \"{}\", \"expiration_time\": {:.3f}, \"signal\": "
      "{}}}\n",
      pid, scope_json, expires, signal);
}

// A server whose workers are pids 100..104 (105..109 belong to worker 100), a writer on its
// pipe, and the expiries it handed on.
struct Harness {
  static constexpr int64_t kSentinelPid = 104;  // only the sentinels' timers: never at its bound

  explicit Harness(size_t bound = TimerTable::kDefaultMaxPerWorker)
      : server(
            io, dir.file("timers"), [this](const TimerExpiry& e) { onExpiry(e); },
            [](int64_t pid) -> int64_t {
              if (pid >= 100 && pid <= 104) return pid;
              if (pid >= 105 && pid <= 109) return 100;
              return -1;
            },
            bound),
        writer(::open(server.path().c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC)) {
    REQUIRE(writer);
    server.start();
  }

  void onExpiry(const TimerExpiry& e) {
    if (e.pid == kSentinelPid) {
      ++sentinels_seen;
      return;
    }
    expiries.push_back(e);
    if (events) events->emit("timer_expired", ddprun::JsonObject().add("pid", e.pid).add("scope", e.timer.scope_id));
  }

  // Writes `text` (whole lines), then a timer that expires at once, and runs the server
  // until it has handed that one on: everything before it has been read by then.
  void send(const std::string& text) {
    const std::string all = text + request(kSentinelPid, "sentinel", now() - 1, 0);
    size_t done = 0;
    const auto deadline = std::chrono::steady_clock::now() + 20s;
    while (done < all.size()) {
      // At most PIPE_BUF a write, as the protocol's writers do.
      const size_t chunk = std::min<size_t>(all.size() - done, 4096);
      const ssize_t n = ::write(writer.get(), all.data() + done, chunk);
      if (n > 0) {
        done += static_cast<size_t>(n);
      } else {
        REQUIRE((n < 0 && errno == EAGAIN));
        io.run_for(1ms);
      }
      REQUIRE(std::chrono::steady_clock::now() < deadline);
    }
    const int wanted = ++sentinels_sent;
    while (sentinels_seen < wanted) {
      io.run_for(5ms);
      REQUIRE(std::chrono::steady_clock::now() < deadline);
    }
  }

  ddprun::testing::AgentLog log;
  TempDir dir;
  boost::asio::io_context io;
  FileTimerServer server;
  UniqueFd writer;
  std::vector<TimerExpiry> expiries;
  EventLog* events = nullptr;
  int sentinels_sent = 0;
  int sentinels_seen = 0;
};

bool isPrintableLog(const std::string& text) {
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if ((c < 0x20 && c != '\n') || c == 0x7F) return false;
    const size_t n = ddprun::utf8SequenceLength(text, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

}  // namespace

// Issue 39, defect 6: each request naming a pid that is no worker's logged a warning.
TEST_CASE("timers of pids that no worker owns are refused with one warning and counted at the attempt's end",
          "[file_timer_server]") {
  Harness h;
  std::string lines;
  for (int i = 0; i < 300; ++i) lines += request(5000 + i, "x", now() - 1);
  h.send(lines);
  CHECK(h.expiries.empty());
  CHECK(h.server.timerCount() == 0);
  CHECK(ddprun::testing::countOf(h.log.text(), "not a process of this node's running workers") == 1);
  h.server.clearTimers();
  CHECK_THAT(h.log.text(), Catch::Contains("300 timer requests named a pid that is not a process of this node's "
                                           "workers in this attempt; ignored"));
  // Counted anew in the next attempt.
  h.send(request(6000, "y", now() - 1));
  CHECK(ddprun::testing::countOf(h.log.text(), "not a process of this node's running workers") == 2);
}

// Issue 39, defect 4: the table grew without bound (30,000 scopes: 114 MiB).
TEST_CASE("a worker's processes share its bound of timers, and past it new timers are refused with one warning",
          "[file_timer_server]") {
  Harness h(8);
  std::string lines;
  for (int i = 0; i < 5; ++i) lines += request(100, fmt::format("a{}", i), now() + 3600);
  for (int i = 0; i < 10; ++i) lines += request(105, fmt::format("b{}", i), now() + 3600);  // worker 100's child
  for (int i = 0; i < 3; ++i) lines += request(101, fmt::format("c{}", i), now() + 3600);
  h.send(lines);
  CHECK(h.server.timerCount() == 11);  // 8 of worker 100, 3 of worker 101
  CHECK(ddprun::testing::countOf(h.log.text(), "holds 8 timers, the most one worker may hold") == 1);
  // Moving a held timer is no new timer; a release makes room for one.
  h.send(request(100, "a0", now() + 7200) + request(100, "a1", -1) + request(105, "late", now() + 3600) +
         request(105, "later", now() + 3600));
  CHECK(h.server.timerCount() == 11);
  CHECK(ddprun::testing::countOf(h.log.text(), "holds 8 timers") == 1);
  h.server.clearTimers();
  CHECK(h.server.timerCount() == 0);
  CHECK_THAT(h.log.text(), Catch::Contains("8 new timers of workers holding 8 already in this attempt; refused"));
}

// Issue 39, defect 6: scopes and bad lines were printed raw, so a worker could forge log lines.
TEST_CASE("scopes and malformed lines a worker wrote are escaped in the log", "[file_timer_server]") {
  Harness h;
  h.send(request(101, "s\\n[ddprun] info: forged\\u001b[2J\xff", now() + 60) + "junk \x1b[31m\xfe\r\n" +
         request(7000, "t\\r\\u009b", now() + 60));
  const std::string log = h.log.text();
  CHECK_THAT(log, Catch::Contains("'s\\n[ddprun] info: forged\\x1b[2J\\xff'"));
  CHECK_THAT(log, Catch::Contains("junk \\x1b[31m\\xfe\\r"));
  CHECK_THAT(log, Catch::Contains("'t\\r\\u009b'"));
  CHECK(isPrintableLog(log));
}

TEST_CASE("hostile requests on the timer pipe: bounded table, escaped log, JSON events", "[file_timer_server][fuzz]") {
  const ddprun::testing::FuzzRun fuzz = ddprun::testing::fuzzRun("file timer pipe");
  std::mt19937 rng(fuzz.seed);
  constexpr size_t kBound = 16;
  Harness h(kBound);
  const std::string events_path = h.dir.file("events.jsonl");
  EventLog events({events_path}, "fuzz\xff");
  h.events = &events;
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  auto hostileScope = [&] {
    static const std::vector<std::string> pieces = {
        "\\n",      "\\r",  "\\u001b[2J", "\\u009b", "\\u202e", "\\ud800",         "\\\"", "\xff", "\xc3",
        "\xe2\x82", "\x80", "[ddprun] ",  "info: ",  "\\t",     "\xf0\x9f\x98\x80"};
    std::string scope;
    for (size_t k = pick(6); k > 0; --k) scope += pieces[pick(pieces.size())];
    return scope + std::to_string(pick(40));
  };
  const auto start = std::chrono::steady_clock::now();
  int rounds = 0;
  size_t checked_to = 0;
  while (std::chrono::steady_clock::now() - start < fuzz.budget) {
    std::string batch;
    for (int i = 0; i < 50; ++i) {
      const int64_t pid = static_cast<int64_t>(98 + pick(12));  // workers, a child, and strangers
      if (pid == Harness::kSentinelPid) continue;
      switch (pick(6)) {
        case 0: {  // random bytes, no newline inside
          std::string junk;
          for (size_t k = pick(80); k > 0; --k) {
            char c = static_cast<char>(rng());
            junk += c == '\n' ? 'n' : c;
          }
          batch += junk + "\n";
          break;
        }
        case 1: batch += request(pid, hostileScope(), -1); break;
        case 2: batch += std::string(4096 + pick(3000), 'x') + "\n"; break;
        default: {
          const double when[] = {now() - 1, now() + 0.001 * static_cast<double>(pick(50)), now() + 3600, 1e300};
          batch += request(pid, hostileScope(), when[pick(4)], static_cast<int>(pick(12)) - 2);
        }
      }
    }
    h.send(batch);
    INFO("seed " << fuzz.seed << ", round " << rounds);
    // Workers 100..103 (105..109 count as 100): never more than their bounds together.
    REQUIRE(h.server.timerCount() <= 4 * kBound);
    const std::string log = h.log.text();
    REQUIRE(isPrintableLog(log.substr(checked_to)));
    checked_to = log.size();
    if (++rounds % 20 == 0) h.server.clearTimers();
  }
  CHECK(rounds > 0);
  auto checked = ddprun::testing::run({"/usr/bin/python3", "-c",
                                       "import json, sys\n"
                                       "lines = open(sys.argv[1], 'rb').read().decode('utf-8').splitlines()\n"
                                       "assert lines, 'no events'\n"
                                       "for l in lines: json.loads(l)\n",
                                       events_path},
                                      {}, 60s);
  INFO(checked.out << checked.err);
  CHECK(checked.exit_code == 0);
}
