// `ddprun status` against a running multi-node job: several agents on loopback form one
// job; status reads their records from the rendezvous store (or finds the store through
// an agent's --log_dir) and shows each node, its ranks and heartbeat, the round and the
// restarts; a killed agent shows as lost once the others have re-formed without it.
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <regex>

#include <catch2/catch.hpp>

#include "tests/e2e/ops_support.h"
#include "tests/support/hostile_store.h"

using namespace ddprun::testing;
using namespace ddprun::testing::ops;

namespace {

RunResult status(const std::vector<std::string>& extra) {
  std::vector<std::string> args = {ddprunPath(), "status"};
  args.insert(args.end(), extra.begin(), extra.end());
  return run(args, {}, 30s);
}

// Table rows of nodes in `state` ("running", "lost", ...).
int rowsInState(const std::string& table, const std::string& state) {
  static const std::regex row(R"(^\S+:\d+\s+\S+\s+(\S+)\s)", std::regex::multiline);
  int n = 0;
  for (std::sregex_iterator it(table.begin(), table.end(), row), end; it != end; ++it) n += (*it)[1] == state;
  return n;
}

}  // namespace

TEST_CASE("status shows every node of a running job, its ranks, round, restarts and heartbeat", "[e2e][ops]") {
  int port = 0;  // agent 0, the store's host, takes one from the kernel and announces it
  const std::string id = "statusjob";
  TempDir logs;
  const std::string conf = "keep_alive_interval=0.5,keep_alive_max_attempt=3,last_call_timeout=3";
  std::vector<std::unique_ptr<TestProcess>> agents;
  for (int i = 0; i < 3; ++i) {
    auto args = agentArgs("2:3", 2, port, id, conf + (i == 0 ? ",is_host=true" : ",is_host=false"));
    args.insert(args.end(), {"--max_restarts=2", "--log_dir=" + logs.path()});
    agents.push_back(std::make_unique<TestProcess>(withShell(args, "echo W rank=$RANK; exec sleep 60")));
    if (i == 0) port = announcedPort(*agents.back());
  }
  const std::string endpoint = "127.0.0.1:" + std::to_string(port);
  for (auto& agent : agents) REQUIRE(agent->waitForOutput("W rank=", 30s, 2));

  RunResult table;
  REQUIRE(eventually(
      [&] {
        table = status({"--rdzv_endpoint=" + endpoint, "--rdzv_id=" + id});
        return table.exit_code == 0 && rowsInState(table.out, "running") == 3;
      },
      20s));
  INFO(table.out << table.err);
  CHECK_THAT(table.out, Catch::Contains("job statusjob"));
  CHECK_THAT(table.out, Catch::Contains("round 0 running"));
  CHECK_THAT(table.out, Catch::Contains("nodes 3  world size 6"));
  CHECK_THAT(table.out, Catch::Contains("restarts 0/2"));
  CHECK_THAT(table.out, Catch::Contains("LAST HEARTBEAT"));
  for (const char* ranks : {" 0-1 ", " 2-3 ", " 4-5 "}) CHECK(countOf(table.out, ranks) == 1);

  {  // --json is one object a script can read
    auto json = status({"--rdzv_endpoint=" + endpoint, "--rdzv_id=" + id, "--json"});
    REQUIRE(json.exit_code == 0);
    TempDir dir;
    const std::string file = dir.file("status.json");
    std::ofstream(file) << json.out;
    auto checked = checkWithPython(file, R"(
import json, sys
d = json.load(open(sys.argv[1]))
assert d["run_id"] == "statusjob" and d["round"] == 0 and d["round_state"] == "running", d
assert d["nodes_in_round"] == 3 and d["world_size"] == 6 and d["restarts"] == 0 and d["max_restarts"] == 2, d
nodes = d["nodes"]
assert len(nodes) == 3, nodes
assert sorted((n["first_rank"], n["last_rank"]) for n in nodes) == [(0, 1), (2, 3), (4, 5)], nodes
assert [n["group_rank"] for n in nodes] == [0, 1, 2], nodes
for n in nodes:
    assert n["state"] == "running" and not n["lost"], n
    assert 0 <= n["last_heartbeat_age_s"] < 10, n
)");
    INFO(json.out << checked.err);
    CHECK(checked.exit_code == 0);
  }

  {  // the log directory is enough to find the job
    auto from_logs = status({"--log_dir=" + logs.path()});
    INFO(from_logs.out << from_logs.err);
    CHECK(from_logs.exit_code == 0);
    CHECK_THAT(from_logs.out, Catch::Contains("job statusjob  store " + endpoint));
    CHECK(rowsInState(from_logs.out, "running") + rowsInState(from_logs.out, "succeeded") >= 1);
  }

  {  // a killed node shows as lost and the job goes on with the others
    ::kill(agents[2]->pid(), SIGKILL);
    REQUIRE(agents[2]->wait(10s));
    RunResult after;
    CHECK(eventually(
        [&] {
          after = status({"--rdzv_endpoint=" + endpoint, "--rdzv_id=" + id});
          return after.exit_code == 0 && rowsInState(after.out, "lost") == 1 &&
                 rowsInState(after.out, "running") == 2 && after.out.find("round 1 running") != std::string::npos;
        },
        30s));
    INFO(after.out << after.err);
    CHECK_THAT(after.out, Catch::Contains("nodes 2  world size 4"));
  }

  // Stopping the store's host stops the job everywhere.
  agents[0]->signal(SIGTERM);
  for (auto& agent : agents) REQUIRE(agent->wait(30s));
  CHECK(agents[0]->exitCode() == 128 + SIGTERM);
  CHECK(agents[1]->exitCode() == 1);
}

TEST_CASE("status of a job that does not exist or a store that is not there fails clearly", "[e2e][ops]") {
  int port = 0;
  const auto store = startStoreServer(port);
  auto unknown = status({"--rdzv_endpoint=127.0.0.1:" + std::to_string(port), "--rdzv_id=nosuchjob"});
  CHECK(unknown.exit_code == 3);
  CHECK_THAT(unknown.err, Catch::Contains("no agent of job 'nosuchjob'"));

  const ClosedPort nobody;
  auto closed = status({"--rdzv_endpoint=127.0.0.1:" + std::to_string(nobody.port()), "--rdzv_id=x"});
  CHECK(closed.exit_code == 3);
  CHECK_THAT(closed.err, Catch::Contains("cannot reach"));

  auto usage = status({"--rdzv_id=x"});
  CHECK(usage.exit_code == 2);
  CHECK_THAT(usage.err, Catch::Contains("--rdzv_endpoint"));

  TempDir empty;
  auto no_events = status({"--log_dir=" + empty.path()});
  CHECK(no_events.exit_code == 2);
  CHECK_THAT(no_events.err, Catch::Contains("events.jsonl"));
}

TEST_CASE("status against a store that claims a 4 GiB value exits 3 with one line, allocating nothing",
          "[e2e][ops][bad-input]") {
  // A forged store: every key exists, and a GET answers with a 4 GiB length and no bytes.
  HostileStore store([](const HostileRequest& r) -> std::optional<HostileReply> {
    if (r.command == 5 || r.command == 6) return std::string(1, '\0');  // CHECK: ready; WAIT: stop waiting
    if (r.command == 3) return HostileStore::value(uint64_t{1} << 32, "");
    return std::nullopt;
  });
  // Under 1 GiB of address space, as a zero-filled 4 GiB string would never fit.
  auto r = run({"/bin/sh", "-c", "ulimit -v 1048576 && exec \"$0\" \"$@\"", ddprunPath(), "status",
                "--rdzv_endpoint=" + store.endpoint(), "--rdzv_id=job"},
               {}, 30s);
  CHECK(r.exit_code == 3);
  CHECK(countOf(r.err, "\n") == 1);
  CHECK_THAT(r.err, Catch::Contains("reply claims a value of 4294967296 bytes"));
  CHECK_THAT(r.err, Catch::Contains(store.endpoint()));
  CHECK_THAT(r.err, !Catch::Contains("bad_alloc"));
}

// Records anyone who can write to the store may forge: escape codes in a node's name, address
// and state once reached the terminal as they were, and one 2 MB address widened every line
// of the table to 2 MB.
TEST_CASE("status prints forged records escaped and cut to 64 columns", "[e2e][ops][bad-input]") {
  const std::string evil = "\x1b]0;PWN\x07\x1b[2J";
  // v1|node|address|state|round|group|rank base|nproc|restarts|max restarts|heartbeat|keep-alive
  // |attempts|failures|cooldown until|exit code; a heartbeat in the future: never lost.
  auto record = [](const std::string& node, const std::string& address, const std::string& state) {
    return "v1|" + node + "|" + address + "|" + state + "|0|0|0|1|0|0|9000000000000000|1000|3|0|0|-1";
  };
  const std::string forged = record("n" + evil + ":1", "10.0.0.1" + evil, "running" + evil);
  const std::string huge = record("big:2", std::string(2 << 20, 'a'), "running");
  HostileStore store([&](const HostileRequest& r) -> std::optional<HostileReply> {
    const auto is = [&](const std::string& key, const std::string& suffix) { return key.ends_with(suffix); };
    if (r.command == 5) return std::string(1, is(r.keys.at(0), "/agents") ? '\0' : '\1');  // CHECK: only the list
    if (r.command == 6) return std::string(1, '\0');                                       // WAIT: stop waiting
    if (r.command == 3 && is(r.keys.at(0), "/agents")) return HostileStore::value("n" + evil + ":1\nbig:2\n");
    if (r.command == 10) {  // MULTI_GET: the records
      std::string values;
      for (const std::string& key : r.keys) values += HostileStore::value(is(key, "big:2") ? huge : forged);
      return values;
    }
    return std::nullopt;
  });
  auto r = status({"--rdzv_endpoint=" + store.endpoint(), "--rdzv_id=job"});
  REQUIRE(r.finished);
  INFO(r.err);
  CHECK(r.exit_code == 0);
  CHECK(r.out.find('\x1b') == std::string::npos);
  CHECK(r.out.find('\x07') == std::string::npos);
  const std::string shown = "\\x1b]0;PWN\\x07\\x1b[2J";
  CHECK_THAT(r.out, Catch::Contains("n" + shown + ":1  "));
  CHECK_THAT(r.out, Catch::Contains("10.0.0.1" + shown + "  "));
  CHECK_THAT(r.out, Catch::Contains("running" + shown + "  "));
  CHECK_THAT(r.out, Catch::Contains(std::string(61, 'a') + "...  "));
  // A title line and four lines of at most nine 64-column cells.
  CHECK(r.out.size() < 4 * 9 * 66 + 200);
}

// status --stacks names the program running as the events file's agent, from /proc/<pid>/exe:
// a program named with escape codes once had them printed as they were.
TEST_CASE("status --stacks names a program that is not an agent escaped", "[e2e][ops][bad-input]") {
  TempDir dir;
  const std::string program = dir.file("x\x1b]0;PWN\x07\x1b[2Jsleep");
  std::filesystem::copy_file("/bin/sleep", program);
  std::filesystem::permissions(program, std::filesystem::perms::owner_all);
  TestProcess impostor({program, "60"});
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const std::string node = std::string(host) + ":" + std::to_string(impostor.pid());
  std::ofstream(dir.file("events.jsonl"))
      << R"({"time":"t","unix_ms":1,"event":"agent_start","node":")" << node << R"(","run_id":"r","store":"h:1"})"
      << "\n"
      << R"({"time":"t","unix_ms":2,"event":"worker_start","node":")" << node
      << R"(","run_id":"r","rank":0,"local_rank":0,"pid":1,"attempt":0})"
      << "\n";
  auto r = status({"--stacks", "--log_dir=" + dir.path()});
  impostor.signal(SIGKILL);
  CHECK(impostor.wait(10s));
  REQUIRE(r.finished);
  INFO(r.err);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Catch::Contains("is x\\x1b]0;PWN\\x07\\x1b[2Jsleep, not a ddprun agent"));
  CHECK(r.err.find('\x1b') == std::string::npos);
}
