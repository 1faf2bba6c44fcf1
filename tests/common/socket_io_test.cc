#include "common/socket_io.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <fstream>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

using namespace ddprun;
using namespace std::chrono_literals;
using Kind = SocketError::Kind;

namespace {

// Bounds every wait that should end at once: a broken helper fails the test, never hangs it.
constexpr auto kGenerous = 30s;

struct SocketPair {
  UniqueFd a;
  UniqueFd b;
  SocketPair() {
    int fds[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
    a.reset(fds[0]);
    b.reset(fds[1]);
  }
};

std::string pattern(size_t size) {
  std::string bytes(size, '\0');
  for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<char>((i * 131) ^ (i >> 9));
  return bytes;
}

std::span<std::byte> writable(std::string& s) { return std::as_writable_bytes(std::span(s)); }

// A loopback listener on a port the kernel picks.
struct Listener {
  UniqueFd fd;
  int port = 0;
  explicit Listener(int backlog = 16) {
    fd.reset(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    REQUIRE(fd);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    if (backlog >= 0) REQUIRE(::listen(fd.get(), backlog) == 0);
    socklen_t len = sizeof addr;
    REQUIRE(::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len) == 0);
    port = ntohs(addr.sin_port);
  }
};

// The scheduler state of thread `tid` of this process ('S' while it sleeps in poll).
char threadState(pid_t tid) {
  std::ifstream stat("/proc/self/task/" + std::to_string(tid) + "/stat");
  std::string line;
  std::getline(stat, line);
  const auto close = line.rfind(')');
  return close == std::string::npos || close + 2 >= line.size() ? '?' : line[close + 2];
}

std::atomic<int> g_signals{0};
void countSignal(int) { ++g_signals; }

}  // namespace

TEST_CASE("sendAll and recvAll move more than the socket buffers hold, in pieces", "[socket_io]") {
  SocketPair pair;
  int small = 4096;
  ::setsockopt(pair.a.get(), SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
  ::setsockopt(pair.b.get(), SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  const std::string sent = pattern(4 << 20);
  std::string received(sent.size(), '\0');
  std::exception_ptr sender_error;
  std::thread sender([&] {
    try {
      sendAll(pair.a.get(), sent, SocketClock::now() + kGenerous);
    } catch (...) {
      sender_error = std::current_exception();
    }
  });
  CHECK_NOTHROW(recvAll(pair.b.get(), writable(received), SocketClock::now() + kGenerous));
  sender.join();
  CHECK_FALSE(sender_error);
  CHECK(received == sent);
}

TEST_CASE("recvAll gives up at its deadline with a timeout", "[socket_io]") {
  SocketPair pair;
  sendAll(pair.a.get(), "abc", SocketClock::now() + kGenerous);
  std::string buffer(10, '\0');
  const auto deadline = SocketClock::now() + 50ms;
  try {
    recvAll(pair.b.get(), writable(buffer), deadline);
    FAIL("recvAll returned with 3 of 10 bytes");
  } catch (const SocketError& e) {
    CHECK(e.kind() == Kind::kTimedOut);
    CHECK(e.timedOut());
    CHECK(e.code() == ETIMEDOUT);
    CHECK(std::string(e.what()) == "timed out");
  }
  CHECK(SocketClock::now() >= deadline);
  CHECK(buffer.substr(0, 3) == "abc");
}

TEST_CASE("sendAll gives up at its deadline when the peer does not read", "[socket_io]") {
  SocketPair pair;
  const auto deadline = SocketClock::now() + 50ms;
  try {
    sendAll(pair.a.get(), pattern(16 << 20), deadline);
    FAIL("16 MiB fit into a socket nobody reads");
  } catch (const SocketError& e) {
    CHECK(e.kind() == Kind::kTimedOut);
  }
  CHECK(SocketClock::now() >= deadline);
}

TEST_CASE("recvAll reports a peer that closed before sending everything", "[socket_io]") {
  SocketPair pair;
  sendAll(pair.a.get(), "abc", SocketClock::now() + kGenerous);
  pair.a.reset();
  std::string buffer(10, '\0');
  try {
    recvAll(pair.b.get(), writable(buffer), SocketClock::now() + kGenerous);
    FAIL("recvAll returned after the end of the stream");
  } catch (const SocketError& e) {
    CHECK(e.kind() == Kind::kPeerClosed);
    CHECK(e.peerClosed());
    CHECK(e.code() == 0);
    CHECK(std::string(e.what()) == "connection closed by the peer");
  }
}

TEST_CASE("sending to a closed peer fails with EPIPE and raises no SIGPIPE", "[socket_io]") {
  // Without MSG_NOSIGNAL this test process would be killed by SIGPIPE.
  SocketPair pair;
  pair.b.reset();
  try {
    sendAll(pair.a.get(), "abc", SocketClock::now() + kGenerous);
    FAIL("sent to a closed peer");
  } catch (const SocketError& e) {
    CHECK(e.kind() == Kind::kFailed);
    CHECK(e.code() == EPIPE);
    CHECK_THAT(e.what(), Catch::StartsWith("send failed: "));
  }
  CHECK_THROWS_AS(sendSome(pair.a.get(), std::as_bytes(std::span("x", 1))), SocketError);
}

TEST_CASE("sendSome and recvSome return 0 instead of blocking", "[socket_io]") {
  SocketPair pair;  // blocking sockets: only MSG_DONTWAIT keeps these calls from waiting
  std::string buffer(16, '\0');
  CHECK(recvSome(pair.b.get(), writable(buffer)) == 0);
  CHECK(recvSome(pair.b.get(), {}) == 0);
  const std::string chunk = pattern(64 << 10);
  size_t total = 0;
  while (const size_t n = sendSome(pair.a.get(), std::as_bytes(std::span(chunk)))) total += n;
  CHECK(total > 0);
  CHECK(sendSome(pair.a.get(), std::as_bytes(std::span(chunk))) == 0);
  CHECK(recvSome(pair.b.get(), writable(buffer)) == buffer.size());
  CHECK(buffer == chunk.substr(0, buffer.size()));
}

TEST_CASE("recvAll keeps waiting through a signal that interrupts poll", "[socket_io]") {
  // poll() fails with EINTR when a handler runs, SA_RESTART or not.
  struct sigaction action {};
  struct sigaction previous {};
  action.sa_handler = countSignal;
  sigemptyset(&action.sa_mask);
  REQUIRE(::sigaction(SIGUSR1, &action, &previous) == 0);
  g_signals = 0;
  SocketPair pair;
  const pid_t receiver = static_cast<pid_t>(::syscall(SYS_gettid));
  const pthread_t receiver_thread = ::pthread_self();
  std::thread interrupter([&] {
    // Each signal lands while the receiver sleeps in poll (state S); then the data comes.
    // check-unit-waits: polls because a thread asleep in the kernel (its state in /proc)
    // announces itself nowhere, and the signal must find the receiver there.
    const auto give_up = SocketClock::now() + kGenerous;
    for (int i = 0; i < 3 && SocketClock::now() < give_up; ++i) {
      while (threadState(receiver) != 'S' && SocketClock::now() < give_up) std::this_thread::yield();
      const int before = g_signals;
      ::pthread_kill(receiver_thread, SIGUSR1);
      while (g_signals == before && SocketClock::now() < give_up) std::this_thread::yield();
    }
    while (threadState(receiver) != 'S' && SocketClock::now() < give_up) std::this_thread::yield();
    sendAll(pair.a.get(), "data", SocketClock::now() + kGenerous);
  });
  std::string buffer(4, '\0');
  std::exception_ptr error;
  try {
    recvAll(pair.b.get(), writable(buffer), SocketClock::now() + kGenerous);
  } catch (...) {
    error = std::current_exception();
  }
  interrupter.join();
  ::sigaction(SIGUSR1, &previous, nullptr);
  CHECK_FALSE(error);
  CHECK(buffer == "data");
  CHECK(g_signals == 3);
}

TEST_CASE("waitReady says whether the socket became ready before the deadline", "[socket_io]") {
  SocketPair pair;
  const auto deadline = SocketClock::now() + 20ms;
  CHECK_FALSE(waitReady(pair.b.get(), POLLIN, deadline));
  CHECK(SocketClock::now() >= deadline);
  CHECK(waitReady(pair.a.get(), POLLOUT, SocketClock::now() + kGenerous));
  sendAll(pair.a.get(), "x", SocketClock::now() + kGenerous);
  CHECK(waitReady(pair.b.get(), POLLIN, SocketClock::now() + kGenerous));
  // A hangup counts as ready: the next receive reports it.
  SocketPair closed;
  closed.a.reset();
  CHECK(waitReady(closed.b.get(), POLLIN, SocketClock::now() + kGenerous));
}

TEST_CASE("pollTimeoutMs stops at 0 and caps and leaves no deadline unlimited", "[socket_io]") {
  CHECK(pollTimeoutMs(SocketClock::time_point::max()) == -1);
  CHECK(pollTimeoutMs(SocketClock::now() - 1s) == 0);
  const int hour = pollTimeoutMs(SocketClock::now() + 1h);
  CHECK(hour <= 3600000);
  CHECK(hour > 3590000);
  CHECK(pollTimeoutMs(SocketClock::now() + std::chrono::hours(24 * 365)) == 1 << 30);
}

TEST_CASE("connectTcp connects to a listener and returns a non-blocking close-on-exec socket", "[socket_io]") {
  Listener listener;
  UniqueFd client = connectTcp("127.0.0.1", std::to_string(listener.port), SocketClock::now() + kGenerous);
  REQUIRE(client);
  CHECK((::fcntl(client.get(), F_GETFL) & O_NONBLOCK) != 0);
  CHECK((::fcntl(client.get(), F_GETFD) & FD_CLOEXEC) != 0);
  UniqueFd server(::accept4(listener.fd.get(), nullptr, nullptr, SOCK_CLOEXEC));
  REQUIRE(server);
  sendAll(client.get(), "ping", SocketClock::now() + kGenerous);
  std::string got(4, '\0');
  recvAll(server.get(), writable(got), SocketClock::now() + kGenerous);
  CHECK(got == "ping");
}

TEST_CASE("connectTcp reports a refused connection and a port that does not resolve", "[socket_io]") {
  Listener bound_only(-1);  // bound, not listening: the port is ours and refuses connections
  try {
    connectTcp("127.0.0.1", std::to_string(bound_only.port), SocketClock::now() + kGenerous);
    FAIL("connected to a port nobody listens on");
  } catch (const SocketError& e) {
    CHECK(e.kind() == Kind::kFailed);
    CHECK(e.code() == ECONNREFUSED);
    CHECK(std::string(e.what()) == "connect failed: Connection refused");
  }
  try {
    connectTcp("127.0.0.1", "no-such-service", SocketClock::now() + kGenerous);
    FAIL("resolved a service name that does not exist");
  } catch (const SocketError& e) {
    CHECK(e.kind() == Kind::kFailed);
    CHECK(e.code() == 0);
    CHECK_THAT(e.what(), Catch::StartsWith("cannot resolve host: "));
  }
}

TEST_CASE("connectTcp gives up at its deadline when the listener answers no SYN", "[socket_io]") {
  // A listener whose accept queue is full drops new SYNs: the connect stays in progress.
  Listener listener(0);
  std::vector<UniqueFd> queued;
  bool timed_out = false;
  for (int i = 0; i < 16 && !timed_out; ++i) {
    const auto deadline = SocketClock::now() + 100ms;
    try {
      queued.push_back(connectTcp("127.0.0.1", std::to_string(listener.port), deadline));
    } catch (const SocketError& e) {
      REQUIRE(e.kind() == Kind::kTimedOut);
      CHECK(e.code() == ETIMEDOUT);
      CHECK(SocketClock::now() >= deadline);
      timed_out = true;
    }
  }
  CHECK(timed_out);
}

TEST_CASE("connectTcp tries each address for at most per_address", "[socket_io]") {
  Listener listener(0);
  std::vector<UniqueFd> queued;
  // Fill the accept queue (as above), then one attempt with a long deadline and a short
  // per-address limit: it ends at the limit, long before the deadline.
  for (int i = 0; i < 16; ++i) {
    try {
      queued.push_back(connectTcp("127.0.0.1", std::to_string(listener.port), SocketClock::now() + 100ms));
    } catch (const SocketError&) {
      break;
    }
  }
  // No overall deadline: without the limit this would wait until the kernel gives up on
  // the SYN (about 2 minutes, past the test's timeout).
  try {
    connectTcp("127.0.0.1", std::to_string(listener.port), SocketClock::time_point::max(), 50ms);
    FAIL("connected to a listener with a full accept queue");
  } catch (const SocketError& e) {
    CHECK(e.kind() == Kind::kTimedOut);
  }
}
