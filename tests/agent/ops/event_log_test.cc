#include "agent/ops/event_log.h"

#include <cmath>

#include <catch2/catch.hpp>

#include "common/error.h"
#include "tests/support/test_process.h"

using namespace ddprun::agent;
using ddprun::JsonObject;
using ddprun::jsonString;
using ddprun::testing::readFile;
using ddprun::testing::TempDir;

TEST_CASE("JSON strings escape what JSON requires", "[events]") {
  CHECK(jsonString("plain") == "\"plain\"");
  CHECK(jsonString("a\"b\\c") == "\"a\\\"b\\\\c\"");
  CHECK(jsonString("l1\nl2\t\x01") == "\"l1\\nl2\\t\\u0001\"");
  CHECK(JsonObject().add("n", 3).add("b", false).add("s", "x").addNull("z").str() ==
        "{\"n\":3,\"b\":false,\"s\":\"x\",\"z\":null}");
}

// Issue 39, defect 9: a 0xFF byte in --rdzv_id or a timer scope made the lines invalid JSON.
TEST_CASE("invalid UTF-8 becomes U+FFFD and valid UTF-8 passes, so every line is JSON", "[events]") {
  CHECK(jsonString("job\xff") == "\"job\\ufffd\"");
  CHECK(jsonString("\xc3\xa9t\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80") ==
        "\"\xc3\xa9t\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"");
  // A truncated sequence, a stray continuation byte, an overlong '/', a surrogate, past U+10FFFF.
  CHECK(jsonString("a\xc3") == "\"a\\ufffd\"");
  CHECK(jsonString("\x80z") == "\"\\ufffdz\"");
  CHECK(jsonString("\xc0\xaf") == "\"\\ufffd\\ufffd\"");
  CHECK(jsonString("\xed\xa0\x80") == "\"\\ufffd\\ufffd\\ufffd\"");
  CHECK(jsonString("\xf4\x90\x80\x80") == "\"\\ufffd\\ufffd\\ufffd\\ufffd\"");
  CHECK(jsonString("\xe2\x82") == "\"\\ufffd\\ufffd\"");
  TempDir dir;
  const std::string path = dir.file("events.jsonl");
  {
    EventLog log({path}, "job\xff\xfe");
    log.setNode("host\xc3:1");
    log.emit("timer_expired", JsonObject().add("scope", "s\xff\n\x1b[2J"));
  }
  CHECK_THAT(readFile(path), Catch::Contains("\"node\":\"host\\ufffd:1\",\"run_id\":\"job\\ufffd\\ufffd\"") &&
                                 Catch::Contains("\"scope\":\"s\\ufffd\\n\\u001b[2J\"}\n"));
}

TEST_CASE("a NaN or infinite number is written as null", "[events]") {
  CHECK(JsonObject().add("a", 1.5).add("b", std::nan("")).add("c", -HUGE_VAL).str() ==
        "{\"a\":1.500,\"b\":null,\"c\":null}");
}

TEST_CASE("each event is one line in every events file, with time, node and run id", "[events]") {
  TempDir dir;
  const std::string a = dir.file("a.jsonl");
  const std::string b = dir.file("b.jsonl");
  {
    EventLog log({a, b}, "job\"1");
    log.setNode("host:7");
    log.emit("worker_exit", JsonObject().add("rank", 3).add("signal", "SIGKILL"));
    log.emit("agent_exit");
  }
  const std::string text = readFile(a);
  CHECK(text == readFile(b));
  CHECK(ddprun::testing::countOf(text, "\n") == 2);
  CHECK(text.rfind("{\"time\":\"", 0) == 0);
  CHECK_THAT(text, Catch::Contains("\"event\":\"worker_exit\",\"node\":\"host:7\",\"run_id\":\"job\\\"1\","
                                   "\"rank\":3,\"signal\":\"SIGKILL\"}\n"));
  CHECK_THAT(text, Catch::EndsWith("\"event\":\"agent_exit\",\"node\":\"host:7\",\"run_id\":\"job\\\"1\"}\n"));
  // Appends: a second agent (or run) sharing the file adds its lines.
  EventLog({a}, "job2").emit("agent_start");
  CHECK(ddprun::testing::countOf(readFile(a), "\n") == 3);
}

TEST_CASE("an events file that cannot be opened is a usage error", "[events]") {
  CHECK_THROWS_AS(EventLog({"/nonexistent-dir/x.jsonl"}, "job"), ddprun::UsageError);
  CHECK_THROWS_AS(checkAppendable("/nonexistent-dir/x.jsonl"), ddprun::UsageError);
}

TEST_CASE("times are UTC ISO 8601 with milliseconds", "[events]") {
  CHECK(isoTimeUtc(0) == "1970-01-01T00:00:00.000Z");
  CHECK(isoTimeUtc(1795352723059) == "2026-11-22T13:05:23.059Z");
}
