// How the server reads: requests cut anywhere or packed many to a write are answered in
// order, and a request that arrives in two segments (torch's client sends the command
// byte on its own) is acknowledged by the reply rather than by a packet of its own.
#include <catch2/catch.hpp>
#include <thread>

#include "tests/rendezvous/store_test_util.h"
#include "tests/rendezvous/tcp_segment_counts.h"

using namespace ddprun::rendezvous;
using namespace ddprun::rendezvous::testing;
using wire::Command;

TEST_CASE("wire: many requests in one write are answered in order", "[wire]") {
  StoreServer server(localServerOptions());
  RawConnection raw(server.port());
  std::string batch = validateFrame();
  for (int i = 0; i < 200; ++i) {
    batch += Frame(Command::kSet).str("/k" + std::to_string(i)).str("v" + std::to_string(i));
    batch += Frame(Command::kAdd).str("/n").i64(i);
    batch += Frame(Command::kGet).str("/k" + std::to_string(i));
  }
  REQUIRE(raw.send(batch));
  int64_t total = 0;
  for (int i = 0; i < 200; ++i) {
    total += i;
    INFO("request group " << i);
    REQUIRE(raw.readValue<int64_t>() == total);
    REQUIRE(raw.readBytes() == "v" + std::to_string(i));
  }
  TcpStoreClient client(clientOptions(server.port()));
  CHECK(client.get("/n") == std::to_string(total));  // ADD keeps a decimal string
}

TEST_CASE("wire: a request that arrives one byte at a time is answered once, whole", "[wire]") {
  StoreServer server(localServerOptions());
  RawConnection raw(server.port());
  REQUIRE(raw.send(validateFrame()));
  const std::string value(300, 'q');
  const std::string set = Frame(Command::kSet).str("/slow").str(value);
  const std::string request = set + std::string(Frame(Command::kGet).str("/slow"));
  // Each byte is taken by the server before the next is sent: each arrives on its own. Taken,
  // the server holds the bytes of the request under way so far, and none once it is whole.
  for (size_t sent = 1; sent <= request.size(); ++sent) {
    REQUIRE(raw.send(request.substr(sent - 1, 1)));
    const size_t held = sent == set.size() || sent == request.size() ? 0 : sent < set.size() ? sent : sent - set.size();
    INFO("byte " << sent << " of " << request.size());
    REQUIRE(server.waitFor([&](const auto& c) { return c.incomplete_request_bytes == held; }, std::chrono::seconds(5)));
  }
  CHECK(raw.readBytes() == value);
  // Answered once: the next reply on the connection is a PING's, no second GET's before it.
  REQUIRE(raw.send(Frame(Command::kPing).u32(0x5eed)));
  CHECK(raw.readValue<uint32_t>() == 0x5eedu);
}

TEST_CASE("wire: a request sent as two segments is acknowledged by its reply, not by a packet of its own", "[wire]") {
  StoreServer server(localServerOptions());
  RawConnection raw(server.port());
  REQUIRE(raw.send(validateFrame()));
  REQUIRE(raw.send(Frame(Command::kSet).str("/k").str("value")));
  const std::string get = Frame(Command::kGet).str("/k");
  auto roundTrips = [&](int n) {
    for (int i = 0; i < n; ++i) {
      // TCP_NODELAY is on: each send leaves as its own segment, like torch's client.
      REQUIRE(raw.send(get.substr(0, 1)));
      REQUIRE(raw.send(get.substr(1)));
      REQUIRE(raw.readBytes() == "value");
    }
  };
  roundTrips(20);  // past Linux's quick-ack start of a connection
  const SegmentCounts before = segmentCounts(raw.fd());
  roundTrips(100);
  const SegmentCounts after = segmentCounts(raw.fd());
  const uint64_t replies = after.received_data - before.received_data;
  const uint64_t bare_acks = (after.received - before.received) - replies;
  INFO(replies << " reply segments and " << bare_acks << " bare acknowledgements for 100 requests");
  CHECK(replies == 100);
  // Reading a two-segment request off the socket makes Linux acknowledge it at once (one
  // bare ACK per request); the server must not. A few may still come from delayed-ACK
  // timers on a machine loaded enough to stall the server for tens of milliseconds.
  CHECK(bare_acks <= 10);
}
