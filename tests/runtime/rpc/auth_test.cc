// The caller's side of the handshake over a socket pair: how its socket failures read to
// the user (a peer that ends the stream is one that refused this worker's secret, one
// gone gives the error, a silent one times out naming the callee). No peer process and
// no waiting: the deadlines given have passed already.
#include "worker_runtime/rpc/auth.h"

#include <sys/socket.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <string>

#include "common/unique_fd.h"
#include "worker_runtime/rpc/rpc.h"

using ddprun::UniqueFd;
using ddprun::rpc::PeerError;
using ddprun::rpc::RpcTimeout;
using ddprun::rpc::auth::clientHandshake;
using ddprun::rpc::auth::ClientHello;

namespace {

// Non-blocking, as clientHandshake requires.
struct SocketPair {
  UniqueFd caller, callee;
  SocketPair() {
    int fds[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds) == 0);
    caller.reset(fds[0]);
    callee.reset(fds[1]);
  }
};

const auto kPassed = std::chrono::steady_clock::now() - std::chrono::seconds(1);

}  // namespace

TEST_CASE("rpc auth: a callee that closes the connection refused it", "[rpc][unit]") {
  SocketPair pair;
  // The end of the stream after the hello, as from a worker that will not answer it.
  REQUIRE(::shutdown(pair.callee.get(), SHUT_WR) == 0);
  CHECK_THROWS_MATCHES(clientHandshake(pair.caller.get(), "secret", 1, 0, kPassed, "worker 'w0' (rank 0)"), PeerError,
                       Catch::Message("rpc: worker 'w0' (rank 0) refused the connection (a different job secret?)"));
}

TEST_CASE("rpc auth: a callee gone before the hello fails naming it and the error", "[rpc][unit]") {
  SocketPair pair;
  pair.callee.reset();
  CHECK_THROWS_MATCHES(clientHandshake(pair.caller.get(), "secret", 1, 0, kPassed, "worker 'w0' (rank 0)"), PeerError,
                       Catch::Message("rpc: authenticating with worker 'w0' (rank 0): Broken pipe"));
}

TEST_CASE("rpc auth: a callee that stays silent times out naming it", "[rpc][unit]") {
  SocketPair pair;
  CHECK_THROWS_MATCHES(clientHandshake(pair.caller.get(), "secret", 1, 0, kPassed, "worker 'w0' (rank 0)"), RpcTimeout,
                       Catch::Message("rpc: authenticating with worker 'w0' (rank 0) timed out"));
  // The hello went out before the wait for the answer.
  ClientHello hello;
  REQUIRE(::recv(pair.callee.get(), &hello, sizeof hello, MSG_DONTWAIT) == static_cast<ssize_t>(sizeof hello));
  CHECK(hello.magic == ddprun::rpc::auth::kHelloMagic);
  CHECK(hello.src == 1);
  CHECK(hello.dst == 0);
}
