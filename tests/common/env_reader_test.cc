// The typed environment reader: every kind of value, the bounds, and the one-line messages
// that name the variable and its value.
#include "common/env_reader.h"

#include <climits>
#include <cstdint>

#include <catch2/catch.hpp>

#include "common/error.h"
#include "tests/support/scoped_env.h"

using ddprun::UsageError;
using ddprun::testing::ScopedEnv;
namespace env = ddprun::env;

namespace {

// A name no other test or the environment uses.
constexpr const char* kVar = "DDPRUN_ENV_READER_TEST_VAR";

// The message of the UsageError that `fn` throws ("" when it throws nothing).
template <class Fn>
std::string usageMessage(Fn&& fn) {
  try {
    fn();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("env reader: strings when unset or empty or set", "[unit][env]") {
  {
    ScopedEnv unset(kVar, std::nullopt);
    CHECK_FALSE(env::raw(kVar));
    CHECK_FALSE(env::optionalString(kVar));
    CHECK(env::stringOr(kVar, "fallback") == "fallback");
    CHECK(usageMessage([] { env::requireString(kVar); }) == std::string(kVar) + " is not set");
  }
  {
    // Empty counts as unset, except for raw(), which tells the two apart.
    ScopedEnv empty(kVar, "");
    CHECK(env::raw(kVar) == std::optional<std::string>(""));
    CHECK_FALSE(env::optionalString(kVar));
    CHECK(env::stringOr(kVar, "fallback") == "fallback");
    CHECK(usageMessage([] { env::requireString(kVar); }) == std::string(kVar) + " is not set");
    CHECK_FALSE(env::optionalInteger(kVar, 0, 10));
    CHECK(env::integerOr(kVar, 7, 0, 10) == 7);
    CHECK(env::booleanOr(kVar, true));
  }
  ScopedEnv set(kVar, "node-1 a b");
  CHECK(env::raw(kVar) == std::optional<std::string>("node-1 a b"));
  CHECK(env::optionalString(kVar) == std::optional<std::string>("node-1 a b"));
  CHECK(env::stringOr(kVar, "fallback") == "node-1 a b");
  CHECK(env::requireString(kVar) == "node-1 a b");
}

TEST_CASE("env reader: integers within bounds", "[unit][env]") {
  CHECK(env::parseInteger("RANK", "0", 0, 3) == 0);
  CHECK(env::parseInteger("RANK", "3", 0, 3) == 3);
  CHECK(env::parseInteger("OFFSET", "-5", -10, 10) == -5);
  CHECK(env::parseInteger("BIG", "9223372036854775807", 0, INT64_MAX) == INT64_MAX);
  CHECK(env::parseInteger("SMALL", "-9223372036854775808", INT64_MIN, 0) == INT64_MIN);

  ScopedEnv set(kVar, "29500");
  CHECK(env::requireInteger(kVar, 1, 65535) == 29500);
  CHECK(env::integerOr(kVar, 0, 1, 65535) == 29500);
  CHECK(env::optionalInteger(kVar, 1, 65535) == std::optional<int64_t>(29500));
  // The default bounds are the type's range.
  CHECK(env::requireInteger<int>(kVar) == 29500);
  ScopedEnv too_big(kVar, "40000");
  CHECK(usageMessage([] { env::requireInteger<int16_t>(kVar); }) ==
        std::string(kVar) + "=40000: out of range -32768..32767");
}

TEST_CASE("env reader: a value that is not an integer names the variable and the value", "[unit][env]") {
  for (const char* text : {"abc", "1.5", "12abc", " 3", "3 ", "+3", "-", "0x10", "1e3"}) {
    INFO("value '" << text << "'");
    CHECK(usageMessage([&] { env::parseInteger("RANK", text, 0, 100); }) ==
          std::string("RANK=") + text + ": not an integer");
  }
  ScopedEnv set("RANK", "abc");
  CHECK(usageMessage([] { env::requireInteger("RANK", 0, INT_MAX); }) == "RANK=abc: not an integer");
  CHECK(usageMessage([] { env::integerOr("RANK", 0, 0, INT_MAX); }) == "RANK=abc: not an integer");
  CHECK(usageMessage([] { env::optionalInteger("RANK", 0, INT_MAX); }) == "RANK=abc: not an integer");
}

TEST_CASE("env reader: a value out of range names the variable with its value and the range", "[unit][env]") {
  CHECK(usageMessage([] { env::parseInteger("MASTER_PORT", "99999", 1, 65535); }) ==
        "MASTER_PORT=99999: out of range 1..65535");
  CHECK(usageMessage([] { env::parseInteger("MASTER_PORT", "0", 1, 65535); }) ==
        "MASTER_PORT=0: out of range 1..65535");
  CHECK(usageMessage([] { env::parseInteger("RANK", "-1", 0, 3); }) == "RANK=-1: out of range 0..3");
  // Too large for any integer: out of range, not wrapped around.
  CHECK(usageMessage([] { env::parseInteger("N", "99999999999999999999", 0, 10); }) ==
        "N=99999999999999999999: out of range 0..10");
  CHECK(usageMessage([] { env::parseInteger("N", "-99999999999999999999", 0, 10); }) ==
        "N=-99999999999999999999: out of range 0..10");
  ScopedEnv set("MASTER_PORT", "99999");
  CHECK(usageMessage([] { env::requireInteger("MASTER_PORT", 1, 65535); }) ==
        "MASTER_PORT=99999: out of range 1..65535");
  CHECK(usageMessage([] { env::integerOr("MASTER_PORT", 29500, 1, 65535); }) ==
        "MASTER_PORT=99999: out of range 1..65535");
}

TEST_CASE("env reader: an unset required integer is reported as not set", "[unit][env]") {
  ScopedEnv unset(kVar, std::nullopt);
  CHECK(usageMessage([] { env::requireInteger(kVar, 0, 10); }) == std::string(kVar) + " is not set");
  CHECK(env::integerOr(kVar, -1, 0, 10) == -1);  // the fallback is the caller's, not checked
}

TEST_CASE("env reader: booleans", "[unit][env]") {
  for (const char* text : {"1", "true", "True", "TRUE", "yes", "Yes", "on", "ON"}) {
    INFO(text);
    CHECK(env::parseBoolean("DDPRUN_SHM", text));
  }
  for (const char* text : {"0", "false", "False", "no", "NO", "off", "Off"}) {
    INFO(text);
    CHECK_FALSE(env::parseBoolean("DDPRUN_SHM", text));
  }
  for (const char* text : {"2", "maybe", "", " 1", "truthy"}) {
    INFO(text);
    CHECK(usageMessage([&] { env::parseBoolean("DDPRUN_SHM", text); }) ==
          std::string("DDPRUN_SHM=") + text + ": not a boolean (1/0, true/false, yes/no, on/off)");
  }
  {
    ScopedEnv unset(kVar, std::nullopt);
    CHECK_FALSE(env::optionalBoolean(kVar));
    CHECK(env::booleanOr(kVar, true));
    CHECK_FALSE(env::booleanOr(kVar, false));
  }
  ScopedEnv set(kVar, "off");
  CHECK(env::optionalBoolean(kVar) == std::optional<bool>(false));
  CHECK_FALSE(env::booleanOr(kVar, true));
}

TEST_CASE("env reader: the message stays on one line whatever the value holds", "[unit][env]") {
  const std::string message = usageMessage([] { env::parseInteger("RANK", "1\n2\t3\x01", 0, 9); });
  CHECK(message == "RANK=1\\x0a2\\x093\\x01: not an integer");
  CHECK(message.find('\n') == std::string::npos);
  const std::string long_value(1000, '7');
  const std::string long_message = usageMessage([&] { env::parseInteger("N", long_value, 0, 9); });
  CHECK(long_message.size() < 300);
  CHECK_THAT(long_message, Catch::StartsWith("N=777") && Catch::EndsWith("...: out of range 0..9"));
}
