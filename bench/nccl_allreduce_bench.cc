// nccl_allreduce_bench: ddprun::dist's all_reduce on CUDA tensors over NCCL, the loop that
// bench/nccl_allreduce_torch.py runs on torch's ProcessGroupNCCL line for line, so
// bench/nccl_compare can set them side by side in one run. Under ddprun, one rank per process:
//   ddprun --standalone --nproc_per_node=N --no_python tests/gpu/per_rank_hostid.sh
//       build/bin/nccl_allreduce_bench [--max-bytes B] [--seconds S]
// For each size (8 B to --max-bytes by 4x, float32): 5 warm-up calls, then rounds of K calls
// between two device synchronizations, K sized so a round lasts about S/3 seconds; the time of a
// call is its round's time over K, the slowest rank's; the median of 3 rounds is kept. Rank 0
// prints per size:
//   nccl_row impl=ddprun n=N bytes=B iters=K us=T busbw_GBps=X
// Every round's result is checked (the sum of ranks + 1): exit 1 on a wrong one.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAFunctions.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "worker_runtime/distributed.h"
#include "worker_runtime/env_contract.h"
#include "worker_runtime/error_record.h"

namespace dist = ddprun::dist;
using Clock = std::chrono::steady_clock;

namespace {

int run(int argc, char** argv) {
  int64_t max_bytes = 256LL << 20;
  double seconds = 0.6;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--max-bytes") {
      max_bytes = std::stoll(argv[i + 1]);
    } else if (flag == "--seconds") {
      seconds = std::stod(argv[i + 1]);
    } else {
      throw std::invalid_argument("unknown flag " + flag + " (--max-bytes B, --seconds S)");
    }
  }
  const auto device = static_cast<c10::DeviceIndex>(ddprun::runtime::localDeviceIndex(c10::cuda::device_count()));
  c10::cuda::set_device(device);
  dist::init_process_group("nccl");
  const int rank = dist::get_rank(), n = dist::get_world_size();
  const auto options = at::TensorOptions().dtype(at::kFloat).device(at::kCUDA, device);
  const double expected = n * (n + 1) / 2.0;
  auto sync = [&] { at::cuda::getCurrentCUDAStream(device).synchronize(); };
  // The slowest rank's value (on the device, through the same group).
  auto slowest = [&](double value) {
    at::Tensor t = at::full({1}, value, options.dtype(at::kDouble));
    dist::all_reduce(t, dist::ReduceOp::MAX);
    return t.item<double>();
  };
  for (int64_t bytes = 8; bytes <= max_bytes; bytes *= 4) {
    const int64_t count = bytes / 4;
    at::Tensor x = at::empty({count}, options);
    auto round = [&](int64_t iters) {
      x.fill_(rank + 1);
      sync();
      const auto start = Clock::now();
      for (int64_t i = 0; i < iters; ++i) {
        dist::all_reduce(x);
        if (i + 1 < iters) x.fill_(rank + 1);  // the same kernels in both loops: one fill per call
      }
      sync();
      const double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count() / iters;
      if (x[0].item<double>() != expected || x[count - 1].item<double>() != expected) {
        throw std::runtime_error("all_reduce at " + std::to_string(bytes) + " bytes: wrong result");
      }
      return slowest(us);
    };
    for (int i = 0; i < 5; ++i) round(1);
    const double probe = round(10);
    const auto iters = static_cast<int64_t>(std::clamp(seconds / 3 * 1e6 / probe, 10.0, 5000.0));
    std::vector<double> rounds;
    for (int i = 0; i < 3; ++i) rounds.push_back(round(iters));
    std::sort(rounds.begin(), rounds.end());
    const double us = rounds[1];
    if (rank == 0) {
      const double busbw = n > 1 ? bytes * 2.0 * (n - 1) / n / us / 1e3 : bytes / us / 1e3;
      std::printf("nccl_row impl=ddprun n=%d bytes=%lld iters=%lld us=%.2f busbw_GBps=%.2f\n", n,
                  static_cast<long long>(bytes), static_cast<long long>(iters), us, busbw);
      std::fflush(stdout);
    }
  }
  dist::destroy_process_group();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return ddprun::runtime::recordErrors([&] { return run(argc, argv); });
}
