// Every reply from etcd is input (issue 44, defects 1 and 10): a fake etcd (fake_etcd.h, no
// etcd needed) answers chosen calls with wrong types, bad base64, text that is not JSON and
// hostile strings. Nothing of it may end ddprun (a std::terminate in a watcher thread was an
// abort, exit 134), every error is a StoreError that names the member and the call, and what
// etcd sent reaches the console escaped and cut: one line, never a forged one. In process
// (EtcdStore, EtcdRoundLease: unit), through ddprun (hostile: e2e) and as a fuzz loop (fuzz).
#include <algorithm>
#include <chrono>
#include <random>
#include <sstream>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "rendezvous/etcd/etcd_round_lease.h"
#include "rendezvous/etcd/etcd_store.h"
#include "tests/rendezvous/etcd/fake_etcd.h"
#include "tests/support/fuzz_run.h"
#include "tests/support/log_lines.h"
#include "tests/support/manual_clock.h"
#include "tests/support/test_process.h"

using namespace ddprun::testing;
using namespace ddprun::rendezvous;
using namespace ddprun::rendezvous::etcd;
using namespace std::chrono_literals;
using nlohmann::json;

namespace {

// A message of etcd's that would recolour the terminal and start a line of ddprun's own.
const std::string kForging = "\x1b[31mred\x1b[0m\n[ddprun] info: forged line\r\x07";
// The same, as printable() shows it.
const std::string kForgingShown = "\\x1b[31mred\\x1b[0m\\n[ddprun] info: forged line\\r\\x07";

FakeEtcd::Override on(const std::string& path, FakeEtcdReply reply) {
  return [path, reply](const std::string& p, const std::string&) -> std::optional<FakeEtcdReply> {
    if (p == path) return reply;
    return std::nullopt;
  };
}

std::unique_ptr<EtcdStore> storeOn(const FakeEtcd& fake, std::chrono::milliseconds timeout = 3s) {
  EtcdConnectionOptions options;
  options.endpoints = parseEndpoints(fake.endpoint());
  options.attempt_timeout = 1s;
  return std::make_unique<EtcdStore>(options, "/t", timeout);
}

// The console of a ddprun that met a hostile etcd: no terminal control byte, no line that
// ddprun did not write (a forged one), every line short.
void checkConsole(const RunResult& r) {
  INFO(r.err);
  CHECK(r.finished);
  CHECK(r.term_signal == 0);
  CHECK(r.exit_code != 134);
  CHECK(r.err.find('\x1b') == std::string::npos);
  CHECK(r.err.find('\x07') == std::string::npos);
  CHECK(r.err.find('\r') == std::string::npos);
  std::istringstream lines(r.out + "\n" + r.err);
  std::string line;
  while (std::getline(lines, line)) {
    CHECK(line.rfind("[ddprun] info: forged", 0) == std::string::npos);
    CHECK(line.size() < 8192);
  }
}

// One node (a round of its own) on the fake, with short keep-alives; the worker sleeps.
RunResult runDdprun(const FakeEtcd& fake, const std::string& worker_seconds = "2") {
  return run(
      {ddprunPath(), "--nnodes=1", "--nproc_per_node=1", "--rdzv_backend=etcd-v2", "--rdzv_endpoint=" + fake.endpoint(),
       "--rdzv_id=hostile", "--rdzv_conf=keep_alive_interval=1,keep_alive_max_attempt=2,join_timeout=20", "--no_python",
       "sleep", worker_seconds},
      {}, 90s);
}

}  // namespace

TEST_CASE("etcd replies of the wrong type or in bad base64 or not JSON are StoreErrors naming the member and the call",
          "[unit]") {
  struct Case {
    std::string path;
    std::string body;
    std::string says;
  };
  const auto c =
      GENERATE(Case{"/v3/lease/grant", R"({"ID":"abc","TTL":"5"})", "field 'ID' is not an integer"},
               Case{"/v3/lease/grant", R"({"ID":[7]})", "field 'ID' is not an integer"},
               Case{"/v3/kv/range", R"({"kvs":[{"key":"!!!!","value":"MQ=="}]})", "is not base64"},
               Case{"/v3/kv/range", R"({"kvs":"all of them"})", "field 'kvs' is not an array"},
               Case{"/v3/kv/range", R"({"kvs":[{"key":5}]})", "field 'key' is not a string"},
               Case{"/v3/kv/range", R"({"header":{"revision":{}}})", "field 'revision'"},
               Case{"/v3/kv/range", R"([1,2,3])", "JSON that is not an object"},
               Case{"/v3/kv/txn", R"({"succeeded":"yes"})", "field 'succeeded' is not a boolean"},
               Case{"/v3/kv/txn", R"({"responses":[{"response_range":{"kvs":[{"key":"%%%%"}]}}]})", "is not base64"});
  INFO(c.path << " answered " << c.body);
  FakeEtcd fake(on(c.path, {200, c.body}));
  auto store = storeOn(fake);
  try {
    if (c.path == "/v3/lease/grant") {
      store->grantLease(5);
    } else if (c.path == "/v3/kv/txn") {
      store->compareSet("k", "", "v");
    } else {
      store->get("k");
    }
    FAIL("no error");
  } catch (const StoreError& e) {
    const std::string what = e.what();
    INFO(what);
    CHECK(what.find(fake.endpoint()) != std::string::npos);
    CHECK(what.find(c.path) != std::string::npos);
    CHECK(what.find(c.says) != std::string::npos);
  }
}

TEST_CASE("an etcd error reply holding escapes and a newline or 40 MB is one escaped line of a few hundred bytes",
          "[unit]") {
  const std::string huge_json = json{{"message", std::string(40 << 20, 'x')}}.dump();
  const std::string huge_text = std::string(40 << 20, 'x') + kForging;
  struct Case {
    int status;
    std::string body;
    std::string shows;
  };
  // A long body is read only so far (64 KiB) and shown with its Content-Length.
  const auto c =
      GENERATE_COPY(Case{400, json{{"message", kForging}}.dump(), kForgingShown}, Case{404, kForging, kForgingShown},
                    Case{400, huge_json, "xxx... (" + std::to_string(huge_json.size()) + " bytes)"},
                    Case{400, huge_text, "xxx... (" + std::to_string(huge_text.size()) + " bytes)"});
  FakeEtcd fake(on("/v3/kv/put", {c.status, c.body}));
  auto store = storeOn(fake);
  try {
    store->set("k", "v");
    FAIL("no error");
  } catch (const StoreError& e) {
    const std::string what = e.what();
    INFO(what.substr(0, 2000));
    CHECK(what.find(fake.endpoint()) != std::string::npos);
    CHECK(what.find("HTTP " + std::to_string(c.status)) != std::string::npos);
    CHECK(what.find(c.shows) != std::string::npos);
    CHECK(what.find('\n') == std::string::npos);
    CHECK(what.find('\x1b') == std::string::npos);
    CHECK(what.size() < 1000);
  }
}

TEST_CASE("a keep-alive answer whose TTL is not a number is a warning and the keep-alives go on", "[unit]") {
  const auto body = GENERATE(std::string(R"({"result":{"TTL":"abc"}})"), std::string(R"({"result":["TTL"]})"),
                             std::string("not json\n"), std::string(R"({"error":{"message":17}})"),
                             std::string(R"([{"result":{"TTL":"5"}}])"));
  INFO(body);
  FakeEtcd fake(on("/v3/lease/keepalive", {200, body}));
  RoundLivenessSpec spec;
  spec.own_key = "r0/alive/0";
  spec.end_key = "r0/end";
  spec.keep_alive_interval = 50ms;
  spec.ttl = 3s;
  ManualClock clock;
  {
    EtcdRoundLease lease(storeOn(fake), spec, clock);
    CHECK(fake.value("/t/r0/alive/0") == "1");
    // Before the fix the first such answer ended the process (std::terminate in this thread).
    // Each keep_alive_interval of the clock is one keep-alive, sent once the one before was
    // answered and its thread waits again (10 s: a guard).
    for (int sent = 1; sent <= 3; ++sent) {
      REQUIRE(clock.awaitSleepers(1, 10s));
      clock.advance(spec.keep_alive_interval);
      CHECK(fake.waitForRequests("/v3/lease/keepalive", sent, 10s));
    }
  }
  CHECK_FALSE(fake.value("/t/r0/end").has_value());
}

TEST_CASE("a successor's watch answered with garbage stops that watch with a warning and evicts no one", "[unit]") {
  const auto body =
      GENERATE(std::string("{\"result\":{\"events\":[{\"type\":\"DELETE\",\"kv\":{\"key\":\"!!!!\"}}]}}\n"),
               std::string("not json at all\n"), std::string("{\"result\":{\"header\":\"x\"}}\n"),
               std::string("{\"result\":{\"events\":[{\"type\":7}]}}\n"));
  INFO(body);
  FakeEtcd fake(on("/v3/watch", {200, body}));
  fake.put("/t/r0/alive/1", "1");
  RoundLivenessSpec spec;
  spec.own_key = "r0/alive/0";
  spec.successor_key = "r0/alive/1";
  spec.successor_name = "host:1";
  spec.end_key = "r0/end";
  spec.evict_reason = "evict:host:1";
  spec.keep_alive_interval = 50ms;
  spec.ttl = 3s;
  ManualClock clock;  // no keep-alive due: only the watch talks to the fake
  LogLines log("rendezvous");
  {
    EtcdRoundLease lease(storeOn(fake), spec, clock);
    // The watch read the answer and gave up on it with a warning (before the fix: abort).
    CHECK(log.waitFor("warning: cannot watch node host:1's etcd lease: ", 10s));
    CHECK(fake.requests("/v3/watch") >= 1);
  }
  // A reply that cannot be read says nothing of the successor.
  CHECK_FALSE(fake.value("/t/r0/end").has_value());
}

TEST_CASE("ddprun on an etcd whose error message forges a console line: exit 3 and one escaped line", "[hostile]") {
  FakeEtcd fake(on("/v3/lease/grant", {400, json{{"message", kForging}}.dump()}));
  const RunResult r = runDdprun(fake);
  INFO(r.err);
  checkConsole(r);
  CHECK(r.exit_code == 3);
  CHECK(r.err.find("ddprun: rendezvous failed: ") != std::string::npos);
  CHECK(r.err.find(kForgingShown) != std::string::npos);
  CHECK(countOf(r.err, "\n") == 1);
}

TEST_CASE("ddprun on an etcd whose error message is 40 MB still prints its error line cut short", "[hostile]") {
  const std::string huge = json{{"message", std::string(40 << 20, 'y')}}.dump();
  FakeEtcd fake(on("/v3/lease/grant", {400, huge}));
  const RunResult r = runDdprun(fake);
  INFO(r.err.substr(0, 2000));
  checkConsole(r);
  CHECK(r.exit_code == 3);
  CHECK(r.err.find("ddprun: rendezvous failed: ") != std::string::npos);
  CHECK(r.err.find("yyy... (" + std::to_string(huge.size()) + " bytes)") != std::string::npos);
  CHECK(r.err.find("console stalled") == std::string::npos);
  CHECK(r.err.size() < 2000);
}

TEST_CASE("ddprun on an etcd that grants a lease without a numeric ID: exit 3 naming the member and the call",
          "[hostile]") {
  FakeEtcd fake(on("/v3/lease/grant", {200, R"({"ID":"abc","TTL":"120"})"}));
  const RunResult r = runDdprun(fake);
  INFO(r.err);
  checkConsole(r);
  CHECK(r.exit_code == 3);
  CHECK(r.err.find("ddprun: rendezvous failed: ") != std::string::npos);
  CHECK(r.err.find("etcd member " + fake.endpoint() + " answered /v3/lease/grant") != std::string::npos);
  CHECK(r.err.find("field 'ID' is not an integer") != std::string::npos);
  CHECK(countOf(r.err, "\n") == 1);
}

TEST_CASE("ddprun whose etcd answers keep-alives with a TTL that is not a number warns and runs its job", "[hostile]") {
  FakeEtcd fake(on("/v3/lease/keepalive", {200, R"({"result":{"TTL":"abc"}})"}));
  const RunResult r = runDdprun(fake, "3");
  INFO(r.err);
  checkConsole(r);
  // Before the fix: std::terminate in the keep-alive thread, SIGABRT.
  CHECK(r.exit_code == 0);
  CHECK(fake.requests("/v3/lease/keepalive") >= 1);
  CHECK(r.err.find("etcd lease keep-alive failed (etcd member " + fake.endpoint() + " answered /v3/lease/keepalive") !=
        std::string::npos);
}

TEST_CASE("ddprun whose etcd watches answer garbage loses the store: exit 3 and the reason escaped", "[hostile]") {
  // A key that is not base64, and that would forge a line if shown as it is (before the fix:
  // std::invalid_argument in the watcher thread, SIGABRT).
  FakeEtcd fake(on("/v3/watch", {200, json{{"result", {{"events", {{{"kv", {{"key", kForging}}}}}}}}}.dump() + "\n"}));
  const RunResult r = runDdprun(fake, "30");
  INFO(r.err);
  checkConsole(r);
  CHECK(r.exit_code == 3);
  CHECK(r.err.find("lost the rendezvous store") != std::string::npos);
  CHECK(r.err.find("answered /v3/watch") != std::string::npos);
  CHECK(r.err.find(kForgingShown) != std::string::npos);
}

// The fuzz tier: each run, one call of ddprun's (keep-alive, watch, txn, range, grant, put,
// deleterange), from its n-th request on, gets a hostile answer: a field of the wrong type,
// base64 that is not, no JSON, hostile strings, an HTTP error. ddprun must finish (exit 0 when
// the call's answer is not needed for the job to go on, 3, a rendezvous error, when it is),
// never abort, and its console must hold no control byte and no forged line.
TEST_CASE("fuzz: a fake etcd answering every call with wrong types or bad base64 or hostile strings", "[fuzz]") {
  const FuzzRun fuzz = fuzzRun("etcd replies");
  std::mt19937 rng(fuzz.seed);
  const auto pick = [&](const std::vector<json>& from) { return from[rng() % from.size()]; };
  const std::vector<std::string> paths = {
      "/v3/lease/keepalive", "/v3/watch",  "/v3/kv/txn",         "/v3/kv/range",
      "/v3/lease/grant",     "/v3/kv/put", "/v3/kv/deleterange", "/v3/maintenance/status"};
  const auto hostileString = [&]() -> std::string {
    switch (rng() % 5) {
      case 0: return kForging;
      case 1: return "\u202eevil\u2066";
      case 2: return std::string(100000 + rng() % 1000, 'z') + kForging;
      case 3: return "!!!!";
      default: return "";
    }
  };
  const auto wrongValue = [&]() -> json {
    return pick({json("abc"), json::array({1}), json::object({{"a", 1}}), json(true), json(-1), json(1e300),
                 json(18446744073709551615ull), json(nullptr), json(hostileString())});
  };
  const auto body = [&](const std::string& path) -> std::string {
    if (rng() % 6 == 0) return hostileString() + "\n";  // not JSON (or a JSON string)
    json j;
    if (path == "/v3/lease/keepalive") {
      j = pick({json{{"result", {{"TTL", wrongValue()}}}}, json{{"result", wrongValue()}},
                json{{"error", {{"message", wrongValue()}}}}, json{{"error", wrongValue()}}, wrongValue()});
    } else if (path == "/v3/watch") {
      j = pick({json{{"result", {{"events", json::array({{{"type", wrongValue()}, {"kv", {{"key", "QQ=="}}}}})}}}},
                json{{"result", {{"events", json::array({{{"kv", {{"key", hostileString()}}}}})}}}},
                json{{"result", {{"events", wrongValue()}}}}, json{{"result", {{"header", wrongValue()}}}},
                json{{"result", {{"canceled", true}, {"cancel_reason", wrongValue()}}}},
                json{{"error", {{"message", hostileString()}}}}, wrongValue()});
    } else if (path == "/v3/kv/txn") {
      j = pick(
          {json{{"succeeded", wrongValue()}}, json{{"responses", wrongValue()}},
           json{{"responses", json::array({{{"response_range", {{"kvs", json::array({{{"key", wrongValue()}}})}}}}})}},
           json{{"responses", json::array({{{"response_range", wrongValue()}}})}}});
    } else if (path == "/v3/lease/grant") {
      j = pick(
          {json{{"ID", wrongValue()}}, json{{"error", wrongValue()}}, json{{"ID", "5"}, {"error", hostileString()}}});
    } else {
      j = pick({json{{"kvs", json::array({{{"key", hostileString()}, {"value", wrongValue()}}})}},
                json{{"kvs", wrongValue()}}, json{{"header", wrongValue()}}, json{{"deleted", wrongValue()}},
                json{{"kvs", json::array({{{"key", "QQ=="}, {"mod_revision", wrongValue()}}})}}});
    }
    return j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
  };
  const auto start = std::chrono::steady_clock::now();
  int runs = 0;
  while (runs == 0 || std::chrono::steady_clock::now() - start < fuzz.budget) {
    const std::string path = paths[rng() % paths.size()];
    const int from = static_cast<int>(rng() % 3);
    const int status = pick({json(200), json(200), json(200), json(400), json(404)}).get<int>();
    const std::string reply = body(path);
    INFO("run " << runs << ": " << path << " from request " << from << ", HTTP " << status << ": "
                << reply.substr(0, 300));
    auto seen = std::make_shared<std::atomic<int>>(0);
    FakeEtcd fake([&, seen](const std::string& p, const std::string&) -> std::optional<FakeEtcdReply> {
      if (p != path || (*seen)++ < from) return std::nullopt;
      return FakeEtcdReply{status, reply};
    });
    const auto run_start = std::chrono::steady_clock::now();
    const RunResult r = runDdprun(fake, "1");
    std::printf("  %s from request %d, HTTP %d: exit %d after %.1f s\n", path.c_str(), from, status, r.exit_code,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count());
    checkConsole(r);
    CHECK((r.exit_code == 0 || r.exit_code == 3));
    ++runs;
  }
  std::printf("etcd replies fuzz: %d runs of ddprun\n", runs);
}
