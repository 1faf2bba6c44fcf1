// EtcdBackend's connections over a cluster whose first member is frozen (a SIGSTOPped etcd:
// the kernel accepts the connection, nothing ever answers), against a fake etcd (fake_etcd.h)
// as the member that does answer. Real time (a silent member's attempt is a second):
// integration.
#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>

#include <catch2/catch.hpp>

#include "common/unique_fd.h"
#include "rendezvous/etcd/etcd_backend.h"
#include "rendezvous/store/store.h"
#include "rendezvous/store/tcp_store_client.h"
#include "tests/rendezvous/etcd/fake_etcd.h"

using namespace ddprun;
using namespace ddprun::testing;
using namespace ddprun::rendezvous;
using namespace std::chrono_literals;

namespace {

// A loopback listener that never accepts: a connection to it completes in the kernel's
// backlog and a request sent there is never answered, as with a frozen member.
class SilentMember {
 public:
  SilentMember() : fd_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    REQUIRE(fd_.get() >= 0);
    REQUIRE(::bind(fd_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    REQUIRE(::listen(fd_.get(), 16) == 0);
    REQUIRE(::getsockname(fd_.get(), reinterpret_cast<sockaddr*>(&addr), &len) == 0);
    port_ = ntohs(addr.sin_port);
  }
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  UniqueFd fd_;
  int port_ = 0;
};

}  // namespace

TEST_CASE("a connection made with a 1 s read_timeout while the first member is frozen reaches the next member",
          "[integration]") {
  // The round watcher connects mid-job with read_timeout as its connect timeout; with 1 s, the
  // frozen member's attempt used all of it and every agent then lost the store at once.
  SilentMember frozen;
  FakeEtcd fake;
  RendezvousConfig config;
  config.backend = "etcd-v2";
  config.endpoint = frozen.endpoint() + "," + fake.endpoint();
  config.conf = {{"read_timeout", "1"}, {"keep_alive_interval", "1"}};
  etcd::EtcdBackend backend(config);
  StoreClientOptions options;
  options.connect_timeout = 1s;
  options.timeout = 1s;
  std::unique_ptr<StoreClient> store;
  try {
    store = backend.connect(options);
  } catch (const StoreError& e) {
    FAIL("connect failed: " << e.what());
  }
  store->set("k", "v");
  CHECK(fake.value("/ddprun/k") == "v");
}
