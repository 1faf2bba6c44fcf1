#include "agent/hang/python/stack_summary.h"

#include <catch2/catch.hpp>

#include "agent/hang/rings/hang_verdict.h"

namespace ddprun::agent {
namespace {

const std::string kTraceback = "File \"/job/train.py\", line 10, in <module>\n  time.sleep(120)\n";

TEST_CASE("a node's Python tracebacks go through its hang summary and come back whole", "[unit]") {
  const std::string lines =
      encodeStackSummary("host b:77", {{2, 0, kTraceback}, {3, 1, ""}, {5, 1, "File \"/a b.py\", line 1, in f\n"}});
  // The rank without a traceback sends nothing.
  CHECK(lines.find("py1 r 3 ") == std::string::npos);
  const RemoteStacks got = decodeStackSummary(lines, 8, {0, 1});
  CHECK(got.rejected == 0);
  REQUIRE(got.ranks.size() == 2);
  CHECK(got.ranks.at(2).node == "host b:77");
  CHECK(got.ranks.at(2).local_rank == 0);
  CHECK(got.ranks.at(2).traceback == kTraceback);
  CHECK(got.ranks.at(5).traceback == "File \"/a b.py\", line 1, in f\n");
  // The ring positions' reader skips these lines rather than rejecting them.
  CHECK(decodeSummary(lines, 8, {0, 1}).rejected == 0);
}

TEST_CASE("a forged summary's tracebacks are rejected: ranks this job cannot hold, this node's, twice, too long",
          "[unit]") {
  std::string forged = encodeStackSummary("n", {{4242, 0, kTraceback}, {0, 0, kTraceback}, {2, 0, kTraceback}});
  forged += "py1 r 2 0 n\n";  // rank 2 again
  std::string long_one = "py1 r 3 0 n\n";
  for (size_t i = 0; i <= kMaxStackLines; ++i) long_one += "py1 s 3 line\n";
  forged += long_one + "py1 s 6 orphan\npy1 x 1\npy1 r -1 0 n\n";
  const RemoteStacks got = decodeStackSummary(forged, 8, {0, 1});
  CHECK(got.ranks.empty());
  CHECK(got.rejected > 0);
}

TEST_CASE("a node's tracebacks stay within the byte budget: ranks that do not fit are left out", "[unit]") {
  std::vector<LocalStack> stacks;
  for (int r = 0; r < 100; ++r) stacks.push_back({r, r, kTraceback});
  const std::string lines = encodeStackSummary("n", stacks, 1000);
  CHECK(lines.size() <= 1000);
  CHECK_FALSE(decodeStackSummary(lines, 100, {}).ranks.empty());
}

}  // namespace
}  // namespace ddprun::agent
