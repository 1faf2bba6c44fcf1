// Helpers shared by the operating-a-job tests (ops_*_test.cc): agents of one c10d job on
// loopback, a raw HTTP client for the health check, and checks on JSON lines through
// Python's json module (a parser the tests do not have to trust ddprun for).
#pragma once

#include <poll.h>

#include <memory>
#include <string>
#include <vector>

#include "common/socket_io.h"
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
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  UniqueFd fd;
  try {
    fd = connectTcp("127.0.0.1", std::to_string(port), deadline);
  } catch (const SocketError&) {
    return "";
  }
  try {
    sendAll(fd.get(), request, deadline);
  } catch (const SocketError&) {
    // A server that stopped reading (a head over its limit) may still have answered.
  }
  std::string response;
  try {
    char buf[4096];
    while (waitReady(fd.get(), POLLIN, deadline)) {
      response.append(buf, recvSome(fd.get(), std::as_writable_bytes(std::span(buf))));
    }
  } catch (const SocketError&) {
    // The end of the answer: the server closed (or reset) the connection.
  }
  return response;
}

// The port of the health check of a ddprun started with --health_check_port=0 (a port from the
// kernel), read from its "health check at http://HOST:PORT/" line; 0 if none came in `timeout`.
inline int healthPort(TestProcess& ddprun, std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  static const std::string kLine = "health check at http://";
  if (!ddprun.waitForOutput(kLine, timeout)) return 0;
  const std::string all = ddprun.out() + ddprun.err();
  const auto colon = all.find(':', all.find(kLine) + kLine.size());
  return std::stoi(all.substr(colon + 1));
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
