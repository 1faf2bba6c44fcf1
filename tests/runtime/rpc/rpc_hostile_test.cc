// Issue 21's probe of the RPC agent, kept as regression tests: rpc_probe_target serves as
// rank 0 of a job of two and this test is rank 1 (or a stranger), speaking the wire
// protocol by hand (rpc_wire_client.h). Each case checks that the worker refuses the
// hostile input and goes on serving valid calls.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/socket_io.h"
#include "common/unique_fd.h"
#include "rendezvous/store/store_server.h"
#include "rendezvous/store/tcp_store_client.h"
#include "tests/runtime/rpc/rpc_wire_client.h"
#include "tests/support/fuzz_run.h"
#include "tests/support/test_process.h"
#include "worker_runtime/rpc/auth.h"

using namespace ddprun::testing;
using namespace ddprun::testing::rpcwire;
using ddprun::UniqueFd;
using ddprun::rpc::wire::Kind;

namespace {

UniqueFd listenLoopback(int& port) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (!fd || ::bind(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 || ::listen(fd.get(), 16) != 0) {
    throw std::runtime_error("cannot listen on loopback");
  }
  socklen_t len = sizeof sa;
  ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&sa), &len);
  port = ntohs(sa.sin_port);
  timeval tv{20, 0};
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);  // accept() gives up too
  return fd;
}

long rssKbOf(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

class ProbeJob {
 public:
  explicit ProbeJob(int rpc_timeout_ms = 60000) : store_(storeOptions()) {
    secret_ = "probe-secret-" + std::to_string(std::random_device{}());
    listener_ = listenLoopback(listen_port_);
    ddprun::rendezvous::StoreClientOptions co;
    co.port = store_.port();
    ddprun::rendezvous::TcpStoreClient client(co);
    client.set("ddprun/rpc/0/worker/1", "peer1\n127.0.0.1\n" + std::to_string(listen_port_));
    target_ = std::make_unique<TestProcess>(
        std::vector<std::string>{binDir() + "/rpc_probe_target", std::to_string(rpc_timeout_ms)},
        std::map<std::string, std::string>{{"MASTER_ADDR", "127.0.0.1"},
                                           {"MASTER_PORT", std::to_string(store_.port())},
                                           {"DDPRUN_RPC_SECRET", secret_},
                                           {"DDPRUN_RPC_SECRET_FILE", ""},
                                           {"TORCHELASTIC_RESTART_COUNT", ""},
                                           {"DDPRUN_LOG_LEVEL", "error"},
                                           {"OMP_NUM_THREADS", "1"}});
    INFO("target stderr: " << target_->err());
    REQUIRE(target_->waitForOutput("serving", 60s));
    const std::string entry = client.get("ddprun/rpc/0/worker/0");
    const auto a = entry.find('\n'), b = entry.rfind('\n');
    host_ = entry.substr(a + 1, b - a - 1);
    port_ = std::stoi(entry.substr(b + 1));
  }

  // A connection authenticated as rank 1.
  UniqueFd member() const {
    UniqueFd fd = connectTo(host_, port_);
    handshake(fd.get(), secret_, 1, 0);
    return fd;
  }
  UniqueFd stranger() const { return connectTo(host_, port_); }
  int64_t callInt(int fd, const std::string& func, const std::vector<std::string>& args = {}) {
    sendAll(fd, frame(Kind::kRequest, 1, ++next_id_, requestMeta(func, args)));
    return intResult(readMessage(fd));
  }
  Message call(int fd, const std::string& func, const std::vector<std::string>& args = {}) {
    sendAll(fd, frame(Kind::kRequest, 1, ++next_id_, requestMeta(func, args)));
    return readMessage(fd);
  }
  // A valid call on a fresh authenticated connection still works, and the worker lives.
  void checkServing() {
    INFO("target stderr: " << target_->err());
    REQUIRE(processAlive(target_->pid()));
    const UniqueFd fd = member();
    CHECK(callInt(fd.get(), "echo", {intValue(41)}) == 41);  // a one-element list comes back
  }
  long rssKb() const { return rssKbOf(target_->pid()); }
  int listener() const { return listener_.get(); }
  const std::string& secret() const { return secret_; }
  const std::string& host() const { return host_; }
  int port() const { return port_; }
  uint64_t nextId() { return ++next_id_; }
  TestProcess& target() { return *target_; }

 private:
  static ddprun::rendezvous::StoreServerOptions storeOptions() {
    ddprun::rendezvous::StoreServerOptions o;
    o.host = "127.0.0.1";
    return o;
  }
  ddprun::rendezvous::StoreServer store_;
  UniqueFd listener_;
  int listen_port_ = 0;
  std::string secret_;
  std::unique_ptr<TestProcess> target_;
  std::string host_;
  int port_ = 0;
  uint64_t next_id_ = 1000;
};

}  // namespace

TEST_CASE("rpc hostile: an RRef naming a rank outside the job or a forged sender is refused", "[rpc][bad-input]") {
  ProbeJob job;
  SECTION("an RRef argument owned by rank 100000") {
    const UniqueFd fd = job.member();
    const Message reply = job.call(fd.get(), "echo", {rrefValue(100000, 1, 5)});
    CHECK(errorText(reply).find("malformed message (RRef 100000:1:5") != std::string::npos);
    CHECK(job.callInt(fd.get(), "echo", {intValue(7)}) == 7);  // the same connection goes on
  }
  SECTION("an RRef with a negative creator") {
    const UniqueFd fd = job.member();
    CHECK(errorText(job.call(fd.get(), "echo", {rrefValue(0, -3, 5)})).find("malformed") != std::string::npos);
  }
  SECTION("a header whose sender is not the authenticated rank") {
    const UniqueFd fd = job.member();
    sendAll(fd.get(), frame(Kind::kRequest, 100000, job.nextId(), requestMeta("mark", {})));
    CHECK(closedByPeer(fd.get()));
    const UniqueFd other = job.member();
    CHECK(job.callInt(other.get(), "marks") == 0);
  }
  job.checkServing();
}

TEST_CASE("rpc hostile: a reply counts only from the connection its call went out on", "[rpc][bad-input]") {
  ProbeJob job;
  const UniqueFd caller = job.member();
  // The worker calls rank 1 (this test) from inside call_peer.
  sendAll(caller.get(), frame(Kind::kRequest, 1, 1, requestMeta("call_peer", {})));
  const UniqueFd served(::accept4(job.listener(), nullptr, nullptr, SOCK_CLOEXEC));
  REQUIRE(served.valid());
  CHECK(serveHandshake(served.get(), job.secret(), 1) == 0);
  const Message request = readMessage(served.get());
  REQUIRE(request.header.kind == static_cast<uint8_t>(Kind::kRequest));
  // A job member forges the answer on its own connection: ids count up and are guessable.
  const UniqueFd forger = job.member();
  sendAll(forger.get(), frame(Kind::kResponse, 1, request.header.id, pod(uint32_t{0}) + intValue(666)));
  CHECK(closedByPeer(forger.get()));
  // The real answer, on the connection the call went out on.
  sendAll(served.get(), frame(Kind::kResponse, 1, request.header.id, pod(uint32_t{0}) + intValue(42)));
  CHECK(intResult(readMessage(caller.get())) == 42);
  CHECK(job.callInt(caller.get(), "last_result") == 42);
}

TEST_CASE("rpc hostile: a caller without the job secret cannot call anything", "[rpc][bad-input]") {
  ProbeJob job;
  SECTION("a request frame sent without a handshake") {
    const UniqueFd fd = job.stranger();
    sendAll(fd.get(), frame(Kind::kRequest, 1, 1, requestMeta("mark", {})));
    CHECK(closedByPeer(fd.get()));
  }
  SECTION("a handshake with a wrong secret") {
    const UniqueFd fd = job.stranger();
    CHECK_THROWS_WITH(handshake(fd.get(), "not-the-secret", 1, 0), "the worker's proof is wrong");
    // Carry on as if the proof had been accepted: the worker still refuses.
    const UniqueFd again = job.stranger();
    ddprun::rpc::auth::ClientHello hello;
    hello.src = 1;
    hello.dst = 0;
    sendAll(again.get(), pod(hello));
    std::string answer(sizeof(ddprun::rpc::auth::ServerHello), '\0');
    ddprun::recvAll(again.get(), std::as_writable_bytes(std::span(answer)), ddprun::SocketClock::now() + kWait);
    sendAll(again.get(), std::string(32, 'x') + frame(Kind::kRequest, 1, 1, requestMeta("mark", {})));
    CHECK(closedByPeer(again.get()));
  }
  SECTION("a handshake for another rank or outside the job") {
    const UniqueFd wrong_callee = job.stranger();
    CHECK_THROWS(handshake(wrong_callee.get(), job.secret(), 1, 1));
    const UniqueFd outside = job.stranger();
    CHECK_THROWS(handshake(outside.get(), job.secret(), 7, 0));
  }
  const UniqueFd member = job.member();
  CHECK(job.callInt(member.get(), "marks") == 0);
  job.checkServing();
}

TEST_CASE("rpc hostile: the worker listens on its own address, not on every address", "[rpc][bad-input]") {
  ProbeJob job;
  REQUIRE(job.host() == "127.0.0.1");
  // 127.0.0.2 is this host too: a wildcard listener would accept there.
  CHECK_THROWS_WITH(connectTo("127.0.0.2", job.port()), Catch::Contains("Connection refused"));
  job.checkServing();
}

TEST_CASE("rpc hostile: announced sizes cost memory only as their bytes arrive", "[rpc][bad-input]") {
  ProbeJob job;
  const long before = job.rssKb();
  std::vector<UniqueFd> held;
  ddprun::rpc::wire::Header big;
  big.kind = static_cast<uint8_t>(Kind::kRequest);
  big.src = 1;
  big.id = 1;
  big.meta_bytes = 256u << 20;
  // Five strangers announce 256 MiB of metadata each and send 4 MiB of it.
  for (int i = 0; i < 5; ++i) {
    held.push_back(job.stranger());
    const std::string bytes = pod(big) + std::string(4u << 20, 'j');
    // One send of what fits, ignoring a refusal: what counts is the worker's memory after.
    try {
      ddprun::sendSome(held.back().get(), std::as_bytes(std::span(bytes)));
    } catch (const ddprun::SocketError&) {
    }
  }
  // Five members announce the same and send 8 MiB of it, then stall.
  for (int i = 0; i < 5; ++i) {
    held.push_back(job.member());
    sendAll(held.back().get(), pod(big) + std::string(8u << 20, 'm'));
  }
  // A member announces a table of a million empty tensors (2 MiB): refused before any.
  {
    const UniqueFd fd = job.member();
    std::string meta = pod(uint32_t{1u << 20});
    for (int i = 0; i < (1 << 20); ++i) meta += pod(int8_t{6}) + pod(uint8_t{0});
    meta += str("echo") + pod(int64_t{-1}) + pod(int64_t{-1}) + pod(int64_t{-1}) + listValue({});
    sendAll(fd.get(), frame(Kind::kRequest, 1, 2, meta));
    CHECK(closedByPeer(fd.get()));
  }
  job.checkServing();
  const long after = job.rssKb();
  INFO("target RSS " << before << " kB -> " << after << " kB");
  // 5 x 16 MiB at most for the members' partial metadata (chunks at most double what
  // arrived); announcing sizes up front would cost 2.5 GiB.
  CHECK(after - before < 160 * 1024);
}

TEST_CASE("rpc hostile: silent and partial connections are closed after their deadlines", "[rpc][bad-input]") {
  ProbeJob job(2000);  // rpc_timeout 2 s: a message stalled that long is dropped
  const UniqueFd silent = job.stranger();
  const UniqueFd partial = job.member();
  sendAll(partial.get(), frame(Kind::kRequest, 1, 1, requestMeta("mark", {})).substr(0, 40));
  const UniqueFd half_header = job.member();
  sendAll(half_header.get(), std::string(10, '\0'));
  CHECK(closedByPeer(partial.get()));  // within the 20 s wait (2 s read deadline)
  CHECK(closedByPeer(half_header.get()));
  CHECK(closedByPeer(silent.get()));  // 10 s handshake deadline
  const UniqueFd member = job.member();
  CHECK(job.callInt(member.get(), "marks") == 0);
  job.checkServing();
}

TEST_CASE("rpc hostile: built-in calls with absurd sizes are refused", "[rpc][bad-input]") {
  ProbeJob job;
  const UniqueFd fd = job.member();
  const long before = job.rssKb();
  const Message reply =
      job.call(fd.get(), "ddprun.module.create",
               {stringValue("Linear"), intValue(1000000), intValue(1000000), pod(kBool) + pod(uint8_t{1})});
  CHECK(errorText(reply).find("1000000 x 1000000 parameters need") != std::string::npos);
  const Message negative = job.call(fd.get(), "ddprun.module.create",
                                    {stringValue("EmbeddingBag"), intValue(-5), intValue(4), stringValue("sum")});
  CHECK(errorText(negative).find("sizes must be positive") != std::string::npos);
  CHECK(job.rssKb() - before < 64 * 1024);
  job.checkServing();
}

namespace {

// Valid frames for the fuzz loop to damage: scalars, strings, nested lists, a tensor,
// RRefs, built-ins.
std::vector<std::string> fuzzBaseFrames() {
  std::vector<std::string> frames;
  frames.push_back(frame(Kind::kRequest, 1, 1, requestMeta("echo", {intValue(5)})));
  frames.push_back(frame(Kind::kRequest, 1, 2, requestMeta("echo", {stringValue("hello fuzz")})));
  frames.push_back(frame(Kind::kRequest, 1, 3,
                         requestMeta("echo", {listValue({intValue(1), listValue({stringValue("x"), intValue(2)})})})));
  frames.push_back(frame(Kind::kRequest, 1, 4, requestMeta("echo", {rrefValue(0, 1, 9)})));
  frames.push_back(frame(Kind::kRequest, 1, 5, requestMeta("ddprun.rref.release", {intValue(1), intValue(3)})));
  frames.push_back(frame(Kind::kRequest, 1, 6, requestMeta("marks", {})));
  frames.push_back(frame(Kind::kResponse, 1, 7, pod(uint32_t{0}) + intValue(3)));
  // echo(tensor float32 [2, 3])
  std::string meta = pod(uint32_t{1}) + pod(int8_t{6}) + pod(uint8_t{2}) + pod(int64_t{2}) + pod(int64_t{3});
  meta += str("echo") + pod(int64_t{-1}) + pod(int64_t{-1}) + pod(int64_t{-1});
  meta += pod(kList) + pod(uint32_t{1}) + pod(kTensor) + pod(uint32_t{0}) + pod(int64_t{-1});
  frames.push_back(frame(Kind::kRequest, 1, 8, meta, std::string(24, '\x01')));
  return frames;
}

// Rank 1's listener, served on a thread: accepts the worker's connections, runs the
// callee's handshake and reads whatever comes, answering nothing.
class PeerStandIn {
 public:
  PeerStandIn(int listener, std::string secret)
      : listener_(listener), secret_(std::move(secret)), thread_([this] { serve(); }) {}
  ~PeerStandIn() {
    stop_ = true;
    thread_.join();
  }

 private:
  void serve() {
    while (!stop_) {
      std::vector<pollfd> polls{{listener_, POLLIN, 0}};
      for (const auto& fd : fds_) polls.push_back({fd.get(), POLLIN, 0});
      if (::poll(polls.data(), polls.size(), 100) <= 0) continue;
      if (polls[0].revents & POLLIN) {
        UniqueFd fd(::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC));
        if (fd) {
          try {
            serveHandshake(fd.get(), secret_, 1, std::chrono::seconds(2));
            fds_.push_back(std::move(fd));
          } catch (const std::exception&) {
            // fd closes here: the worker sees a peer that refused it.
          }
        }
      }
      for (size_t k = 1; k < polls.size(); ++k) {
        if (!polls[k].revents) continue;
        std::byte buf[65536];
        try {
          ddprun::recvSome(polls[k].fd, buf);
        } catch (const ddprun::SocketError&) {  // closed or reset: close our end too
          std::erase_if(fds_, [&](const UniqueFd& fd) { return fd.get() == polls[k].fd; });
        }
      }
    }
  }
  int listener_;
  std::string secret_;
  std::vector<UniqueFd> fds_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Sends `bytes`, ends the sending side and reads until the worker closes: the worker
// reads everything, answers what it can and then sees the end.
void sendAndDrain(int fd, const std::string& bytes) {
  try {
    sendAll(fd, bytes);
  } catch (const ddprun::SocketError&) {  // the worker may close before it has read everything
  }
  ::shutdown(fd, SHUT_WR);
  closedByPeer(fd, std::chrono::seconds(5));
}

}  // namespace

TEST_CASE("rpc hostile: a fuzz loop of random and damaged frames", "[rpc][bad-input][fuzz]") {
  const auto [seed, budget] = fuzzRun("rpc");
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  ProbeJob job(1000);
  // Damaged RRefs make the worker call rank 1 (releases): answer as a live peer would.
  PeerStandIn peer(job.listener(), job.secret());
  const auto base = fuzzBaseFrames();
  auto pick = [&] { return base[rng() % base.size()]; };
  const long rss_before = job.rssKb();
  const auto end = std::chrono::steady_clock::now() + budget;
  int i = 0;
  for (; std::chrono::steady_clock::now() < end; ++i) {
    std::string bytes;
    bool authenticate = true;
    switch (rng() % 5) {
      case 0:  // noise
        bytes.resize(1 + rng() % 200);
        for (auto& c : bytes) c = static_cast<char>(rng());
        authenticate = rng() % 2;
        break;
      case 1: {  // a valid frame, cut short
        const std::string f = pick();
        bytes = f.substr(0, rng() % f.size());
        break;
      }
      case 2:  // a valid frame with a few bytes changed after the magic, maybe cut
      case 3: {
        bytes = pick() + pick();
        for (int m = 1 + rng() % 3; m > 0; --m) bytes[4 + rng() % (bytes.size() - 4)] = static_cast<char>(rng());
        if (rng() % 3 == 0) bytes.resize(4 + rng() % (bytes.size() - 4));
        break;
      }
      case 4:  // valid frames from a stranger
        bytes = pick();
        authenticate = false;
        break;
    }
    const UniqueFd fd = authenticate ? job.member() : job.stranger();
    sendAndDrain(fd.get(), bytes);
    // Keep the worker's output pipes drained (its log lines must not block it).
    if (i % 50 == 49) job.target().waitForOutput("\x01never", 30ms);
    if (i % 200 == 199) {
      job.checkServing();
      REQUIRE(job.rssKb() - rss_before < 256 * 1024);
    }
  }
  std::printf("rpc fuzz: %d connections\n", i);
  job.checkServing();
  INFO("target RSS " << rss_before << " kB -> " << job.rssKb() << " kB");
  CHECK(job.rssKb() - rss_before < 256 * 1024);
}
