// A peer may call a worker the moment it has learnt the worker's address, which can be
// before the worker's own init_rpc has returned. The request must be served, not refused
// with "init_rpc has not been called": the built-ins (RRef waits, releases) look the agent
// up through currentAgent(). Two agents in one process make the ordering deterministic:
// the caller's request reaches the callee between its start() and its serve(), the window
// in which init_rpc makes it current.
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <future>
#include <memory>
#include <string>

#include "rendezvous/store/store_server.h"
#include "worker_runtime/rpc/function_registry.h"
#include "worker_runtime/rpc/rpc_agent.h"

using namespace ddprun;
using rpc::detail::RpcAgent;

namespace {

// The listening socket on `port` among this process's descriptors (both agents live here), or -1.
int listenerOn(int port) {
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    int fd = -1;
    try {
      fd = std::stoi(entry.path().filename().string());
    } catch (const std::exception&) {
      continue;
    }
    sockaddr_in address{};
    socklen_t length = sizeof address;
    int listening = 0;
    socklen_t size = sizeof listening;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0 && address.sin_family == AF_INET &&
        ntohs(address.sin_port) == port && ::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &size) == 0 &&
        listening != 0) {
      return fd;
    }
  }
  return -1;
}

// The port in describe()'s "worker 'w' (rank 1, 127.0.0.1:41234)".
int portIn(const std::string& described) {
  const size_t colon = described.rfind(':');
  REQUIRE(colon != std::string::npos);
  return std::stoi(described.substr(colon + 1));
}

}  // namespace

TEST_CASE("a request that arrives while the callee's init_rpc is finishing is served", "[rpc][unit]") {
  rendezvous::StoreServerOptions so;
  so.host = "127.0.0.1";
  rendezvous::StoreServer store(so);
  rpc::RpcBackendOptions options;
  options.store_host = "127.0.0.1";
  options.store_port = store.port();
  options.num_worker_threads = 1;
  options.init_timeout = std::chrono::seconds(20);
  options.rpc_timeout = std::chrono::seconds(20);
  rpc::detail::registerBuiltins();
  auto caller = std::make_shared<RpcAgent>("caller", 0, 2, options);
  auto callee = std::make_shared<RpcAgent>("callee", 1, 2, options);
  // start() blocks until both addresses are in the store.
  auto started = std::async(std::launch::async, [&] { caller->start(); });
  callee->start();
  started.get();
  caller->serve();  // its I/O thread reads the reply

  // owned_count is a built-in that asks currentAgent(); the callee is not current yet.
  auto reply = std::async(std::launch::async, [&] {
    return caller->call(1, "ddprun.rref.owned_count", {}, options.rpc_timeout, -1).wait();
  });
  // The request reaches the callee's listening socket before the callee becomes current: its
  // connection waits in the accept queue (the kernel holds it until serve()), which makes the
  // listener readable. 20 s at most: a guard.
  const int listener = listenerOn(portIn(caller->describe(1)));
  REQUIRE(listener >= 0);
  pollfd pending{listener, POLLIN, 0};
  REQUIRE(::poll(&pending, 1, 20000) == 1);
  rpc::detail::setCurrentAgent(callee);
  callee->serve();

  std::string error;
  int64_t owned = -1;
  try {
    owned = reply.get().toInt();
  } catch (const std::exception& e) {
    error = e.what();
  }
  rpc::detail::setCurrentAgent(nullptr);
  caller->stop();
  callee->stop();
  INFO(error);
  CHECK(error.empty());
  CHECK(owned == 0);
}
