// A c10d rendezvous endpoint where something accepts TCP connections and never answers
// (issue 44, noticed): the join gives up at join_timeout, as torch's c10d handler does, with
// one line naming the endpoint, not after read_timeout (60 s) at the first store call.
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "common/unique_fd.h"
#include "tests/support/test_process.h"

using namespace ddprun::testing;
using ddprun::UniqueFd;

namespace {

// Listens on 127.0.0.1, a port from the kernel; accepts every connection and holds it
// without reading or writing a byte, until destroyed.
class SilentListener {
 public:
  SilentListener() : fd_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    REQUIRE(fd_.valid());
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    REQUIRE(::listen(fd_.get(), 16) == 0);
    socklen_t len = sizeof addr;
    ::getsockname(fd_.get(), reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] {
      while (!stop_) {
        pollfd p{fd_.get(), POLLIN, 0};
        if (::poll(&p, 1, 100) <= 0) continue;
        UniqueFd c(::accept4(fd_.get(), nullptr, nullptr, SOCK_CLOEXEC));
        if (c) held_.push_back(std::move(c));
        ++accepted_;
      }
    });
  }
  ~SilentListener() {
    stop_ = true;
    thread_.join();
  }
  int port() const { return port_; }
  int accepted() const { return accepted_; }

 private:
  UniqueFd fd_;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> accepted_{0};
  std::vector<UniqueFd> held_;
  std::thread thread_;
};

}  // namespace

TEST_CASE("a c10d endpoint that accepts and never answers fails the join at join_timeout and names it",
          "[e2e][bad_input]") {
  SilentListener silent;
  const std::string endpoint = "127.0.0.1:" + std::to_string(silent.port());
  const auto start = std::chrono::steady_clock::now();
  // The endpoint is this host's: ddprun tries to host the store there, finds the port taken
  // and joins whatever holds it (as a second agent of the host would).
  const RunResult r =
      run({ddprunPath(), "--nnodes=2", "--nproc_per_node=1", "--rdzv_backend=c10d", "--rdzv_endpoint=" + endpoint,
           "--rdzv_id=silent", "--rdzv_conf=join_timeout=5", "--no_python", "true"},
          {}, 30s);
  const auto took = std::chrono::steady_clock::now() - start;
  INFO(r.err);
  REQUIRE(r.finished);  // before the fix: still waiting for the first reply at 30 s (read_timeout: 60 s)
  CHECK(r.exit_code == 3);
  CHECK(silent.accepted() >= 1);
  CHECK_THAT(r.err, Catch::Contains("ddprun: rendezvous failed: ") && Catch::Contains(endpoint) &&
                        Catch::Contains("did not answer within 5000 ms"));
  CHECK(countOf(r.err, "\n") == 1);
  CHECK(took < 20s);
}
