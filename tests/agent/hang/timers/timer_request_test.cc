#include <string>

#include <catch2/catch.hpp>

#include "agent/hang/timers/timer_request.h"

using namespace ddprun::agent;

namespace {

TimerRequest parsedOk(std::string_view line) {
  ParsedTimerRequest p = parseTimerRequest(line);
  INFO(line << " -> " << p.error);
  REQUIRE(p.request);
  CHECK(p.error.empty());
  return *p.request;
}

std::string errorOf(std::string_view line) {
  ParsedTimerRequest p = parseTimerRequest(line);
  CHECK_FALSE(p.request);
  return p.error;
}

}  // namespace

TEST_CASE("timer requests as torch's FileTimerClient writes them are read", "[timer_request]") {
  // json.dumps(FileTimerRequest.to_json()) of torch 1.13 and 2.x.
  const TimerRequest set = parsedOk(
      R"({"version": 1, "pid": 4242, "scope_id": "train_step", "expiration_time": 1700000000.25, "signal": 9})");
  CHECK(set.version == 1);
  CHECK(set.pid == 4242);
  CHECK(set.scope_id == "train_step");
  CHECK(set.expiration_time == 1700000000.25);
  CHECK(set.signal == 9);
  CHECK_FALSE(set.isRelease());

  const TimerRequest release =
      parsedOk(R"({"version": 1, "pid": 4242, "scope_id": "train_step", "expiration_time": -1, "signal": 0})");
  CHECK(release.isRelease());
  CHECK(release.signal == 0);
}

TEST_CASE("timer requests in compact JSON with other keys and escapes and Python's Infinity", "[timer_request]") {
  const TimerRequest compact =
      parsedOk(R"({"pid":7,"scope_id":"s","expiration_time":12,"signal":15,"extra":[1,{"a":null}]})");
  CHECK(compact.pid == 7);
  CHECK(compact.expiration_time == 12.0);
  CHECK(compact.signal == 15);
  // json.dumps escapes every non-ASCII character, pairs of surrogates above the BMP.
  const TimerRequest escaped =
      parsedOk(R"({"pid": 1, "scope_id": "\u00e9tape \"1\"\\\n\ud83d\ude80", "expiration_time": 1e3, "signal": -1})");
  CHECK(escaped.scope_id == "\xc3\xa9tape \"1\"\\\n\xf0\x9f\x9a\x80");
  CHECK(escaped.expiration_time == 1000.0);
  CHECK(escaped.signal == -1);
  const TimerRequest forever = parsedOk(R"({"pid": 1, "scope_id": "s", "expiration_time": Infinity, "signal": 9})");
  CHECK(std::isinf(forever.expiration_time));
  CHECK_FALSE(forever.isRelease());
}

TEST_CASE("malformed timer requests are refused with the reason", "[timer_request]") {
  CHECK_THAT(errorOf("hello"), Catch::StartsWith("not JSON at byte 0"));
  CHECK_THAT(errorOf(""), Catch::StartsWith("not JSON"));
  CHECK_THAT(errorOf(R"({"pid": 1, "scope_id": "s", "expiration_time": 1, "signal": 9)"),
             Catch::StartsWith("not JSON"));
  CHECK_THAT(errorOf(R"({"pid": 1, "scope_id": "s", "expiration_time": 1, "signal": 9} x)"),
             Catch::Contains("text after the object"));
  CHECK_THAT(errorOf(R"({"pid": 01, "scope_id": "s", "expiration_time": 1, "signal": 9})"),
             Catch::Contains("leading zero"));
  CHECK_THAT(errorOf(R"({"pid": 1, "scope_id": "s\q", "expiration_time": 1, "signal": 9})"),
             Catch::Contains("bad escape"));
  CHECK(errorOf(R"({"scope_id": "s", "expiration_time": 1, "signal": 9})") == "no field 'pid'");
  CHECK(errorOf(R"({"pid": 1, "expiration_time": 1, "signal": 9})") == "no field 'scope_id'");
  CHECK(errorOf(R"({"pid": 1, "scope_id": "s", "signal": 9})") == "no field 'expiration_time'");
  CHECK(errorOf(R"({"pid": 1, "scope_id": "s", "expiration_time": 1})") == "no field 'signal'");
  CHECK(errorOf(R"({"pid": "1", "scope_id": "s", "expiration_time": 1, "signal": 9})") ==
        "field 'pid' is a string, not an integer");
  CHECK(errorOf(R"({"pid": 1.5, "scope_id": "s", "expiration_time": 1, "signal": 9})") ==
        "field 'pid' is not an integer");
  CHECK(errorOf(R"({"pid": 1, "scope_id": 3, "expiration_time": 1, "signal": 9})") ==
        "field 'scope_id' is a number, not a string");
  CHECK(errorOf(R"({"pid": 1, "scope_id": "s", "expiration_time": null, "signal": 9})") ==
        "field 'expiration_time' is null, not a number");
  CHECK(errorOf(R"({"pid": 0, "scope_id": "s", "expiration_time": 1, "signal": 9})") ==
        "field 'pid' is 0, not a process id");
  CHECK(errorOf(R"({"pid": -5, "scope_id": "s", "expiration_time": 1, "signal": 9})") ==
        "field 'pid' is -5, not a process id");
  CHECK(errorOf(R"({"pid": 1, "scope_id": "s", "expiration_time": NaN, "signal": 9})") ==
        "field 'expiration_time' is NaN");
  CHECK(errorOf(R"({"pid": 1, "scope_id": "s", "expiration_time": 1, "signal": 99})") ==
        "field 'signal' is 99, not a signal number");
  CHECK(errorOf("[1, 2]").find("expected '{'") != std::string::npos);
}

TEST_CASE("the pipe's bytes become request lines whatever the reads cut", "[timer_request]") {
  TimerLineBuffer buffer;
  CHECK(buffer.feed("{\"a\"").empty());
  auto lines = buffer.feed(": 1}\n\n{\"b\": 2}\n{\"c\"");
  REQUIRE(lines.size() == 2);
  CHECK(lines[0].text == "{\"a\": 1}");
  CHECK(lines[1].text == "{\"b\": 2}");
  lines = buffer.feed(": 3}\n");
  REQUIRE(lines.size() == 1);
  CHECK(lines[0].text == "{\"c\": 3}");
  CHECK(lines[0].overlong_size == 0);
}

TEST_CASE("a line longer than PIPE_BUF is dropped as one and the next line is read", "[timer_request]") {
  TimerLineBuffer buffer;
  const std::string big(TimerLineBuffer::kMaxLine + 10, 'x');
  CHECK(buffer.feed(big.substr(0, 3000)).empty());
  CHECK(buffer.feed(big.substr(3000)).empty());
  auto lines = buffer.feed("yz\n{\"ok\": 1}\n");
  REQUIRE(lines.size() == 2);
  CHECK(lines[0].text.empty());
  CHECK(lines[0].overlong_size == big.size() + 2);
  CHECK(lines[1].text == "{\"ok\": 1}");
  // Exactly PIPE_BUF bytes is still a line.
  const std::string edge(TimerLineBuffer::kMaxLine, 'e');
  lines = buffer.feed(edge + "\n");
  REQUIRE(lines.size() == 1);
  CHECK(lines[0].text == edge);
}
