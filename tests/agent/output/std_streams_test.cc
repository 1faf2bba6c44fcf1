#include <catch2/catch.hpp>

#include "agent/output/std_streams.h"
#include "common/error.h"

using ddprun::agent::Std;
using ddprun::agent::StdSpec;

TEST_CASE("a single value applies to every local rank", "[std_streams]") {
  auto spec = StdSpec::parse("--tee", "3");
  CHECK(spec.forLocalRank(0) == Std::kAll);
  CHECK(spec.forLocalRank(17) == Std::kAll);
  CHECK(StdSpec::parse("--tee", "0").anyStream() == false);
  CHECK(includesStdout(Std::kOut));
  CHECK_FALSE(includesStderr(Std::kOut));
  CHECK(includesStderr(Std::kErr));
  CHECK(includesStdout(Std::kAll));
  CHECK(includesStderr(Std::kAll));
}

TEST_CASE("a per-rank map names ranks and others get none", "[std_streams]") {
  auto spec = StdSpec::parse("--redirects", "0:1,1:2,12:3");
  CHECK(spec.forLocalRank(0) == Std::kOut);
  CHECK(spec.forLocalRank(1) == Std::kErr);
  CHECK(spec.forLocalRank(12) == Std::kAll);
  CHECK(spec.forLocalRank(2) == Std::kNone);
  CHECK(spec.anyStream());
  CHECK_FALSE(StdSpec::parse("--redirects", "0:0").anyStream());
}

TEST_CASE("malformed values are rejected with the flag's name", "[std_streams]") {
  for (const char* bad : {"", "4", "-1", "a", "1:", ":1", "0:4", "0:1,", "0:1,,1:2", "0:1,0:2", "0=1"}) {
    INFO(bad);
    CHECK_THROWS_WITH(StdSpec::parse("--tee", bad), Catch::Contains("--tee"));
  }
}
