// Round-trip time of a small RPC between two workers on ddprun::rpc, the counterpart of
// bench/rpc_rtt_torch.py (same call, same counts): worker "w0" calls "add_scalar" on "w1"
// with a 4-element float tensor and an integer and waits for the result tensor.
// 200 warm-up calls, then 2000 timed calls; prints the median and p90 in microseconds.
//
//   ddprun --standalone --nproc_per_node=2 --no_python build/bin/rpc_rtt_bench [calls]
#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "common/env_names.h"
#include "common/env_reader.h"
#include "worker_runtime/error_record.h"
#include "worker_runtime/rpc/rpc.h"

namespace rpc = ddprun::rpc;

int main(int argc, char** argv) {
  return ddprun::runtime::recordErrors([&] {
    namespace env = ddprun::env;
    const auto calls = static_cast<int>(argc > 1 ? env::parseInteger("calls", argv[1], 1, INT32_MAX) : 2000);
    const auto world = env::optionalInteger(env::kWorldSize, 1, INT_MAX);
    if (!world || *world != 2 || calls < 1) {
      std::fprintf(stderr, "usage: ddprun --standalone --nproc_per_node=2 --no_python rpc_rtt_bench [calls]\n");
      return 2;
    }
    const int rank = env::requireInteger(env::kRank, 0, 1);
    rpc::register_function("add_scalar",
                           [](const rpc::Args& a) { return rpc::Value(a.at(0).toTensor() + a.at(1).toInt()); });
    rpc::init_rpc("w" + std::to_string(rank), rank, 2);
    if (rank == 0) {
      const at::Tensor t = at::ones({4});
      std::vector<double> us;
      for (int i = 0; i < 200 + calls; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        at::Tensor out = rpc::rpc_sync("w1", "add_scalar", {t, int64_t{1}}).toTensor();
        const auto t1 = std::chrono::steady_clock::now();
        if (out[0].item<float>() != 2.0f) throw ddprun::DdprunError("rpc_rtt_bench: wrong result");
        if (i >= 200) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      }
      std::sort(us.begin(), us.end());
      std::printf("ddprun-rpc rtt calls=%d median_us=%.1f p90_us=%.1f\n", calls, us[us.size() / 2],
                  us[us.size() * 9 / 10]);
    }
    rpc::shutdown();
    return 0;
  });
}
