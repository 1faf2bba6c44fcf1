#include "rendezvous/c10d/local_addresses.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>

#include <charconv>
#include <cstring>
#include <set>

#include "common/error.h"

namespace ddprun::rendezvous {
namespace {

std::set<std::string> interfaceAddresses() {
  std::set<std::string> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  for (ifaddrs* ifa = list; ifa; ifa = ifa->ifa_next) {
    if (!ifa->ifa_addr) continue;
    char buf[INET6_ADDRSTRLEN] = {};
    if (ifa->ifa_addr->sa_family == AF_INET) {
      ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(ifa->ifa_addr)->sin_addr, buf, sizeof buf);
    } else if (ifa->ifa_addr->sa_family == AF_INET6) {
      ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(ifa->ifa_addr)->sin6_addr, buf, sizeof buf);
    } else {
      continue;
    }
    out.insert(buf);
  }
  ::freeifaddrs(list);
  return out;
}

}  // namespace

bool isLocalAddress(const std::string& host) {
  if (host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1") return true;
  auto local = interfaceAddresses();
  if (local.count(host)) return true;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0) return false;
  bool is_local = false;
  for (addrinfo* ai = found; ai && !is_local; ai = ai->ai_next) {
    char buf[INET6_ADDRSTRLEN] = {};
    if (ai->ai_family == AF_INET) {
      ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(ai->ai_addr)->sin_addr, buf, sizeof buf);
    } else if (ai->ai_family == AF_INET6) {
      ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(ai->ai_addr)->sin6_addr, buf, sizeof buf);
    }
    std::string addr = buf;
    is_local = addr.rfind("127.", 0) == 0 || addr == "::1" || local.count(addr);
  }
  ::freeaddrinfo(found);
  return is_local;
}

void splitHostPort(const std::string& endpoint, std::string& host, int& port, int default_port) {
  host = endpoint;
  port = default_port;
  std::string port_text;
  if (!endpoint.empty() && endpoint.front() == '[') {
    auto close = endpoint.find(']');
    host = endpoint.substr(1, close == std::string::npos ? std::string::npos : close - 1);
    if (close != std::string::npos && close + 1 < endpoint.size()) port_text = endpoint.substr(close + 2);
  } else if (auto colon = endpoint.rfind(':'); colon != std::string::npos && endpoint.find(':') == colon) {
    host = endpoint.substr(0, colon);
    port_text = endpoint.substr(colon + 1);
  }
  if (port_text.empty()) return;
  const char* last = port_text.data() + port_text.size();
  const auto [end, ec] = std::from_chars(port_text.data(), last, port);
  if (ec != std::errc() || end != last || port < 0 || port > 65535) {
    throw UsageError("endpoint '" + endpoint + "': port '" + port_text + "' is not a number in 0..65535");
  }
}

}  // namespace ddprun::rendezvous
