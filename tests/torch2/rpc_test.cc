// torch.distributed.rpc (TensorPipe) on torch 2.6 workers: init_rpc's env:// rendezvous goes
// through ddprun's workers' store (TORCHELASTIC_USE_AGENT_STORE), then rpc_sync, rpc_async,
// remote and an RRef passed along, each checked by the script. Two nodes: netns_two_nodes_test.sh.
#include <catch2/catch.hpp>

#include "tests/support/test_process.h"
#include "tests/torch2/torch2_scripts.h"

using namespace ddprun::testing;

TEST_CASE("torch.distributed.rpc on torch 2.6 workers meets through ddprun's workers' store", "[torch2]") {
  auto r = run({ddprunPath(), "--standalone", "--nproc_per_node=2", torch2Script("rpc_calls.py")}, torch2Env(), 240s);
  INFO(r.out << r.err);
  REQUIRE(r.finished);
  CHECK(r.exit_code == 0);
  CHECK(countOf(r.out, "rank 0/2 (node 0): rpc ok") == 1);
  CHECK(countOf(r.out, "rank 1/2 (node 0): rpc ok") == 1);
  CHECK(countOf(r.out, "MISMATCH") == 0);
}
