// Hostile and broken clients against a live server on raw sockets: garbage, truncated
// frames, absurd lengths, unknown commands, slow and stalled clients, waiters that vanish,
// clients that never read, and a fuzz loop. After each, the offending connection must be
// gone and a well-behaved client must still get correct answers.
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <future>
#include <limits>
#include <memory>
#include <random>
#include <thread>

#include "tests/rendezvous/store_test_util.h"
#include "tests/support/fuzz_run.h"
#include "tests/support/sanitizers.h"
#include "tests/support/test_process.h"

using namespace ddprun::rendezvous;
using namespace ddprun::rendezvous::testing;
using ddprun::testing::ManualClock;
using wire::Command;
using wire::LegacyCommand;

namespace {

constexpr uint64_t kU64Max = std::numeric_limits<uint64_t>::max();

// This process's resident set in KiB (the server under test runs in it).
long rssKb() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  }
  return 0;
}

long msSince(Clock::time_point start) {
  return static_cast<long>(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count());
}

// A server and one well-behaved client that stays connected throughout. The server's request
// deadlines run on `clock` (a manual one where a test moves time itself).
struct Fixture {
  explicit Fixture(StoreServerOptions options = localServerOptions(), ddprun::Clock& clock = ddprun::Clock::real())
      : server(std::move(options), clock), client(clientOptions(server.port())) {
    client.set("sentinel/base", "base");
  }

  // The store answers correctly, on the old connection and on a new one, and every
  // connection but the well-behaved client's is gone.
  void expectServes(const std::string& after) {
    INFO("after: " << after);
    const std::string key = "sentinel/" + std::to_string(++checks);
    client.set(key, "value " + after);
    CHECK(client.get(key) == "value " + after);
    CHECK(client.add(key + "/n", 3) == 3);
    CHECK(client.add(key + "/n", 4) == 7);
    CHECK(client.compareSet(key, "value " + after, "swapped") == "swapped");
    CHECK(client.get("sentinel/base") == "base");
    {
      TcpStoreClient fresh(clientOptions(server.port()));
      CHECK(fresh.get(key) == "swapped");
      CHECK(fresh.get(key + "/n") == "7");
      CHECK(fresh.ping(static_cast<uint32_t>(checks)) == static_cast<uint32_t>(checks));
      CHECK(server.waitFor([&](const auto& c) { return c.connections == 2; }, 5s));
    }
    TcpStoreClient again(clientOptions(server.port()));
    CHECK(again.check({key, key + "/n"}));
  }

  void expectOnlyClientLeft() {
    CHECK(server.waitFor([&](const auto& c) { return c.connections == 1; }, 5s));
  }

  StoreServer server;
  TcpStoreClient client;
  int checks = 0;
};

// Valid current-generation requests, for truncation and mutation.
std::vector<std::string> currentFrames() {
  return {
      Frame(Command::kSet).str("/fuzz/a").str("value"),
      Frame(Command::kCompareSet).str("/fuzz/c").str("").str("new"),
      Frame(Command::kGet).str("/fuzz/a"),
      Frame(Command::kAdd).str("/fuzz/n").i64(5),
      Frame(Command::kCheck).keys({"/fuzz/a", "/fuzz/b"}),
      Frame(Command::kWait).keys({"/fuzz/w1", "/fuzz/w2"}),
      Frame(Command::kGetNumKeys),
      Frame(Command::kDeleteKey).str("/fuzz/d"),
      Frame(Command::kAppend).str("/fuzz/l").str("tail"),
      Frame(Command::kMultiGet).keys({"/fuzz/a", "/fuzz/n"}),
      Frame(Command::kMultiSet).u64(2).str("/fuzz/m1").str("1").str("/fuzz/m2").str("2"),
      Frame(Command::kCancelWait),
      Frame(Command::kPing).u32(77),
      Frame(Command::kQueuePush).str("/fuzz/q").str("item"),
      Frame(Command::kQueuePop).str("/fuzz/q"),
      Frame(Command::kQueueLen).str("/fuzz/q"),
      Frame(Command::kListKeys),
      Frame(Command::kBarrier).str("/fuzz/b").i64(3),
      Frame(Command::kAuthHello).bytes(std::string(wire::kAuthNonceBytes, 'n')),
  };
}

std::vector<std::string> legacyFrames() {
  return {
      Frame(LegacyCommand::kSet).str("/fuzz/a").str("value"),
      Frame(LegacyCommand::kCompareSet).str("/fuzz/c").str("x").str("y"),
      Frame(LegacyCommand::kGet).str("/fuzz/a"),
      Frame(LegacyCommand::kAdd).str("/fuzz/n").i64(1),
      Frame(LegacyCommand::kCheck).keys({"/fuzz/a"}),
      Frame(LegacyCommand::kWait).keys({"/fuzz/w1"}),
      Frame(LegacyCommand::kGetNumKeys),
      Frame(LegacyCommand::kWatchKey).str("/fuzz/a"),
      Frame(LegacyCommand::kDeleteKey).str("/fuzz/d"),
  };
}

}  // namespace

TEST_CASE("bad input: random bytes close only that connection", "[bad-input]") {
  Fixture f;
  std::mt19937 rng(12345);
  for (int i = 0; i < 30; ++i) {
    std::string garbage(64 + rng() % 4096, '\0');
    for (auto& c : garbage) c = static_cast<char>(rng());
    RawConnection raw(f.server.port());
    if (i % 2) raw.send(validateFrame());
    raw.send(garbage);
    raw.closedByPeerWithin(200ms);  // most are refused at once; the rest we drop ourselves
  }
  f.expectServes("random bytes");
}

TEST_CASE("bad input: frames cut short and then closed", "[bad-input]") {
  Fixture f;
  for (const auto& frame : currentFrames()) {
    for (size_t cut = 0; cut < frame.size(); ++cut) {
      RawConnection raw(f.server.port());
      raw.send(validateFrame() + frame.substr(0, cut));
    }
  }
  for (const auto& frame : legacyFrames()) {
    for (size_t cut = 1; cut < frame.size(); ++cut) {
      RawConnection raw(f.server.port());
      raw.send(frame.substr(0, cut));
    }
  }
  f.expectOnlyClientLeft();
  f.expectServes("truncated frames");
}

TEST_CASE("bad input: absurd lengths are refused at once", "[bad-input]") {
  Fixture f;
  struct Case {
    const char* name;
    std::string bytes;
  };
  const Case cases[] = {
      {"key length 2^64-1", validateFrame() + std::string(Frame(Command::kSet).u64(kU64Max))},
      {"value length 2^64-1", validateFrame() + std::string(Frame(Command::kSet).str("/k").u64(kU64Max))},
      {"value length past the limit",
       validateFrame() + std::string(Frame(Command::kAppend).str("/k").u64(StoreLimits{}.max_value_bytes + 1))},
      {"compare_set desired 2^64-1",
       validateFrame() + std::string(Frame(Command::kCompareSet).str("/k").str("").u64(kU64Max))},
      {"CHECK count 2^64-1", validateFrame() + std::string(Frame(Command::kCheck).u64(kU64Max))},
      {"WAIT count 2^64-1", validateFrame() + std::string(Frame(Command::kWait).u64(kU64Max))},
      {"MULTI_GET count 2^64-1", validateFrame() + std::string(Frame(Command::kMultiGet).u64(kU64Max))},
      {"MULTI_SET count -1", validateFrame() + std::string(Frame(Command::kMultiSet).i64(-1))},
      {"MULTI_SET inner value 2^64-1",
       validateFrame() + std::string(Frame(Command::kMultiSet).u64(1).str("/k").u64(kU64Max))},
      {"QUEUE_PUSH value 2^64-1", validateFrame() + std::string(Frame(Command::kQueuePush).str("/q").u64(kU64Max))},
      {"legacy SET key 2^64-1", Frame(LegacyCommand::kSet).u64(kU64Max)},
      {"legacy WAIT count 2^64-1", Frame(LegacyCommand::kWait).u64(kU64Max)},
  };
  for (const auto& c : cases) {
    INFO(c.name);
    RawConnection raw(f.server.port());
    REQUIRE(raw.send(c.bytes));
    auto start = Clock::now();
    CHECK(raw.closedByPeerWithin(3s));
    CHECK(msSince(start) < 3000);
  }
  f.expectOnlyClientLeft();
  f.expectServes("absurd lengths");
}

TEST_CASE("bad input: unknown commands and a wrong VALIDATE close the connection", "[bad-input]") {
  Fixture f;
  SECTION("unknown command bytes after VALIDATE") {
    for (int code : {19, 20, 0x42, 0x5f, 0x62, 0xfe, 0xff}) {
      INFO("command " << code);
      RawConnection raw(f.server.port());
      REQUIRE(raw.send(validateFrame() + std::string(Frame().u8(static_cast<uint8_t>(code)).u64(0))));
      CHECK(raw.closedByPeerWithin(3s));
    }
  }
  SECTION("unknown legacy commands") {
    for (int code : {9, 10, 13, 0x60, 0xff}) {
      INFO("command " << code);
      RawConnection raw(f.server.port());
      REQUIRE(raw.send(Frame().u8(static_cast<uint8_t>(code)).u64(0)));
      CHECK(raw.closedByPeerWithin(3s));
    }
  }
  SECTION("VALIDATE with the wrong magic") {
    RawConnection raw(f.server.port());
    REQUIRE(raw.send(Frame(Command::kValidate).u32(0x12345678).u32(0)));
    CHECK(raw.closedByPeerWithin(3s));
  }
  SECTION("a valid request after an invalid one is never answered") {
    RawConnection raw(f.server.port());
    REQUIRE(raw.send(validateFrame() + std::string(Frame().u8(0x42)) + std::string(Frame(Command::kPing).u32(9))));
    CHECK_FALSE(raw.readValue<uint32_t>(2s).has_value());
  }
  f.expectOnlyClientLeft();
  f.expectServes("unknown commands");
}

// On a manual clock: the server sweeps stalled requests every request_timeout / 4 (75 ms here)
// of the clock's time, which only passes when the test says so (passTime).
TEST_CASE("bad input: a client that stalls mid-request is closed after request_timeout", "[bad-input]") {
  auto options = localServerOptions();
  options.request_timeout = 300ms;
  ManualClock clock;
  Fixture f(options, clock);
  SECTION("stalled after part of a header") {
    RawConnection raw(f.server.port());
    REQUIRE(raw.send(validateFrame() + std::string(Frame(Command::kSet)).append("\x05\x00\x00", 3)));
    REQUIRE(f.server.waitFor([&](const auto& c) { return c.incomplete_requests == 1; }, 5s));
    // Open for all of request_timeout, with a sweep at its very end (300 ms is not past it).
    REQUIRE(passTime(clock, 300ms));
    CHECK(f.server.connectionCount() == 2);
    REQUIRE(passTime(clock, 75ms));
    CHECK(raw.closedByPeerWithin(5s));
  }
  SECTION("trickling one byte at a time does not extend the deadline") {
    RawConnection raw(f.server.port());
    std::string frame =
        validateFrame() + std::string(Frame(Command::kSet).str(std::string(100, 'k')).str(std::string(100, 'v')));
    REQUIRE(f.server.waitFor([&](const auto& c) { return c.connections == 2; }, 5s));
    size_t sent = 0;
    while (sent < frame.size() && f.server.connectionCount() == 2) {
      if (!raw.send(frame.substr(sent++, 1))) break;
      REQUIRE(passTime(clock, 50ms));
    }
    INFO("closed after " << sent << " of " << frame.size() << " bytes, 50 ms apart");
    CHECK(sent < 20);  // request_timeout is six bytes' time; all of it would take over 10 s
    CHECK(raw.closedByPeerWithin(5s));
    CHECK_FALSE(f.client.check({std::string(100, 'k')}));
  }
  SECTION("an idle client between requests is not closed") {
    RawConnection raw(f.server.port());
    REQUIRE(raw.send(validateFrame() + std::string(Frame(Command::kPing).u32(1))));
    CHECK(raw.readValue<uint32_t>() == 1u);
    REQUIRE(passTime(clock, 1s));
    CHECK(f.server.connectionCount() == 2);
    REQUIRE(raw.send(Frame(Command::kPing).u32(31337)));
    CHECK(raw.readValue<uint32_t>() == 31337u);
  }
  SECTION("a client blocked in WAIT longer than request_timeout is not closed") {
    TcpStoreClient waiter(clientOptions(f.server.port()));
    auto blocked = std::async(std::launch::async, [&] { return waiter.get("slow-key"); });
    REQUIRE(f.server.waitFor([&](const auto& c) { return c.waiting_clients == 1; }, 5s));
    REQUIRE(passTime(clock, 1s));
    CHECK(f.server.connectionCount() == 2);
    f.client.set("slow-key", "finally");
    REQUIRE(blocked.wait_for(5s) == std::future_status::ready);
    CHECK(blocked.get() == "finally");
  }
  f.expectOnlyClientLeft();
  f.expectServes("stalled clients");
}

TEST_CASE("bad input: many stalled clients at once do not hold up others", "[bad-input]") {
  auto options = localServerOptions();
  options.request_timeout = 2s;
  ManualClock clock;
  Fixture f(options, clock);
  std::vector<std::unique_ptr<RawConnection>> stalled;
  for (int i = 0; i < 50; ++i) {
    stalled.push_back(std::make_unique<RawConnection>(f.server.port()));
    REQUIRE(stalled.back()->send(validateFrame() + std::string(Frame(Command::kGet).u64(10)).append("abc")));
  }
  REQUIRE(f.server.waitFor([&](const auto& c) { return c.incomplete_requests == 50; }, 5s));
  f.client.set("during", "stall");
  CHECK(f.client.get("during") == "stall");
  CHECK(f.server.connectionCount() == 51);  // answered while they still hang
  REQUIRE(passTime(clock, 2s + 500ms));     // the first sweep past request_timeout
  for (auto& raw : stalled) CHECK(raw->closedByPeerWithin(5s));
  f.expectOnlyClientLeft();
  f.expectServes("many stalled clients");
}

// Each request completes within 50 ms, but every read ends half-way into the next one,
// as with back-to-back SETs of large values: the connection is making progress and must
// not be treated as stalled.
// Regression: the deadline once ran from the first partial byte until the buffer was
// empty, so a busy streaming client was closed as stalled.
TEST_CASE("a client streaming requests that each complete in time is not closed", "[bad-input]") {
  auto options = localServerOptions();
  options.request_timeout = 300ms;
  ManualClock clock;
  Fixture f(options, clock);
  RawConnection raw(f.server.port());
  REQUIRE(raw.send(validateFrame()));
  // Each request its own key, so that the test sees it handled before time moves on.
  const auto frame = [](int i) {
    return std::string(Frame(Command::kSet).str("/stream/" + std::to_string(i)).str(std::string(1000, 'x')));
  };
  const auto firstHalf = [&](int i) { return frame(i).substr(0, frame(i).size() / 2); };
  const auto secondHalf = [&](int i) { return frame(i).substr(frame(i).size() / 2); };
  REQUIRE(raw.send(firstHalf(0)));
  // 1.5 s of the clock, five times request_timeout, in steps of 50 ms.
  int sent = 0;
  for (; sent < 30; ++sent) {
    if (!raw.send(secondHalf(sent) + firstHalf(sent + 1))) break;
    REQUIRE_NOTHROW(f.client.wait({"/stream/" + std::to_string(sent)}, 5s));
    REQUIRE(passTime(clock, 50ms));
  }
  raw.send(secondHalf(sent) + std::string(Frame(Command::kPing).u32(4242)));
  INFO("sent " << sent << " requests over 1500 ms of the server's clock");
  CHECK(raw.readValue<uint32_t>(3s) == 4242u);
}

TEST_CASE("bad input: a client that vanishes while waiting leaves no waiter behind", "[bad-input]") {
  Fixture f;
  std::vector<std::string> many_keys;
  for (int i = 0; i < 1000; ++i) many_keys.push_back("/gate/" + std::to_string(i));
  for (int round = 0; round < 20; ++round) {
    REQUIRE(f.server.waitFor([&](const auto& c) { return c.waiting_clients == 0; }, 5s));  // the last round's is gone
    RawConnection raw(f.server.port());
    std::string wait = round % 2 ? std::string(Frame(Command::kWait).keys({"/gate", "/gate2"}))
                                 : std::string(Frame(LegacyCommand::kWait).keys(many_keys));
    REQUIRE(raw.send((round % 2 ? validateFrame() : std::string()) + wait));
    CHECK(f.server.waitFor([&](const auto& c) { return c.waiting_clients == 1; }, 5s));  // really waiting
    CHECK(raw.quietFor(0ms));                                                            // no reply yet
  }
  f.expectOnlyClientLeft();
  // The keys the vanished clients waited for now come; nobody is there to tell.
  f.client.set("/gate/0", "x");
  f.client.set("/gate", "x");
  f.client.set("/gate2", "x");
  f.expectServes("vanished waiters");

  SECTION("other clients' waits still work") {
    TcpStoreClient waiter(clientOptions(f.server.port()));
    auto blocked = std::async(std::launch::async, [&] { return waiter.get("/gate/1"); });
    REQUIRE(f.server.waitFor([&](const auto& c) { return c.waiting_clients == 1; }, 5s));
    f.client.set("/gate/1", "open");
    REQUIRE(blocked.wait_for(5s) == std::future_status::ready);
    CHECK(blocked.get() == "open");
  }
  SECTION("a waiter that stays gets exactly one STOP_WAITING") {
    RawConnection raw(f.server.port());
    REQUIRE(raw.send(validateFrame() + std::string(Frame(Command::kWait).keys({"/once"}))));
    REQUIRE(f.server.waitFor([&](const auto& c) { return c.waiting_clients == 1; }, 5s));
    CHECK(raw.quietFor(0ms));
    f.client.set("/once", "1");
    CHECK(raw.readValue<uint8_t>() == static_cast<uint8_t>(wire::WaitResponse::kStopWaiting));
    f.client.set("/once", "2");
    f.client.set("/once", "3");
    // Handled, with whatever they queued for `raw`, before this reply; the PING's answer
    // below is then the first byte `raw` gets unless a second STOP_WAITING came.
    CHECK(f.client.get("/once") == "3");
    REQUIRE(raw.send(Frame(Command::kPing).u32(5)));
    CHECK(raw.readValue<uint32_t>() == 5u);
  }
}

TEST_CASE("bad input: a client that never reads its replies does not stall others", "[bad-input]") {
  auto options = localServerOptions();
  options.max_pending_reply_bytes = 64 * 1024;
  Fixture f(options);
  std::string value(16 * 1024, '\0');
  for (size_t i = 0; i < value.size(); ++i) value[i] = static_cast<char>(i * 31 % 253);
  f.client.set("/big", value);
  // 2000 GETs and PINGs: 30 KB of requests asking for 33 MB of replies, more than the
  // socket buffers hold, so the server has to hold back.
  constexpr uint32_t kRounds = 2000;
  std::string requests = validateFrame();
  std::string expected;
  for (uint32_t i = 0; i < kRounds; ++i) {
    requests += Frame(Command::kGet).str("/big");
    requests += Frame(Command::kPing).u32(i);
    expected += Frame().str(value);
    expected += Frame().u32(i);
  }
  RawConnection raw(f.server.port());
  REQUIRE(raw.send(requests, 10s));
  // The server holds back: more replies queued for `raw` than it lets pile up.
  REQUIRE(
      f.server.waitFor([&](const auto& c) { return c.pending_reply_bytes > options.max_pending_reply_bytes; }, 10s));
  auto start = Clock::now();
  f.client.set("meanwhile", "served");
  CHECK(f.client.get("meanwhile") == "served");
  CHECK(msSince(start) < 2000);
  // Now it reads: every reply is there, complete and in order.
  auto replies = raw.read(expected.size(), 30s);
  REQUIRE(replies.has_value());
  CHECK(replies->size() == expected.size());
  CHECK((*replies == expected));
  REQUIRE(raw.send(Frame(Command::kPing).u32(99)));
  CHECK(raw.readValue<uint32_t>() == 99u);
  raw.close();
  f.expectServes("a flood of unread replies");
}

TEST_CASE("bad input: a fuzz loop of random and damaged frames", "[bad-input][fuzz]") {
  Fixture f;
  const auto [seed, budget] = ddprun::testing::fuzzRun("store");
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  const auto current = currentFrames();
  const auto legacy = legacyFrames();
  auto pick = [&](const std::vector<std::string>& frames) { return frames[rng() % frames.size()]; };
  const long rss_before = rssKb();
  const auto end = Clock::now() + budget;
  int i = 0;
  for (; Clock::now() < end; ++i) {
    std::string bytes;
    switch (rng() % 5) {
      case 0: {  // noise
        bytes.resize(1 + rng() % 200);
        for (auto& c : bytes) c = static_cast<char>(rng());
        break;
      }
      case 1: {  // a valid frame, cut short
        std::string frame = pick(current);
        bytes = validateFrame() + frame.substr(0, rng() % frame.size());
        break;
      }
      case 2: {  // valid frames with a few bytes changed, maybe cut
        bytes = validateFrame() + pick(current) + pick(current);
        for (int m = 1 + rng() % 3; m > 0; --m) bytes[5 + rng() % (bytes.size() - 5)] = static_cast<char>(rng());
        if (rng() % 2) bytes.resize(5 + rng() % (bytes.size() - 5));
        break;
      }
      case 3: {  // torch 1.13 frames, damaged
        bytes = pick(legacy) + pick(legacy);
        for (int m = 1 + rng() % 3; m > 0; --m) bytes[1 + rng() % (bytes.size() - 1)] = static_cast<char>(rng());
        if (rng() % 2) bytes.resize(1 + rng() % (bytes.size() - 1));
        break;
      }
      default: {  // VALIDATE, then noise
        bytes = validateFrame();
        for (int n = 1 + rng() % 64; n > 0; --n) bytes.push_back(static_cast<char>(rng()));
        break;
      }
    }
    RawConnection raw(f.server.port());
    raw.send(bytes, 1s);
    if (rng() % 4 == 0) raw.closedByPeerWithin(10ms);  // sometimes linger a moment
    // This iteration's connection may hold a valid request the server rightly keeps open
    // for: close it before counting connections.
    raw.close();
    if (i % 100 == 99) f.expectServes("fuzz iteration " + std::to_string(i));
  }
  std::printf("store fuzz: %d connections of random and damaged frames\n", i);
  f.expectOnlyClientLeft();
  f.expectServes("the fuzz loop");
  // Every frame's connection is gone and nothing it asked for stays allocated (not measurable
  // where the sanitizers' quarantine keeps freed memory resident).
  if (!ddprun::testing::kSanitizedHeap) CHECK(rssKb() - rss_before < 64 * 1024);
}

TEST_CASE("bad input: torch 1.13 frames on a raw socket get torch 1.13 answers", "[bad-input][legacy]") {
  Fixture f;
  RawConnection raw(f.server.port());
  REQUIRE(raw.send(Frame(LegacyCommand::kSet).str("/k").str("v1")));
  REQUIRE(raw.send(Frame(LegacyCommand::kGet).str("/k")));
  CHECK(raw.readBytes() == "v1");
  REQUIRE(raw.send(Frame(LegacyCommand::kAdd).str("init/").i64(1)));
  CHECK(raw.readValue<int64_t>() == 1);
  REQUIRE(raw.send(Frame(LegacyCommand::kCompareSet).str("/k").str("v1").str("v2")));
  CHECK(raw.readBytes() == "v2");
  REQUIRE(raw.send(Frame(LegacyCommand::kCheck).keys({"/k", "init/"})));
  CHECK(raw.readValue<uint8_t>() == static_cast<uint8_t>(wire::CheckResponse::kReady));
  REQUIRE(raw.send(Frame(LegacyCommand::kGetNumKeys)));
  CHECK(raw.readValue<int64_t>() == 3);  // sentinel/base, /k, init/
  REQUIRE(raw.send(Frame(LegacyCommand::kDeleteKey).str("/k")));
  CHECK(raw.readValue<int64_t>() == 1);
  REQUIRE(raw.send(Frame(LegacyCommand::kWait).keys({"/late"})));
  REQUIRE(f.server.waitFor([&](const auto& c) { return c.waiting_clients == 1; }, 5s));
  CHECK(raw.quietFor(0ms));
  f.client.set("/late", "here");
  CHECK(raw.readValue<uint8_t>() == static_cast<uint8_t>(wire::WaitResponse::kStopWaiting));
  // WATCH_KEY: registered, then told of a creation with old and new values.
  RawConnection watcher(f.server.port());
  REQUIRE(watcher.send(Frame(LegacyCommand::kWatchKey).str("/watched")));
  CHECK(watcher.readValue<uint8_t>() == static_cast<uint8_t>(wire::WatchResponse::kCallbackRegistered));
  f.client.set("/watched", "new");
  CHECK(watcher.readValue<uint8_t>() == static_cast<uint8_t>(wire::WatchResponse::kKeyCreated));
  CHECK(watcher.readBytes() == "/watched");
  CHECK(watcher.readBytes() == "");
  CHECK(watcher.readBytes() == "new");
  watcher.close();
  // The current generation's commands do not exist for a torch 1.13 connection.
  REQUIRE(raw.send(Frame().u8(static_cast<uint8_t>(Command::kMultiGet)).keys({"/late"})));
  CHECK(raw.closedByPeerWithin(3s));
  f.expectServes("torch 1.13 frames");
}

// Regression: the limit was once checked only before the next read, while one read's worth
// of requests was answered in full, so a few KB of GETs for a large value made the server
// buffer hundreds of MB.
TEST_CASE("replies a client does not read stay within max_pending_reply_bytes", "[bad-input]") {
  auto options = localServerOptions();
  options.max_pending_reply_bytes = 1024 * 1024;
  Fixture f(options);
  f.client.set("/big", std::string(1024 * 1024, 'x'));
  REQUIRE(f.client.get("/big").size() == 1024 * 1024);
  const long before = rssKb();
  std::string requests = validateFrame();
  for (int i = 0; i < 300; ++i) requests += Frame(Command::kGet).str("/big");  // 4 KB asking for 300 MiB
  RawConnection raw(f.server.port());
  REQUIRE(raw.send(requests));
  // The server has started on the flood; the one I/O thread then answers this PING only
  // after it has handled all it read of it.
  REQUIRE(f.server.waitFor([&](const auto& c) { return c.pending_reply_bytes > 0; }, 10s));
  CHECK(f.client.ping(1) == 1u);
  const long grown_mb = (rssKb() - before) / 1024;
  INFO("the server's memory grew by " << grown_mb << " MiB");
  CHECK(grown_mb < 64);
}

TEST_CASE("bad input: a MULTI_GET whose reply would be gigabytes is refused, and the store serves on", "[bad-input]") {
  Fixture f;
  RawConnection raw(f.server.port());
  REQUIRE(raw.send(validateFrame() + std::string(Frame(Command::kSet).str("/big").str(std::string(1 << 20, 'v')))));
  // 36 KB asking for a 4 GiB reply: refused before any of it is built.
  REQUIRE(raw.send(Frame(Command::kMultiGet).keys(std::vector<std::string>(4096, "/big"))));
  CHECK(raw.closedByPeerWithin(5s));
  // A MULTI_GET of the same key within the limit is answered in full.
  RawConnection fair(f.server.port());
  REQUIRE(
      fair.send(validateFrame() + std::string(Frame(Command::kMultiGet).keys(std::vector<std::string>(16, "/big")))));
  for (int i = 0; i < 16; ++i) {
    auto value = fair.readBytes(10s);
    REQUIRE(value.has_value());
    CHECK(value->size() == (1u << 20));
  }
  fair.close();
  f.expectOnlyClientLeft();
  f.expectServes("a gigabyte MULTI_GET");
}

namespace {

size_t residentBytes() {
  long pages = 0;
  long resident = 0;
  std::ifstream("/proc/self/statm") >> pages >> resident;
  return static_cast<size_t>(resident) * static_cast<size_t>(::sysconf(_SC_PAGESIZE));
}

}  // namespace

TEST_CASE("bad input: requests announcing 60 MiB cost memory only as their bytes arrive", "[bad-input]") {
  Fixture f;
  const size_t before = residentBytes();
  std::vector<std::unique_ptr<RawConnection>> raws;
  const std::string head = Frame(Command::kSet).str("/big").u64(60u << 20);
  for (int i = 0; i < 4; ++i) {
    raws.push_back(std::make_unique<RawConnection>(f.server.port()));
    REQUIRE(raws.back()->send(validateFrame() + head + std::string(8192, 'v')));
  }
  // The buffer for the rest is sized when more of the request arrives: send more, in a
  // second segment each, once the server has taken the first.
  REQUIRE(f.server.waitFor(
      [&](const auto& c) {
        return c.incomplete_requests == 4 && c.incomplete_request_bytes == 4 * (head.size() + 8192);
      },
      5s));
  for (auto& raw : raws) REQUIRE(raw->send(std::string(8192, 'w')));
  // The server has taken the second segments too (and sized its buffers for them).
  REQUIRE(f.server.waitFor([&](const auto& c) { return c.incomplete_request_bytes == 4 * (head.size() + 16384); }, 5s));
  f.client.set("sentinel/during", "served");
  CHECK(f.client.get("sentinel/during") == "served");
  // The server lives in this process: 4 x 60 MiB zero-filled up front would show here.
  const size_t after = residentBytes();
  CHECK(after - std::min(before, after) < (32u << 20));
  raws.clear();
  f.expectServes("four 60 MiB announcements");
}

TEST_CASE("bad input: torch 1.13 watchers that never read are closed, not buffered without bound", "[bad-input]") {
  auto options = localServerOptions();
  options.max_pending_reply_bytes = 16u << 20;
  Fixture f(options);
  std::vector<std::unique_ptr<RawConnection>> watchers;
  for (int i = 0; i < 4; ++i) {
    watchers.push_back(std::make_unique<RawConnection>(f.server.port()));
    REQUIRE(watchers.back()->send(Frame(LegacyCommand::kWatchKey).str("/watched")));
  }
  // Registration is answered in order; once all four are registered, every SET notifies all.
  for (auto& w : watchers) {
    CHECK(w->readValue<uint8_t>() == static_cast<uint8_t>(wire::WatchResponse::kCallbackRegistered));
  }
  const std::string big(4u << 20, 'x');
  for (int i = 0; i < 30; ++i) f.client.set("/watched", big + std::to_string(i));
  // Thirty changes carry 240 MiB of old and new values per watcher: past 16 MiB queued (plus
  // what the kernel's socket buffers hold), each watcher is closed.
  for (auto& w : watchers) CHECK(w->closedByPeerWithin(10s));
  watchers.clear();
  f.expectServes("watchers that never read");
}

// Issue 21 #4: each connection's unread replies were bounded, but twelve clients asking for
// large values and never reading made the server hold twelve times that bound.
TEST_CASE("bad input: replies queued for all clients stay within max_total_pending_reply_bytes", "[bad-input]") {
  auto options = localServerOptions();
  options.max_pending_reply_bytes = 16u << 20;
  options.max_total_pending_reply_bytes = 64u << 20;
  Fixture f(options);
  const std::string value(4u << 20, 'v');
  f.client.set("/big", value);
  // SET has no reply: a GET makes sure the value is there before the hogs ask for it.
  REQUIRE(f.client.get("/big").size() == value.size());
  const long rss_before = rssKb();
  // Each hog asks for 256 MiB of replies in 1.5 KB of requests and never reads; without the
  // server-wide bound each held 16-20 MiB beyond what the kernel's socket buffers take.
  constexpr int kHogs = 12;
  std::string requests = validateFrame();
  for (int i = 0; i < 64; ++i) requests += Frame(Command::kGet).str("/big");
  std::vector<std::unique_ptr<RawConnection>> hogs;
  for (int i = 0; i < kHogs; ++i) {
    hogs.push_back(std::make_unique<RawConnection>(f.server.port()));
    REQUIRE(hogs.back()->send(requests));
    // Its first reply's length: the server has taken it in (reading no more keeps it a hog).
    CHECK(hogs.back()->read(sizeof(uint64_t)).has_value());
  }
  // At least one hog is closed (counted by the server: a hog would have to read all that was
  // sent to it to see its end).
  CHECK(f.server.waitFor([&](const auto& c) { return c.connections < kHogs + 1; }, 10s));
  // A well-behaved client asking for the same large value is served throughout.
  for (int i = 0; i < 8; ++i) CHECK((f.client.get("/big") == value));  // no 4 MiB expansions
  const size_t peak = f.server.peakPendingReplyBytes();
  INFO("peak queued reply bytes: " << peak << ", now " << f.server.pendingReplyBytes() << ", connections "
                                   << f.server.connectionCount());
  CHECK(peak <= options.max_total_pending_reply_bytes);
  CHECK(f.server.pendingReplyBytes() <= options.max_total_pending_reply_bytes);
  // The server lives in this process; twelve hogs at 16-20 MiB each would show here (string
  // growth can hold up to twice the bytes counted, hence the margin). Not under a sanitizer:
  // its quarantine keeps the closed hogs' freed replies resident.
  const long grown_mb = (rssKb() - rss_before) / 1024;
  INFO("the server's memory grew by " << grown_mb << " MiB");
  if (!ddprun::testing::kSanitizedHeap) CHECK(grown_mb < 160);
  hogs.clear();
  f.expectOnlyClientLeft();
  f.expectServes("twelve clients that never read large replies");
}
