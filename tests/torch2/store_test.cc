// torch 2.6's TCPStore client against the workers' store of a real ddprun job. The worker
// (store_ops.py) runs every operation the client has and checks the replies: each connection
// opens with VALIDATE and PING, and a timed-out wait or get sends CANCEL_WAIT and goes on using
// its connection (which torch 1.13 could not). Then it waits while this test reads the same keys
// with ddprun's C++ client and a torch 1.13 client (the older wire generation, on the same server
// at the same time) writes some back.
#include <algorithm>
#include <catch2/catch.hpp>

#include "rendezvous/store/tcp_store_client.h"
#include "tests/support/test_process.h"
#include "tests/torch2/torch2_scripts.h"

using namespace ddprun::testing;
using ddprun::rendezvous::StoreClientOptions;
using ddprun::rendezvous::TcpStoreClient;

TEST_CASE("torch 2.6's TCPStore runs every operation against ddprun's workers' store and meets torch 1.13 there",
          "[torch2]") {
  TestProcess job({ddprunPath(), "--standalone", "--nproc_per_node=1", torch2Script("store_ops.py")}, torch2Env());
  const std::string ready = "store checks done; store at ";
  const bool got_ready = job.waitForOutput(ready, 180s);
  INFO("ddprun so far:\n" << job.out() << job.err());
  REQUIRE(got_ready);
  CHECK(countOf(job.out(), "MISMATCH") == 0);
  CHECK_THAT(job.out(), Catch::Contains("ok: wait with a timeout on a missing key: honoured its timeout"));
  CHECK_THAT(job.out(), Catch::Contains("ok: the same client after its wait timed out"));

  const std::string where = job.out().substr(job.out().find(ready) + ready.size());
  StoreClientOptions options;
  options.host = where.substr(0, where.find(':'));
  options.port = std::stoi(where.substr(where.find(':') + 1));
  options.timeout = 10s;
  options.connect_timeout = 5s;
  TcpStoreClient cxx(options);
  // torch 2.6 puts '/' before every key but its init/ counter, as 1.13 did.
  CHECK(cxx.get("/from-torch2") == "hello from torch 2.6");
  CHECK(cxx.get("/counter") == "-2");
  CHECK(cxx.get("/log") == std::string("one\0two", 7));
  CHECK(cxx.multiGet({"/m1", "/m2", "/m3", "/cs"}) ==
        std::vector<std::string>{"x", std::string("\0y", 2), "", "second"});
  CHECK(cxx.get("/shared") == "200");
  CHECK(cxx.get("init/") == "1");  // one client said world_size=1
  CHECK_FALSE(cxx.check({"/key"}));
  auto keys = cxx.listKeys();
  std::sort(keys.begin(), keys.end());
  CHECK(keys == std::vector<std::string>{"/bin", "/counter", "/cs", "/from-torch2", "/late", "/late-add",
                                         "/late-append", "/late-cs", "/late-m", "/log", "/m1", "/m2", "/m3", "/never",
                                         "/shared", "init/"});

  // Debian 12's torch 1.13 (its own wire numbering, no VALIDATE) on the same store.
  auto peer = run({"/usr/bin/python3", torch2Script("store_peer_113.py"), options.host, std::to_string(options.port)},
                  {}, 120s);
  INFO("torch 1.13 peer:\n" << peer.out << peer.err);
  REQUIRE(peer.finished);
  CHECK(peer.exit_code == 0);

  cxx.set("/from-ddprun", std::string("bytes\0from ddprun", 17));
  cxx.set("/cxx-done", "1");
  const bool finished = job.wait(120s);
  INFO("ddprun:\n" << job.out() << job.err());
  REQUIRE(finished);
  CHECK(job.exitCode() == 0);
  CHECK_THAT(job.out(), Catch::Contains("ALL OK"));
  CHECK_THAT(job.out(), Catch::Contains("ok: what torch 1.13's client wrote"));
  CHECK(countOf(job.out(), "MISMATCH") == 0);
}
