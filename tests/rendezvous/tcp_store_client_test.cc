// Every store operation through TcpStoreClient against an in-process StoreServer, with
// torch's semantics: ADD keeps decimal strings, compare_set's rules, waits released by
// other clients, and a timed-out wait that leaves its client usable.
#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>

#include "common/unique_fd.h"
#include "tests/rendezvous/store_test_util.h"
#include "tests/support/manual_clock.h"
#include "tests/support/test_process.h"

using namespace ddprun::rendezvous;
using namespace ddprun::rendezvous::testing;
using ddprun::testing::ManualClock;

namespace {

using Keys = std::vector<std::string>;

long msSince(Clock::time_point start) {
  return static_cast<long>(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count());
}

// Runs `fn` on another thread once `clients` clients are blocked in a wait on `server` (so
// that what `fn` does comes while they wait), or after 10 s of not seeing them, to release
// them all the same. The destructor joins, and checks that they were seen.
class OnceWaiting {
 public:
  template <class Fn>
  OnceWaiting(const StoreServer& server, size_t clients, Fn fn)
      : thread_([this, &server, clients, fn = std::move(fn)]() mutable {
          seen_ = server.waitFor([&](const auto& c) { return c.waiting_clients >= clients; }, 10s);
          fn();
        }) {}
  ~OnceWaiting() {
    thread_.join();
    CHECK(seen_);
  }

 private:
  bool seen_ = false;  // written by thread_, read after joining it
  std::thread thread_;
};

// Runs `fn`, which must fail with StoreTimeout (not just any StoreError: callers retry
// on one and give up on the other) and a message that says so.
template <class Fn>
void expectTimesOut(Fn fn) {
  try {
    fn();
    FAIL("returned instead of timing out");
  } catch (const StoreTimeout& e) {
    CHECK_THAT(e.what(), Catch::Contains("timed out after"));
  } catch (const StoreError& e) {
    FAIL("a plain StoreError instead of StoreTimeout: " << e.what());
  }
}

}  // namespace

TEST_CASE("client: set and get round-trip any bytes", "[client]") {
  StoreServer server(localServerOptions());
  TcpStoreClient store(clientOptions(server.port()));
  store.set("a", "1");
  CHECK(store.get("a") == "1");
  store.set("a", "overwritten");
  CHECK(store.get("a") == "overwritten");
  const std::string binary("\0\x01\xff\n\r", 5);
  store.set("binary", binary);
  CHECK(store.get("binary") == binary);
  store.set("empty", "");
  CHECK(store.get("empty").empty());
  CHECK(store.check({"empty"}));  // an empty value still exists
  std::string big(3 * 1024 * 1024 + 17, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131 % 251);
  store.set("big", big);
  CHECK(store.get("big") == big);
  // Keys are bytes too.
  store.set(std::string("k\0ey", 4), "nul");
  CHECK(store.get(std::string("k\0ey", 4)) == "nul");
  CHECK_FALSE(store.check({"k"}));
}

TEST_CASE("client: another client sees a value at once", "[client]") {
  StoreServer server(localServerOptions());
  TcpStoreClient writer(clientOptions(server.port()));
  TcpStoreClient reader(clientOptions(server.port()));
  writer.set("shared", "from writer");
  CHECK(reader.get("shared") == "from writer");
}

TEST_CASE("client: get waits for a key that another client sets later", "[client]") {
  StoreServer server(localServerOptions());
  TcpStoreClient reader(clientOptions(server.port()));
  OnceWaiting writer(server, 1, [&] { TcpStoreClient(clientOptions(server.port())).set("late", "arrived"); });
  CHECK(reader.get("late") == "arrived");
}

TEST_CASE("client: add keeps a decimal string", "[client]") {
  StoreServer server(localServerOptions());
  TcpStoreClient store(clientOptions(server.port()));
  CHECK(store.add("n", 5) == 5);
  CHECK(store.get("n") == "5");
  CHECK(store.add("n", -7) == -2);
  CHECK(store.get("n") == "-2");
  CHECK(store.add("n", 0) == -2);
  // A value set as text counts too, as torch's stoll reads it.
  store.set("text", "40");
  CHECK(store.add("text", 2) == 42);
  CHECK(store.get("text") == "42");
  CHECK(store.add("big", int64_t{1} << 40) == int64_t{1} << 40);
  CHECK(store.get("big") == "1099511627776");
}

TEST_CASE("client: add to a non-numeric value fails, and the client recovers", "[client]") {
  StoreServer server(localServerOptions());
  TcpStoreClient store(clientOptions(server.port()));
  store.set("word", "hello");
  CHECK_THROWS_AS(store.add("word", 1), StoreError);
  CHECK(store.get("word") == "hello");  // unchanged; the client reconnected
  CHECK(store.add("other", 3) == 3);
}

TEST_CASE("client: compare_set follows torch's rules", "[client]") {
  StoreServer server(localServerOptions());
  TcpStoreClient store(clientOptions(server.port()));
  SECTION("missing key and empty expected: created") {
    CHECK(store.compareSet("k", "", "first") == "first");
    CHECK(store.get("k") == "first");
  }
  SECTION("missing key and non-empty expected: returns expected, creates nothing") {
    CHECK(store.compareSet("k", "guess", "new") == "guess");
    CHECK_FALSE(store.check({"k"}));
    CHECK(store.numKeys() == 0);
  }
  SECTION("match: swapped") {
    store.set("k", "old");
    CHECK(store.compareSet("k", "old", "new") == "new");
    CHECK(store.get("k") == "new");
  }
  SECTION("mismatch: returns the current value, unchanged") {
    store.set("k", "current");
    CHECK(store.compareSet("k", "stale", "new") == "current");
    CHECK(store.get("k") == "current");
  }
  SECTION("existing key and empty expected: no swap") {
    store.set("k", "taken");
    CHECK(store.compareSet("k", "", "mine") == "taken");
    CHECK(store.get("k") == "taken");
  }
}

TEST_CASE("client: check reports whether all keys exist", "[client]") {
  StoreServer server(localServerOptions());
  TcpStoreClient store(clientOptions(server.port()));
  CHECK_FALSE(store.check({"a"}));
  store.set("a", "1");
  CHECK(store.check({"a"}));
  CHECK_FALSE(store.check({"a", "b"}));
  store.set("b", "2");
  CHECK(store.check({"a", "b"}));
  CHECK(store.check({}));
}

TEST_CASE("client: wait returns when another client sets the keys", "[client]") {
  StoreServer server(localServerOptions());
  TcpStoreClient waiter(clientOptions(server.port()));
  TcpStoreClient setter(clientOptions(server.port()));
  SECTION("one key") {
    std::atomic<bool> setting{false};
    OnceWaiting later(server, 1, [&] {
      setting = true;
      setter.set("ready", "1");
    });
    waiter.wait({"ready"}, 10s);
    CHECK(setting);  // it returned for the SET, not before
    CHECK(waiter.check({"ready"}));
  }
  SECTION("all of several keys, not just the first") {
    std::atomic<bool> adding{false};
    std::atomic<bool> waiting_after_x{false};
    OnceWaiting later(server, 1, [&] {
      setter.set("x", "1");
      CHECK_NOTHROW(setter.check({"x"}));  // the SET is handled once this is answered
      waiting_after_x = server.waitingClients() == 1;
      adding = true;
      setter.add("y", 1);
    });
    waiter.wait({"x", "y"}, 10s);
    CHECK(waiting_after_x);
    CHECK(adding);
    CHECK(waiter.check({"x", "y"}));
  }
  SECTION("keys already there: at once") {
    setter.set("here", "1");
    auto start = Clock::now();
    waiter.wait({"here"}, 10s);
    waiter.wait({}, 10s);
    CHECK(msSince(start) < 1000);
  }
}

TEST_CASE("client: a wait that times out throws StoreTimeout and leaves the client usable", "[client][integration]") {
  StoreServer server(localServerOptions());
  TcpStoreClient waiter(clientOptions(server.port()));
  TcpStoreClient other(clientOptions(server.port()));
  auto start = Clock::now();
  expectTimesOut([&] { waiter.wait({"never"}, 300ms); });
  auto elapsed = msSince(start);
  CHECK(elapsed >= 280);
  CHECK(elapsed < 3000);
  // The wait was withdrawn: setting the key now must not leave a stray reply that the
  // next request would read as its answer.
  other.set("never", "now");
  CHECK(waiter.ping(0x1234abcd) == 0x1234abcd);
  CHECK(waiter.add("counter", 7) == 7);
  CHECK(waiter.get("never") == "now");
  CHECK(waiter.numKeys() == 2);
  // And it can wait again.
  OnceWaiting later(server, 1, [&] { other.set("second", "1"); });
  waiter.wait({"second"}, 10s);
  CHECK(waiter.check({"second"}));
  CHECK(server.connectionCount() == 2);  // the same connections all along
}

TEST_CASE("client: get of a key that never comes times out", "[client][integration]") {
  StoreServer server(localServerOptions());
  auto options = clientOptions(server.port());
  options.timeout = 300ms;
  TcpStoreClient store(options);
  auto start = Clock::now();
  expectTimesOut([&] { store.get("absent"); });
  CHECK(msSince(start) < 5000);
  store.set("present", "yes");
  CHECK(store.get("present") == "yes");
}

TEST_CASE("client: numKeys counts keys, not queues", "[client]") {
  StoreServer server(localServerOptions());
  TcpStoreClient store(clientOptions(server.port()));
  CHECK(store.numKeys() == 0);
  store.set("a", "1");
  store.add("b", 1);
  store.append("c", "x");
  CHECK(store.numKeys() == 3);
  store.set("a", "again");
  CHECK(store.numKeys() == 3);
  store.queuePush("q", "item");
  CHECK(store.numKeys() == 3);
  store.deleteKey("a");
  CHECK(store.numKeys() == 2);
}

TEST_CASE("client: deleteKey removes a key once", "[client]") {
  StoreServer server(localServerOptions());
  TcpStoreClient store(clientOptions(server.port()));
  store.set("d", "1");
  CHECK(store.deleteKey("d"));
  CHECK_FALSE(store.check({"d"}));
  CHECK_FALSE(store.deleteKey("d"));
  CHECK_FALSE(store.deleteKey("never-set"));
  // A deleted counter starts again from zero.
  store.add("n", 10);
  store.deleteKey("n");
  CHECK(store.add("n", 1) == 1);
}

TEST_CASE("client: append creates, then concatenates", "[client]") {
  StoreServer server(localServerOptions());
  TcpStoreClient store(clientOptions(server.port()));
  store.append("log", "a");
  CHECK(store.get("log") == "a");
  store.append("log", "bc");
  store.append("log", std::string("\0d", 2));
  CHECK(store.get("log") == std::string("abc\0d", 5));
}

TEST_CASE("client: multiSet and multiGet keep the order of keys", "[client]") {
  StoreServer server(localServerOptions());
  TcpStoreClient store(clientOptions(server.port()));
  store.multiSet({"m1", "m2", "m3"}, {"one", "", "three"});
  CHECK(store.multiGet({"m3", "m1", "m2"}) == Keys{"three", "one", ""});
  CHECK(store.get("m2").empty());
  CHECK(store.multiGet({}).empty());
  CHECK_THROWS_AS(store.multiSet({"a", "b"}, {"1"}), StoreError);
  SECTION("multiGet waits for keys set later") {
    TcpStoreClient setter(clientOptions(server.port()));
    OnceWaiting later(server, 1, [&] { setter.set("late", "L"); });
    CHECK(store.multiGet({"m1", "late"}) == Keys{"one", "L"});
  }
}

TEST_CASE("client: queues are FIFO and pop waits for a push", "[client]") {
  StoreServer server(localServerOptions());
  TcpStoreClient store(clientOptions(server.port()));
  CHECK(store.queueLength("q") == 0);
  store.queuePush("q", "first");
  store.queuePush("q", "second");
  store.queuePush("q", std::string("\0third", 6));
  CHECK(store.queueLength("q") == 3);
  CHECK(store.queuePop("q", 5s) == "first");
  CHECK(store.queuePop("q", 5s) == "second");
  CHECK(store.queuePop("q", 5s) == std::string("\0third", 6));
  CHECK(store.queueLength("q") == 0);
  CHECK_FALSE(store.check({"q"}));  // an empty queue does not count as a key

  SECTION("pop blocks until another thread pushes") {
    TcpStoreClient pusher(clientOptions(server.port()));
    std::atomic<bool> pushing{false};
    OnceWaiting later(server, 1, [&] {
      pushing = true;
      pusher.queuePush("jobs", "job-1");
    });
    CHECK(store.queuePop("jobs", 10s) == "job-1");
    CHECK(pushing);
    CHECK(store.queueLength("jobs") == 0);
  }
  SECTION("one push releases one of two poppers") {
    TcpStoreClient popper2(clientOptions(server.port()));
    TcpStoreClient pusher(clientOptions(server.port()));
    std::mutex popped_mutex;
    std::condition_variable popped_cv;
    int popped = 0;
    auto pop = [&](TcpStoreClient& client) {
      std::string value = client.queuePop("work", 10s);
      {
        std::lock_guard lock(popped_mutex);
        ++popped;
      }
      popped_cv.notify_all();
      return value;
    };
    auto a = std::async(std::launch::async, [&] { return pop(store); });
    auto b = std::async(std::launch::async, [&] { return pop(popper2); });
    REQUIRE(server.waitFor([&](const auto& c) { return c.waiting_clients == 2; }, 5s));
    pusher.queuePush("work", "only");
    {
      std::unique_lock lock(popped_mutex);
      REQUIRE(popped_cv.wait_for(lock, 3s, [&] { return popped > 0; }));
    }
    // Exactly one got it: once the server has served the push, the other still waits there.
    // Counted where the pop returned, not by its future: a thread that has popped is ready
    // only once its lambda returns, a moment later (a clean-clone run at load 4 saw neither).
    CHECK(server.waitFor([&](const auto& c) { return c.waiting_clients == 1; }, 5s));
    {
      std::lock_guard lock(popped_mutex);
      CHECK(popped == 1);
    }
    pusher.queuePush("work", "second");
    std::vector<std::string> got{a.get(), b.get()};
    std::sort(got.begin(), got.end());
    CHECK(got == Keys{"only", "second"});
  }
  SECTION("queues and keys of the same name are separate") {
    store.set("both", "key-value");
    store.queuePush("both", "queued");
    CHECK(store.get("both") == "key-value");
    CHECK(store.queuePop("both", 5s) == "queued");
    CHECK(store.get("both") == "key-value");
  }
}

// The client's timeouts of a wait are its socket's deadlines, real time on a real socket: the
// cases that wait one out are integration tests (docs/testing.md), not unit ones.
TEST_CASE("client: pop on an empty queue times out and the client stays usable", "[client][integration]") {
  StoreServer server(localServerOptions());
  TcpStoreClient store(clientOptions(server.port()));
  auto start = Clock::now();
  expectTimesOut([&] { store.queuePop("empty", 300ms); });
  CHECK(msSince(start) < 3000);
  store.queuePush("empty", "now");
  CHECK(store.queuePop("empty", 5s) == "now");
}

TEST_CASE("client: listKeys lists every key, not queues", "[client]") {
  StoreServer server(localServerOptions());
  TcpStoreClient store(clientOptions(server.port()));
  CHECK(store.listKeys().empty());
  store.set("b", "1");
  store.add("a", 1);
  store.set("c/d", "2");
  store.queuePush("q", "x");
  auto keys = store.listKeys();
  std::sort(keys.begin(), keys.end());
  CHECK(keys == Keys{"a", "b", "c/d"});
  store.deleteKey("b");
  keys = store.listKeys();
  std::sort(keys.begin(), keys.end());
  CHECK(keys == Keys{"a", "c/d"});
}

TEST_CASE("client: ping echoes the nonce", "[client]") {
  StoreServer server(localServerOptions());
  TcpStoreClient store(clientOptions(server.port()));
  CHECK(store.ping(0) == 0);
  CHECK(store.ping(42) == 42);
  CHECK(store.ping(0xffffffffu) == 0xffffffffu);
}

TEST_CASE("client: PrefixStore keeps each job's keys apart", "[client]") {
  StoreServer server(localServerOptions());
  TcpStoreClient inner(clientOptions(server.port()));
  PrefixStore job1("rdzv/job1/", inner);
  PrefixStore job2("rdzv/job2/", inner);
  job1.set("rank0", "a");
  job2.set("rank0", "b");
  CHECK(job1.get("rank0") == "a");
  CHECK(job2.get("rank0") == "b");
  CHECK(inner.get("rdzv/job1/rank0") == "a");
  CHECK(job1.add("count", 2) == 2);
  CHECK(job2.check({"rank0"}));
  CHECK_FALSE(job2.check({"count"}));
  auto keys = job1.listKeys();
  std::sort(keys.begin(), keys.end());
  CHECK(keys == Keys{"count", "rank0"});
}

TEST_CASE("client: connecting to a port with no server fails within connect_timeout", "[client]") {
  int port = 0;
  {
    StoreServer gone(localServerOptions());
    port = gone.port();
  }
  auto options = clientOptions(port);
  options.connect_timeout = 500ms;
  // The tries and the back-off between them run on the client's clock: the test moves it on
  // through each back-off until the client gives up.
  ManualClock clock;
  const auto start = clock.now();
  auto client = std::async(std::launch::async, [&] { TcpStoreClient store(options, clock); });
  for (int moves = 0; client.wait_for(0s) != std::future_status::ready && moves < 1000; ++moves) {
    if (clock.awaitSleepers(1, 100ms)) clock.advanceToNextDeadline();
  }
  REQUIRE(client.wait_for(30s) == std::future_status::ready);
  CHECK_THROWS_WITH(client.get(), Catch::Contains("cannot reach 127.0.0.1:" + std::to_string(port) +
                                                  " within 500 ms: Connection refused"));
  // It gave up once its next back-off would have passed connect_timeout, not before.
  CHECK(clock.now() - start < 500ms);
  CHECK(clock.now() - start >= 250ms);
}

// Issue 44 (noticed): something that accepts and never answers held the rendezvous' first
// call for read_timeout (60 s) whatever join_timeout said.
TEST_CASE("client: with first_answer_timeout a listener that never answers fails the constructor then",
          "[client][integration]") {
  // Listening, never accepting: the kernel completes the connection, nothing ever answers.
  ddprun::UniqueFd silent(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(silent.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(::listen(silent.get(), 4) == 0);
  socklen_t len = sizeof addr;
  ::getsockname(silent.get(), reinterpret_cast<sockaddr*>(&addr), &len);
  const int port = ntohs(addr.sin_port);
  for (const std::string token : {"", "job-token"}) {
    INFO("token '" << token << "'");
    auto options = clientOptions(port, token);
    options.first_answer_timeout = 300ms;
    const auto start = Clock::now();
    try {
      TcpStoreClient store(options);
      FAIL("connected to a listener that never answers");
    } catch (const StoreTimeout& e) {
      CHECK_THAT(e.what(), Catch::Contains("127.0.0.1:" + std::to_string(port)) &&
                               Catch::Contains("did not answer within 300 ms"));
    }
    CHECK(msSince(start) < 5000);  // not options.timeout (10 s)
  }
  // A store answers, with a token or without.
  for (const std::string token : {"", "job-token"}) {
    auto server_options = localServerOptions();
    server_options.token = token;
    StoreServer server(server_options);
    auto options = clientOptions(server.port(), token);
    options.first_answer_timeout = 300ms;
    TcpStoreClient store(options);
    store.set("a", "1");
    CHECK(store.get("a") == "1");
  }
}

TEST_CASE("client: a client retries until a late server comes up", "[client]") {
  // Reserve a port by starting and stopping a server, then start it again a little later.
  int port = 0;
  {
    StoreServer probe(localServerOptions());
    port = probe.port();
  }
  auto options = clientOptions(port);
  options.connect_timeout = 10s;
  // The client's back-off between tries runs on its clock: each refused try shows as the
  // client waiting on it, for twice as long as the one before.
  ManualClock clock;
  auto client = std::async(std::launch::async, [&] { return std::make_unique<TcpStoreClient>(options, clock); });
  auto backingOff = [&](std::chrono::milliseconds backoff) {
    return clock.awaitSleepers(1, [&] { return clock.nextDeadline() == clock.now() + backoff; });
  };
  for (auto backoff : {10ms, 20ms, 40ms}) {
    REQUIRE(backingOff(backoff));
    clock.advanceToNextDeadline();
  }
  REQUIRE(backingOff(80ms));
  // The server comes up while the client waits for its next try.
  auto server_options = localServerOptions();
  server_options.port = port;
  StoreServer server(server_options);
  clock.advanceToNextDeadline();
  REQUIRE(client.wait_for(30s) == std::future_status::ready);
  auto store = client.get();
  store->set("up", "yes");
  CHECK(store->get("up") == "yes");
}

TEST_CASE("client: interrupt releases a blocked wait at once", "[client]") {
  StoreServer server(localServerOptions());
  TcpStoreClient waiter(clientOptions(server.port()));
  auto blocked = std::async(std::launch::async, [&] { waiter.wait({"never"}, 20s); });
  REQUIRE(server.waitFor([&](const auto& c) { return c.waiting_clients == 1; }, 5s));
  auto start = Clock::now();
  waiter.interrupt();
  REQUIRE(blocked.wait_for(5s) == std::future_status::ready);
  CHECK_THROWS_AS(blocked.get(), StoreError);
  CHECK(msSince(start) < 2000);
  CHECK_THROWS_AS(waiter.set("after", "1"), StoreError);
  // The server forgets the interrupted client.
  CHECK(server.waitFor([&](const auto& c) { return c.connections == 0; }, 5s));
}

// Regression: run() used to rethrow the StoreTimeout of a wait as a plain StoreError.
TEST_CASE("client: every wait-based call that times out throws StoreTimeout", "[client][integration]") {
  StoreServer server(localServerOptions());
  auto options = clientOptions(server.port());
  options.timeout = 300ms;
  TcpStoreClient store(options);
  expectTimesOut([&] { store.wait({"never"}, 300ms); });
  expectTimesOut([&] { store.get("never"); });
  expectTimesOut([&] { store.multiGet({"here", "never"}); });
  expectTimesOut([&] { store.queuePop("never", 300ms); });
  CHECK(store.ping(1) == 1);
  CHECK(server.connectionCount() == 1);  // no reconnects: each wait was withdrawn
}
