#include "agent/ops/health_server.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <vector>

#include <catch2/catch.hpp>

#include "common/error.h"
#include "common/socket_io.h"
#include "tests/e2e/ops_support.h"

using ddprun::agent::HealthServer;
using ddprun::testing::ops::httpGet;
using ddprun::testing::ops::httpRequest;

TEST_CASE("the health server answers with the state it was last given", "[health]") {
  HealthServer server("127.0.0.1", 0);
  REQUIRE(server.port() > 0);
  server.update(true, "{\"state\":\"running\"}");
  std::string ok = httpGet(server.port());
  CHECK(ok.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
  CHECK_THAT(ok, Catch::Contains("Content-Length: 20\r\n"));
  CHECK_THAT(ok, Catch::EndsWith("\r\n\r\n{\"state\":\"running\"}\n"));
  server.update(false, "{\"state\":\"cooldown\"}");
  std::string down = httpGet(server.port(), "/healthz?verbose=1");
  CHECK(down.rfind("HTTP/1.1 503 Service Unavailable\r\n", 0) == 0);
  CHECK_THAT(down, Catch::Contains("cooldown"));
  std::string head = httpRequest(server.port(), "HEAD / HTTP/1.0\r\n\r\n");
  CHECK(head.rfind("HTTP/1.1 503", 0) == 0);
  CHECK_THAT(head, Catch::EndsWith("\r\n\r\n"));
  CHECK(httpRequest(server.port(), "DELETE / HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 405", 0) == 0);
  CHECK(httpGet(server.port(), "/metrics").rfind("HTTP/1.1 404", 0) == 0);
  // A request head larger than the limit is cut off without an answer.
  CHECK(httpRequest(server.port(), "GET /" + std::string(20000, 'a')).empty());
  CHECK(httpGet(server.port()).rfind("HTTP/1.1 503", 0) == 0);
}

TEST_CASE("a bad address or a taken port is a usage error", "[health]") {
  CHECK_THROWS_AS(HealthServer("not-an-address", 0), ddprun::UsageError);
  HealthServer first("127.0.0.1", 0);
  CHECK_THROWS_WITH(HealthServer("127.0.0.1", first.port()), Catch::Contains("cannot listen"));
}

namespace {

// A TCP connection to 127.0.0.1:port that sends nothing (a stalled or hostile client).
// Throws SocketError when none is made within 30 s (a SYN dropped on a full backlog is
// sent again after 1 s, 3 s, ...).
ddprun::UniqueFd idleConnection(int port) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  return ddprun::connectTcp("127.0.0.1", std::to_string(port), deadline);
}

// Segments (SYNs included) the kernel sent again on these connections.
uint32_t retransmissions(const std::vector<ddprun::UniqueFd>& connections) {
  uint32_t total = 0;
  for (const auto& fd : connections) {
    tcp_info info{};
    socklen_t len = sizeof info;
    REQUIRE(::getsockopt(fd.get(), IPPROTO_TCP, TCP_INFO, &info, &len) == 0);
    total += info.tcpi_total_retrans;
  }
  return total;
}

}  // namespace

TEST_CASE("idle connections do not delay a probe, past the connection cap too", "[health]") {
  HealthServer server("127.0.0.1", 0);
  server.update(true, "{\"state\":\"running\"}");
  for (int count : {10, 200}) {
    INFO(count << " idle connections");
    std::vector<ddprun::UniqueFd> idle;
    for (int i = 0; i < count; ++i) idle.push_back(idleConnection(server.port()));
    // None of them waited for a SYN retransmission: the server's backlog took the burst (with
    // a backlog of 16, a burst of 200 lost SYNs and took 11 s to connect).
    CHECK(retransmissions(idle) == 0);
    // Served one at a time, each idle connection held the next probe for up to 2 s: the
    // probe (5 s to answer) went unanswered.
    CHECK(httpGet(server.port()).rfind("HTTP/1.1 200 OK", 0) == 0);
    idle.clear();
  }
}
