#include "agent/event_log.h"

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
