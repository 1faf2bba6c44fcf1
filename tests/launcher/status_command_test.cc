// Agent records, the status read from a real store server (in-process, loopback), and the
// table and JSON `ddprun status` prints from them.
#include "rendezvous/board/job_status.h"

#include <fstream>
#include <random>

#include <catch2/catch.hpp>

#include "launcher/status_command.h"
#include "rendezvous/store/store_server.h"
#include "rendezvous/store/tcp_store_client.h"
#include "tests/support/fuzz_run.h"
#include "tests/support/hostile_store.h"
#include "tests/support/test_process.h"

using namespace ddprun;
using namespace ddprun::rendezvous;
using ddprun::testing::HostileReply;
using ddprun::testing::HostileRequest;
using ddprun::testing::HostileStore;

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

TEST_CASE("an agent record keeps its workers' generations, and an older agent's v1 record reads without them",
          "[status]") {
  AgentRecord r = record("host-a:123", "running", 0, 0, 0);
  r.generations = {0, 2};
  CHECK(decodeAgentRecord(encodeAgentRecord(r)).generations == std::vector<int>{0, 2});
  r.generations.clear();
  CHECK(decodeAgentRecord(encodeAgentRecord(r)).generations.empty());
  // An agent of before the generations field (a job mid-upgrade) is still shown.
  const AgentRecord old = decodeAgentRecord("v1|n:1|10.0.0.1|running|0|0|0|1|0|3|9000000000000000|1000|3|0|0|-1");
  CHECK(old.state == "running");
  CHECK(old.generations.empty());
  std::string forged = encodeAgentRecord(record("n:1", "running", 0, 0, 0)) + "0,x";
  CHECK_THROWS_AS(decodeAgentRecord(forged), RendezvousError);  // a generation that is not a number
}

TEST_CASE("status shows each worker's generation, a replacement's above 0, in the table and in --json", "[status]") {
  JobStatus s;
  s.run_id = "job";
  s.store = "127.0.0.1:1";
  s.round = 0;
  s.round_state = "running";
  s.now_ms = wallClockMillis();
  s.agents = {record("a:1", "running", 0, 0, 0), record("b:2", "joining", -1, -1, 0)};
  s.agents[0].generations = {0, 1};  // local rank 1 replaced alone once (--recovery=in-job)
  const std::string table = launcher::formatStatusTable(s);
  CHECK_THAT(table, Catch::Contains("GENERATIONS"));
  CHECK_THAT(table, Catch::Contains("  0,1  "));
  const std::string json = launcher::formatStatusJson(s);
  CHECK_THAT(json, Catch::Contains("\"worker_generations\":[0,1]"));
  CHECK_THAT(json, Catch::Contains("\"worker_generations\":[]"));
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

namespace {

// `ddprun status` in this process against the store at `endpoint`: "ok", or the error's
// kind and line. Anything but a DdprunError (std::bad_alloc, std::out_of_range) escapes.
std::string statusOutcome(const std::string& endpoint) {
  const std::string arg = "--rdzv_endpoint=" + endpoint;
  const char* argv[] = {"ddprun", "status", arg.c_str(), "--rdzv_id=job", "--json"};
  try {
    launcher::runStatusCommand(5, argv);
    return "ok";
  } catch (const RendezvousError& e) {
    return std::string("rendezvous: ") + e.what();
  }
}

}  // namespace

TEST_CASE("status against a store that claims a 4 GiB value fails with one line naming the length",
          "[status][bad-input]") {
  HostileStore store([](const HostileRequest& r) -> std::optional<HostileReply> {
    if (r.command == 5 || r.command == 6) return std::string(1, '\0');  // CHECK: ready; WAIT: stop waiting
    if (r.command == 3) return HostileStore::value(uint64_t{1} << 32, "");
    return std::nullopt;
  });
  const std::string outcome = statusOutcome(store.endpoint());
  CHECK_THAT(outcome, Catch::StartsWith("rendezvous: status of job 'job': store get(key=rdzv/job/agents): reply "
                                        "claims a value of 4294967296 bytes"));
  CHECK(outcome.find('\n') == std::string::npos);
}

TEST_CASE("status against a store whose values and key counts lie is refused before it allocates",
          "[status][bad-input]") {
  const std::string names = "a:1\nb:2\n";
  SECTION("a MULTI_GET whose values together exceed one reply") {
    HostileStore store([&](const HostileRequest& r) -> std::optional<HostileReply> {
      if (r.command == 5 || r.command == 6) return std::string(1, '\0');
      if (r.command == 3) return HostileStore::value(names);
      // Two values of 200 MiB each (with none of their bytes): each fits, both do not.
      if (r.command == 10) return HostileStore::value(200 << 20, "");
      return std::nullopt;
    });
    CHECK_THAT(statusOutcome(store.endpoint()), Catch::Contains("store multi_get(2 keys): "));
  }
  SECTION("a value cut short by a closed connection") {
    HostileStore store([&](const HostileRequest& r) -> std::optional<HostileReply> {
      if (r.command == 5 || r.command == 6) return std::string(1, '\0');
      if (r.command == 3) return HostileStore::value(100 << 20, "a:1\n");
      return std::nullopt;
    });
    // The reply's 100 MiB are never sent: the close ends the read, not a zero-filled buffer.
    CHECK_THAT(statusOutcome(store.endpoint()), Catch::Contains("the server closed the connection"));
  }
  SECTION("LIST_KEYS claiming 2^62 keys") {
    HostileStore store([](const HostileRequest& r) -> std::optional<HostileReply> {
      if (r.command == 17) return HostileStore::value(uint64_t{1} << 62, "");
      return std::nullopt;
    });
    StoreClientOptions options;
    options.port = store.port();
    options.timeout = std::chrono::seconds(10);
    TcpStoreClient client(options);
    CHECK_THROWS_WITH(client.listKeys(), Catch::Contains("reply claims 4611686018427387904 keys"));
  }
}

// Replies made of forged lengths, random bytes and connections closed midway, for the reads
// of `status` (CHECK, WAIT, GET, MULTI_GET): every run must end in a line of its own (or a
// status), never a crash, a bad_alloc or another exception, and quickly (the store closes
// a connection once it is done with it, so no read waits out the timeout).
TEST_CASE("status fuzz: a hostile store answering with forged lengths and random bytes", "[status][bad-input][fuzz]") {
  const auto [seed, budget] = ddprun::testing::fuzzRun("status");
  std::mt19937 rng(seed);
  auto pick = [&](uint64_t n) { return std::uniform_int_distribution<uint64_t>(0, n - 1)(rng); };
  auto randomBytes = [](auto& p, size_t n) {
    std::string s(n, '\0');
    for (char& c : s) c = static_cast<char>(p(256));
    return s;
  };
  const std::string good_record = encodeAgentRecord(record("a:1", "running", 0, 0, 0));
  // A value, and whether it holds as many bytes as it claims.
  auto forgedValue = [&](auto& p) -> std::pair<std::string, bool> {
    switch (p(7)) {
      case 0: return {HostileStore::value(uint64_t{1} << (32 + p(32)), ""), false};              // huge
      case 1: return {HostileStore::value(p(uint64_t{1} << 31), randomBytes(p, p(64))), false};  // longer than sent
      case 2: return {HostileStore::value(randomBytes(p, p(200))), true};
      case 3: return {HostileStore::value(p(2) ? "a:1\n" : "a:1\nb:2\n\n|||\n"), true};
      case 4: return {HostileStore::value(good_record), true};
      case 5: return {randomBytes(p, p(12)), false};  // not even a length
      default: return {HostileStore::value(std::string(p(2) ? "v1|" : "") + randomBytes(p, p(100))), true};
    }
  };
  const auto deadline = std::chrono::steady_clock::now() + budget;
  int runs = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    const auto run_seed = static_cast<uint32_t>(pick(uint64_t{1} << 32));
    std::mt19937 answer_rng(run_seed);
    HostileStore store([&](const HostileRequest& r) -> std::optional<HostileReply> {
      auto p = [&](uint64_t n) { return std::uniform_int_distribution<uint64_t>(0, n - 1)(answer_rng); };
      if (p(20) == 0) return std::nullopt;  // close instead of answering
      if (r.command == 5 || r.command == 6) return std::string(1, static_cast<char>(p(8) == 0 ? p(256) : 0));
      HostileReply reply("");
      const size_t values = r.command == 10 ? r.keys.size() : 1;
      for (size_t i = 0; i < values; ++i) {
        auto [bytes, whole] = forgedValue(p);
        reply.bytes += bytes;
        reply.then_close = reply.then_close || !whole;
      }
      return reply;
    });
    INFO("run seed " << run_seed);
    std::string outcome;
    REQUIRE_NOTHROW(outcome = statusOutcome(store.endpoint()));
    CHECK(outcome.find('\n') == std::string::npos);
    ++runs;
  }
  std::printf("status fuzz: %d runs\n", runs);
  CHECK(runs > 0);
}

TEST_CASE("status shows the last hang verdict of the events file", "[status]") {
  ddprun::testing::TempDir dir;
  const std::string events = dir.file("events.jsonl");
  CHECK_FALSE(launcher::lastHangVerdict(events));
  std::ofstream(events) << "{\"event\":\"agent_start\",\"store\":\"h:1\"}\n"
                           "{\"event\":\"hang_verdict\",\"trigger\":\"t\",\"verdict\":\"hang: rank 3 is behind\","
                           "\"attempt\":0}\n"
                           "{\"event\":\"hang_verdict\",\"trigger\":\"t\",\"verdict\":\"hang: rank 1 is not in a "
                           "collective, at /j.py:10 in <module>: time.sleep(60)\",\"source\":\"python_stacks\","
                           "\"attempt\":2}\n"
                           "{\"event\":\"worker_exit\",\"rank\":1}\n";
  auto verdict = launcher::lastHangVerdict(events);
  REQUIRE(verdict);
  CHECK(*verdict == "attempt 2: hang: rank 1 is not in a collective, at /j.py:10 in <module>: time.sleep(60)");
}

namespace {

JobStatus statusOf(std::vector<AgentRecord> agents) {
  JobStatus s;
  s.run_id = "job";
  s.store = "127.0.0.1:1";
  s.now_ms = wallClockMillis();
  s.agents = std::move(agents);
  return s;
}

std::vector<std::string> linesOf(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t end; (end = text.find('\n', start)) != std::string::npos; start = end + 1) {
    lines.push_back(text.substr(start, end - start));
  }
  return lines;
}

}  // namespace

// One forged 2 MB address once widened its column, and so every line of the table: rows x
// the widest cell (2 GB printed for 1,000 records).
TEST_CASE("status cuts every cell to 64 columns, so one huge field cannot widen every line", "[status][bad-input]") {
  std::vector<AgentRecord> agents;
  AgentRecord big = record("big:1", "running", 0, 0, 0);
  big.address = std::string(2 << 20, 'a');
  agents.push_back(big);
  for (int i = 0; i < 20; ++i) agents.push_back(record("n:" + std::to_string(i), "running", 0, 0, 0));
  AgentRecord wide = record("", "running", 0, 0, 0);
  for (int i = 0; i < 100; ++i) wide.node += "\xc3\xa9";  // é: two bytes, one column
  agents.push_back(wide);
  const std::string table = launcher::formatStatusTable(statusOf(agents));
  const std::vector<std::string> lines = linesOf(table);
  REQUIRE(lines.size() == 2 + agents.size());
  // Nine columns of at most 64 and the two spaces between them (two bytes for an é).
  size_t longest = 0;
  for (const std::string& line : lines) longest = std::max(longest, line.size());
  CHECK(longest <= 9 * (64 + 2) + 64);
  CHECK_THAT(table, Catch::Contains(std::string(61, 'a') + "...  "));
  CHECK(table.find(std::string(62, 'a')) == std::string::npos);
  std::string cut_node;
  for (int i = 0; i < 61; ++i) cut_node += "\xc3\xa9";
  CHECK_THAT(table, Catch::Contains(cut_node + "...  "));
}

TEST_CASE("status shows a record's node, address and state, and the round's end, escaped", "[status][bad-input]") {
  const std::string evil = "\x1b]0;PWN\x07\x1b[2J";
  const std::string shown = "\\x1b]0;PWN\\x07\\x1b[2J";
  AgentRecord r = record("n" + evil + ":1", "running" + evil, 0, 0, 0);
  r.address = "10.0.0.1" + evil;
  JobStatus s = statusOf({r});
  s.round = 0;
  s.round_state = "ended";
  s.end_reason = "fail:" + evil;
  const std::string table = launcher::formatStatusTable(s);
  CHECK(table.find('\x1b') == std::string::npos);
  CHECK(table.find('\x07') == std::string::npos);
  CHECK_THAT(table, Catch::Contains("(fail:" + shown + ")"));
  CHECK_THAT(table, Catch::Contains("n" + shown + ":1  "));
  CHECK_THAT(table, Catch::Contains("10.0.0.1" + shown + "  "));
  CHECK_THAT(table, Catch::Contains("running" + shown + "  "));
}
