// Where an RPC worker finds its store and its peers: the store from the options or
// MASTER_ADDR/MASTER_PORT, the round from TORCHELASTIC_RESTART_COUNT (both checked, a bad
// value named in one line), and the address entries workers publish, whose port must be a
// real one.
#include "worker_runtime/rpc/rpc_environment.h"

#include <catch2/catch.hpp>
#include <string>
#include <utility>

#include "common/error.h"
#include "tests/support/scoped_env.h"

using ddprun::DdprunError;
using ddprun::UsageError;
using ddprun::rpc::detail::PeerAddress;
using ddprun::rpc::detail::RpcEnvironment;
using ddprun::testing::ScopedEnv;

namespace {

std::string parseErrorOf(const std::string& entry) {
  try {
    PeerAddress::parse(3, entry);
  } catch (const DdprunError& e) {
    return e.what();
  }
  return "(accepted)";
}

}  // namespace

TEST_CASE("a published address entry parses back to the name host and port", "[rpc][unit]") {
  const PeerAddress published{"worker3", "10.0.0.7", 41234};
  const PeerAddress parsed = PeerAddress::parse(3, published.entry());
  CHECK(parsed.name == "worker3");
  CHECK(parsed.host == "10.0.0.7");
  CHECK(parsed.port == 41234);
  CHECK(PeerAddress::parse(0, "w\n::1\n65535").port == 65535);
  CHECK(PeerAddress::parse(0, "w\n127.0.0.1\n1").port == 1);
}

// Before the port was validated, 70000 became 4464 (atoi, then a 16-bit cast) and the
// worker connected to whatever listens there.
TEST_CASE("an address entry whose port is not 1 to 65535 is refused naming the rank", "[rpc][unit]") {
  for (const char* port : {"70000", "65536", "0", "-1", "", "x", "80x", " 80", "4294967297", "99999999999999999999"}) {
    INFO("port '" << port << "'");
    const std::string error = parseErrorOf(std::string("w\n127.0.0.1\n") + port);
    CHECK_THAT(error, Catch::StartsWith("init_rpc: malformed address entry for rank 3"));
  }
}

TEST_CASE("an address entry without name host and port lines is refused", "[rpc][unit]") {
  CHECK(parseErrorOf("w") == "init_rpc: malformed address entry for rank 3");
  CHECK(parseErrorOf("w\n127.0.0.1") == "init_rpc: malformed address entry for rank 3");
}

TEST_CASE("the store comes from the options before MASTER_ADDR and MASTER_PORT", "[rpc][unit]") {
  ScopedEnv addr("MASTER_ADDR", "10.1.1.1");
  ScopedEnv port("MASTER_PORT", "29500");
  ScopedEnv round("TORCHELASTIC_RESTART_COUNT", "2");
  auto env = RpcEnvironment::fromEnvironment("127.0.0.1", 4000);
  CHECK(env.store_host == "127.0.0.1");
  CHECK(env.store_port == 4000);
  CHECK(env.restart_count == 2);

  env = RpcEnvironment::fromEnvironment("", 0);
  CHECK(env.store_host == "10.1.1.1");
  CHECK(env.store_port == 29500);
}

TEST_CASE("without a store in the options MASTER_ADDR and MASTER_PORT are required", "[rpc][unit]") {
  ScopedEnv addr("MASTER_ADDR", "10.1.1.1");
  ScopedEnv port("MASTER_PORT", std::nullopt);
  CHECK_THROWS_WITH(RpcEnvironment::fromEnvironment("", 0),
                    "init_rpc: MASTER_ADDR and MASTER_PORT must be set (start with ddprun)");
  // Empty counts as unset (it was port 0 before).
  ScopedEnv empty_port("MASTER_PORT", "");
  CHECK_THROWS_WITH(RpcEnvironment::fromEnvironment("", 0),
                    "init_rpc: MASTER_ADDR and MASTER_PORT must be set (start with ddprun)");
}

// Before, MASTER_PORT went through atoi: "abc" became port 0 and 70000 wrapped to 4464,
// so the worker waited out init_timeout on a store that is not there, or met another.
TEST_CASE("a MASTER_PORT that is not a port is refused naming it", "[rpc][unit]") {
  ScopedEnv addr("MASTER_ADDR", "10.1.1.1");
  const std::pair<const char*, const char*> cases[] = {
      {"abc", "MASTER_PORT=abc: not an integer"},
      {"29500x", "MASTER_PORT=29500x: not an integer"},
      {"70000", "MASTER_PORT=70000: out of range 1..65535"},
      {"0", "MASTER_PORT=0: out of range 1..65535"},
  };
  for (const auto& [value, message] : cases) {
    ScopedEnv port("MASTER_PORT", value);
    CHECK_THROWS_MATCHES(RpcEnvironment::fromEnvironment("", 0), UsageError, Catch::Message(message));
  }
}

TEST_CASE("with a store in the options MASTER_PORT is not read", "[rpc][unit]") {
  ScopedEnv port("MASTER_PORT", "abc");
  CHECK(RpcEnvironment::fromEnvironment("127.0.0.1", 4000).store_port == 4000);
}

// Before, the raw text went into the store keys ("ddprun/rpc/abc/").
TEST_CASE("a TORCHELASTIC_RESTART_COUNT that is not a count is refused naming it", "[rpc][unit]") {
  const std::pair<const char*, const char*> cases[] = {
      {"abc", "TORCHELASTIC_RESTART_COUNT=abc: not an integer"},
      {"1.5", "TORCHELASTIC_RESTART_COUNT=1.5: not an integer"},
      {"-1", "TORCHELASTIC_RESTART_COUNT=-1: out of range 0..2147483647"},
  };
  for (const auto& [value, message] : cases) {
    ScopedEnv round("TORCHELASTIC_RESTART_COUNT", value);
    CHECK_THROWS_MATCHES(RpcEnvironment::fromEnvironment("127.0.0.1", 4000), UsageError, Catch::Message(message));
  }
}

TEST_CASE("the round is 0 without TORCHELASTIC_RESTART_COUNT", "[rpc][unit]") {
  ScopedEnv round("TORCHELASTIC_RESTART_COUNT", std::nullopt);
  CHECK(RpcEnvironment::fromEnvironment("127.0.0.1", 0).restart_count == 0);
}
