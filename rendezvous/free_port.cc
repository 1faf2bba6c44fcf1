#include "rendezvous/free_port.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/error.h"

namespace ddprun::rendezvous {

int findFreePort(const std::string& host) {
  const bool v6 = host.find(':') != std::string::npos;
  int fd = ::socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw SystemError("socket()", errno);
  sockaddr_storage storage{};
  socklen_t len = 0;
  if (v6) {
    auto* addr = reinterpret_cast<sockaddr_in6*>(&storage);
    addr->sin6_family = AF_INET6;
    if (::inet_pton(AF_INET6, host.c_str(), &addr->sin6_addr) != 1) addr->sin6_addr = in6addr_loopback;
    len = sizeof(sockaddr_in6);
  } else {
    auto* addr = reinterpret_cast<sockaddr_in*>(&storage);
    addr->sin_family = AF_INET;
    const char* literal = host == "localhost" ? "127.0.0.1" : host.c_str();
    if (::inet_pton(AF_INET, literal, &addr->sin_addr) != 1) addr->sin_addr.s_addr = htonl(INADDR_ANY);
    len = sizeof(sockaddr_in);
  }
  if (::bind(fd, reinterpret_cast<sockaddr*>(&storage), len) != 0) {
    int err = errno;
    ::close(fd);
    throw SystemError("bind(" + host + ":0)", err);
  }
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&storage), &len) != 0) {
    int err = errno;
    ::close(fd);
    throw SystemError("getsockname()", err);
  }
  ::close(fd);
  return v6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&storage)->sin6_port)
            : ntohs(reinterpret_cast<sockaddr_in*>(&storage)->sin_port);
}

}  // namespace ddprun::rendezvous
