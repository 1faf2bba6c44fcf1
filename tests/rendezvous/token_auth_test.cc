// The store's shared token: the right token is let in, a wrong or missing one is kept
// out before any command runs, torch 1.13 frames (which cannot authenticate) are
// refused, and a client with a token will not talk to a store that does not know it.
#include "rendezvous/store/token_auth.h"

#include <catch2/catch.hpp>
#include <fstream>
#include <memory>
#include <vector>

#include "tests/rendezvous/store_test_util.h"
#include "tests/support/test_process.h"

using namespace ddprun::rendezvous;
using namespace ddprun::rendezvous::testing;
using ddprun::testing::TempDir;
using ddprun::testing::TestProcess;
using wire::Command;
using wire::LegacyCommand;

namespace {

const std::string kToken = "s3cret";

StoreServerOptions tokenServerOptions(const std::string& token = kToken) {
  auto options = localServerOptions();
  options.token = token;
  return options;
}

// A raw connection that has done VALIDATE and AUTH_HELLO; holds the nonces it saw.
struct Hello {
  explicit Hello(int port, const std::string& client_nonce = randomNonce()) : raw(port), client_nonce(client_nonce) {
    REQUIRE(raw.send(validateFrame() + std::string(Frame(Command::kAuthHello).bytes(client_nonce))));
    auto nonce = raw.read(wire::kAuthNonceBytes);
    auto proof = raw.read(wire::kAuthMacBytes);
    REQUIRE(nonce.has_value());
    REQUIRE(proof.has_value());
    server_nonce = *nonce;
    server_proof = *proof;
  }
  RawConnection raw;
  std::string client_nonce;
  std::string server_nonce;
  std::string server_proof;
};

int parsePort(const std::string& out) {
  auto at = out.find("listening on ");
  if (at == std::string::npos) return 0;
  return std::stoi(out.substr(at + 13));
}

}  // namespace

TEST_CASE("token: a client with the store's token works", "[token]") {
  StoreServer server(tokenServerOptions());
  TcpStoreClient store(clientOptions(server.port(), kToken));
  store.set("k", "v");
  CHECK(store.get("k") == "v");
  CHECK(store.add("n", 2) == 2);
  TcpStoreClient other(clientOptions(server.port(), kToken));
  CHECK(other.get("k") == "v");
  CHECK(other.numKeys() == 2);
}

TEST_CASE("token: a client with a wrong token fails at construction", "[token]") {
  StoreServer server(tokenServerOptions());
  for (const std::string wrong : {"s3creT", "s3cret ", "x"}) {
    INFO("token '" << wrong << "'");
    try {
      TcpStoreClient store(clientOptions(server.port(), wrong));
      FAIL("a client with a wrong token connected");
    } catch (const StoreError& e) {
      CHECK_THAT(e.what(), Catch::Contains("token"));
    }
  }
  CHECK(server.waitFor([&](const auto& c) { return c.connections == 0; }, 5s));
}

TEST_CASE("token: a client without the token cannot run commands", "[token]") {
  StoreServer server(tokenServerOptions());
  TcpStoreClient member(clientOptions(server.port(), kToken));
  member.set("secret/value", "42");
  auto options = clientOptions(server.port());  // no token
  options.timeout = 3s;
  TcpStoreClient outsider(options);
  CHECK_THROWS_AS(outsider.numKeys(), StoreError);
  CHECK_THROWS_AS(outsider.get("secret/value"), StoreError);
  CHECK_THROWS_AS(outsider.add("secret/value", 1), StoreError);
  CHECK_THROWS_AS(outsider.compareSet("secret/value", "42", "hijacked"), StoreError);
  try {
    outsider.set("intruder", "x");  // fire-and-forget: may not notice, but must not land
  } catch (const StoreError&) {
  }
  CHECK_THROWS_AS(outsider.ping(1), StoreError);
  CHECK(member.get("secret/value") == "42");
  CHECK_FALSE(member.check({"intruder"}));
  CHECK(member.numKeys() == 1);
  CHECK(server.waitFor([&](const auto& c) { return c.connections == 1; }, 5s));
}

TEST_CASE("token: raw frames without the handshake are refused", "[token]") {
  StoreServer server(tokenServerOptions());
  TcpStoreClient member(clientOptions(server.port(), kToken));
  SECTION("a torch 1.13 frame") {
    RawConnection raw(server.port());
    REQUIRE(raw.send(Frame(LegacyCommand::kSet).str("/legacy").str("x")));
    CHECK(raw.closedByPeerWithin(3s));
    RawConnection torch_join(server.port());  // what torch 1.13 sends first
    REQUIRE(torch_join.send(Frame(LegacyCommand::kAdd).str("init/").i64(1)));
    CHECK_FALSE(torch_join.readValue<int64_t>(3s).has_value());
    CHECK_FALSE(member.check({"/legacy"}));
    CHECK_FALSE(member.check({"init/"}));
  }
  SECTION("a current frame after VALIDATE only") {
    RawConnection raw(server.port());
    REQUIRE(raw.send(validateFrame() + std::string(Frame(Command::kSet).str("/current").str("x")) +
                     std::string(Frame(Command::kPing).u32(1))));
    CHECK_FALSE(raw.readValue<uint32_t>(3s).has_value());
    CHECK_FALSE(member.check({"/current"}));
  }
  SECTION("a command between AUTH_HELLO and AUTH_PROOF") {
    Hello hello(server.port());
    REQUIRE(hello.raw.send(Frame(Command::kGetNumKeys)));
    CHECK_FALSE(hello.raw.readValue<int64_t>(3s).has_value());
  }
  SECTION("a SET announcing 64 MiB before the handshake is refused at once, not awaited") {
    RawConnection raw(server.port());
    REQUIRE(raw.send(validateFrame() + std::string(Frame(Command::kSet).str("/big").u64(64u << 20)) +
                     std::string(100, 'v')));
    CHECK(raw.closedByPeerWithin(3s));
  }
  SECTION("AUTH_PROOF before AUTH_HELLO") {
    RawConnection raw(server.port());
    REQUIRE(raw.send(validateFrame() + std::string(Frame(Command::kAuthProof).bytes(std::string(32, 'p')))));
    CHECK(raw.closedByPeerWithin(3s));
  }
  SECTION("a wrong proof") {
    Hello hello(server.port());
    REQUIRE(hello.raw.send(Frame(Command::kAuthProof).bytes(std::string(wire::kAuthMacBytes, '\0'))));
    CHECK(hello.raw.closedByPeerWithin(3s));
  }
  CHECK(member.ping(7) == 7);
  CHECK(server.waitFor([&](const auto& c) { return c.connections == 1; }, 5s));
}

TEST_CASE("token: the handshake proves both sides and cannot be replayed", "[token]") {
  StoreServer server(tokenServerOptions());
  Hello first(server.port());
  // The server proved it knows the token, bound to this connection's nonces.
  CHECK(first.server_proof == serverProof(kToken, first.client_nonce, first.server_nonce));
  CHECK(first.server_proof != serverProof("other", first.client_nonce, first.server_nonce));
  const std::string proof = clientProof(kToken, first.client_nonce, first.server_nonce);
  REQUIRE(first.raw.send(Frame(Command::kAuthProof).bytes(proof)));
  CHECK(first.raw.readValue<uint8_t>() == 1);
  REQUIRE(first.raw.send(Frame(Command::kAdd).str("/hand").i64(5)));
  CHECK(first.raw.readValue<int64_t>() == 5);

  // Same client nonce again: the server picks a fresh nonce, so the old proof is worthless.
  Hello second(server.port(), first.client_nonce);
  CHECK(second.server_nonce != first.server_nonce);
  REQUIRE(second.raw.send(Frame(Command::kAuthProof).bytes(proof)));
  CHECK(second.raw.closedByPeerWithin(3s));
  // The server's proof is not accepted as the client's (the labels differ).
  Hello third(server.port());
  REQUIRE(third.raw.send(Frame(Command::kAuthProof).bytes(third.server_proof)));
  CHECK(third.raw.closedByPeerWithin(3s));
}

TEST_CASE("token: a client with a token refuses a store without one", "[token]") {
  StoreServer open_server(localServerOptions());
  try {
    TcpStoreClient store(clientOptions(open_server.port(), kToken));
    FAIL("connected to a store that does not know the token");
  } catch (const StoreError& e) {
    CHECK_THAT(e.what(), Catch::Contains("does not know this job's token"));
  }
  // A store with a different token is refused the same way.
  StoreServer other_job(tokenServerOptions("another-job"));
  try {
    TcpStoreClient store(clientOptions(other_job.port(), kToken));
    FAIL("connected to another job's store");
  } catch (const StoreError& e) {
    CHECK_THAT(e.what(), Catch::Contains("does not know this job's token"));
  }
}

TEST_CASE("token: ddprun_store_server reads the token from --token-file or DDPRUN_TOKEN", "[token][binary]") {
  TempDir dir;
  const std::string server_bin = ddprun::testing::binDir() + "/ddprun_store_server";
  SECTION("--token-file") {
    std::ofstream(dir.file("token")) << kToken << "\nsecond line ignored\n";
    TestProcess server({server_bin, "--host", "127.0.0.1", "--port", "0", "--token-file", dir.file("token")},
                       {{"DDPRUN_TOKEN", ""}});
    REQUIRE(server.waitForOutput("listening on ", 10s));
    int port = parsePort(server.out());
    REQUIRE(port > 0);
    TcpStoreClient member(clientOptions(port, kToken));
    member.set("k", "v");
    CHECK(member.get("k") == "v");
    CHECK_THROWS_AS(TcpStoreClient(clientOptions(port, "wrong")), StoreError);
    auto options = clientOptions(port);
    options.timeout = 3s;
    TcpStoreClient outsider(options);
    CHECK_THROWS_AS(outsider.numKeys(), StoreError);
  }
  SECTION("DDPRUN_TOKEN wins over the file") {
    std::ofstream(dir.file("token")) << "from-file\n";
    TestProcess server({server_bin, "--host", "127.0.0.1", "--port", "0", "--token-file", dir.file("token")},
                       {{"DDPRUN_TOKEN", "from-env"}});
    REQUIRE(server.waitForOutput("listening on ", 10s));
    int port = parsePort(server.out());
    REQUIRE(port > 0);
    TcpStoreClient member(clientOptions(port, "from-env"));
    CHECK(member.ping(3) == 3);
    CHECK_THROWS_AS(TcpStoreClient(clientOptions(port, "from-file")), StoreError);
  }
  SECTION("an empty or missing token file is a usage error") {
    std::ofstream(dir.file("empty")) << "";
    auto r = ddprun::testing::run({server_bin, "--port", "0", "--token-file", dir.file("empty")},
                                  {{"DDPRUN_TOKEN", ""}}, 10s);
    REQUIRE(r.finished);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.err, Catch::Contains("empty"));
    r = ddprun::testing::run({server_bin, "--port", "0", "--token-file", dir.file("absent")}, {{"DDPRUN_TOKEN", ""}},
                             10s);
    REQUIRE(r.finished);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.err, Catch::Contains("cannot read"));
  }
}

// Issue 21 #7: out of descriptors, a store with a token closes the unauthenticated
// connection silent the longest so that a member can still get in. ddprun_store_server runs
// under `ulimit -n 32`; 40 strangers connect (half send VALIDATE, half nothing) and stay,
// which before this fix kept every later client in the listen backlog for good.
TEST_CASE("token: out of descriptors the longest-idle strangers make room for a member", "[token][binary]") {
  TempDir dir;
  std::ofstream(dir.file("token")) << kToken << "\n";
  const std::string server_bin = ddprun::testing::binDir() + "/ddprun_store_server";
  TestProcess server({"/bin/sh", "-c", "ulimit -n 32 && exec \"$0\" \"$@\"", server_bin, "--host", "127.0.0.1",
                      "--port", "0", "--token-file", dir.file("token")},
                     {{"DDPRUN_TOKEN", ""}});
  REQUIRE(server.waitForOutput("listening on ", 10s));
  const int port = parsePort(server.out());
  REQUIRE(port > 0);
  std::vector<std::unique_ptr<RawConnection>> strangers;
  for (int i = 0; i < 40; ++i) {
    strangers.push_back(std::make_unique<RawConnection>(port));  // completes in the backlog if not accepted
    if (i % 2) REQUIRE(strangers.back()->send(validateFrame()));
  }
  // The server has run out: it says so once, at the first failure.
  REQUIRE(server.waitForOutput("accept failed", 10s));
  // A member behind the strangers in the backlog gets in once strangers have been silent a
  // second (the client's own timeouts, 5 s to connect and 10 s per call, bound the wait).
  try {
    TcpStoreClient member(clientOptions(port, kToken));
    member.set("k", "v");
    CHECK(member.get("k") == "v");
    CHECK(member.add("n", 5) == 5);
  } catch (const StoreError& e) {
    FAIL("a member could not use the store: " << e.what());
  }
  CHECK(server.waitForOutput("closed the longest-idle unauthenticated connection", 5s));
  INFO("server log: " << server.err());
  CHECK(ddprun::testing::processAlive(server.pid()));
}
