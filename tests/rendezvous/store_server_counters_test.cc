// The server's counters and the wait on them (StoreServer::waitFor) that the store's tests use
// instead of polling: each counter as clients come, send part of a request and go, and a waiter
// woken by the change itself.
#include <catch2/catch.hpp>
#include <functional>
#include <future>
#include <memory>

#include "tests/rendezvous/store_test_util.h"

using namespace ddprun::rendezvous;
using namespace ddprun::rendezvous::testing;
using wire::Command;

namespace {

// A waitFor on a thread of its own, started once that thread has found `holds` false (it is then
// asleep, or about to sleep under the lock that a change's wake takes): only a wake at the
// change can end it before its 30 s bound, and the test gives it 10 s.
class Waiter {
 public:
  Waiter(const StoreServer& server, std::function<bool(const StoreServerCounters&)> holds) {
    auto looked = looked_.get_future();
    result_ = std::async(std::launch::async, [this, &server, holds = std::move(holds)] {
      return server.waitFor(
          [&](const StoreServerCounters& c) {
            const bool held = holds(c);
            if (!held && !looked_set_) {
              looked_set_ = true;
              looked_.set_value();
            }
            return held;
          },
          30s);
    });
    REQUIRE(looked.wait_for(10s) == std::future_status::ready);
  }
  // Whether it returned true within 10 s.
  bool woken() { return result_.wait_for(10s) == std::future_status::ready && result_.get(); }

 private:
  std::promise<void> looked_;
  bool looked_set_ = false;  // on the waiting thread only
  std::future<bool> result_;
};

}  // namespace

TEST_CASE("server counters: a waiter wakes when a client connects and when it leaves", "[server-counters]") {
  StoreServer server(localServerOptions());
  CHECK(server.counters().connections == 0);
  // Nothing changes: the wait says so once its bound passes (here at once).
  CHECK_FALSE(server.waitFor([](const auto& c) { return c.connections == 1; }, 0ms));
  // Waiting before the change: woken by the accept on the server's thread.
  Waiter connected(server, [](const auto& c) { return c.connections == 1; });
  auto client = std::make_unique<TcpStoreClient>(clientOptions(server.port()));
  CHECK(connected.woken());
  Waiter left(server, [](const auto& c) { return c.connections == 0; });
  client.reset();
  CHECK(left.woken());
}

TEST_CASE(
    "server counters: a request's bytes are held as they arrive and let go when it completes or its client leaves",
    "[server-counters]") {
  StoreServer server(localServerOptions());
  RawConnection raw(server.port());
  const std::string set = Frame(Command::kSet).str("/k").str(std::string(1000, 'v'));
  REQUIRE(raw.send(validateFrame() + set.substr(0, 600)));
  CHECK(server.waitFor([](const auto& c) { return c.incomplete_requests == 1 && c.incomplete_request_bytes == 600; },
                       10s));
  REQUIRE(raw.send(set.substr(600, 300)));
  CHECK(server.waitFor([](const auto& c) { return c.incomplete_request_bytes == 900; }, 10s));
  // The rest, and a PING whose answer says the SET before it was handled: nothing is held.
  REQUIRE(raw.send(set.substr(900) + std::string(Frame(Command::kPing).u32(7))));
  REQUIRE(raw.readValue<uint32_t>(10s) == 7u);
  CHECK(
      server.waitFor([](const auto& c) { return c.incomplete_requests == 0 && c.incomplete_request_bytes == 0; }, 10s));
  // Part of another request, then the client goes: what it held goes with it.
  REQUIRE(raw.send(set.substr(0, 10)));
  CHECK(server.waitFor([](const auto& c) { return c.incomplete_request_bytes == 10; }, 10s));
  raw.close();
  CHECK(server.waitFor(
      [](const auto& c) { return c.connections == 0 && c.incomplete_requests == 0 && c.incomplete_request_bytes == 0; },
      10s));
}
