#include "launcher/slurm_env.h"

#include <stdlib.h>

#include <catch2/catch.hpp>
#include <map>

#include "common/env_names.h"
#include "common/error.h"
#include "launcher/cli.h"
#include "launcher/program_resolver.h"

using ddprun::UsageError;
using ddprun::launcher::countOnNode;
using ddprun::launcher::deriveSlurmFlags;
using ddprun::launcher::EnvLookup;
using ddprun::launcher::SlurmFlag;
using Vars = std::map<std::string, std::string>;
using Flags = std::map<std::string, std::string>;

namespace {

// Every variable --slurm reads; each test starts with all of them unset.
const char* const kSlurmVars[] = {"SLURM_NNODES",
                                  "SLURM_JOB_NUM_NODES",
                                  "SLURM_NODEID",
                                  "SLURM_JOB_ID",
                                  "SLURM_JOBID",
                                  "SLURM_STEP_NODELIST",
                                  "SLURM_JOB_NODELIST",
                                  "SLURM_NODELIST",
                                  "SLURM_GPUS_ON_NODE",
                                  "SLURM_NTASKS_PER_NODE",
                                  "SLURM_TASKS_PER_NODE",
                                  ddprun::env::kSlurmJobTasksPerNode,
                                  "SLURM_STEP_TASKS_PER_NODE",
                                  "PET_NPROC_PER_NODE",
                                  "PET_MASTER_PORT"};

EnvLookup lookupIn(const Vars& vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    return it == vars.end() ? std::nullopt : std::optional<std::string>(it->second);
  };
}

Flags derive(const Vars& vars, const std::set<std::string>& given = {}, std::string_view backend = "static") {
  Flags flags;
  for (const SlurmFlag& f : deriveSlurmFlags(lookupIn(vars), given, backend)) {
    CHECK(flags.count(f.name) == 0);
    flags[f.name] = f.value;
  }
  return flags;
}

std::string deriveError(const Vars& vars, const std::set<std::string>& given = {}) {
  try {
    derive(vars, given);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "<no error>";
}

// A two-node step as srun sets it up (the variables a real srun step has).
Vars stepOnNode(int node_id) {
  return {{"SLURM_NNODES", "4"},       {"SLURM_JOB_NUM_NODES", "4"},         {"SLURM_NODEID", std::to_string(node_id)},
          {"SLURM_JOB_ID", "123456"},  {"SLURM_JOB_NODELIST", "gpu[07-10]"}, {"SLURM_STEP_NODELIST", "gpu[07-10]"},
          {"SLURM_GPUS_ON_NODE", "8"}, {"SLURM_NTASKS_PER_NODE", "1"},       {"SLURM_TASKS_PER_NODE", "1(x4)"}};
}

// The process environment for parseCommandLine: SLURM's variables set as given,
// every other one --slurm reads unset, all restored afterwards.
class ScopedSlurmEnv {
 public:
  explicit ScopedSlurmEnv(const Vars& vars) {
    for (const char* name : kSlurmVars) {
      if (const char* old = std::getenv(name)) saved_[name] = old;
      ::unsetenv(name);
    }
    for (const auto& [name, value] : vars) {
      if (!saved_.count(name)) {
        if (const char* old = std::getenv(name.c_str())) saved_[name] = old;
      }
      touched_.push_back(name);
      ::setenv(name.c_str(), value.c_str(), 1);
    }
  }
  ~ScopedSlurmEnv() {
    for (const auto& name : touched_) ::unsetenv(name.c_str());
    for (const char* name : kSlurmVars) ::unsetenv(name);
    for (const auto& [name, value] : saved_) ::setenv(name.c_str(), value.c_str(), 1);
  }

 private:
  std::map<std::string, std::string> saved_;
  std::vector<std::string> touched_;
};

ddprun::launcher::ParsedCommandLine parse(std::vector<std::string> args) {
  args.insert(args.begin(), "ddprun");
  std::vector<const char*> argv;
  for (auto& a : args) argv.push_back(a.c_str());
  return ddprun::launcher::parseCommandLine(static_cast<int>(argv.size()), argv.data());
}

std::string parseError(std::vector<std::string> args) {
  try {
    parse(std::move(args));
  } catch (const UsageError& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace

TEST_CASE("slurm: a step's variables give every flag of a static job", "[slurm]") {
  auto flags = derive(stepOnNode(2));
  CHECK(flags == Flags{{"nnodes", "4"},
                       {"node_rank", "2"},
                       {"master_addr", "gpu07"},
                       {"master_port", "23456"},
                       {"rdzv_id", "123456"},
                       {"nproc_per_node", "8"}});
  // Every node derives the same job-wide values.
  auto other = derive(stepOnNode(0));
  CHECK(other.at("node_rank") == "0");
  for (const char* name : {"nnodes", "master_addr", "master_port", "rdzv_id"}) CHECK(other.at(name) == flags.at(name));
}

TEST_CASE("slurm: the port follows the job id and stays below the ephemeral range", "[slurm]") {
  CHECK(ddprun::launcher::slurmMasterPort(0) == 20000);
  CHECK(ddprun::launcher::slurmMasterPort(7) == 20007);
  CHECK(ddprun::launcher::slurmMasterPort(9999) == 29999);
  CHECK(ddprun::launcher::slurmMasterPort(10000) == 20000);
  CHECK(ddprun::launcher::slurmMasterPort(123456789) == 26789);
}

TEST_CASE("slurm: fallbacks for the node count, the node list and the job id", "[slurm]") {
  Vars vars = stepOnNode(1);
  vars.erase("SLURM_NNODES");
  vars["SLURM_JOB_NUM_NODES"] = "3";
  CHECK(derive(vars).at("nnodes") == "3");
  vars.erase("SLURM_JOB_NUM_NODES");
  CHECK(derive(vars).at("nnodes") == "4");  // the node list's length

  // The step's list wins: SLURM_NODEID numbers the step's nodes.
  vars["SLURM_STEP_NODELIST"] = "gpu[09-10]";
  CHECK(derive(vars).at("master_addr") == "gpu09");
  vars.erase("SLURM_STEP_NODELIST");
  CHECK(derive(vars).at("master_addr") == "gpu07");
  vars.erase("SLURM_JOB_NODELIST");
  vars["SLURM_NODELIST"] = "rack[2-3]-n[01-02]";
  CHECK(derive(vars).at("master_addr") == "rack2-n01");

  vars.erase("SLURM_JOB_ID");
  vars["SLURM_JOBID"] = "77";
  CHECK(derive(vars).at("rdzv_id") == "77");
  CHECK(derive(vars).at("master_port") == "20077");
}

TEST_CASE("slurm: workers per node from GPUs, then tasks per node", "[slurm]") {
  Vars vars = stepOnNode(3);
  CHECK(derive(vars).at("nproc_per_node") == "8");
  vars["SLURM_GPUS_ON_NODE"] = "0";  // no GPUs on this node: fall through
  CHECK(derive(vars).at("nproc_per_node") == "1");
  vars.erase("SLURM_GPUS_ON_NODE");
  vars["SLURM_NTASKS_PER_NODE"] = "6";
  CHECK(derive(vars).at("nproc_per_node") == "6");
  vars.erase("SLURM_NTASKS_PER_NODE");
  vars["SLURM_TASKS_PER_NODE"] = "2(x3),1";
  CHECK(derive(vars).at("nproc_per_node") == "1");  // node 3 is the fourth entry
  vars["SLURM_NODEID"] = "1";
  CHECK(derive(vars).at("nproc_per_node") == "2");
  // ddprun-slurm's copy of the job's list (srun replaces SLURM_*TASKS_PER_NODE
  // with the step's one task per node) comes before the step's values.
  vars["SLURM_NTASKS_PER_NODE"] = "1";
  vars[ddprun::env::kSlurmJobTasksPerNode] = "4,3(x3)";
  CHECK(derive(vars).at("nproc_per_node") == "3");
  vars["SLURM_GPUS_ON_NODE"] = "2";
  CHECK(derive(vars).at("nproc_per_node") == "2");

  Vars none = stepOnNode(0);
  for (const char* name : {"SLURM_GPUS_ON_NODE", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}) none.erase(name);
  CHECK(derive(none).count("nproc_per_node") == 0);  // left to ddprun's default
}

TEST_CASE("slurm: per-node counts in SLURM's N(xM) form", "[slurm]") {
  const int expected[] = {2, 2, 2, 1};
  for (int node = 0; node < 4; ++node) CHECK(countOnNode("V", "2(x3),1", node) == expected[node]);
  CHECK(countOnNode("V", "8", 0) == 8);
  CHECK(countOnNode("V", "1(x2),4(x2),16", 4) == 16);
  CHECK_THROWS_WITH(countOnNode("V", "2(x3),1", 4),
                    "--slurm: V='2(x3),1' covers 4 nodes, but this is node 4 (SLURM_NODEID)");
  for (const char* bad : {"", "x", "2(x)", "2(3)", "2(x0)", "2(x3", "2,,1", "-1", "2(x3)1", "2 "}) {
    INFO("list: '" << bad << "'");
    CHECK_THROWS_WITH(countOnNode("V", bad, 0), "--slurm: V='" + std::string(bad) + "' is not a list like 2(x3),1");
  }
}

TEST_CASE("slurm: flags given on the command line are neither derived nor needed", "[slurm]") {
  Vars vars = stepOnNode(1);
  auto flags = derive(vars, {"nnodes", "master_addr", "nproc_per_node"});
  CHECK(flags == Flags{{"node_rank", "1"}, {"master_port", "23456"}, {"rdzv_id", "123456"}});
  // With everything given, SLURM's variables are not read at all.
  CHECK(derive({}, {"nnodes", "node_rank", "master_addr", "master_port", "rdzv_id", "nproc_per_node"}).empty());
  // A node list ddprun cannot read does not matter when the host is given.
  vars["SLURM_STEP_NODELIST"] = "n[1-";
  CHECK(derive(vars, {"master_addr"}).count("master_port") == 1);
}

TEST_CASE("slurm: the c10d backend gets the same host and port as its endpoint", "[slurm]") {
  auto flags = derive(stepOnNode(3), {}, "c10d");
  CHECK(flags ==
        Flags{{"nnodes", "4"}, {"rdzv_endpoint", "gpu07:23456"}, {"rdzv_id", "123456"}, {"nproc_per_node", "8"}});
  CHECK(derive(stepOnNode(3), {"rdzv_endpoint"}, "c10d").count("rdzv_endpoint") == 0);
}

TEST_CASE("slurm: missing or malformed variables fail with one line naming them", "[slurm]") {
  Vars vars = stepOnNode(0);
  vars.erase("SLURM_NODEID");
  CHECK(deriveError(vars) ==
        "--slurm: SLURM_NODEID is not set, so this node's rank cannot be "
        "derived; run ddprun --slurm inside a job "
        "step (srun --ntasks-per-node=1 ...), or give the flag");
  CHECK(deriveError(vars, {"node_rank"}) == "<no error>");
  vars["SLURM_NODEID"] = "one";
  CHECK(deriveError(vars) == "--slurm: SLURM_NODEID='one' is not a non-negative integer");
  vars["SLURM_NODEID"] = "0";
  vars["SLURM_NNODES"] = "0";
  CHECK(deriveError(vars) == "--slurm: SLURM_NNODES='0' is not a positive integer");
  vars["SLURM_NNODES"] = "2";
  vars["SLURM_STEP_NODELIST"] = "gpu[07-";
  CHECK(deriveError(vars) ==
        "--slurm: SLURM_STEP_NODELIST: invalid host list "
        "'gpu[07-': '[' at position 4 is never closed");
  for (const char* name : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}) vars.erase(name);
  CHECK(deriveError(vars) ==
        "--slurm: SLURM_STEP_NODELIST or SLURM_JOB_NODELIST or SLURM_NODELIST "
        "is not set, so --master_addr cannot "
        "be derived; run ddprun --slurm inside a job step (srun "
        "--ntasks-per-node=1 ...), or give the flag");
  Vars crowded = stepOnNode(1);
  crowded["SLURM_STEP_TASKS_PER_NODE"] = "1,2";
  CHECK(deriveError(crowded) ==
        "--slurm: SLURM_STEP_TASKS_PER_NODE='1,2' starts 2 ddprun agents on node 1, which would all claim its node "
        "rank; start one per node (srun --ntasks-per-node=1)");
  crowded["SLURM_STEP_TASKS_PER_NODE"] = "1(x2)";
  CHECK(deriveError(crowded) == "<no error>");
  CHECK(deriveError({}) ==
        "--slurm: SLURM_JOB_ID or SLURM_JOBID is not set, so --rdzv_id cannot "
        "be derived; run ddprun --slurm inside "
        "a job step (srun --ntasks-per-node=1 ...), or give the flag");
  Vars tasks = stepOnNode(0);
  tasks.erase("SLURM_GPUS_ON_NODE");
  tasks.erase("SLURM_NTASKS_PER_NODE");
  tasks["SLURM_TASKS_PER_NODE"] = "0,2";
  CHECK(deriveError(tasks) ==
        "--slurm: SLURM_TASKS_PER_NODE gives this node "
        "no tasks; give --nproc_per_node");
}

TEST_CASE("slurm: --slurm on the command line, flags and PET_ variables win", "[slurm][cli]") {
  const std::string program = ddprun::launcher::findExecutable("true");
  Vars vars = stepOnNode(1);
  vars.erase("SLURM_GPUS_ON_NODE");
  vars["SLURM_NTASKS_PER_NODE"] = "3";
  ScopedSlurmEnv env(vars);
  auto derived = parse({"--slurm", "--no_python", program});
  const auto& r = derived.config.rendezvous;
  CHECK(r.min_nodes == 4);
  CHECK(r.max_nodes == 4);
  CHECK(r.node_rank == 1);
  CHECK(r.master_addr == "gpu07");
  CHECK(r.master_port == 23456);
  CHECK(r.run_id == "123456");
  CHECK(r.backend == "static");
  CHECK(derived.config.nproc_per_node == 3);
  CHECK_FALSE(derived.dry_run_text.has_value());

  auto given = parse({"--slurm", "--nproc-per-node=2", "--master_port=29400", "--node_rank=3", "--rdzv_id=mine",
                      "--nnodes=4", "--master_addr=10.1.2.3", "--no_python", program});
  CHECK(given.config.nproc_per_node == 2);
  CHECK(given.config.rendezvous.master_port == 29400);
  CHECK(given.config.rendezvous.node_rank == 3);
  CHECK(given.config.rendezvous.run_id == "mine");
  CHECK(given.config.rendezvous.master_addr == "10.1.2.3");

  ::setenv("PET_NPROC_PER_NODE", "5", 1);
  CHECK(parse({"--slurm", "--no_python", program}).config.nproc_per_node == 5);
  ::unsetenv("PET_NPROC_PER_NODE");

  auto c10d = parse({"--slurm", "--rdzv_backend=c10d", "--no_python", program});
  CHECK(c10d.config.rendezvous.endpoint == "gpu07:23456");
  CHECK(c10d.config.rendezvous.node_rank == 0);

  CHECK(parseError({"--slurm", "--standalone", "--no_python", program}) ==
        "--slurm and --standalone cannot be combined: a SLURM job step spans "
        "its nodes");
}

TEST_CASE("slurm: --dry_run prints the resolved flags one per line", "[slurm][cli]") {
  ScopedSlurmEnv env(stepOnNode(2));
  auto parsed = parse({"--slurm", "--dry_run", "--max_restarts=2", "--no_python", "true"});
  REQUIRE(parsed.dry_run_text.has_value());
  CHECK(*parsed.dry_run_text ==
        "--nnodes=4\n--nproc_per_node=8\n--rdzv_backend=static\n--node_rank="
        "2\n--master_addr=gpu07\n"
        "--master_port=23456\n--rdzv_id=123456\n--max_restarts=2\n");
  // The program may be left out of a dry run; with --rdzv_backend=c10d the endpoint shows.
  auto c10d = parse({"--slurm", "--dry_run", "--rdzv_backend=c10d"});
  CHECK(*c10d.dry_run_text ==
        "--nnodes=4\n--nproc_per_node=8\n--rdzv_backend=c10d\n--rdzv_endpoint="
        "gpu07:23456\n--rdzv_id=123456\n"
        "--max_restarts=0\n");
  // A bad value is still an error, not a printout.
  CHECK(parseError({"--slurm", "--dry_run", "--node_rank=9"}) == "--node_rank 9 is out of range for --nnodes 4");
}
