// The RPC framework end to end: rpc_test_worker runs one scenario per job
// (every call type, futures, remote exceptions, timeouts, RRef lifetime,
// shutdown with calls in flight, distributed autograd, RemoteModule with
// DistributedOptimizer) under ddprun; the workers check results themselves and
// report by exit status. The killed-peer case starts the two workers directly
// around a store this test serves, so that the launcher does not stop the
// survivor before it reports.
#include <signal.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "rendezvous/store/store_server.h"
#include "tests/support/test_process.h"

using namespace ddprun::testing;

namespace {

std::string workerPath() { return binDir() + "/rpc_test_worker"; }

std::string tail(const std::string& text, size_t bytes = 6000) {
  return text.size() <= bytes ? text : "..." + text.substr(text.size() - bytes);
}

void runScenario(const std::string& scenario, int nproc, std::chrono::seconds timeout = 120s) {
  auto r = run({ddprunPath(), "--standalone", "--nproc_per_node=" + std::to_string(nproc), "--term_timeout=5",
                "--no_python", workerPath(), scenario},
               {{"OMP_NUM_THREADS", "1"}}, timeout);
  INFO("stdout:\n" << tail(r.out));
  INFO("stderr:\n" << tail(r.err));
  REQUIRE(r.finished);
  CHECK(r.exit_code == 0);
  CHECK(countOf(r.out, "scenario ok") == nproc);
  CHECK(countOf(r.err, "MISMATCH") == 0);
}

}  // namespace

TEST_CASE(
    "rpc_sync, rpc_async, then, remote, nested and self calls with every "
    "value type",
    "[rpc]") {
  runScenario("calls", 2);
  runScenario("calls", 3);
}

TEST_CASE("remote exceptions, unknown functions and workers, timeouts", "[rpc]") { runScenario("errors", 2); }

TEST_CASE("RRef lifetime across three workers (owner count drops to zero)", "[rpc]") { runScenario("rref", 3); }

TEST_CASE("shutdown drains calls in flight on every worker", "[rpc]") { runScenario("shutdown", 3); }

TEST_CASE("distributed autograd carries gradients to the owner, not into grad", "[rpc]") { runScenario("autograd", 2); }

TEST_CASE(
    "RemoteModule with DistributedOptimizer SGD Adagrad Adam equals "
    "local torch optim",
    "[rpc]") {
  runScenario("optim", 2);
}

TEST_CASE("a killed peer fails the pending call at once, naming the peer", "[rpc]") {
  ddprun::rendezvous::StoreServerOptions so;
  so.host = "127.0.0.1";
  ddprun::rendezvous::StoreServer store(so);
  std::vector<std::unique_ptr<TestProcess>> procs;
  for (int rank = 0; rank < 2; ++rank) {
    procs.push_back(
        std::make_unique<TestProcess>(std::vector<std::string>{workerPath(), "killed"},
                                      std::map<std::string, std::string>{{"RANK", std::to_string(rank)},
                                                                         {"WORLD_SIZE", "2"},
                                                                         {"MASTER_ADDR", "127.0.0.1"},
                                                                         {"MASTER_PORT", std::to_string(store.port())},
                                                                         {"TORCHELASTIC_RESTART_COUNT", ""},
                                                                         {"OMP_NUM_THREADS", "1"}}));
  }
  REQUIRE(procs[1]->waitForOutput("waiting to be killed", 60s));
  REQUIRE(procs[0]->waitForOutput("call pending", 60s));
  procs[1]->signal(SIGKILL);
  // The call's timeout is 60 s; the failure must come from the lost connection,
  // well before.
  const bool exited = procs[0]->wait(30s);
  INFO("rank 0 stdout:\n" << tail(procs[0]->out()));
  INFO("rank 0 stderr:\n" << tail(procs[0]->err()));
  REQUIRE(exited);
  CHECK(procs[0]->exitCode() == 0);
  CHECK(countOf(procs[0]->out(), "scenario ok") == 1);
  CHECK(countOf(procs[0]->out(), "failed after") == 1);
}
