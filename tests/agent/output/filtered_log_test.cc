#include "agent/output/filtered_log.h"

#include <catch2/catch.hpp>

#include "common/error.h"
#include "tests/support/test_process.h"

using ddprun::agent::FilteredLog;
using ddprun::agent::parseFilterList;
using Strings = std::vector<std::string>;

TEST_CASE("filter lists split at commas and ,, is a literal comma", "[unit][filters]") {
  CHECK(parseFilterList("--f", "") == Strings{});
  CHECK(parseFilterList("--f", "apple") == Strings{"apple"});
  CHECK(parseFilterList("--f", "apple,orange") == Strings{"apple", "orange"});
  CHECK(parseFilterList("--f", "a,,b") == Strings{"a,b"});
  // Pairs are taken left to right, as torchrun's replace(",,", ...) takes them.
  CHECK(parseFilterList("--f", "a,,,b") == Strings{"a,", "b"});
  CHECK(parseFilterList("--f", ",,") == Strings{","});
  CHECK(parseFilterList("--f", " x ") == Strings{" x "});
}

TEST_CASE("an empty filter is a usage error naming the flag", "[unit][filters]") {
  for (const char* bad : {"apple,", ",apple", "a,,,", "a,,,,,"}) {
    INFO(bad);
    CHECK_THROWS_AS(parseFilterList("--duplicate_stdout_filters", bad), ddprun::UsageError);
    CHECK_THROWS_WITH(parseFilterList("--duplicate_stdout_filters", bad),
                      Catch::StartsWith("invalid --duplicate_stdout_filters value '" + std::string(bad) + "'") &&
                          Catch::Contains("empty filter"));
  }
}

TEST_CASE("a filtered log keeps exactly the matching lines with their prefixes", "[unit][filters]") {
  ddprun::testing::TempDir dir;
  {
    FilteredLog log(dir.file("filtered_stdout.log"), {"apple", "kiwi,lime"});
    log.offer("[rank0]:", "an apple a day\n");
    log.offer("[rank1]:", "a banana\n");
    log.offer("[rank1]:", "kiwi,lime\n");
    log.offer("[rank1]:", "kiwi lime\n");
    log.offer("", "apple without a prefix\n");
  }
  CHECK(ddprun::testing::readFile(dir.file("filtered_stdout.log")) ==
        "[rank0]:an apple a day\n[rank1]:kiwi,lime\napple without a prefix\n");
}

TEST_CASE("a filtered log that cannot be opened is skipped", "[unit][filters]") {
  FilteredLog log("/nonexistent-dir/filtered_stdout.log", {"x"});
  log.offer("", "x\n");  // must not throw
  SUCCEED();
}
