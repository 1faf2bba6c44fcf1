#include <stdlib.h>

#include <stdexcept>

#include <catch2/catch.hpp>

#include "agent/ops/error_file.h"
#include "common/json_writer.h"
#include "tests/support/test_process.h"
#include "worker_runtime/error_record.h"

TEST_CASE("the runtime writes errors the agent can read back", "[error_record]") {
  ddprun::testing::TempDir dir;
  std::string path = dir.file("error.json");
  ::setenv("TORCHELASTIC_ERROR_FILE", path.c_str(), 1);
  int code = ddprun::runtime::recordErrors([]() -> int { throw std::runtime_error("bad \"quote\"\nline2\t\x01"); });
  ::unsetenv("TORCHELASTIC_ERROR_FILE");
  CHECK(code == 1);
  auto record = ddprun::agent::readErrorFile(path);
  REQUIRE(record);
  CHECK(record->message == "std::runtime_error: bad \"quote\"\nline2\t\x01");
  REQUIRE(record->timestamp);
  CHECK(*record->timestamp > 1.6e9);
}

TEST_CASE("recordErrors passes the body's exit code through", "[error_record]") {
  CHECK(ddprun::runtime::recordErrors([] { return 0; }) == 0);
  CHECK(ddprun::runtime::recordErrors([] { return 5; }) == 5);
}

TEST_CASE("json escaping", "[error_record]") {
  CHECK(ddprun::jsonString("a\"b\\c\n") == "\"a\\\"b\\\\c\\n\"");
  CHECK(ddprun::jsonString(std::string(1, '\x1f')) == "\"\\u001f\"");
}
