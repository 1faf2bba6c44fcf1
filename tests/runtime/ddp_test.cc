// DistributedDataParallel end to end: ddprun_ddp_worker trains a DDP model on slices of
// each batch next to a single-process reference on the whole batch and checks they agree
// (see the worker); these tests pick the mode and world size and read the verdict.
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "tests/support/test_process.h"

using namespace ddprun::testing;
using namespace std::chrono_literals;

namespace {

std::string tail(const std::string& text, size_t bytes = 4000) {
  return text.size() <= bytes ? text : "..." + text.substr(text.size() - bytes);
}

RunResult runDdp(int nproc, const std::vector<std::string>& args) {
  std::vector<std::string> argv = {ddprunPath(),       "--standalone", "--nproc_per_node=" + std::to_string(nproc),
                                   "--term_timeout=5", "--no_python",  binDir() + "/ddprun_ddp_worker"};
  argv.insert(argv.end(), args.begin(), args.end());
  return run(argv, {{"OMP_NUM_THREADS", "1"}}, 120s);
}

void requireOk(int nproc, const std::vector<std::string>& args) {
  const RunResult r = runDdp(nproc, args);
  INFO("world " << nproc << ", mode " << args.front());
  INFO("stdout:\n" << tail(r.out));
  INFO("stderr:\n" << tail(r.err));
  REQUIRE(r.finished);
  CHECK(r.exit_code == 0);
  CHECK(countOf(r.out, "OK " + args.front()) == nproc);
  CHECK(countOf(r.out, "MISMATCH") == 0);
}

}  // namespace

TEST_CASE("DDP on 1, 2 and 3 ranks matches one process on the whole batch, for several bucket sizes", "[ddp]") {
  for (int nproc : {1, 2, 3}) {
    for (const char* cap : {"25", "0.001", "0.0002"}) requireOk(nproc, {"equivalence", cap});
  }
}

TEST_CASE("DDP with one bucket per parameter matches one process", "[ddp]") {
  // 1e-9 MiB: every parameter overflows the cap, so each gets its own bucket.
  for (int nproc : {2, 3}) requireOk(nproc, {"per_param_buckets", "0.000000001"});
}

TEST_CASE("DDP no_sync() accumulates locally and reduces the sum on the next synchronized backward", "[ddp]") {
  for (int nproc : {1, 2, 3}) requireOk(nproc, {"no_sync"});
}

TEST_CASE("DDP find_unused_parameters: a branch used on one rank only and a layer used nowhere", "[ddp]") {
  for (int nproc : {2, 3}) requireOk(nproc, {"unused"});
}

TEST_CASE("DDP without find_unused_parameters names the parameter that got no gradient", "[ddp]") {
  const RunResult r = runDdp(2, {"unused_error"});
  INFO("stdout:\n" << tail(r.out));
  REQUIRE(r.finished);
  CHECK(r.exit_code != 0);
  CHECK(r.out.find("received no gradient") != std::string::npos);
  CHECK(r.out.find("(branch.weight)") != std::string::npos);
  CHECK(r.out.find("find_unused_parameters=true") != std::string::npos);
}

TEST_CASE("DDP broadcasts buffers from rank 0 at construction and before each forward", "[ddp]") {
  requireOk(3, {"buffers"});
}

TEST_CASE("DDP starts the first bucket's all_reduce before backward has produced every gradient", "[ddp]") {
  requireOk(2, {"overlap"});
}

TEST_CASE("DDP refuses models whose parameter shapes differ across ranks, naming the first mismatch", "[ddp]") {
  const RunResult r = runDdp(2, {"shapes"});
  INFO("stdout:\n" << tail(r.out));
  REQUIRE(r.finished);
  CHECK(r.exit_code != 0);
  CHECK(r.out.find("parameter 0 (l1.weight) is Float [16, 8] on rank 0 but Float [12, 8] on rank 1") !=
        std::string::npos);
}

TEST_CASE("DDP join(): ranks with fewer batches shadow the others and every rank ends with the same model", "[ddp]") {
  for (int nproc : {2, 3}) requireOk(nproc, {"join"});
}

TEST_CASE("DDP fp16 and bf16 compression hooks train close to exact averaging", "[ddp]") {
  requireOk(2, {"fp16"});
  requireOk(2, {"bf16"});
}
