// init_process_group in a real worker process (ddprun_collectives_worker, started directly,
// no ddprun) with a malformed environment or init method: the worker must exit non-zero at
// once with one line on stderr naming the variable (or the URL) and its value. Before,
// RANK=abc ran as rank 0 and MASTER_PORT=99999 wrapped to 34463 (both then hosted the store
// and waited for peers), and RANK=-1, RANK=WORLD_SIZE or an unknown MASTER_ADDR retried
// connecting for the whole group timeout. The workers get a 10-minute group timeout, so a
// worker still waiting when the test's bound passes is the defect.
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "tests/support/test_process.h"

using namespace ddprun::testing;

namespace {

struct BadEnv {
  std::map<std::string, std::string> changes;
  std::string message;
  // The failure comes after init_process_group: the worker needs a store to reach, which the
  // test serves (ddprun_store_server on a port from the kernel, TORCHELASTIC_USE_AGENT_STORE).
  bool past_init = false;
};

// `bad` applied to a good environment; `init` extra arguments of the worker (--init ...).
void requireFailsAtOnce(const BadEnv& bad, const std::vector<std::string>& init = {"--init", "env://"}) {
  // A port held by this test and never listening: a worker that got as far as the store would
  // fail on it, not wait, and the message check below would show it.
  const ClosedPort port;
  std::unique_ptr<TestProcess> store;
  int master_port = port.port();
  if (bad.past_init) store = startStoreServer(master_port);
  std::map<std::string, std::string> env = {{"RANK", "0"},
                                            {"WORLD_SIZE", "2"},
                                            {"MASTER_ADDR", "127.0.0.1"},
                                            {"MASTER_PORT", std::to_string(master_port)},
                                            {"TORCHELASTIC_USE_AGENT_STORE", bad.past_init ? "True" : ""},
                                            {"TORCHELASTIC_RESTART_COUNT", ""},
                                            {"TORCHELASTIC_ERROR_FILE", ""},
                                            {"DDPRUN_SHM", ""},
                                            {"OMP_NUM_THREADS", "1"}};
  for (const auto& [name, value] : bad.changes) env[name] = value;
  std::vector<std::string> argv = {binDir() + "/ddprun_collectives_worker", "--timeout-s", "600"};
  argv.insert(argv.end(), init.begin(), init.end());
  TestProcess worker(argv, env);
  const bool exited = worker.wait(60s);
  INFO("stdout:\n" << worker.out());
  INFO("stderr:\n" << worker.err());
  REQUIRE(exited);
  CHECK(worker.exitCode() == 1);
  CHECK_THAT(worker.err(), Catch::Contains(bad.message));
  CHECK(countOf(worker.err(), "\n") == 1);                                      // one line
  CHECK(countOf(worker.err(), "init_process_group: init_process_group") == 0);  // named once
}

}  // namespace

TEST_CASE("init_process_group: RANK=abc fails at once naming the variable", "[e2e][env]") {
  requireFailsAtOnce({{{"RANK", "abc"}}, "RANK=abc: not an integer"});
}

TEST_CASE("init_process_group: MASTER_PORT=99999 fails at once instead of wrapping", "[e2e][env]") {
  requireFailsAtOnce({{{"MASTER_PORT", "99999"}}, "MASTER_PORT=99999: out of range 1..65535"});
}

TEST_CASE("init_process_group: RANK=-1 fails at once instead of waiting out the timeout", "[e2e][env]") {
  requireFailsAtOnce({{{"RANK", "-1"}}, "RANK=-1: out of range 0..1"});
}

TEST_CASE("init_process_group: RANK equal to WORLD_SIZE fails at once", "[e2e][env]") {
  requireFailsAtOnce({{{"RANK", "2"}}, "RANK=2: out of range 0..1"});
}

TEST_CASE("init_process_group: an unknown MASTER_ADDR fails at once", "[e2e][env]") {
  // .invalid never resolves (RFC 6761): the resolver reports it unknown at once.
  requireFailsAtOnce(
      {{{"RANK", "1"}, {"MASTER_ADDR", "bogus.invalid"}}, "MASTER_ADDR=bogus.invalid: cannot resolve the host ("});
}

TEST_CASE("init_process_group: a DDPRUN_SHM that is not a boolean fails naming it", "[e2e][env]") {
  // World size 1: the group forms at once, and the setting is read as the backend starts.
  requireFailsAtOnce({{{"WORLD_SIZE", "1"}, {"DDPRUN_SHM", "maybe"}}, "DDPRUN_SHM=maybe: not a boolean"});
}

// Before, atoi read the port of tcp://host:port: 99999 wrapped to 34463, which rank 1
// dialled for the whole group timeout, and "abc" became 0, an ephemeral port rank 0 served.
TEST_CASE("init_process_group: a tcp:// port that is not 1 to 65535 fails at once naming the URL", "[e2e][env]") {
  requireFailsAtOnce({{}, "init_process_group(tcp://127.0.0.1:99999): port '99999' is not a whole number in 1..65535"},
                     {"--init", "tcp://127.0.0.1:99999", "--rank", "1", "--world-size", "2"});
  requireFailsAtOnce({{}, "init_process_group(tcp://127.0.0.1:abc): port 'abc' is not a whole number in 1..65535"},
                     {"--init", "tcp://127.0.0.1:abc", "--rank", "0", "--world-size", "2"});
}

// The backend string is read before anything connects: a bad one fails at once (the group's
// peers never come here, so a check after connecting would wait out the timeout).
TEST_CASE("init_process_group: an unknown backend fails at once naming it", "[e2e][env][backend]") {
  requireFailsAtOnce({{}, "init_process_group: backend 'mpi' is not available (use auto, gloo, cpu, nccl"},
                     {"--init", "env://", "--backend", "mpi"});
}

TEST_CASE("init_process_group: NCCL for CPU tensors fails at once", "[e2e][env][backend]") {
  requireFailsAtOnce({{}, "init_process_group: backend 'cpu:nccl': NCCL runs CUDA tensors only"},
                     {"--init", "env://", "--backend", "cpu:nccl"});
}

#if !DDPRUN_TEST_TORCH_CUDA
// This build's LibTorch has no CUDA, so NCCL cannot run whatever the machine has.
TEST_CASE("init_process_group: backend nccl without CUDA fails at once saying why", "[e2e][env][backend]") {
  requireFailsAtOnce({{},
                      "backend 'nccl' asks for NCCL, which is not viable here: this ddprun runtime was built "
                      "against a LibTorch without CUDA"},
                     {"--init", "env://", "--backend", "nccl"});
  requireFailsAtOnce({{}, "backend 'cpu:gloo,cuda:nccl' asks for NCCL"},
                     {"--init", "env://", "--backend", "cpu:gloo,cuda:nccl"});
}
#endif

TEST_CASE("a CPU tensor on a group whose backend runs only CUDA tensors fails naming the op", "[e2e][env][backend]") {
  requireFailsAtOnce(
      {{{"WORLD_SIZE", "1"}}, "broadcast: a CPU tensor, but this group's backend (cuda:gloo) runs none", true},
      {"--init", "env://", "--backend", "cuda:gloo", "--ops", "broadcast"});
}
