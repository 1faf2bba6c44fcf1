// Many agents on loopback: each is a real ddprun process; together they form one job
// through the c10d (or static) rendezvous hosted by one of them.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <map>
#include <memory>
#include <regex>
#include <set>

#include <catch2/catch.hpp>

#include "tests/support/test_process.h"

using namespace ddprun::testing;

namespace {

// Worker lines look like: "W rank=3 world=6 group=1 groups=3 restart=0 run=job master=127.0.0.1:4321"
const char* kPrintEnv =
    "echo W rank=$RANK world=$WORLD_SIZE group=$GROUP_RANK groups=$GROUP_WORLD_SIZE "
    "restart=$TORCHELASTIC_RESTART_COUNT run=$TORCHELASTIC_RUN_ID master=$MASTER_ADDR:$MASTER_PORT "
    "store=$TORCHELASTIC_USE_AGENT_STORE";

struct WorkerLine {
  int rank, world, group, groups, restart;
  std::string run, master, store;
};

std::vector<WorkerLine> workerLines(const std::string& out) {
  static const std::regex line(
      R"(W rank=(\d+) world=(\d+) group=(\d+) groups=(\d+) restart=(\d+) run=(\S+) master=(\S+) store=(\S+))");
  std::vector<WorkerLine> lines;
  for (std::sregex_iterator it(out.begin(), out.end(), line), end; it != end; ++it) {
    const auto& m = *it;
    lines.push_back(
        {std::stoi(m[1]), std::stoi(m[2]), std::stoi(m[3]), std::stoi(m[4]), std::stoi(m[5]), m[6], m[7], m[8]});
  }
  return lines;
}

std::vector<std::string> agentArgs(int nnodes_min, int nnodes_max, int nproc, int port, const std::string& id,
                                   const std::string& conf = "") {
  std::vector<std::string> args = {ddprunPath(),
                                   "--nnodes=" + std::to_string(nnodes_min) + ":" + std::to_string(nnodes_max),
                                   "--nproc_per_node=" + std::to_string(nproc),
                                   "--rdzv_backend=c10d",
                                   "--rdzv_endpoint=127.0.0.1:" + std::to_string(port),
                                   "--rdzv_id=" + id};
  if (!conf.empty()) args.push_back("--rdzv_conf=" + conf);
  return args;
}

// Starts `count` agents of one c10d job whose first agent hosts the store (is_host) on a port
// from the kernel (returned in `port`), each with one worker running `script`; returns once
// every worker has printed its line.
std::vector<std::unique_ptr<TestProcess>> startHostedJob(int count, int min_nodes, int max_nodes, int& port,
                                                         const std::string& id, const std::string& conf,
                                                         const std::string& script);

std::vector<std::string> withWorker(std::vector<std::string> args, const std::string& script) {
  args.insert(args.end(), {"--no_python", "sh", "-c", script});
  return args;
}

std::vector<std::unique_ptr<TestProcess>> startHostedJob(int count, int min_nodes, int max_nodes, int& port,
                                                         const std::string& id, const std::string& conf,
                                                         const std::string& script) {
  std::vector<std::unique_ptr<TestProcess>> agents;
  agents.push_back(std::make_unique<TestProcess>(
      withWorker(agentArgs(min_nodes, max_nodes, 1, 0, id, conf + ",is_host=true"), script)));
  port = announcedPort(*agents[0]);
  for (int i = 1; i < count; ++i) {
    agents.push_back(std::make_unique<TestProcess>(
        withWorker(agentArgs(min_nodes, max_nodes, 1, port, id, conf + ",is_host=false"), script)));
  }
  for (auto& agent : agents) REQUIRE(agent->waitForOutput("W rank=", 30s));
  return agents;
}

// Starts the agent that hosts the store on a port from the kernel (`args` built for port 0),
// and returns the port it announces for the others.
int startHost(std::vector<std::unique_ptr<TestProcess>>& agents, std::vector<std::string> args,
              const std::map<std::string, std::string>& env = {}) {
  auto conf =
      std::find_if(args.begin(), args.end(), [](const std::string& a) { return a.rfind("--rdzv_conf=", 0) == 0; });
  if (conf != args.end()) {
    *conf += ",is_host=true";
  } else {
    args.insert(args.begin() + 1, "--rdzv_conf=is_host=true");
  }
  agents.push_back(std::make_unique<TestProcess>(args, env));
  return announcedPort(*agents.back());
}

}  // namespace

TEST_CASE("2, 4 and 8 agents on loopback form one job with every rank exactly once", "[e2e][multinode]") {
  for (int nodes : {2, 4, 8}) {
    INFO("nodes=" << nodes);
    std::vector<std::unique_ptr<TestProcess>> agents;
    const std::string id = "job" + std::to_string(nodes);
    const int port = startHost(agents, withWorker(agentArgs(nodes, nodes, 1, 0, id), kPrintEnv));
    int expected_world = 1;
    for (int i = 1; i < nodes; ++i) {
      int nproc = 1 + i % 2;  // different local world sizes on purpose
      expected_world += nproc;
      agents.push_back(std::make_unique<TestProcess>(withWorker(agentArgs(nodes, nodes, nproc, port, id), kPrintEnv)));
    }
    std::string all;
    for (auto& agent : agents) {
      REQUIRE(agent->wait(60s));
      INFO(agent->err());
      CHECK(agent->exitCode() == 0);
      all += agent->out();
    }
    auto lines = workerLines(all);
    REQUIRE(lines.size() == static_cast<size_t>(expected_world));
    std::set<int> ranks;
    std::map<int, std::set<int>> ranks_of_group;
    for (const auto& l : lines) {
      ranks.insert(l.rank);
      ranks_of_group[l.group].insert(l.rank);
      CHECK(l.world == expected_world);
      CHECK(l.groups == nodes);
      CHECK(l.restart == 0);
      CHECK(l.run == "job" + std::to_string(nodes));
      CHECK(l.master == lines[0].master);
      CHECK(l.store == "True");
    }
    CHECK(ranks.size() == static_cast<size_t>(expected_world));
    CHECK(*ranks.begin() == 0);
    CHECK(*ranks.rbegin() == expected_world - 1);
    // RANK is contiguous per node, in GROUP_RANK order.
    int next = 0;
    for (const auto& [group, group_ranks] : ranks_of_group) {
      CHECK(*group_ranks.begin() == next);
      next = *group_ranks.rbegin() + 1;
    }
  }
}

TEST_CASE("static rendezvous: node ranks from the command line", "[e2e][multinode]") {
  std::vector<std::unique_ptr<TestProcess>> agents;
  auto node = [](int rank, int port) {
    return withWorker({ddprunPath(), "--nnodes=3", "--node_rank=" + std::to_string(rank), "--nproc_per_node=2",
                       "--master_addr=127.0.0.1", "--master_port=" + std::to_string(port)},
                      kPrintEnv);
  };
  // Node 0, the store's host, takes a port from the kernel (--master_port=0) and announces it.
  agents.push_back(std::make_unique<TestProcess>(node(0, 0)));
  const int port = announcedPort(*agents[0]);
  for (int rank = 2; rank >= 1; --rank) agents.push_back(std::make_unique<TestProcess>(node(rank, port)));
  std::string all;
  for (auto& agent : agents) {
    REQUIRE(agent->wait(60s));
    INFO(agent->err());
    CHECK(agent->exitCode() == 0);
    all += agent->out();
  }
  auto lines = workerLines(all);
  REQUIRE(lines.size() == 6);
  for (const auto& l : lines) {
    CHECK(l.world == 6);
    CHECK(l.rank / 2 == l.group);  // node_rank decides the group rank
  }
}

TEST_CASE("two jobs with different rdzv ids on one store stay apart", "[e2e][multinode]") {
  // A store that outlives both jobs (an agent hosting it would leave with its own job).
  int port = 0;
  const auto store = startStoreServer(port);
  std::vector<std::unique_ptr<TestProcess>> agents;
  for (const char* id : {"alpha", "beta", "alpha", "beta"}) {
    agents.push_back(
        std::make_unique<TestProcess>(withWorker(agentArgs(2, 2, 1, port, id, "is_host=false"), kPrintEnv)));
  }
  std::map<std::string, std::set<int>> ranks_by_job;
  for (auto& agent : agents) {
    REQUIRE(agent->wait(60s));
    INFO(agent->err());
    CHECK(agent->exitCode() == 0);
    for (const auto& l : workerLines(agent->out())) {
      CHECK(l.world == 2);
      ranks_by_job[l.run].insert(l.rank);
    }
  }
  CHECK(ranks_by_job["alpha"] == std::set<int>{0, 1});
  CHECK(ranks_by_job["beta"] == std::set<int>{0, 1});
}

TEST_CASE("a worker failure on one node restarts every node with the same restart count", "[e2e][multinode]") {
  // Group rank 1's worker fails on the first attempt; everything else waits to be stopped.
  const std::string script = std::string(kPrintEnv) +
                             "; if [ $TORCHELASTIC_RESTART_COUNT = 0 ]; then "
                             "if [ $GROUP_RANK = 1 ]; then exit 7; fi; exec sleep 60; fi";
  std::vector<std::unique_ptr<TestProcess>> agents;
  const int port = startHost(agents, withWorker(agentArgs(3, 3, 1, 0, "restarts"), script));
  for (int i = 1; i < 3; ++i) {
    agents.push_back(std::make_unique<TestProcess>(withWorker(agentArgs(3, 3, 1, port, "restarts"), script)));
  }
  for (auto& agent : agents) {
    // --max_restarts defaults to 0: the failure is final.
    REQUIRE(agent->wait(60s));
    CHECK(agent->exitCode() == 1);
  }
  std::string all;
  for (auto& agent : agents) all += agent->err();
  CHECK_THAT(all, Catch::Contains("exit code 7"));

  std::vector<std::unique_ptr<TestProcess>> retried;
  auto retrying = [&](int port) {
    auto args = agentArgs(3, 3, 1, port, "restarts2");
    args.push_back("--max_restarts=1");
    return withWorker(args, script);
  };
  const int port2 = startHost(retried, retrying(0));
  for (int i = 1; i < 3; ++i) retried.push_back(std::make_unique<TestProcess>(retrying(port2)));
  std::string out;
  for (auto& agent : retried) {
    REQUIRE(agent->wait(60s));
    INFO(agent->err());
    CHECK(agent->exitCode() == 0);
    out += agent->out();
  }
  int second_attempt = 0;
  for (const auto& l : workerLines(out)) second_attempt += l.restart == 1 ? 1 : 0;
  CHECK(second_attempt == 3);  // every node's worker ran again, all with restart count 1
}

TEST_CASE("an agent killed mid-job is evicted and the others finish with a smaller world", "[e2e][multinode]") {
  int port = 0;
  const std::string conf = "keep_alive_interval=0.5,keep_alive_max_attempt=3,last_call_timeout=0.5";
  // Workers wait while the world is 3 nodes; in a world of 2 they finish.
  const std::string script = std::string(kPrintEnv) + "; if [ $GROUP_WORLD_SIZE = 3 ]; then exec sleep 60; fi";
  auto agents = startHostedJob(3, 2, 3, port, "shrink", conf, script);
  // Agent 0 hosts the store; kill another one.
  ::kill(agents[2]->pid(), SIGKILL);
  REQUIRE(agents[2]->wait(10s));
  for (int i = 0; i < 2; ++i) {
    REQUIRE(agents[i]->wait(60s));
    INFO(agents[i]->err());
    CHECK(agents[i]->exitCode() == 0);
    CHECK_THAT(agents[i]->err(), Catch::Contains("re-forming the job (evict:"));
    bool saw_small_world = false;
    for (const auto& l : workerLines(agents[i]->out())) {
      if (l.groups != 2) continue;
      saw_small_world = l.world == 2;
      CHECK(l.restart == 0);  // re-forming the job does not use up a restart
    }
    CHECK(saw_small_world);
  }
}

TEST_CASE("survivors below the minimum fail with a clear message", "[e2e][multinode]") {
  int port = 0;
  const std::string conf = "keep_alive_interval=0.5,keep_alive_max_attempt=3,join_timeout=2";
  const std::string script = std::string(kPrintEnv) + "; exec sleep 60";
  auto agents = startHostedJob(2, 2, 2, port, "toofew", conf, script);
  ::kill(agents[1]->pid(), SIGKILL);
  REQUIRE(agents[0]->wait(30s));
  CHECK(agents[0]->exitCode() == 3);
  CHECK_THAT(agents[0]->err(), Catch::Contains("only 1 of at least 2 nodes joined"));
}

TEST_CASE("a node that arrives late makes the job grow", "[e2e][multinode]") {
  const std::string conf = "last_call_timeout=0.3,keep_alive_interval=0.5";
  const std::string script = std::string(kPrintEnv) + "; if [ $GROUP_WORLD_SIZE != 3 ]; then exec sleep 60; fi";
  std::vector<std::unique_ptr<TestProcess>> agents;
  const int port = startHost(agents, withWorker(agentArgs(1, 3, 1, 0, "grow", conf), script));
  agents.push_back(std::make_unique<TestProcess>(withWorker(agentArgs(1, 3, 1, port, "grow", conf), script)));
  for (auto& agent : agents) REQUIRE(agent->waitForOutput("W rank=", 30s));
  agents.push_back(std::make_unique<TestProcess>(withWorker(agentArgs(1, 3, 1, port, "grow", conf), script)));
  std::set<int> final_ranks;
  for (auto& agent : agents) {
    REQUIRE(agent->wait(60s));
    INFO(agent->err());
    CHECK(agent->exitCode() == 0);
    for (const auto& l : workerLines(agent->out())) {
      if (l.groups == 3) final_ranks.insert(l.rank);
    }
  }
  CHECK(final_ranks == std::set<int>{0, 1, 2});
  CHECK_THAT(agents[0]->err(), Catch::Contains("re-forming the job (join:"));
}

TEST_CASE("the death of the store's host stops the others with a message naming it", "[e2e][multinode]") {
  int port = 0;
  const std::string conf = "keep_alive_interval=0.5,read_timeout=3";
  auto agents = startHostedJob(3, 3, 3, port, "hostdeath", conf, std::string(kPrintEnv) + "; exec sleep 60");
  ::kill(agents[0]->pid(), SIGKILL);
  for (int i = 1; i < 3; ++i) {
    REQUIRE(agents[i]->wait(30s));
    CHECK(agents[i]->exitCode() == 3);
    CHECK_THAT(agents[i]->err(), Catch::Contains("127.0.0.1:" + std::to_string(port)));
  }
}

TEST_CASE("agents with the same token form a job and a wrong token cannot join", "[e2e][multinode]") {
  const std::map<std::string, std::string> token = {{"DDPRUN_TOKEN", "s3cret"}};
  std::vector<std::unique_ptr<TestProcess>> agents;
  const int port = startHost(agents, withWorker(agentArgs(2, 2, 1, 0, "secure"), kPrintEnv), token);
  agents.push_back(std::make_unique<TestProcess>(withWorker(agentArgs(2, 2, 1, port, "secure"), kPrintEnv), token));
  for (auto& agent : agents) {
    REQUIRE(agent->wait(60s));
    INFO(agent->err());
    CHECK(agent->exitCode() == 0);
  }
  TestProcess host(withWorker(agentArgs(2, 2, 1, 0, "secure2", "join_timeout=5,is_host=true"), kPrintEnv), token);
  const int port2 = announcedPort(host);
  auto intruder = run(withWorker(agentArgs(2, 2, 1, port2, "secure2", "join_timeout=5,is_host=false"), kPrintEnv),
                      {{"DDPRUN_TOKEN", "wrong"}}, 30s);
  CHECK(intruder.exit_code == 3);
  CHECK_THAT(intruder.err, Catch::Contains("token"));
  CHECK(workerLines(intruder.out).empty());
}

// torchrun counts restarts per agent, so a node that rejoins with a fresh agent brings a fresh
// budget (pytorch/pytorch #108158, #147064). ddprun keeps one count for the job in the store.
TEST_CASE(
    "the restart budget (--max_restarts) bounds the whole job across nodes and a node that rejoins with a fresh agent",
    "[e2e][multinode]") {
  const std::string conf = "keep_alive_interval=0.5,keep_alive_max_attempt=3,join_timeout=30";
  // FLAP=early: fail while fewer than 2 restarts were used; FLAP=always: fail every attempt.
  const std::string script =
      "echo W restart=$TORCHELASTIC_RESTART_COUNT; "
      "if [ \"$FLAP\" = always ] || { [ \"$FLAP\" = early ] && [ $TORCHELASTIC_RESTART_COUNT -lt 2 ]; }; "
      "then sleep 0.3; exit 3; fi; exec sleep 60";
  auto args = [&](int port) {
    auto a = agentArgs(2, 2, 1, port, "budget", conf);
    a.push_back("--max_restarts=2");
    return withWorker(a, script);
  };
  std::vector<std::unique_ptr<TestProcess>> agents;
  const int port = startHost(agents, args(0));
  TestProcess first(args(port), {{"FLAP", "early"}});
  // Two failures of the first agent's worker use both restarts; at restart 2 it waits.
  REQUIRE(first.waitForOutput("W restart=2", 60s));
  ::kill(first.pid(), SIGKILL);
  REQUIRE(first.wait(10s));
  // A fresh agent on the same node: under a per-agent count it would have two restarts to spend.
  TestProcess rejoined(args(port), {{"FLAP", "always"}});
  REQUIRE(rejoined.wait(60s));
  REQUIRE(agents[0]->wait(60s));
  INFO("host:\n" << agents[0]->out() << agents[0]->err() << "\nrejoined:\n" << rejoined.out() << rejoined.err());
  CHECK(rejoined.exitCode() == 1);
  CHECK(agents[0]->exitCode() == 1);
  // The rejoined node's only attempt ran at the job's count, and its failure was final.
  CHECK(countOf(rejoined.out(), "W restart=") == 1);
  CHECK(countOf(rejoined.out(), "W restart=2") == 1);
  // The host ran restarts 0, 1, 2 and the re-formed attempt at 2 (re-forming uses none): never 3.
  CHECK(countOf(agents[0]->out(), "W restart=0") == 1);
  CHECK(countOf(agents[0]->out(), "W restart=1") == 1);
  CHECK(countOf(agents[0]->out(), "W restart=2") == 2);
  CHECK(countOf(agents[0]->out() + rejoined.out(), "W restart=3") == 0);
}
