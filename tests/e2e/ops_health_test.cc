// The health-check endpoint (--health_check_port): 200 with the agent's state as JSON
// while the job runs, 503 while the node sits out a cooldown, 404/405 for anything but
// GET of its path, and nothing listening once ddprun has exited.
#include <csignal>
#include <fstream>

#include <catch2/catch.hpp>

#include "tests/e2e/ops_support.h"

using namespace ddprun::testing;
using namespace ddprun::testing::ops;

namespace {

std::string body(const std::string& response) {
  auto at = response.find("\r\n\r\n");
  return at == std::string::npos ? "" : response.substr(at + 4);
}

}  // namespace

TEST_CASE("the health check answers 200 with the agent's state while the job runs", "[e2e][ops]") {
  TempDir dir;
  TestProcess ddprun({ddprunPath(), "--standalone", "--nproc_per_node=2", "--health_check_port=0",
                      "--health_check_addr=127.0.0.1", "--no_python", testWorkerPath(), "wait", dir.path()});
  const int port = healthPort(ddprun);
  REQUIRE(port > 0);
  REQUIRE(ddprun.waitForOutput("ready rank=", 20s, 2));
  std::string ok;
  REQUIRE(eventually(
      [&] {
        ok = httpGet(port);
        return ok.find("\"state\":\"running\"") != std::string::npos;
      },
      10s));
  INFO(ok);
  CHECK(ok.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
  CHECK_THAT(ok, Catch::Contains("Content-Type: application/json"));
  const std::string json = body(ok);
  CHECK_THAT(json, Catch::Contains("\"status\":\"ok\""));
  CHECK_THAT(json, Catch::Contains("\"world_size\":2"));
  CHECK_THAT(json, Catch::Contains("\"restart_count\":0"));
  CHECK(countOf(json, "\"running\":true") == 2);
  TempDir check_dir;
  std::ofstream(check_dir.file("body.json")) << json;
  CHECK(checkWithPython(check_dir.file("body.json"),
                        "import json,sys; d=json.load(open(sys.argv[1])); "
                        "assert len(d['workers']) == 2 and d['round'] == 0, d")
            .exit_code == 0);

  CHECK(httpGet(port, "/health").rfind("HTTP/1.1 200 OK", 0) == 0);
  CHECK(httpGet(port, "/nope").rfind("HTTP/1.1 404", 0) == 0);
  CHECK(httpRequest(port, "POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n").rfind("HTTP/1.1 405", 0) == 0);
  // A client that connects and says nothing does not block the next probe for long.
  std::string silent_then_probe = httpRequest(port, "", 100ms);
  CHECK(silent_then_probe.empty());
  CHECK(httpGet(port).rfind("HTTP/1.1 200 OK", 0) == 0);

  ddprun.signal(SIGTERM);
  REQUIRE(ddprun.wait(20s));
  CHECK(ddprun.exitCode() == 128 + SIGTERM);
  CHECK(httpGet(port).empty());  // nothing listens any more
}

TEST_CASE("the health check answers 503 while the node sits out a cooldown", "[e2e][ops]") {
  TestProcess ddprun({ddprunPath(), "--standalone", "--nproc_per_node=1", "--max_restarts=5", "--node_cooldown=30",
                      "--health_check_port=0", "--health_check_addr=127.0.0.1", "--no_python", "sh", "-c", "exit 4"});
  const int port = healthPort(ddprun);
  REQUIRE(port > 0);
  REQUIRE(ddprun.waitForOutput("sits out of the job for 30.0 s", 20s));
  std::string unavailable;
  CHECK(eventually(
      [&] {
        unavailable = httpGet(port);
        return unavailable.rfind("HTTP/1.1 503", 0) == 0 && unavailable.find("cooldown") != std::string::npos;
      },
      10s));
  INFO(unavailable);
  CHECK_THAT(unavailable, Catch::Contains("\"state\":\"cooldown\""));
  CHECK_THAT(unavailable, Catch::Contains("\"consecutive_failures\":2"));
  CHECK_THAT(unavailable, Catch::Contains("\"cooldown_until\":"));
  // A signal during the cooldown ends ddprun at once.
  ddprun.signal(SIGTERM);
  REQUIRE(ddprun.wait(10s));
  CHECK(ddprun.exitCode() == 128 + SIGTERM);
}

TEST_CASE("a health check port that is taken is a clear error", "[e2e][ops]") {
  TestProcess first({ddprunPath(), "--standalone", "--health_check_port=0", "--health_check_addr=127.0.0.1",
                     "--no_python", "sleep", "30"});
  const int port = healthPort(first);
  REQUIRE(port > 0);
  REQUIRE(eventually([&] { return !httpGet(port).empty(); }, 10s));
  auto second = run({ddprunPath(), "--standalone", "--health_check_port=" + std::to_string(port),
                     "--health_check_addr=127.0.0.1", "--no_python", "true"},
                    {}, 30s);
  CHECK(second.exit_code == 2);
  CHECK_THAT(second.err, Catch::Contains("--health_check_port " + std::to_string(port)));
  first.signal(SIGTERM);
  CHECK(first.wait(20s));
}
