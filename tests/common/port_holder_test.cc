#include "common/port_holder.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include <catch2/catch.hpp>

#include "common/unique_fd.h"

namespace {

// A loopback socket listening on a kernel-chosen port.
ddprun::UniqueFd boundSocket(int& port) {
  ddprun::UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(::listen(fd.get(), 4) == 0);
  socklen_t len = sizeof addr;
  REQUIRE(::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  port = ntohs(addr.sin_port);
  return fd;
}

std::string ownName() {
  std::ifstream in("/proc/self/comm");
  std::string name;
  std::getline(in, name);
  return name;
}

}  // namespace

TEST_CASE("the holder of a port in use is named by pid and command", "[port_holder]") {
  int port = 0;
  const auto fd = boundSocket(port);
  const std::string expected = "pid " + std::to_string(::getpid()) + " (" + ownName() + ")";
  CHECK(ddprun::portHolder(port) == expected);
  CHECK(ddprun::portHolderSuffix(port) == ", held by " + expected);
}

TEST_CASE("a free port or an impossible one has no holder and no suffix", "[port_holder]") {
  int port = 0;
  { const auto fd = boundSocket(port); }
  CHECK(ddprun::portHolder(port).empty());
  CHECK(ddprun::portHolderSuffix(port).empty());
  CHECK(ddprun::portHolder(0).empty());
  CHECK(ddprun::portHolder(70000).empty());
}

// /proc/<pid>/comm is whatever the process named itself (prctl, or exec's argv[0]): a holder
// named with a title-setting and a screen-clearing sequence must not reach the terminal so.
TEST_CASE("the holder's command name is shown escaped", "[port_holder][bad-input]") {
  int port = 0;
  const auto fd = boundSocket(port);
  const std::string own = ownName();
  // This thread is the process's first, whose name /proc/<pid>/comm shows.
  REQUIRE(::prctl(PR_SET_NAME, "\x1b]0;PWN\x07\x1b[2J", 0, 0, 0) == 0);
  const std::string holder = ddprun::portHolder(port);
  ::prctl(PR_SET_NAME, own.c_str(), 0, 0, 0);
  CHECK(holder == "pid " + std::to_string(::getpid()) + " (\\x1b]0;PWN\\x07\\x1b[2J)");
}
