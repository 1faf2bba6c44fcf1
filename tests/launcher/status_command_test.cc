// Agent records, the status read from a real store server (in-process, loopback), and the
// table and JSON `ddprun status` prints from them.
#include "rendezvous/job_status.h"

#include <catch2/catch.hpp>

#include "launcher/status_command.h"
#include "rendezvous/store_server.h"
#include "rendezvous/tcp_store_client.h"
#include "tests/support/test_process.h"

using namespace ddprun;
using namespace ddprun::rendezvous;

namespace {

AgentRecord record(const std::string& node, const std::string& state, int round, int group_rank, int rank_base) {
  AgentRecord r;
  r.node = node;
  r.address = "127.0.0.1";
  r.state = state;
  r.round = round;
  r.group_rank = group_rank;
  r.rank_base = rank_base;
  r.nproc = 2;
  r.restarts = 1;
  r.max_restarts = 3;
  r.heartbeat_ms = wallClockMillis();
  r.keep_alive_ms = 1000;
  r.keep_alive_max_attempt = 3;
  return r;
}

}  // namespace

TEST_CASE("an agent record survives encoding", "[status]") {
  AgentRecord r = record("host-a:123", "cooldown", 4, 1, 2);
  r.consecutive_failures = 3;
  r.cooldown_until_ms = 1234567890123;
  r.exit_code = -1;
  AgentRecord back = decodeAgentRecord(encodeAgentRecord(r));
  CHECK(back.node == r.node);
  CHECK(back.state == "cooldown");
  CHECK(back.round == 4);
  CHECK(back.group_rank == 1);
  CHECK(back.rank_base == 2);
  CHECK(back.nproc == 2);
  CHECK(back.restarts == 1);
  CHECK(back.max_restarts == 3);
  CHECK(back.heartbeat_ms == r.heartbeat_ms);
  CHECK(back.consecutive_failures == 3);
  CHECK(back.cooldown_until_ms == 1234567890123);
  CHECK(back.exit_code == -1);
}

TEST_CASE("malformed records are errors, not garbage", "[status]") {
  CHECK_THROWS_AS(decodeAgentRecord(""), RendezvousError);
  CHECK_THROWS_AS(decodeAgentRecord("v2|a|b"), RendezvousError);
  std::string text = encodeAgentRecord(record("n:1", "running", 0, 0, 0));
  text.replace(text.find("|running|") + 9, 1, "x");  // the round is no longer a number
  CHECK_THROWS_AS(decodeAgentRecord(text), RendezvousError);
}

TEST_CASE("a node is lost when its heartbeat is older than its keep-alives allow", "[status]") {
  AgentRecord r = record("n:1", "running", 0, 0, 0);
  CHECK_FALSE(agentLost(r, r.heartbeat_ms + 3999));
  CHECK(agentLost(r, r.heartbeat_ms + 4001));
  r.state = "exited";
  CHECK_FALSE(agentLost(r, r.heartbeat_ms + 100000));
}

TEST_CASE("the job's status is read from the store's keys", "[status]") {
  StoreServerOptions options;
  options.host = "127.0.0.1";
  StoreServer server(options);
  StoreClientOptions client_options;
  client_options.port = server.port();
  TcpStoreClient store(client_options);
  CHECK_THROWS_WITH(readJobStatus(store, "job"), Catch::Contains("no agent of job 'job'"));

  const std::string p = "rdzv/job/";
  for (const auto& r :
       {record("a:1", "running", 2, 1, 2), record("b:2", "running", 2, 0, 0), record("c:3", "cooldown", 1, 2, 4)}) {
    store.set(p + agentRecordKey(r.node), encodeAgentRecord(r));
    store.append(p + agentsListKey(), r.node + "\n");
  }
  store.set(p + "round", "2");
  store.set(p + "r2/closed", std::to_string((int64_t{2} << 32) | 4));
  store.set(p + "r2/restarts", "1");
  JobStatus s = readJobStatus(store, "job");
  CHECK(s.round == 2);
  CHECK(s.round_state == "running");
  CHECK(s.nodes_in_round == 2);
  CHECK(s.world_size == 4);
  CHECK(s.restarts == 1);
  CHECK(s.max_restarts == 3);
  REQUIRE(s.agents.size() == 3);
  // The current round's nodes in group-rank order, then the others.
  CHECK(s.agents[0].node == "b:2");
  CHECK(s.agents[1].node == "a:1");
  CHECK(s.agents[2].node == "c:3");

  s.store = "127.0.0.1:1";
  const std::string table = launcher::formatStatusTable(s);
  CHECK_THAT(table, Catch::Contains("round 2 running  nodes 2  world size 4  restarts 1/3"));
  CHECK_THAT(table, Catch::Contains("cooldown"));
  CHECK(ddprun::testing::countOf(table, "\n") == 5);  // the header line, the column names, three nodes
  const std::string json = launcher::formatStatusJson(s);
  CHECK_THAT(json, Catch::Contains("\"round\":2,\"round_state\":\"running\",\"end_reason\":null"));
  CHECK(ddprun::testing::countOf(json, "\"node\":") == 3);

  store.set(p + "r2/end", "fail:a:1");
  s = readJobStatus(store, "job");
  CHECK(s.round_state == "ended");
  CHECK(s.end_reason == "fail:a:1");
  // The next round is forming: its restarts are the failed round's plus one.
  store.set(p + "round", "3");
  s = readJobStatus(store, "job");
  CHECK(s.round == 3);
  CHECK(s.round_state == "forming");
  CHECK(s.restarts == 2);
}
