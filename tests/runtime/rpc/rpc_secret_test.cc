// The RPC secret as ddprun hands it to workers (worker_runtime/rpc/auth.h): a 0600 file
// per round, the same for every worker of the job, derived from the token across nodes,
// and absent where only the open store could carry it.
#include <catch2/catch.hpp>
#include <memory>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "tests/support/test_process.h"

using namespace ddprun::testing;

namespace {

// Each worker prints its secret file's mode and contents (or that it has none).
const char* kShowSecret =
    "if [ -n \"$DDPRUN_RPC_SECRET_FILE\" ]; then "
    "echo \"S mode=$(stat -c %a \"$DDPRUN_RPC_SECRET_FILE\") secret=$(cat \"$DDPRUN_RPC_SECRET_FILE\")\"; "
    "else echo 'S none'; fi";

std::vector<std::string> secretsIn(const std::string& out) {
  std::vector<std::string> secrets;
  static const std::regex line("S mode=600 secret=([0-9a-f]{64})");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), line); it != std::sregex_iterator(); ++it) {
    secrets.push_back((*it)[1]);
  }
  return secrets;
}

std::vector<std::string> agentArgs(int port, bool host) {
  return {ddprunPath(),
          "--nnodes=2",
          "--nproc_per_node=1",
          "--rdzv_backend=c10d",
          "--rdzv_endpoint=127.0.0.1:" + std::to_string(port),
          "--rdzv_id=secret",
          std::string("--rdzv_conf=is_host=") + (host ? "true" : "false"),
          "--no_python",
          "sh",
          "-c",
          kShowSecret};
}

}  // namespace

TEST_CASE("rpc secret: one node's workers share a 0600 secret file, new for every run", "[rpc][secret]") {
  auto run1 =
      run({ddprunPath(), "--standalone", "--nproc_per_node=2", "--no_python", "sh", "-c", kShowSecret}, {}, 60s);
  auto run2 =
      run({ddprunPath(), "--standalone", "--nproc_per_node=2", "--no_python", "sh", "-c", kShowSecret}, {}, 60s);
  INFO(run1.out << run1.err);
  REQUIRE(run1.exit_code == 0);
  const auto first = secretsIn(run1.out), second = secretsIn(run2.out);
  REQUIRE(first.size() == 2);
  REQUIRE(second.size() == 2);
  CHECK(first[0] == first[1]);
  CHECK(second[0] == second[1]);
  CHECK(first[0] != second[0]);
}

TEST_CASE("rpc secret: with a token every node derives the same secret and without one none is handed out",
          "[rpc][secret]") {
  for (const bool with_token : {true, false}) {
    INFO("token: " << with_token);
    const std::map<std::string, std::string> env{{"DDPRUN_TOKEN", with_token ? "rpc-secret-token" : ""}};
    std::vector<std::unique_ptr<TestProcess>> agents;
    // The store's host takes a port from the kernel; the other agent joins on the port it announces.
    agents.push_back(std::make_unique<TestProcess>(agentArgs(0, true), env));
    agents.push_back(std::make_unique<TestProcess>(agentArgs(announcedPort(*agents[0]), false), env));
    std::vector<std::string> secrets;
    int none = 0;
    for (auto& a : agents) {
      REQUIRE(a->wait(60s));
      INFO(a->out() << a->err());
      CHECK(a->exitCode() == 0);
      for (const auto& s : secretsIn(a->out())) secrets.push_back(s);
      none += countOf(a->out(), "S none");
    }
    if (with_token) {
      REQUIRE(secrets.size() == 2);
      CHECK(secrets[0] == secrets[1]);
    } else {
      CHECK(secrets.empty());
      CHECK(none == 2);  // the workers agree on one through the store (rpc/auth.h)
    }
  }
}
