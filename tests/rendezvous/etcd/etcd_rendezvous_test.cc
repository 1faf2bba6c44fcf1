// ddprun agents forming jobs on a real 3-member etcd cluster on loopback (label etcd):
// forming, scaling up and down, the etcd leader killed mid-round and between rounds, a member
// frozen (SIGSTOP), TLS, and an unreachable cluster or a wrong prefix. Skipped with a warning
// where etcd is not installed or the test has no network namespace of its own.
#include <csignal>
#include <fstream>
#include <memory>
#include <regex>

#include <catch2/catch.hpp>

#include "tests/rendezvous/etcd/etcd_cluster.h"
#include "tests/support/test_process.h"

using namespace ddprun::testing;

namespace {

// Each worker prints its line, then runs until the test creates `go` (at most 60 s).
std::string workerScript(const std::string& go) {
  return "echo W rank=$RANK world=$WORLD_SIZE group=$GROUP_RANK groups=$GROUP_WORLD_SIZE "
         "restart=$TORCHELASTIC_RESTART_COUNT master=$MASTER_ADDR:$MASTER_PORT; i=0; "
         "while [ ! -e " +
         go + " ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done";
}

struct Job {
  std::string endpoints;
  std::string id;
  std::string prefix;
  std::string go;
  std::string extra_conf;
};

std::unique_ptr<TestProcess> agent(const Job& job, int min_nodes = 2, int max_nodes = 3) {
  std::string conf = "key_prefix=" + job.prefix +
                     ",keep_alive_interval=1,keep_alive_max_attempt=3,last_call_timeout=1,join_timeout=60";
  if (!job.extra_conf.empty()) conf += "," + job.extra_conf;
  return std::make_unique<TestProcess>(std::vector<std::string>{
      ddprunPath(), "--nnodes=" + std::to_string(min_nodes) + ":" + std::to_string(max_nodes), "--nproc_per_node=1",
      "--rdzv_backend=etcd-v2", "--rdzv_endpoint=" + job.endpoints, "--rdzv_id=" + job.id, "--rdzv_conf=" + conf,
      "--no_python", "sh", "-c", workerScript(job.go)});
}

Job newJob(const EtcdCluster& cluster, const TempDir& dir, const std::string& id) {
  return Job{cluster.endpoints(), id, "/ddprun-test-" + id, dir.file("go"), ""};
}

void finishJob(const Job& job, std::vector<std::unique_ptr<TestProcess>>& agents) {
  std::ofstream(job.go) << "go\n";
  for (auto& a : agents) {
    REQUIRE(a->wait(60s));
    INFO(a->err());
    CHECK(a->exitCode() == 0);
  }
}

}  // namespace

TEST_CASE("two agents form a job, a third scales it up, killing one scales it down, the keys go at the end", "[etcd]") {
  EtcdCluster cluster;
  REQUIRE_ETCD(cluster);
  TempDir dir;
  const Job job = newJob(cluster, dir, "scale");
  std::vector<std::unique_ptr<TestProcess>> agents;
  agents.push_back(agent(job));
  agents.push_back(agent(job));
  for (auto& a : agents) REQUIRE(a->waitForOutput("groups=2 restart=0", 60s));

  agents.push_back(agent(job));  // scale up: the job re-forms with it, no restart used
  for (auto& a : agents) REQUIRE(a->waitForOutput("groups=3 restart=0", 60s));
  // Each node's key in the round lives on its lease (written once its watcher starts).
  CHECK(eventually([&] { return countOf(cluster.keys(job.prefix + "/rdzv/scale/r1/alive/"), "alive/") == 3; }, 20s));

  // Scale down: agent 3 dies with its workers; its lease lapses (3 s) and the others re-form.
  ::kill(-agents[2]->pid(), SIGKILL);
  ::kill(agents[2]->pid(), SIGKILL);
  REQUIRE(agents[2]->wait(30s));
  agents.pop_back();
  for (auto& a : agents) {
    INFO(a->err());
    REQUIRE(a->waitForOutput("groups=2 restart=0", 60s, 2));
  }
  finishJob(job, agents);
  // The last agent out removed the run's keys.
  CHECK(cluster.keys(job.prefix + "/rdzv/").empty());
}

TEST_CASE("losing the node of group rank 0 (the workers' store) re-forms the job on the others", "[etcd]") {
  EtcdCluster cluster;
  REQUIRE_ETCD(cluster);
  TempDir dir;
  const Job job = newJob(cluster, dir, "first");
  std::vector<std::unique_ptr<TestProcess>> agents;
  for (int i = 0; i < 3; ++i) agents.push_back(agent(job, 2, 3));
  for (auto& a : agents) REQUIRE(a->waitForOutput("groups=3 restart=0", 60s));
  // Under c10d the store's host is the node whose loss ends the job; here no node is.
  size_t first = agents.size();
  for (size_t i = 0; i < agents.size(); ++i) {
    if (agents[i]->out().find("group=0 groups=3") != std::string::npos) first = i;
  }
  REQUIRE(first < agents.size());
  ::kill(-agents[first]->pid(), SIGKILL);
  ::kill(agents[first]->pid(), SIGKILL);
  REQUIRE(agents[first]->wait(30s));
  agents.erase(agents.begin() + static_cast<std::ptrdiff_t>(first));
  for (auto& a : agents) {
    INFO(a->err());
    REQUIRE(a->waitForOutput("groups=2 restart=0", 60s));
    CHECK(a->err().find("evict") != std::string::npos);
  }
  finishJob(job, agents);
  CHECK(cluster.keys(job.prefix + "/rdzv/").empty());
}

TEST_CASE("the leader killed mid-round, and after its return the next leader, costs the job nothing", "[etcd]") {
  EtcdCluster cluster;
  REQUIRE_ETCD(cluster);
  TempDir dir;
  const Job job = newJob(cluster, dir, "leader-mid");
  std::vector<std::unique_ptr<TestProcess>> agents;
  agents.push_back(agent(job, 2, 2));
  agents.push_back(agent(job, 2, 2));
  for (auto& a : agents) REQUIRE(a->waitForOutput("W rank=", 60s));
  // `ddprun status` reads the job's records from etcd.
  RunResult table;
  CHECK(eventually(
      [&] {
        table = run({ddprunPath(), "status", "--rdzv_backend=etcd-v2", "--rdzv_endpoint=" + job.endpoints,
                     "--rdzv_id=" + job.id, "--rdzv_conf=key_prefix=" + job.prefix},
                    {}, 30s);
        return table.exit_code == 0 && countOf(table.out, "  running ") == 2;  // rows, not the header
      },
      20s));
  INFO(table.out << table.err);
  CHECK(table.out.find("nodes 2  world size 2") != std::string::npos);
  // Member 1 leads and is the agents' first member: its loss is felt by every call.
  REQUIRE(cluster.makeLeader(1));
  cluster.kill(1);
  // Several lease TTLs (3 s) pass on the two remaining members: keep-alives fail over.
  std::this_thread::sleep_for(8s);
  // The member comes back and catches up; then the new leader is lost too.
  cluster.restart(1);
  const int second = cluster.leader();
  REQUIRE(second >= 1);
  cluster.kill(second);
  std::this_thread::sleep_for(8s);
  finishJob(job, agents);
  for (auto& a : agents) {
    INFO(a->out() << a->err());
    CHECK(countOf(a->out(), "W rank=") == 1);  // no restart, no re-formation
  }
  CHECK(cluster.keys(job.prefix + "/rdzv/").empty());
}

TEST_CASE("the leader killed between rounds, the next round forms on the two members left", "[etcd]") {
  EtcdCluster cluster;
  REQUIRE_ETCD(cluster);
  TempDir dir;
  const Job job = newJob(cluster, dir, "leader-between");
  std::vector<std::unique_ptr<TestProcess>> agents;
  agents.push_back(agent(job));
  agents.push_back(agent(job));
  for (auto& a : agents) REQUIRE(a->waitForOutput("groups=2 restart=0", 60s));
  const int leader = cluster.leader();
  REQUIRE(leader >= 1);
  cluster.kill(leader);
  agents.push_back(agent(job));  // the next round forms while etcd elects a new leader
  for (auto& a : agents) {
    INFO(a->err());
    REQUIRE(a->waitForOutput("groups=3 restart=0", 60s));
  }
  finishJob(job, agents);
}

TEST_CASE("the leader frozen (SIGSTOP: partitioned) mid-round costs the job nothing", "[etcd]") {
  EtcdCluster cluster;
  REQUIRE_ETCD(cluster);
  // Member 1 leads and is the one the agents talk to first: the hardest member to lose.
  REQUIRE(cluster.makeLeader(1));
  TempDir dir;
  const Job job = newJob(cluster, dir, "frozen");
  std::vector<std::unique_ptr<TestProcess>> agents;
  agents.push_back(agent(job, 2, 2));
  agents.push_back(agent(job, 2, 2));
  for (auto& a : agents) REQUIRE(a->waitForOutput("W rank=", 60s));
  // Frozen, it accepts connections and never answers; the other two elect a new leader.
  const int pid = cluster.pid(1);
  REQUIRE(pid > 1);
  ::kill(pid, SIGSTOP);
  std::this_thread::sleep_for(10s);
  finishJob(job, agents);
  ::kill(pid, SIGCONT);
  for (auto& a : agents) {
    INFO(a->out() << a->err());
    CHECK(countOf(a->out(), "W rank=") == 1);
  }
}

TEST_CASE("the leader frozen while the job re-forms costs no agent, with a read_timeout shorter than an election",
          "[etcd]") {
  EtcdCluster cluster;
  REQUIRE_ETCD(cluster);
  REQUIRE(cluster.makeLeader(1));
  TempDir dir;
  Job job = newJob(cluster, dir, "frozen-reform");
  // 1 s per store operation, less than a silent leader's attempt and an election: each etcd
  // operation gets at least 10 s (etcd_backend.cc), or every agent fails at once here.
  job.extra_conf = "read_timeout=1";
  std::vector<std::unique_ptr<TestProcess>> agents;
  agents.push_back(agent(job, 2, 3));
  agents.push_back(agent(job, 2, 3));
  for (auto& a : agents) REQUIRE(a->waitForOutput("groups=2", 60s));
  const int pid = cluster.pid(1);
  REQUIRE(pid > 1);
  ::kill(pid, SIGSTOP);
  agents.push_back(agent(job, 2, 3));  // a third joins: every agent re-forms while the others elect
  for (auto& a : agents) {
    INFO(a->err());
    CHECK(a->waitForOutput("groups=3", 60s));
  }
  ::kill(pid, SIGCONT);
  finishJob(job, agents);
}

TEST_CASE("agents form a job over TLS with client certificates", "[etcd]") {
  EtcdCluster cluster(true);
  REQUIRE_ETCD(cluster);
  TempDir dir;
  Job job = newJob(cluster, dir, "tls");
  job.extra_conf = "protocol=https,cacert=" + cluster.tlsFile("ca.pem") + ",cert=" + cluster.tlsFile("client.pem") +
                   ",key=" + cluster.tlsFile("client-key.pem");
  std::vector<std::unique_ptr<TestProcess>> agents;
  agents.push_back(agent(job, 2, 2));
  agents.push_back(agent(job, 2, 2));
  for (auto& a : agents) {
    INFO(a->err());
    REQUIRE(a->waitForOutput("groups=2 restart=0", 60s));
  }
  finishJob(job, agents);
  CHECK(cluster.keys(job.prefix + "/rdzv/").empty());

  // Without the client certificate the cluster refuses: one line, exit 3.
  Job plain = job;
  plain.extra_conf = "protocol=https,cacert=" + cluster.tlsFile("ca.pem");
  auto refused = agent(plain, 1, 1);
  REQUIRE(refused->wait(60s));
  INFO(refused->err());
  CHECK(refused->exitCode() == 3);
  CHECK(refused->err().find("etcd") != std::string::npos);
}

// Exit codes as for every rendezvous and usage error (agent/elastic_agent.h): 3, and 2 for a
// bad --rdzv_conf, found before anything starts.
TEST_CASE("an unreachable cluster or a wrong key prefix is one line and a failed exit, soon", "[etcd]") {
  // Two loopback ports held by this test, bound but never listening: a connection is refused.
  const ClosedPort first, second;
  const std::string nowhere =
      "127.0.0.1:" + std::to_string(first.port()) + ",127.0.0.1:" + std::to_string(second.port());
  const RunResult r = run({ddprunPath(), "--nnodes=1", "--rdzv_backend=etcd-v2", "--rdzv_endpoint=" + nowhere,
                           "--rdzv_id=x", "--no_python", "true"},
                          {}, 60s);
  INFO(r.err);
  REQUIRE(r.finished);
  CHECK(r.exit_code == 3);
  CHECK(r.err.find("cannot reach etcd at " + nowhere) != std::string::npos);
  CHECK(countOf(r.err, "\n") == 1);

  const RunResult p = run({ddprunPath(), "--nnodes=1", "--rdzv_backend=etcd-v2", "--rdzv_endpoint=" + nowhere,
                           "--rdzv_id=x", "--rdzv_conf=key_prefix=ddprun", "--no_python", "true"},
                          {}, 60s);
  INFO(p.err);
  REQUIRE(p.finished);
  CHECK(p.exit_code == 2);
  CHECK(p.err.find("key_prefix=ddprun") != std::string::npos);
  CHECK(countOf(p.err, "\n") == 1);
}
