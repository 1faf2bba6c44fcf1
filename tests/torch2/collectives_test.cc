// Seed 002's collectives and a gloo DDP model on three torch 2.6 workers under one ddprun
// (three ranks: the new_group of the first and last rank leaves one out). The script checks
// every result exactly; two nodes: netns_two_nodes_test.sh.
#include <catch2/catch.hpp>

#include "tests/support/test_process.h"
#include "tests/torch2/torch2_scripts.h"

using namespace ddprun::testing;

TEST_CASE("seed 002's collectives and gloo DDP on three torch 2.6 workers under ddprun --standalone", "[torch2]") {
  auto r = run({ddprunPath(), "--standalone", "--nproc_per_node=3", torch2Script("seed002_collectives.py")},
               torch2Env(), 240s);
  INFO(r.out << r.err);
  REQUIRE(r.finished);
  CHECK(r.exit_code == 0);
  for (int rank = 0; rank < 3; ++rank) {
    CHECK(countOf(r.out, "rank " + std::to_string(rank) + "/3 (node 0): seed 002 collectives and DDP ok") == 1);
  }
  CHECK(countOf(r.out, "MISMATCH") == 0);
}
