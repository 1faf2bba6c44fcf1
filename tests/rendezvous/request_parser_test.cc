// The request parser on its own: every command of both generations, every truncation
// point, limits enforced from the length fields alone, unknown commands, and telling the
// generations apart from a connection's first bytes.
#include "rendezvous/store/request_parser.h"

#include <catch2/catch.hpp>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "tests/rendezvous/store_test_util.h"

using namespace ddprun::rendezvous;
using ddprun::rendezvous::testing::Frame;
using wire::Command;
using wire::Generation;
using wire::LegacyCommand;

namespace {

std::span<const uint8_t> span(const std::string& s, size_t n) {
  return {reinterpret_cast<const uint8_t*>(s.data()), n};
}
std::span<const uint8_t> span(const std::string& s) { return span(s, s.size()); }

ParseResult parse(const std::string& bytes, Generation generation, Request& out, const StoreLimits& limits = {}) {
  return parseRequest(span(bytes), generation, limits, out);
}

const char* statusName(ParseStatus s) {
  switch (s) {
    case ParseStatus::kComplete: return "Complete";
    case ParseStatus::kNeedMore: return "NeedMore";
    case ParseStatus::kError: return "Error";
  }
  return "?";
}

// A binary value: NUL and high bytes must survive.
const std::string kBinary("v\0\xff\x01z", 5);

struct Sample {
  std::string name;
  Generation generation;
  std::string frame;
  std::function<void(const Request&)> verify;
};

std::vector<Sample> samples() {
  using K = std::vector<std::string>;
  const std::string nonce(wire::kAuthNonceBytes, '\x5a');
  const std::string mac(wire::kAuthMacBytes, '\xa5');
  auto expect = [](Command c, K keys, K values) {
    return [=](const Request& r) {
      CHECK(r.command == c);
      CHECK_FALSE(r.watch_key);
      CHECK(r.keys == keys);
      CHECK(r.values == values);
    };
  };
  std::vector<Sample> s;
  auto cur = Generation::kCurrent;
  auto leg = Generation::kLegacy;
  s.push_back({"VALIDATE", cur, Frame(Command::kValidate).u32(wire::kValidationMagic), [](const Request& r) {
                 CHECK(r.command == Command::kValidate);
                 CHECK(r.word == wire::kValidationMagic);
               }});
  s.push_back({"SET", cur, Frame(Command::kSet).str("/k").str(kBinary), expect(Command::kSet, {"/k"}, {kBinary})});
  s.push_back({"COMPARE_SET", cur, Frame(Command::kCompareSet).str("/k").str("old").str("new"),
               expect(Command::kCompareSet, {"/k"}, {"old", "new"})});
  s.push_back({"COMPARE_SET with empty expected", cur, Frame(Command::kCompareSet).str("/k").str("").str("new"),
               expect(Command::kCompareSet, {"/k"}, {"", "new"})});
  s.push_back({"GET", cur, Frame(Command::kGet).str("/key"), expect(Command::kGet, {"/key"}, {})});
  s.push_back({"ADD", cur, Frame(Command::kAdd).str("/n").i64(-42), [](const Request& r) {
                 CHECK(r.command == Command::kAdd);
                 CHECK(r.keys == K{"/n"});
                 CHECK(r.amount == -42);
               }});
  s.push_back(
      {"CHECK", cur, Frame(Command::kCheck).keys({"/a", "/bb", ""}), expect(Command::kCheck, {"/a", "/bb", ""}, {})});
  s.push_back({"WAIT", cur, Frame(Command::kWait).keys({"/a"}), expect(Command::kWait, {"/a"}, {})});
  s.push_back({"WAIT for no keys", cur, Frame(Command::kWait).keys({}), expect(Command::kWait, {}, {})});
  s.push_back({"GETNUMKEYS", cur, Frame(Command::kGetNumKeys), expect(Command::kGetNumKeys, {}, {})});
  s.push_back({"DELETE_KEY", cur, Frame(Command::kDeleteKey).str("/d"), expect(Command::kDeleteKey, {"/d"}, {})});
  s.push_back(
      {"APPEND", cur, Frame(Command::kAppend).str("/a").str("tail"), expect(Command::kAppend, {"/a"}, {"tail"})});
  s.push_back(
      {"MULTI_GET", cur, Frame(Command::kMultiGet).keys({"/x", "/y"}), expect(Command::kMultiGet, {"/x", "/y"}, {})});
  s.push_back({"MULTI_SET", cur, Frame(Command::kMultiSet).u64(2).str("/x").str("1").str("/y").str(kBinary),
               expect(Command::kMultiSet, {"/x", "/y"}, {"1", kBinary})});
  s.push_back({"CANCEL_WAIT", cur, Frame(Command::kCancelWait), expect(Command::kCancelWait, {}, {})});
  s.push_back({"PING", cur, Frame(Command::kPing).u32(0xdeadbeef), [](const Request& r) {
                 CHECK(r.command == Command::kPing);
                 CHECK(r.word == 0xdeadbeef);
               }});
  s.push_back({"QUEUE_PUSH", cur, Frame(Command::kQueuePush).str("/q").str("item"),
               expect(Command::kQueuePush, {"/q"}, {"item"})});
  s.push_back({"QUEUE_POP", cur, Frame(Command::kQueuePop).str("/q"), expect(Command::kQueuePop, {"/q"}, {})});
  s.push_back({"QUEUE_LEN", cur, Frame(Command::kQueueLen).str("/q"), expect(Command::kQueueLen, {"/q"}, {})});
  s.push_back({"LIST_KEYS", cur, Frame(Command::kListKeys), expect(Command::kListKeys, {}, {})});
  s.push_back({"BARRIER", cur, Frame(Command::kBarrier).str("/b").i64(8), [](const Request& r) {
                 CHECK(r.command == Command::kBarrier);
                 CHECK(r.keys == K{"/b"});
                 CHECK(r.amount == 8);
               }});
  s.push_back({"AUTH_HELLO", cur, Frame(Command::kAuthHello).bytes(nonce), [nonce](const Request& r) {
                 CHECK(r.command == Command::kAuthHello);
                 CHECK(r.blob == nonce);
               }});
  s.push_back({"AUTH_PROOF", cur, Frame(Command::kAuthProof).bytes(mac), [mac](const Request& r) {
                 CHECK(r.command == Command::kAuthProof);
                 CHECK(r.blob == mac);
               }});
  // torch 1.13's numbering maps onto the current commands.
  s.push_back(
      {"legacy SET", leg, Frame(LegacyCommand::kSet).str("/k").str(kBinary), expect(Command::kSet, {"/k"}, {kBinary})});
  s.push_back({"legacy COMPARE_SET", leg, Frame(LegacyCommand::kCompareSet).str("/k").str("a").str("b"),
               expect(Command::kCompareSet, {"/k"}, {"a", "b"})});
  s.push_back({"legacy GET", leg, Frame(LegacyCommand::kGet).str("/k"), expect(Command::kGet, {"/k"}, {})});
  s.push_back({"legacy ADD", leg, Frame(LegacyCommand::kAdd).str("init/").i64(1), [](const Request& r) {
                 CHECK(r.command == Command::kAdd);
                 CHECK(r.keys == K{"init/"});
                 CHECK(r.amount == 1);
               }});
  s.push_back({"legacy CHECK", leg, Frame(LegacyCommand::kCheck).keys({"/a", "/b"}),
               expect(Command::kCheck, {"/a", "/b"}, {})});
  s.push_back({"legacy WAIT", leg, Frame(LegacyCommand::kWait).keys({"/a"}), expect(Command::kWait, {"/a"}, {})});
  s.push_back({"legacy GETNUMKEYS", leg, Frame(LegacyCommand::kGetNumKeys), expect(Command::kGetNumKeys, {}, {})});
  s.push_back({"legacy WATCH_KEY", leg, Frame(LegacyCommand::kWatchKey).str("/w"), [](const Request& r) {
                 CHECK(r.watch_key);
                 CHECK(r.keys == K{"/w"});
               }});
  s.push_back(
      {"legacy DELETE_KEY", leg, Frame(LegacyCommand::kDeleteKey).str("/d"), expect(Command::kDeleteKey, {"/d"}, {})});
  return s;
}

}  // namespace

TEST_CASE("parser: every command of both generations parses completely", "[parser]") {
  for (const auto& sample : samples()) {
    INFO(sample.name);
    Request request;
    ParseResult result = parse(sample.frame, sample.generation, request);
    INFO("status " << statusName(result.status) << ": " << result.error);
    REQUIRE(result.status == ParseStatus::kComplete);
    CHECK(result.consumed == sample.frame.size());
    sample.verify(request);
  }
}

TEST_CASE("parser: back-to-back requests are consumed one at a time", "[parser]") {
  for (const auto& sample : samples()) {
    INFO(sample.name);
    // The next request follows in the same read, as fire-and-forget SETs do.
    std::string two = sample.frame + sample.frame.substr(0, sample.frame.size() / 2 + 1);
    Request request;
    ParseResult result = parse(two, sample.generation, request);
    REQUIRE(result.status == ParseStatus::kComplete);
    CHECK(result.consumed == sample.frame.size());
    sample.verify(request);
  }
}

TEST_CASE("parser: a frame cut at any byte needs more, never fails or completes", "[parser]") {
  for (const auto& sample : samples()) {
    for (size_t cut = 0; cut < sample.frame.size(); ++cut) {
      INFO(sample.name << " cut after " << cut << " of " << sample.frame.size() << " bytes");
      Request request;
      ParseResult result = parseRequest(span(sample.frame, cut), sample.generation, StoreLimits{}, request);
      INFO("status " << statusName(result.status) << ": " << result.error);
      REQUIRE(result.status == ParseStatus::kNeedMore);
      CHECK(result.need_at_least > cut);
      CHECK(result.need_at_least <= sample.frame.size());
    }
  }
}

TEST_CASE("parser: oversized lengths and counts fail from the header alone", "[parser]") {
  StoreLimits limits;
  limits.max_key_bytes = 16;
  limits.max_value_bytes = 32;
  limits.max_keys_per_request = 4;
  limits.max_request_bytes = 100;
  const uint64_t kHuge = std::numeric_limits<uint64_t>::max();
  auto expectError = [&](const std::string& frame, Generation generation, const StoreLimits& l) {
    Request request;
    ParseResult result = parse(frame, generation, request, l);
    INFO("status " << statusName(result.status));
    CHECK(result.status == ParseStatus::kError);
    CHECK_FALSE(result.error.empty());
    return result.error;
  };
  auto expectNeedMore = [&](const std::string& frame, const StoreLimits& l) {
    Request request;
    ParseResult result = parse(frame, Generation::kCurrent, request, l);
    INFO("status " << statusName(result.status) << ": " << result.error);
    CHECK(result.status == ParseStatus::kNeedMore);
  };
  // Only the length field is present: the parser must refuse before any payload arrives.
  SECTION("key") {
    CHECK_THAT(expectError(Frame(Command::kSet).u64(17), Generation::kCurrent, limits), Catch::Contains("key"));
    expectNeedMore(Frame(Command::kSet).u64(16), limits);  // the limit itself is allowed
    expectError(Frame(Command::kGet).u64(kHuge), Generation::kCurrent, limits);
    expectError(Frame(Command::kGet).u64(kHuge), Generation::kCurrent, StoreLimits{});
    expectError(Frame(Command::kGet).u64(kHuge), Generation::kLegacy, StoreLimits{});
    expectError(Frame(Command::kGet).u64(StoreLimits{}.max_key_bytes + 1), Generation::kCurrent, StoreLimits{});
  }
  SECTION("value") {
    CHECK_THAT(expectError(Frame(Command::kSet).str("/k").u64(33), Generation::kCurrent, limits),
               Catch::Contains("value"));
    expectNeedMore(Frame(Command::kSet).str("/k").u64(32), limits);
    expectError(Frame(Command::kSet).str("/k").u64(kHuge), Generation::kCurrent, StoreLimits{});
    expectError(Frame(Command::kAppend).str("/k").u64(kHuge), Generation::kCurrent, StoreLimits{});
    expectError(Frame(Command::kQueuePush).str("/k").u64(kHuge), Generation::kCurrent, StoreLimits{});
    expectError(Frame(Command::kCompareSet).str("/k").str("").u64(kHuge), Generation::kCurrent, StoreLimits{});
    expectError(Frame(Command::kSet).str("/k").u64(StoreLimits{}.max_value_bytes + 1), Generation::kCurrent,
                StoreLimits{});
  }
  SECTION("key count") {
    for (auto command : {Command::kCheck, Command::kWait, Command::kMultiGet, Command::kMultiSet}) {
      INFO("command " << int(command));
      expectError(Frame(command).u64(5), Generation::kCurrent, limits);
      expectError(Frame(command).u64(kHuge), Generation::kCurrent, StoreLimits{});
      expectError(Frame(command).u64(StoreLimits{}.max_keys_per_request + 1), Generation::kCurrent, StoreLimits{});
    }
    expectNeedMore(Frame(Command::kWait).u64(4), limits);
    expectError(Frame(LegacyCommand::kWait).u64(kHuge), Generation::kLegacy, StoreLimits{});
  }
  SECTION("whole request") {
    // Each field is within its limit; together they are not.
    Frame multi(Command::kMultiSet);
    multi.u64(3).str(std::string(16, 'a')).str(std::string(32, 'v')).str(std::string(16, 'b')).u64(32);
    CHECK_THAT(expectError(multi, Generation::kCurrent, limits), Catch::Contains("size limit"));
  }
}

TEST_CASE("parser: an unknown command byte is an error", "[parser]") {
  for (int code : {19, 20, 0x42, 0x5f, 0x62, 0xff}) {
    INFO("current command " << code);
    Request request;
    ParseResult result = parse(Frame().u8(static_cast<uint8_t>(code)).u64(0), Generation::kCurrent, request);
    CHECK(result.status == ParseStatus::kError);
    CHECK_THAT(result.error, Catch::Contains(std::to_string(code)));
  }
  // torch 1.13 had commands 0..8 only; the ddprun extensions are not part of it either.
  for (int code : {9, 12, 13, 0x60, 0x61, 0xff}) {
    INFO("legacy command " << code);
    Request request;
    ParseResult result = parse(Frame().u8(static_cast<uint8_t>(code)).u64(0), Generation::kLegacy, request);
    CHECK(result.status == ParseStatus::kError);
  }
  // The error does not wait for a body.
  Request request;
  CHECK(parse(Frame().u8(0x42), Generation::kCurrent, request).status == ParseStatus::kError);
}

TEST_CASE("parser: the generation is told from the first bytes", "[parser]") {
  auto detect = [](const std::string& bytes) { return detectGeneration(span(bytes)); };
  const std::string validate = ddprun::rendezvous::testing::validateFrame();
  CHECK(detect("") == Generation::kUnknown);
  SECTION("a first byte other than 0 is torch 1.13") {
    CHECK(detect(Frame().u8(3)) == Generation::kLegacy);
    for (int code = 1; code <= 8; ++code) CHECK(detect(Frame().u8(static_cast<uint8_t>(code))) == Generation::kLegacy);
    CHECK(detect(Frame(LegacyCommand::kAdd).str("init/").i64(1)) == Generation::kLegacy);
  }
  SECTION("0 alone, or with part of the magic, is not decided yet") {
    for (size_t n = 1; n < validate.size(); ++n) {
      INFO(n << " bytes");
      CHECK(detect(validate.substr(0, n)) == Generation::kUnknown);
    }
  }
  SECTION("VALIDATE with the magic is the current generation") {
    CHECK(detect(validate) == Generation::kCurrent);
    CHECK(detect(validate + std::string(Frame(Command::kPing).u32(7))) == Generation::kCurrent);
  }
  SECTION("0 followed by anything but the magic is a torch 1.13 SET") {
    std::string legacy_set = Frame(LegacyCommand::kSet).str("/k").str("v");
    CHECK(detect(legacy_set) == Generation::kLegacy);
    CHECK(detect(Frame().u8(0).u32(wire::kValidationMagic + 1)) == Generation::kLegacy);
    CHECK(detect(Frame().u8(0).u32(0)) == Generation::kLegacy);
    // And it parses as one.
    Request request;
    ParseResult result = parse(legacy_set, Generation::kLegacy, request);
    REQUIRE(result.status == ParseStatus::kComplete);
    CHECK(request.command == Command::kSet);
    CHECK(request.keys == std::vector<std::string>{"/k"});
  }
}

TEST_CASE("parser: VALIDATE reports a wrong magic for the server to refuse", "[parser]") {
  Request request;
  ParseResult result = parse(Frame(Command::kValidate).u32(0x12345678), Generation::kCurrent, request);
  REQUIRE(result.status == ParseStatus::kComplete);
  CHECK(request.command == Command::kValidate);
  CHECK(request.word == 0x12345678);
}
