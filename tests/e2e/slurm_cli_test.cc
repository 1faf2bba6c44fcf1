// ddprun hostnames and ddprun --slurm --dry_run through the real binary: what a user sees
// on stdout and stderr, and the exit codes.
#include <catch2/catch.hpp>

#include "tests/support/test_process.h"

using namespace ddprun::testing;

namespace {

// The variables of one node of a two-node srun step; every other SLURM variable --slurm
// reads is unset (an empty value unsets it), so the test's own environment does not leak in.
std::map<std::string, std::string> stepEnv(int node_id) {
  return {{"SLURM_NNODES", "2"},
          {"SLURM_JOB_NUM_NODES", "2"},
          {"SLURM_NODEID", std::to_string(node_id)},
          {"SLURM_JOB_ID", "4242"},
          {"SLURM_JOBID", ""},
          {"SLURM_JOB_NODELIST", "node[07-08]"},
          {"SLURM_STEP_NODELIST", "node[07-08]"},
          {"SLURM_NODELIST", ""},
          {"SLURM_GPUS_ON_NODE", ""},
          {"SLURM_NTASKS_PER_NODE", "1"},
          {"SLURM_TASKS_PER_NODE", "1(x2)"},
          {"SLURM_STEP_TASKS_PER_NODE", "1(x2)"},
          {"DDPRUN_SLURM_JOB_TASKS_PER_NODE", "3(x2)"},
          {"PET_NPROC_PER_NODE", ""},
          {"PET_MASTER_PORT", ""}};
}

}  // namespace

TEST_CASE("ddprun hostnames prints one host per line", "[slurm]") {
  auto r = run({ddprunPath(), "hostnames", "rack[1-2]-n[01-02]", "gpu[08-10]-ib,login"});
  REQUIRE(r.finished);
  CHECK(r.exit_code == 0);
  CHECK(r.out == "rack1-n01\nrack1-n02\nrack2-n01\nrack2-n02\ngpu08-ib\ngpu09-ib\ngpu10-ib\nlogin\n");
  CHECK(r.err.empty());

  auto from_env = run({ddprunPath(), "hostnames"}, {{"SLURM_JOB_NODELIST", "n[1-3]"}});
  CHECK(from_env.exit_code == 0);
  CHECK(from_env.out == "n1\nn2\nn3\n");
}

TEST_CASE("ddprun hostnames: a malformed list prints nothing and exits 2 with one line", "[slurm]") {
  auto r = run({ddprunPath(), "hostnames", "ok[1-2]", "n[3-1]"});
  REQUIRE(r.finished);
  CHECK(r.exit_code == 2);
  CHECK(r.out.empty());
  CHECK(r.err == "ddprun: error: invalid host list 'n[3-1]': range '3-1' at position 3 goes down (3 > 1)\n");

  auto none = run({ddprunPath(), "hostnames"}, {{"SLURM_JOB_NODELIST", ""}});
  CHECK(none.exit_code == 2);
  CHECK(none.err == "ddprun: error: hostnames: no host list given and SLURM_JOB_NODELIST is not set\n");
}

TEST_CASE("ddprun --slurm --dry_run prints each node's resolved flags and starts nothing", "[slurm]") {
  TempDir dir;
  const std::string marker = dir.file("ran");
  for (int node : {0, 1}) {
    auto r = run({ddprunPath(), "--slurm", "--dry_run", "--max_restarts=1", "--no_python", "/bin/touch", marker},
                 stepEnv(node));
    REQUIRE(r.finished);
    CHECK(r.exit_code == 0);
    CHECK(r.out == "--nnodes=2\n--nproc_per_node=3\n--rdzv_backend=static\n--node_rank=" + std::to_string(node) +
                       "\n--master_addr=node07\n--master_port=24242\n--rdzv_id=4242\n--max_restarts=1\n");
  }
  CHECK_FALSE(fileExists(marker));

  auto given = run({ddprunPath(), "--slurm", "--dry_run", "--nproc_per_node=2", "--master_addr=10.0.0.7"}, stepEnv(1));
  CHECK(given.exit_code == 0);
  CHECK(given.out ==
        "--nnodes=2\n--nproc_per_node=2\n--rdzv_backend=static\n--node_rank=1\n--master_addr=10.0.0.7\n"
        "--master_port=24242\n--rdzv_id=4242\n--max_restarts=0\n");
}

TEST_CASE("ddprun --slurm outside a job exits 2 naming the missing variable", "[slurm]") {
  auto env = stepEnv(0);
  for (auto& [name, value] : env) value = "";
  auto r = run({ddprunPath(), "--slurm", "--no_python", "/bin/true"}, env);
  REQUIRE(r.finished);
  CHECK(r.exit_code == 2);
  CHECK(r.out.empty());
  CHECK(r.err ==
        "ddprun: error: --slurm: SLURM_JOB_ID or SLURM_JOBID is not set, so --rdzv_id cannot be derived; run ddprun "
        "--slurm inside a job step (srun --ntasks-per-node=1 ...), or give the flag\n");
}
