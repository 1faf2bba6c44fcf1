// The worker that tests/runtime/rpc/rpc_hostile_test.cc probes: rank 0 of a job of two, whose
// rank 1 is the test itself speaking the wire protocol by hand. It serves until killed.
//   rpc_probe_target <rpc_timeout_ms>
// Functions: echo (returns its first argument), mark / marks (count calls), call_peer (calls
// rank 1's "answer" and keeps the result), last_result.
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

#include "common/env_reader.h"
#include "worker_runtime/rpc/rpc.h"

namespace rpc = ddprun::rpc;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: rpc_probe_target <rpc_timeout_ms>\n");
    return 2;
  }
  static std::atomic<int64_t> marks{0};
  static std::mutex mutex;
  static rpc::Value last;
  rpc::register_function("echo", [](const rpc::Args& a) { return a.empty() ? rpc::Value() : a[0]; });
  rpc::register_function("mark", [](const rpc::Args&) { return rpc::Value(++marks); });
  rpc::register_function("marks", [](const rpc::Args&) { return rpc::Value(marks.load()); });
  rpc::register_function("call_peer", [](const rpc::Args&) {
    rpc::Value v;
    try {
      v = rpc::rpc_sync("peer1", "answer");
    } catch (const std::exception& e) {
      v = rpc::Value(std::string("failed: ") + e.what());
    }
    std::lock_guard lock(mutex);
    last = v;
    return v;
  });
  rpc::register_function("last_result", [](const rpc::Args&) {
    std::lock_guard lock(mutex);
    return last;
  });
  rpc::RpcBackendOptions options;
  options.rpc_timeout = std::chrono::milliseconds(ddprun::env::parseInteger("rpc timeout (ms)", argv[1], 0, INT32_MAX));
  options.num_worker_threads = 4;
  options.init_timeout = std::chrono::seconds(30);
  try {
    rpc::init_rpc("target", 0, 2, options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "init_rpc: %s\n", e.what());
    return 1;
  }
  std::printf("serving\n");
  std::fflush(stdout);
  for (;;) ::pause();
}
