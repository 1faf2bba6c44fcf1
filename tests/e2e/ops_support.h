// Helpers shared by the operating-a-job tests (ops_*_test.cc): agents of one c10d job on
// loopback, a raw HTTP client for the health check, and checks on JSON lines through
// Python's json module (a parser the tests do not have to trust ddprun for).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "tests/support/test_process.h"

namespace ddprun::testing::ops {

// The command line of one agent of a c10d job on 127.0.0.1:port with `nproc` workers each.
inline std::vector<std::string> agentArgs(const std::string& nnodes, int nproc, int port, const std::string& id,
                                          const std::string& conf) {
  return {ddprunPath(),
          "--nnodes=" + nnodes,
          "--nproc_per_node=" + std::to_string(nproc),
          "--rdzv_backend=c10d",
          "--rdzv_endpoint=127.0.0.1:" + std::to_string(port),
          "--rdzv_id=" + id,
          "--rdzv_conf=" + conf};
}

inline std::vector<std::string> withShell(std::vector<std::string> args, const std::string& script) {
  args.insert(args.end(), {"--no_python", "sh", "-c", script});
  return args;
}

// One request to 127.0.0.1:port; returns what came back before the server closed (empty
// when nothing could connect), all within `timeout`.
inline std::string httpRequest(int port, const std::string& request, std::chrono::milliseconds timeout = 5s) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return "";
  }
  ::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string response;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
    char buf[4096];
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    response.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return response;
}

inline std::string httpGet(int port, const std::string& path = "/") {
  return httpRequest(port, "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
}

// Runs a Python snippet with the file at `path` as sys.argv[1]; the snippet asserts.
// Returns Python's result (exit 0 when every assertion held; its traceback otherwise).
inline RunResult checkWithPython(const std::string& path, const std::string& code) {
  return run({"/usr/bin/python3", "-c", code, path}, {}, 30s);
}

}  // namespace ddprun::testing::ops
