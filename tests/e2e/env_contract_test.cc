#include <set>

#include <catch2/catch.hpp>

#include "tests/support/test_process.h"

using namespace ddprun::testing;

namespace {

// Returns the value worker `rank` printed for `name`.
std::string valueOf(const std::string& out, int rank, const std::string& name) {
  std::string key = "R" + std::to_string(rank) + " " + name + "=";
  auto pos = out.find(key);
  if (pos == std::string::npos) return "<missing>";
  pos += key.size();
  return out.substr(pos, out.find('\n', pos) - pos);
}

}  // namespace

TEST_CASE("workers get torchrun's environment contract", "[e2e][env]") {
  for (int nproc : {1, 2, 8}) {
    INFO("nproc_per_node=" << nproc);
    auto r = run({ddprunPath(), "--standalone", "--nproc_per_node=" + std::to_string(nproc), "--max_restarts=2",
                  "--role=trainer", "--no_python", testWorkerPath(), "env"},
                 {{"OMP_NUM_THREADS", ""}});
    REQUIRE(r.finished);
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    std::string port = valueOf(r.out, 0, "MASTER_PORT");
    std::string run_id = valueOf(r.out, 0, "TORCHELASTIC_RUN_ID");
    CHECK(run_id.size() == 36);
    std::set<std::string> error_files;
    for (int rank = 0; rank < nproc; ++rank) {
      CHECK(valueOf(r.out, rank, "RANK") == std::to_string(rank));
      CHECK(valueOf(r.out, rank, "LOCAL_RANK") == std::to_string(rank));
      CHECK(valueOf(r.out, rank, "WORLD_SIZE") == std::to_string(nproc));
      CHECK(valueOf(r.out, rank, "LOCAL_WORLD_SIZE") == std::to_string(nproc));
      CHECK(valueOf(r.out, rank, "GROUP_RANK") == "0");
      CHECK(valueOf(r.out, rank, "GROUP_WORLD_SIZE") == "1");
      CHECK(valueOf(r.out, rank, "ROLE_RANK") == std::to_string(rank));
      CHECK(valueOf(r.out, rank, "ROLE_WORLD_SIZE") == std::to_string(nproc));
      CHECK(valueOf(r.out, rank, "ROLE_NAME") == "trainer");
      CHECK(valueOf(r.out, rank, "MASTER_ADDR") == "127.0.0.1");
      CHECK(valueOf(r.out, rank, "MASTER_PORT") == port);
      CHECK(valueOf(r.out, rank, "TORCHELASTIC_RESTART_COUNT") == "0");
      CHECK(valueOf(r.out, rank, "TORCHELASTIC_MAX_RESTARTS") == "2");
      CHECK(valueOf(r.out, rank, "TORCHELASTIC_RUN_ID") == run_id);
      CHECK(valueOf(r.out, rank, "TORCHELASTIC_USE_AGENT_STORE") == "True");
      CHECK(valueOf(r.out, rank, "TORCH_NCCL_ASYNC_ERROR_HANDLING") == "1");
      CHECK(valueOf(r.out, rank, "OMP_NUM_THREADS") == (nproc > 1 ? "1" : "<unset>"));
      std::string error_file = valueOf(r.out, rank, "TORCHELASTIC_ERROR_FILE");
      CHECK_THAT(error_file, Catch::EndsWith("/attempt_0/" + std::to_string(rank) + "/error.json"));
      error_files.insert(error_file);
    }
    CHECK(error_files.size() == static_cast<size_t>(nproc));
    CHECK(std::stoi(port) > 0);
    if (nproc > 1) CHECK_THAT(r.err, Catch::Contains("OMP_NUM_THREADS=1"));
  }
}

TEST_CASE("master_port and rdzv_id reach the workers and a user OMP_NUM_THREADS is kept", "[e2e][env]") {
  // A fixed port: in a network namespace of the test's own (scripts/in-private-netns), where
  // nothing else can hold it.
  auto r = run({sourceDir() + "/scripts/in-private-netns", ddprunPath(), "--nproc_per_node=2", "--master_port=29731",
                "--rdzv_id=myjob", "--no_python", testWorkerPath(), "env"},
               {{"OMP_NUM_THREADS", "3"}});
  REQUIRE(r.finished);
  REQUIRE(r.exit_code == 0);
  CHECK(valueOf(r.out, 1, "MASTER_PORT") == "29731");
  CHECK(valueOf(r.out, 1, "TORCHELASTIC_RUN_ID") == "myjob");
  CHECK(valueOf(r.out, 1, "OMP_NUM_THREADS") == "3");
  CHECK_THAT(r.err, !Catch::Contains("OMP_NUM_THREADS=1"));
}

TEST_CASE("each restart gets a fresh master port and its own error files", "[e2e][env]") {
  auto r = run({ddprunPath(), "--standalone", "--nproc_per_node=1", "--max_restarts=1", "--no_python", "sh", "-c",
                testWorkerPath() + " env; test \"$TORCHELASTIC_RESTART_COUNT\" = 1"});
  REQUIRE(r.finished);
  REQUIRE(r.exit_code == 0);
  CHECK(countOf(r.out, "R0 TORCHELASTIC_RESTART_COUNT=0") == 1);
  CHECK(countOf(r.out, "R0 TORCHELASTIC_RESTART_COUNT=1") == 1);
  CHECK(countOf(r.out, "/attempt_1/0/error.json") == 1);
}
